/// Fragment of kernel.cc (see there), inside its anonymous namespace; shared by every part.
/// The replay's problem (Problem), cursors over a trajectory's event rows (EventCursor) and
/// mesh node times (Nodes), the split of trajectories over threads, prefetching.

struct Problem {
  int64_t n, s1, k;
  const real* times; const int32_t* n_eff; const real* p; const int32_t* save;
  const real* tsave; const int32_t* subst;
  // Known-time events: per trajectory J jumps (their nodes, sorted, 0 padding at the end,
  // and their sizes) and L tstop nodes (sorted, 0: none); J = L = 0 without events.
  // land: the landing node that moves with each jump (-1: none), jt: the jump times.
  int64_t J = 0, L = 0;
  const int32_t* jidx = nullptr; const real* jsz = nullptr; const int32_t* tidx = nullptr;
  const int32_t* land = nullptr; const real* jt = nullptr;
  std::vector<int64_t> order;
  // Trajectory t's stored states start at row soff[t] = t * s1 + rows[t]: the forward packs
  // them by step count, not at a stride of the mesh capacity, so the pages a replay touches
  // follow the steps taken (the capacity-strided buffer faulted ~1,500 fresh pages per call
  // at n = 1,000 and 4,096 slots, ~1.5 ms). The offsets travel as `rows`, relative to t * s1,
  // because `vmap` may broadcast the states of n trajectories to a batch of copies: a copy's
  // trajectory t then still finds its rows at the same distance from its own t * s1.
  std::vector<int64_t> soff;
  // No save time moves a node and there are no jumps: every node is at its recorded time,
  // read directly (the node cursors cost ~10 % of a sweep's time at d = 2).
  bool plain = false;
  // Width of a stored row: D (the state at a node) or D + 1 (then the node's time, so the
  // reverse sweep reads one stream per lane instead of two and takes the forward's step
  // sizes bitwise; the caller picks D where the buffer would grow too large).
  int64_t sw = D + 1;
};

// A cursor over one trajectory's sorted jump (or tstop) nodes. `ahead(node)` visits nodes
// in increasing order (the forward sweep), `behind(node)` in decreasing order (the reverse
// sweep); both return the first slot at `node` or -1, O(1) amortised.
struct EventCursor {
  const int32_t* row; int64_t len, c;
  void start_up(const int32_t* r, int64_t l) { row = r; len = l; c = 0; }
  void start_down(const int32_t* r, int64_t l) {
    row = r; len = l; c = l - 1;
    while (c >= 0 && row[c] <= 0) --c;  // padding (node 0) sits at the end
  }
  int64_t ahead(int64_t node) {
    while (c < len && row[c] > 0 && row[c] < node) ++c;
    return (c < len && row[c] == node) ? c : -1;
  }
  int64_t behind(int64_t node) {
    while (c >= 0 && row[c] > node) --c;
    return (c >= 0 && row[c] == node) ? c : -1;
  }
};

// Mesh node times: the recorded ones, except nodes that a save slot with `subst` moves to
// its `tsave` value, and a jump's node and its free landing node, which sit at the jump's
// time. Steps visit nodes monotonically, so cursors over the (sorted) save and jump rows
// find them in O(1) amortised: `up` for the forward sweep, `down` for the reverse.
struct Nodes {
  const Problem* pr; int64_t t; int64_t c; int64_t jc; bool rising;
  void start_up(int64_t traj) { t = traj; c = 0; jc = 0; rising = true; }
  void start_down(int64_t traj) { t = traj; c = pr->k - 1; jc = pr->J - 1; rising = false; }
  // The jump time of `node` if it is a jump's node or landing node, else `recorded`.
  real jump_time(int64_t node, real recorded) {
    if (!pr->J) return recorded;
    const int32_t* ji = pr->jidx + t * pr->J; const int32_t* la = pr->land + t * pr->J;
    if (rising) {
      while (jc < pr->J && ji[jc] < node) ++jc;  // padding (node 0) is passed over
    } else {
      while (jc >= 0 && (ji[jc] <= 0 || (la[jc] >= 0 ? la[jc] : ji[jc]) > node)) --jc;
    }
    const bool hit = jc >= 0 && jc < pr->J && ji[jc] > 0 && (ji[jc] == node || la[jc] == node);
    return hit ? pr->jt[t * pr->J + jc] : recorded;
  }
  int64_t up(int64_t node) {  // slot moving `node`, or -1; nodes must not decrease
    const int32_t* row = pr->save + t * pr->k; const int32_t* sub = pr->subst + t * pr->k;
    while (c < pr->k && (!sub[c] || row[c] < node)) ++c;
    return (c < pr->k && row[c] == node) ? c : -1;
  }
  int64_t down(int64_t node) {  // the same, nodes must not increase
    const int32_t* row = pr->save + t * pr->k; const int32_t* sub = pr->subst + t * pr->k;
    while (c >= 0 && (!sub[c] || row[c] > node)) --c;
    return (c >= 0 && row[c] == node) ? c : -1;
  }
  real time(int64_t node, int64_t slot) {
    return slot >= 0 ? pr->tsave[t * pr->k + slot]
                     : jump_time(node, pr->times[t * pr->s1 + node]);
  }
};

void sort_by_length(Problem& pr) {
  pr.order.resize(pr.n);
  std::iota(pr.order.begin(), pr.order.end(), 0);
  std::stable_sort(pr.order.begin(), pr.order.end(),
                   [&](int64_t a, int64_t b) { return pr.n_eff[a] < pr.n_eff[b]; });
}

// The CPUs this process may run on: its affinity mask (taskset, a batch scheduler's
// allocation), not the machine's core count.
static int64_t usable_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return std::thread::hardware_concurrency();
}

// The threads a call of n trajectories runs on. `requested` (the driver's `threads`, an
// FFI attribute) caps the count; 0 means the CPUs this process may use, or
// GRADSOLVE_KERNEL_THREADS where that is set. A thread runs LANES trajectories at a time,
// so a call of at most LANES (one lane group) runs on one. A Rosenbrock step (a d x d
// factorisation, its stage solves) costs far more than a thread's start: a thread per lane
// group the call fills (THREAD_GROUPS 1: a PEtab problem's 6 conditions run on one thread,
// its 36 on up to 5). An explicit step of a small field costs little more than a thread's
// start, so there a thread must have THREAD_GROUPS (16) full groups.
static int64_t threads_for(int64_t n, int64_t requested) {
  int64_t cap = usable_cpus();
  if (const char* env = std::getenv("GRADSOLVE_KERNEL_THREADS")) cap = std::atoi(env);
  if (requested > 0) cap = requested;
  const int64_t want = THREAD_GROUPS == 1 ? (n + LANES - 1) / LANES : n / (THREAD_GROUPS * LANES);
  return std::max<int64_t>(1, std::min<int64_t>(cap > 0 ? cap : 1, want));
}

// Work is split over threads_for's threads by striding through the length-sorted order
// (longest first), so every thread gets a similar mix. Trajectories are independent and
// each is computed by the same code whichever lane and thread runs it, so the results do
// not depend on the count.
template <typename Fn>
void for_threads(int64_t n, int64_t requested, Fn fn) {
  const int64_t threads = threads_for(n, requested);
  if (threads <= 1) { fn(0, 1); return; }
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < threads; ++w) pool.emplace_back([&, w] { fn(w, threads); });
  for (auto& th : pool) th.join();
}

// Each lane walks its own trajectory's rows of `times` and `states`, so eight interleaved
// streams miss the cache at every new line (the reverse sweep measured ~40 % of its time in
// those loads at n = 10,000); fetch the lines a few steps ahead.
static inline void prefetch_ahead(const Problem& pr, int64_t t, int64_t kk, int64_t n,
                                  const real* states) {
  const int64_t ahead = std::min<int64_t>(kk + PF_STEPS, n);
  __builtin_prefetch(pr.times + t * pr.s1 + ahead);
  __builtin_prefetch(states + (pr.soff[t] + ahead) * pr.sw, 1);
}
static inline void prefetch_back(const Problem& pr, int64_t t, int64_t kk, const real* states,
                                 const real* ct_ys, int64_t save_slot) {
  const int64_t back = std::max<int64_t>(kk - PF_STEPS, 0);
  if (pr.sw == D) __builtin_prefetch(pr.times + t * pr.s1 + back);
  __builtin_prefetch(states + (pr.soff[t] + back) * pr.sw);
  if (save_slot >= 0) __builtin_prefetch(ct_ys + (t * pr.k + save_slot) * D);
}

static inline real rmax(real a, real b) { return (a > b || a != a) ? a : b; }
