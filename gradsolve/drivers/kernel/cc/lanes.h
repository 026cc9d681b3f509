/// Fragment of kernel.cc (see there), inside its anonymous namespace. The vector field at
/// the lanes flagged FRESH (@RHS_EVAL@: source.py's straight-line code for one lane, j) and
/// the queue that refills a lane when its trajectory finishes.

// f(TQ, YQ) into FQ for the lanes flagged in FRESH.
static void eval_rhs(const real* TQ, const real* YQ, const real* PB, const int* FRESH, real* FQ) {
  #pragma omp simd
  for (int j = 0; j < LANES; ++j) {
    @RHS_EVAL@
  }
}

// Lanes are refilled as their trajectory finishes, so a ragged ensemble costs the sum
// of its step counts plus at most LANES - 1 idle lanes at the tail of each thread.
struct Queue {
  const int64_t* order; int64_t n, next, stride;
  int64_t pop() {
    if (next >= n) return -1;
    int64_t t = order[n - 1 - next];  // from the back: longest first when sorted
    next += stride;
    return t;
  }
};
