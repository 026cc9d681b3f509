/// Fragment of a Rosenbrock kernel (emitted before rosenbrock.h with its tables): the
/// sparse elimination policy, an LU factorisation of W over the filled pattern of a
/// fill-reducing order only, without pivoting, and its solves (rosenbrock.h's notes give
/// the policy interface).
///
/// The symbolic factorisation is computed in Python at build time
/// (gradsolve.drivers.kernel._sparse.SparseLU) and emitted as a struct of tables `Sp`:
///   N, NNZ: states and entries of the filled pattern (L + U) of W[ORDER][:, ORDER];
///   ORDER[N]: the state at each position; DIAG[N]: the slot of pivot k;
///   JSLOT[M::NNZ]: the slot of each structural nonzero of J, in the Model's order;
///   LPTR[N+1], LSLOT, LROW: L's column k below the diagonal (slots, rows);
///   UPTR[N+1], USLOT, UCOL: U's row k right of the diagonal (slots, columns);
///   TPTR[#L+1], TARGET: for L entry e of column k and the m-th entry of U's row k, the
///     slot TARGET[TPTR[e] + m] that their product updates.
/// Values live per slot for all lanes, V[slot * LANES + j]; every loop runs over the
/// tables with the lanes innermost (vectorised across lanes, never unrolled per entry).
///
/// Pivots are not exchanged (the order is the build's). What an unpivoted elimination
/// can lose is growth: pivot k adds l_ik u_kj to the entries it updates, at most
/// max_i |W_ik| max_j |W_kj| / |pivot| (its column below and its row right of it, as they
/// stand at step k). A pivot is refused where that exceeds SPARSE_GROWTH_MAX times W's
/// largest entry, or is zero or not finite: the backward error of the factors stays
/// within about 1e-16 * D * SPARSE_GROWTH_MAX of W (the worst case). Measured on the
/// collection's models (W = I / gamma - h J at states along a solve, h from 1e-6 to 1e6):
/// the relative pivot |pivot| / max(column, row) falls to 2.4e-10 (Laske) and 3.3e-10
/// (Isensee) at h = 1e6, each proportional to 1 / h (a state whose own rate has no term
/// in itself), yet the backward error of the solves stays under 5e-16, because such a
/// pivot's row or column is empty or small: a relative-pivot test would refuse them. The
/// growth ratio stays under 11 on Laske, 0.5 on Zheng, 0.07 on Bachmann; on Isensee it
/// grows with h, 9e4 at h = 1e6 (so its steps past h ~ 1e7 go to the dense fallback).
/// Where an active lane refuses a pivot, the policy factors the whole block again with
/// DenseElimination (partial pivoting) and serves this step's solves from it, when
/// D <= SPARSE_DENSE_FALLBACK_MAX (the dense matrix is D^2 LANES reals per thread); above
/// that the lane gets FAIL = 1 and the step marks its results NaN (the record then rejects
/// the step and retries a smaller one, where W = ALPHA I - BETA J is closer to a multiple
/// of I).

#ifndef SPARSE_GROWTH_MAX
#define SPARSE_GROWTH_MAX 1e6
#endif
#ifndef SPARSE_DENSE_FALLBACK_MAX
#define SPARSE_DENSE_FALLBACK_MAX 64
#endif

// Sparse LU of W = ALPHA[j] I - BETA[j] J for all lanes (the numeric part only).
// Returns through FAIL[j] (0 or 1) which lanes refused a pivot.
template <class Sp>
static inline void sparse_lu_factor(real* V, const real* JNZ, const real* ALPHA,
                                    const real* BETA, int njac, int* FAIL) {
  std::memset(V, 0, sizeof(real) * Sp::NNZ * LANES);
  for (int k = 0; k < Sp::N; ++k) {
    real* v = V + Sp::DIAG[k] * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) v[j] = ALPHA[j];
  }
  // W's entries as the dense policy forms them: ALPHA - BETA J on the diagonal, 0 - BETA J
  // off it.
  for (int k = 0; k < njac; ++k) {
    real* v = V + Sp::JSLOT[k] * LANES;
    const real* jk = JNZ + k * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) v[j] = v[j] - BETA[j] * jk[j];
  }
  // W's largest magnitude, per lane
  alignas(64) real wmax[LANES];
  #pragma omp simd
  for (int j = 0; j < LANES; ++j) wmax[j] = 0;
  for (int s = 0; s < Sp::NNZ; ++s) {
    const real* v = V + s * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) wmax[j] = std::abs(v[j]) > wmax[j] ? std::abs(v[j]) : wmax[j];
  }
  for (int j = 0; j < LANES; ++j) FAIL[j] = 0;
  for (int k = 0; k < Sp::N; ++k) {
    alignas(64) real col[LANES];
    alignas(64) real row[LANES];
    alignas(64) real rec[LANES];
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) { col[j] = 0; row[j] = 0; }
    for (int e = Sp::LPTR[k]; e < Sp::LPTR[k + 1]; ++e) {
      const real* l = V + Sp::LSLOT[e] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) col[j] = std::abs(l[j]) > col[j] ? std::abs(l[j]) : col[j];
    }
    for (int m = Sp::UPTR[k]; m < Sp::UPTR[k + 1]; ++m) {
      const real* u = V + Sp::USLOT[m] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) row[j] = std::abs(u[j]) > row[j] ? std::abs(u[j]) : row[j];
    }
    const real* piv = V + Sp::DIAG[k] * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {
      const real a = std::abs(piv[j]);
      // growth col * row / a within SPARSE_GROWTH_MAX * wmax, written without dividing
      // (an overflow to infinity is refused); a NaN pivot is refused, a NaN elsewhere
      // reaches the solves' results, where the step's error test sees it
      const bool ok = a > 0 && a < (real)INFINITY && wmax[j] < (real)INFINITY
                      && col[j] * row[j] <= (real)SPARSE_GROWTH_MAX * wmax[j] * a;
      FAIL[j] |= !ok;
      rec[j] = (real)1 / (ok ? piv[j] : (real)1);
    }
    const int u0 = Sp::UPTR[k], nu = Sp::UPTR[k + 1] - u0;
    for (int e = Sp::LPTR[k]; e < Sp::LPTR[k + 1]; ++e) {
      real* l = V + Sp::LSLOT[e] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) l[j] = l[j] * rec[j];
      const int* tg = Sp::TARGET + Sp::TPTR[e];
      for (int m = 0; m < nu; ++m) {
        real* a = V + tg[m] * LANES;
        const real* u = V + Sp::USLOT[u0 + m] * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) a[j] = a[j] - l[j] * u[j];
      }
    }
  }
}

// b <- W^-1 b (b[r * LANES + j], r a state), X a work array of N * LANES.
template <class Sp>
static inline void sparse_lu_solve(const real* V, real* b, real* X) {
  for (int k = 0; k < Sp::N; ++k) std::memcpy(X + k * LANES, b + Sp::ORDER[k] * LANES,
                                              sizeof(real) * LANES);
  for (int k = 0; k < Sp::N; ++k) {  // L y = b, unit diagonal, column by column
    const real* x = X + k * LANES;
    for (int e = Sp::LPTR[k]; e < Sp::LPTR[k + 1]; ++e) {
      const real* l = V + Sp::LSLOT[e] * LANES;
      real* y = X + Sp::LROW[e] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) y[j] -= l[j] * x[j];
    }
  }
  for (int k = Sp::N - 1; k >= 0; --k) {  // U x = y, row by row
    real* x = X + k * LANES;
    for (int m = Sp::UPTR[k]; m < Sp::UPTR[k + 1]; ++m) {
      const real* u = V + Sp::USLOT[m] * LANES;
      const real* y = X + Sp::UCOL[m] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) x[j] -= u[j] * y[j];
    }
    const real* d = V + Sp::DIAG[k] * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) x[j] = x[j] / d[j];
  }
  for (int k = 0; k < Sp::N; ++k) std::memcpy(b + Sp::ORDER[k] * LANES, X + k * LANES,
                                              sizeof(real) * LANES);
}

// b <- W^-T b: W[ORDER][:, ORDER] = L U, so its transpose is U^T L^T.
template <class Sp>
static inline void sparse_lu_solve_transposed(const real* V, real* b, real* X) {
  for (int k = 0; k < Sp::N; ++k) std::memcpy(X + k * LANES, b + Sp::ORDER[k] * LANES,
                                              sizeof(real) * LANES);
  for (int k = 0; k < Sp::N; ++k) {  // U^T z = b, column k of U^T is row k of U
    real* x = X + k * LANES;
    const real* d = V + Sp::DIAG[k] * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) x[j] = x[j] / d[j];
    for (int m = Sp::UPTR[k]; m < Sp::UPTR[k + 1]; ++m) {
      const real* u = V + Sp::USLOT[m] * LANES;
      real* y = X + Sp::UCOL[m] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) y[j] -= u[j] * x[j];
    }
  }
  for (int k = Sp::N - 1; k >= 0; --k) {  // L^T w = z, row k of L^T is column k of L
    real* x = X + k * LANES;
    for (int e = Sp::LPTR[k]; e < Sp::LPTR[k + 1]; ++e) {
      const real* l = V + Sp::LSLOT[e] * LANES;
      const real* y = X + Sp::LROW[e] * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) x[j] -= l[j] * y[j];
    }
  }
  for (int k = 0; k < Sp::N; ++k) std::memcpy(b + Sp::ORDER[k] * LANES, X + k * LANES,
                                              sizeof(real) * LANES);
}

// rosenbrock.h's dense policy, the fallback (defined there, before it is instantiated).
template <class M> struct DenseElimination;

// The elimination policy (rosenbrock.h's interface) over the tables Sp.
template <class M, class Sp>
struct SparseElimination {
  static constexpr bool FALLBACK = Sp::N <= SPARSE_DENSE_FALLBACK_MAX;
  struct None {
    void factor(const real*, const real*, const real*, const int*, int*) {}
    void solve(real*) const {}
    void solve_transposed(real*) const {}
  };
  using Dense = typename std::conditional<FALLBACK, DenseElimination<M>, None>::type;
  alignas(64) real V[Sp::NNZ * LANES];
  alignas(64) mutable real X[Sp::N * LANES];
  Dense dense;
  bool use_dense = false;
  int64_t fallbacks = 0;  // factorisations served by the dense policy (this thread)

  void factor(const real* JNZ, const real* ALPHA, const real* BETA, const int* ACT,
              int* FAIL) {
    sparse_lu_factor<Sp>(V, JNZ, ALPHA, BETA, M::NNZ, FAIL);
    use_dense = false;
    if constexpr (FALLBACK && !std::is_same<Dense, None>::value) {
      bool any = false;
      for (int j = 0; j < LANES; ++j) any |= FAIL[j] && ACT[j];
      if (any) {
        dense.factor(JNZ, ALPHA, BETA, ACT, FAIL);
        use_dense = true;
        ++fallbacks;
      }
    }
  }
  void solve(real* b) const {
    if (use_dense) dense.solve(b);
    else sparse_lu_solve<Sp>(V, b, X);
  }
  void solve_transposed(real* b) const {
    if (use_dense) dense.solve_transposed(b);
    else sparse_lu_solve_transposed<Sp>(V, b, X);
  }
};
