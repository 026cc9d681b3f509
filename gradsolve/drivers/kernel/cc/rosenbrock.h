/// Fragment of a Rosenbrock kernel (rosenbrock_source.py inserts it at kernel.cc's
/// @ROSENBROCK@, after the generated `Model` and `Tableau` and before forward.h): a
/// Rosenbrock step of LANES lanes at once, forward and reverse, in loop form.
///
/// Generated per model (struct Model, by rosenbrock_source.py): only what depends on the
/// vector field, each a function of all LANES lanes at once (arrays [index][LANES], lanes
/// innermost: X[r * LANES + j] is entry r of lane j):
///   NNZ, ROW[NNZ], COL[NNZ]: the structural nonzeros of J = df/dy, in that order;
///   f(T, Y, P, F):                   F = f(T, Y, P);
///   jac(T, Y, P, F0, JNZ, FT):       F0 = f, JNZ[k] = J[ROW[k]][COL[k]], FT = df/dt;
///   f_vjp(T, Y, P, FB, TB, YB, PB):  (TB, YB) = (df/dt, df/dy)^T FB, PB += (df/dp)^T FB;
///   jac_vjp(T, Y, P, F0B, JNZB, FTB, TB, YB, PB): the same for (F0, JNZ, FT) with the
///     cotangents (F0B, JNZB, FTB): the second-order products of the adjoint.
/// Generated per solver (struct Tableau): the method's constants.
///
/// Fixed here: the stages, W, its factorisation and solves (through an elimination
/// policy), the error estimate and the exact discrete adjoint of the step, as loops
/// instantiated by size (D, NNZ, S), not unrolled per entry.
///
/// ---------------------------------------------------------------------------------------
/// THE ELIMINATION POLICY. Every factorisation and solve of a step goes through one
/// policy object (one per thread, serving all LANES lanes at once), a class
/// `template <class M> struct X` (M: the generated Model) with this interface:
///
///   // Factor W = ALPHA[j] I - BETA[j] J for every lane j, J given by its structural
///   // nonzeros in the Model's order: JNZ[k * LANES + j] = J[M::ROW[k]][M::COL[k]].
///   // W's entries must be formed as ALPHA - BETA * J on the diagonal and 0 - BETA * J
///   // off it (the XLA step's rounding). Lanes with ACT[j] == 0 may hold anything (their
///   // results are not read). FAIL[j] = 1 where lane j's W cannot be factored (a zero
///   // pivot), else 0: the step then marks the lane's result NaN itself.
///   void factor(const real* JNZ, const real* ALPHA, const real* BETA, const int* ACT,
///               int* FAIL);
///   // b <- W^-1 b and b <- W^-T b in place, b[r * LANES + j] for r < D, every lane.
///   void solve(real* b) const;
///   void solve_transposed(real* b) const;
///
/// The step calls factor once, then solve S times (forward) or S solves and up to S
/// solve_transposed (reverse), so a policy keeps its factors between the calls. A policy
/// may use tables of its own computed at build time (a fill-reducing order, a symbolic
/// factorisation over M's pattern) emitted before this file by its Python side.
/// DenseElimination (below) is the LU with partial pivoting of LAPACK's getrf.
/// rosenbrock_source.py picks the policy (`Elimination`, the C++ type name and its text).
/// ---------------------------------------------------------------------------------------
///
/// The reverse step recomputes the forward step from the stored state (Jacobian,
/// factorisation, stages) and runs its exact discrete adjoint (the derivation is in
/// rosenbrock_source.py's notes); the factorisation is not carried from the forward
/// sweep (rosenbrock_source.py says why, with the measurement).

// Dense LU with partial pivoting (the largest magnitude in the column, the first such
// row), all lanes at once: A[(r * D + c) * LANES + j]; PIV[k * LANES + j] the row swapped
// with row k at step k. The swaps are scalar per lane (O(D^2) per factorisation), the
// elimination vectorised over lanes.
template <class M>
struct DenseElimination {
  alignas(64) real A[D * D * LANES];
  int PIV[D * LANES];

  void factor(const real* JNZ, const real* ALPHA, const real* BETA, const int* ACT,
              int* FAIL) {
    std::memset(A, 0, sizeof(A));
    for (int r = 0; r < D; ++r)
      for (int j = 0; j < LANES; ++j) A[(r * D + r) * LANES + j] = ALPHA[j];
    for (int k = 0; k < M::NNZ; ++k) {
      real* a = A + (M::ROW[k] * D + M::COL[k]) * LANES;
      const real* jk = JNZ + k * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) a[j] = a[j] - BETA[j] * jk[j];
    }
    for (int j = 0; j < LANES; ++j) FAIL[j] = 0;
    for (int k = 0; k < D; ++k) {
      alignas(64) real best[LANES];
      alignas(64) int at[LANES];
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) { best[j] = std::abs(A[(k * D + k) * LANES + j]); at[j] = k; }
      for (int i = k + 1; i < D; ++i) {
        const real* a = A + (i * D + k) * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) {
          const real m = std::abs(a[j]);
          const bool better = m > best[j];
          best[j] = better ? m : best[j];
          at[j] = better ? i : at[j];
        }
      }
      for (int j = 0; j < LANES; ++j) {
        PIV[k * LANES + j] = at[j];
        if (at[j] != k)
          for (int c = 0; c < D; ++c)
            std::swap(A[(k * D + c) * LANES + j], A[(at[j] * D + c) * LANES + j]);
      }
      alignas(64) real rec[LANES];
      const real* piv = A + (k * D + k) * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const bool zero = piv[j] == 0 || piv[j] != piv[j];
        FAIL[j] |= zero;
        rec[j] = (real)1 / (zero ? (real)1 : piv[j]);
      }
      for (int i = k + 1; i < D; ++i) {
        real* l = A + (i * D + k) * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) l[j] = l[j] * rec[j];
        for (int c = k + 1; c < D; ++c) {
          real* a = A + (i * D + c) * LANES;
          const real* u = A + (k * D + c) * LANES;
          #pragma omp simd
          for (int j = 0; j < LANES; ++j) a[j] = a[j] - l[j] * u[j];
        }
      }
    }
    (void)ACT;
  }

  void solve(real* b) const {
    for (int k = 0; k < D; ++k)
      for (int j = 0; j < LANES; ++j) {
        const int p = PIV[k * LANES + j];
        if (p != k) std::swap(b[k * LANES + j], b[p * LANES + j]);
      }
    for (int i = 1; i < D; ++i)
      for (int c = 0; c < i; ++c) {
        const real* l = A + (i * D + c) * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) b[i * LANES + j] -= l[j] * b[c * LANES + j];
      }
    for (int i = D - 1; i >= 0; --i) {
      for (int c = i + 1; c < D; ++c) {
        const real* u = A + (i * D + c) * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) b[i * LANES + j] -= u[j] * b[c * LANES + j];
      }
      const real* d = A + (i * D + i) * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) b[i * LANES + j] = b[i * LANES + j] / d[j];
    }
  }

  // W = P^T L U, so W^T x = b is U^T z = b, L^T w = z, x = P^T w.
  void solve_transposed(real* b) const {
    for (int i = 0; i < D; ++i) {
      for (int c = 0; c < i; ++c) {
        const real* u = A + (c * D + i) * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) b[i * LANES + j] -= u[j] * b[c * LANES + j];
      }
      const real* d = A + (i * D + i) * LANES;
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) b[i * LANES + j] = b[i * LANES + j] / d[j];
    }
    for (int i = D - 2; i >= 0; --i)
      for (int c = i + 1; c < D; ++c) {
        const real* l = A + (c * D + i) * LANES;
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) b[i * LANES + j] -= l[j] * b[c * LANES + j];
      }
    for (int k = D - 1; k >= 0; --k)
      for (int j = 0; j < LANES; ++j) {
        const int p = PIV[k * LANES + j];
        if (p != k) std::swap(b[k * LANES + j], b[p * LANES + j]);
      }
  }
};

// ---------------------------------------------------------------------------- helpers

// y = x (all D entries, all lanes)
static inline void rb_copy(real* y, const real* x) { std::memcpy(y, x, sizeof(real) * D * LANES); }

// acc (if `have`) + c * x into out, the order of gradsolve._solver.base.combine:
// acc = c0 * u0; acc = acc + c1 * u1; ...
static inline void rb_axpy(real* out, bool have, real c, const real* x) {
  #pragma omp simd
  for (int i = 0; i < D * LANES; ++i) out[i] = have ? out[i] + c * x[i] : c * x[i];
}

// per-lane dot products: out[j] += sum_r a[r, j] * b[r, j]
static inline void rb_dot_add(real* out, const real* a, const real* b) {
  for (int r = 0; r < D; ++r) {
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) out[j] += a[r * LANES + j] * b[r * LANES + j];
  }
}

// A lane whose W could not be factored: NaN results.
static inline void rb_mark_failed(const int* FAIL, real* x, int rows) {
  for (int j = 0; j < LANES; ++j)
    if (FAIL[j])
      for (int r = 0; r < rows; ++r) x[r * LANES + j] = std::numeric_limits<real>::quiet_NaN();
}

// G[k] = sum over (RB_i, U_i) pairs of RB_i[ROW[k]] * U_i[COL[k]]: W's cotangent is
// -sum_i RB_i U_i^T, and only J's structural nonzeros carry it on.
template <class M>
static inline void rb_outer_add(real* G, const real* rb, const real* u) {
  for (int k = 0; k < M::NNZ; ++k) {
    const real* a = rb + M::ROW[k] * LANES;
    const real* b = u + M::COL[k] * LANES;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) G[k * LANES + j] += a[j] * b[j];
  }
}

// ------------------------------------------------------------- the step, both kinds

// Tableau::KIND 0: the transformed Rosenbrock–Wanner form of
// gradsolve._solver.rosenbrock.AbstractRosenbrock.step (Hairer & Wanner IV.7.25, times h):
//   W = I / gamma - h J,  W u_i = h f(t0 + c_i h, y0 + sum_k a_ik u_k)
//                                 + sum_k C_ik u_k + d_i h^2 f_t,
//   y1 = y0 + sum_i m_i u_i,  err = sum_i e_i u_i.
// Tableau::KIND 1: gradsolve.Rosenbrock23.step (Shampine & Reichelt's ode23s), W = I - d h J.
template <class M, class T, class E>
struct RosenbrockWork {
  static constexpr int NZ = M::NNZ > 0 ? M::NNZ : 1;
  static constexpr int NS = T::NST;
  E el;
  alignas(64) real F0[D * LANES], FT[D * LANES], JNZ[NZ * LANES], G[NZ * LANES];
  alignas(64) real U[NS][D * LANES], FS[NS][D * LANES], YS[NS][D * LANES], RBS[NS][D * LANES];
  alignas(64) real UB[NS][D * LANES];
  alignas(64) real TS[NS][LANES];
  alignas(64) real R[D * LANES], Y1[D * LANES], ERR[D * LANES], YBAR[D * LANES], TMP[D * LANES];
  alignas(64) real F0B[D * LANES], FTB[D * LANES];
  alignas(64) real ALPHA[LANES], BETA[LANES], HB[LANES], TB[LANES], TBI[LANES];
  alignas(64) int FAIL[LANES];

  void assemble(const real* TA, const real* H, const real* Y, const real* PR, const int* ACT,
                bool factor = true) {
    M::jac(TA, Y, PR, F0, JNZ, FT);
    for (int j = 0; j < LANES; ++j) {
      ALPHA[j] = (real)T::ALPHA;
      BETA[j] = T::KIND == 0 ? H[j] : (real)T::DCOEF * H[j];
    }
    if (factor) el.factor(JNZ, ALPHA, BETA, ACT, FAIL);
  }

  // The forward step into Y1 (and ERR, the error estimate, where `error`), stages kept.
  void forward(const real* TA, const real* H, const real* Y, const real* PR, const int* ACT,
               bool error) {
    assemble(TA, H, Y, PR, ACT);
    if constexpr (T::KIND == 0) forward_tableau(TA, H, Y, PR, error);
    else forward_ode23s(TA, H, Y, PR, error);
    rb_mark_failed(FAIL, Y1, D);
    if (error) rb_mark_failed(FAIL, ERR, D);
  }

  void forward_tableau(const real* TA, const real* H, const real* Y, const real* PR,
                       bool error) {
    for (int i = 0; i < NS; ++i) {
      if (i == 0 && T::C[0] == 0) {
        rb_copy(FS[0], F0);
        rb_copy(YS[0], Y);
        for (int j = 0; j < LANES; ++j) TS[0][j] = TA[j];
      } else {
        bool have = false;
        for (int k = 0; k < i; ++k)
          if (T::A[i][k] != 0) { rb_axpy(TMP, have, (real)T::A[i][k], U[k]); have = true; }
        #pragma omp simd
        for (int q = 0; q < D * LANES; ++q) YS[i][q] = have ? Y[q] + TMP[q] : Y[q];
        for (int j = 0; j < LANES; ++j) TS[i][j] = TA[j] + (real)T::C[i] * H[j];
        M::f(TS[i], YS[i], PR, FS[i]);
      }
      for (int r = 0; r < D; ++r) {
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) R[r * LANES + j] = H[j] * FS[i][r * LANES + j];
      }
      bool have = false;
      for (int k = 0; k < i; ++k)
        if (T::CC[i][k] != 0) { rb_axpy(TMP, have, (real)T::CC[i][k], U[k]); have = true; }
      if (have) {
        #pragma omp simd
        for (int q = 0; q < D * LANES; ++q) R[q] = R[q] + TMP[q];
      }
      if (T::DD[i] != 0)
        for (int r = 0; r < D; ++r) {
          #pragma omp simd
          for (int j = 0; j < LANES; ++j)
            R[r * LANES + j] = R[r * LANES + j]
                               + ((real)T::DD[i] * (H[j] * H[j])) * FT[r * LANES + j];
        }
      el.solve(R);
      rb_copy(U[i], R);
    }
    bool have = false;
    for (int i = 0; i < NS; ++i)
      if (T::M[i] != 0) { rb_axpy(TMP, have, (real)T::M[i], U[i]); have = true; }
    #pragma omp simd
    for (int q = 0; q < D * LANES; ++q) Y1[q] = have ? Y[q] + TMP[q] : Y[q];
    if (error) {
      have = false;
      for (int i = 0; i < NS; ++i)
        if (T::ME[i] != 0) { rb_axpy(ERR, have, (real)T::ME[i], U[i]); have = true; }
      if (!have) std::memset(ERR, 0, sizeof(ERR));
    }
  }

  // ode23s: U[0] = k1, U[1] = W^-1 (F1 - k1) (k2 = U[1] + k1), FS[1] = F1 at (TS[1], YS[1]).
  void forward_ode23s(const real* TA, const real* H, const real* Y, const real* PR,
                      bool error) {
    const real dc = (real)T::DCOEF;
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        R[q] = F0[q] + (dc * H[j]) * FT[q];
      }
    }
    el.solve(R);
    rb_copy(U[0], R);
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        YS[1][q] = Y[q] + ((real)0.5 * H[j]) * U[0][q];
      }
    }
    for (int j = 0; j < LANES; ++j) TS[1][j] = TA[j] + (real)0.5 * H[j];
    M::f(TS[1], YS[1], PR, FS[1]);
    #pragma omp simd
    for (int q = 0; q < D * LANES; ++q) R[q] = FS[1][q] - U[0][q];
    el.solve(R);
    rb_copy(U[1], R);
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        Y1[q] = Y[q] + H[j] * (U[1][q] + U[0][q]);
      }
    }
    if (!error) return;
    for (int j = 0; j < LANES; ++j) TS[2][j] = TA[j] + H[j];
    M::f(TS[2], Y1, PR, FS[2]);
    const real e32 = (real)T::E32;
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        const real k1 = U[0][q], k2 = U[1][q] + U[0][q];
        R[q] = FS[2][q] - e32 * (k2 - FS[1][q]) - (real)2 * (k1 - F0[q]) + (dc * H[j]) * FT[q];
      }
    }
    el.solve(R);
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        const real k1 = U[0][q], k2 = U[1][q] + U[0][q];
        ERR[q] = (H[j] / (real)6) * (k1 - (real)2 * k2 + R[q]);
      }
    }
  }

  // The reverse step: LAM (y1's cotangent) becomes y0's, CTP gathers p's, CTT and CTH
  // (per lane) the cotangents of the step's start time t0 and its size h.
  void backward(const real* TA, const real* H, const real* Y, const real* PR, const int* ACT,
                real* LAM, real* CTP, real* CTT, real* CTH) {
#ifdef GS_ROSENBROCK_REUSE_PROBE
    // A timing probe only (bench_kernel_rosenbrock.py --reuse-probe; wrong derivatives):
    // the reverse step without its factorisation, the most that carrying the forward's
    // factors could save.
    assemble(TA, H, Y, PR, ACT, false);
#else
    assemble(TA, H, Y, PR, ACT);
#endif
    if constexpr (T::KIND == 0) forward_tableau(TA, H, Y, PR, false);
    else forward_ode23s(TA, H, Y, PR, false);
    std::memset(G, 0, sizeof(G));
    std::memset(F0B, 0, sizeof(F0B));
    std::memset(FTB, 0, sizeof(FTB));
    for (int j = 0; j < LANES; ++j) { HB[j] = 0; TB[j] = 0; }
    rb_copy(YBAR, LAM);
    if constexpr (T::KIND == 0) backward_tableau(TA, H, Y, PR, LAM, CTP);
    else backward_ode23s(TA, H, Y, PR, LAM, CTP);
    // W = ALPHA I - BETA J: J's cotangent BETA G, h's BETA / h <JNZ, G>.
    const real bc = T::KIND == 0 ? (real)1 : (real)T::DCOEF;
    for (int k = 0; k < M::NNZ; ++k) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = k * LANES + j;
        HB[j] += bc * (JNZ[q] * G[q]);
        G[q] = (bc * H[j]) * G[q];
      }
    }
    M::jac_vjp(TA, Y, PR, F0B, G, FTB, TBI, TMP, CTP);
    for (int q = 0; q < D * LANES; ++q) LAM[q] = YBAR[q] + TMP[q];
    for (int j = 0; j < LANES; ++j) { CTT[j] = TB[j] + TBI[j]; CTH[j] = HB[j]; }
    rb_mark_failed(FAIL, LAM, D);
    rb_mark_failed(FAIL, CTP, P_REAL);
    rb_mark_failed(FAIL, CTT, 1);
    rb_mark_failed(FAIL, CTH, 1);
  }

  void backward_tableau(const real* TA, const real* H, const real* Y, const real* PR,
                        const real* LAM, real* CTP) {
    for (int i = 0; i < NS; ++i) {
      if (T::M[i] != 0) {
        #pragma omp simd
        for (int q = 0; q < D * LANES; ++q) UB[i][q] = (real)T::M[i] * LAM[q];
      } else {
        std::memset(UB[i], 0, sizeof(UB[i]));
      }
    }
    for (int i = NS - 1; i >= 0; --i) {
      real* rb = RBS[i];
      rb_copy(rb, UB[i]);
      el.solve_transposed(rb);
      rb_outer_add<M>(G, rb, U[i]);
      // r_i = h F_i + sum_k C_ik u_k + (d_i h^2) f_t
      rb_dot_add(HB, rb, FS[i]);
      if (T::DD[i] != 0) {
        for (int j = 0; j < LANES; ++j) TBI[j] = 0;
        rb_dot_add(TBI, rb, FT);
        for (int r = 0; r < D; ++r) {
          #pragma omp simd
          for (int j = 0; j < LANES; ++j) {
            const int q = r * LANES + j;
            FTB[q] += ((real)T::DD[i] * (H[j] * H[j])) * rb[q];
          }
        }
        for (int j = 0; j < LANES; ++j) HB[j] += (real)2 * (real)T::DD[i] * H[j] * TBI[j];
      }
      for (int k = 0; k < i; ++k)
        if (T::CC[i][k] != 0) {
          #pragma omp simd
          for (int q = 0; q < D * LANES; ++q) UB[k][q] += (real)T::CC[i][k] * rb[q];
        }
      for (int r = 0; r < D; ++r) {
        #pragma omp simd
        for (int j = 0; j < LANES; ++j) R[r * LANES + j] = H[j] * rb[r * LANES + j];
      }
      if (i == 0 && T::C[0] == 0) {
        #pragma omp simd
        for (int q = 0; q < D * LANES; ++q) F0B[q] += R[q];
        continue;
      }
      M::f_vjp(TS[i], YS[i], PR, R, TBI, TMP, CTP);
      #pragma omp simd
      for (int q = 0; q < D * LANES; ++q) YBAR[q] += TMP[q];
      for (int k = 0; k < i; ++k)
        if (T::A[i][k] != 0) {
          #pragma omp simd
          for (int q = 0; q < D * LANES; ++q) UB[k][q] += (real)T::A[i][k] * TMP[q];
        }
      for (int j = 0; j < LANES; ++j) { TB[j] += TBI[j]; HB[j] += (real)T::C[i] * TBI[j]; }
    }
  }

  void backward_ode23s(const real* TA, const real* H, const real* Y, const real* PR,
                       const real* LAM, real* CTP) {
    const real dc = (real)T::DCOEF;
    // y1 = y0 + h (U1 + U0): U1 and U0 get h LAM, h gets <LAM, U1 + U0>.
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        HB[j] += LAM[q] * (U[1][q] + U[0][q]);
        UB[1][q] = H[j] * LAM[q];
      }
    }
    // U1 = W^-1 (F1 - U0)
    real* q2 = RBS[1];
    rb_copy(q2, UB[1]);
    el.solve_transposed(q2);
    rb_outer_add<M>(G, q2, U[1]);
    #pragma omp simd
    for (int q = 0; q < D * LANES; ++q) UB[0][q] = UB[1][q] - q2[q];
    // F1 = f(t0 + h/2, y0 + (h/2) U0)
    M::f_vjp(TS[1], YS[1], PR, q2, TBI, TMP, CTP);
    for (int j = 0; j < LANES; ++j) { TB[j] += TBI[j]; HB[j] += (real)0.5 * TBI[j]; }
    for (int j = 0; j < LANES; ++j) TBI[j] = 0;
    rb_dot_add(TBI, TMP, U[0]);
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        YBAR[q] += TMP[q];
        UB[0][q] += ((real)0.5 * H[j]) * TMP[q];
      }
    }
    for (int j = 0; j < LANES; ++j) HB[j] += (real)0.5 * TBI[j];
    // U0 = W^-1 (F0 + (d h) FT)
    real* q1 = RBS[0];
    rb_copy(q1, UB[0]);
    el.solve_transposed(q1);
    rb_outer_add<M>(G, q1, U[0]);
    for (int j = 0; j < LANES; ++j) TBI[j] = 0;
    rb_dot_add(TBI, q1, FT);
    for (int r = 0; r < D; ++r) {
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {
        const int q = r * LANES + j;
        F0B[q] += q1[q];
        FTB[q] += (dc * H[j]) * q1[q];
      }
    }
    for (int j = 0; j < LANES; ++j) HB[j] += dc * TBI[j];
  }
};

template <class W>
static W& rosenbrock_work() {
  // One per thread (the kernel's threads are short-lived), on the heap: W's matrix grows
  // with D^2 * LANES.
  thread_local std::unique_ptr<W> work;
  if (!work) work.reset(new W());
  return *work;
}
