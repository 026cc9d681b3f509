"""C++ source of the compiled replay kernel for one (vector field, explicit RK tableau, dtype).

Two XLA FFI handlers:

- ``Fwd``: the replay. Trajectories are sorted by step count and processed in blocks of
  ``LANES``; inside a block every stage of every step is straight-line code over the lanes
  (vectorised by the compiler), so no intermediate leaves the cache. Stores the state at
  every mesh node for the reverse sweep (``n * (S+1) * d`` numbers).
- ``Bwd``: the exact discrete adjoint of the same steps. Per step (last to first) it
  recomputes the stages from the stored state and runs the Runge–Kutta adjoint recursion
  (Hairer, Lubich & Wanner, *Geometric Numerical Integration*, VI.4; Sandu, "On the
  properties of Runge–Kutta discrete adjoints", 2006):

      kappa_i = h b_i lambda + h sum_{j>i} a_ji mu_j,
      (mu_i, pi_i, tau_i) = (d f / d(y, p, t))(T_i, Y_i)^T kappa_i,
      lambda <- lambda + sum_i mu_i,  grad_p += sum_i pi_i,

  plus the cotangents of the two node times through ``h`` and the stage times. With FSAL the
  carried first stage is ``f(t_k, y_k)`` recomputed, the same function of ``y_k``.

The vector field and its VJP come from `gradsolve._kernel.codegen`.
"""

from __future__ import annotations

import numpy as np

from .codegen import translate

LANES = 8


def _block(lines: list[str], outs: list[tuple[list[str], list[str]]]) -> str:
    """A ``{ ... }`` scope running translated ``lines`` and assigning outputs to outer names."""
    body = list(lines)
    for names, exprs in outs:
        body += [f"{nm} = {ex};" for nm, ex in zip(names, exprs)]
    return "{ " + " ".join(body) + " }"


def _comb(coeffs, terms) -> str | None:
    """``sum_j c_j * term_j`` in the order `gradsolve._solver.base.combine` uses."""
    acc = None
    for c, t in zip(coeffs, terms):
        if float(c) != 0.0:
            term = f"((real){float(c)!r} * {t})"
            acc = term if acc is None else f"({acc} + {term})"
    return acc


def generate(f_flat, d: int, p_size: int, dtype, solver) -> str:
    """Full C++ source. ``f_flat(t, y (d,), p (p_size,))`` is the flattened vector field."""
    import jax
    import jax.numpy as jnp

    real = "double" if np.dtype(dtype) == np.float64 else "float"
    t_ex = jax.ShapeDtypeStruct((), dtype)
    y_ex = jax.ShapeDtypeStruct((d,), dtype)
    p_ex = jax.ShapeDtypeStruct((p_size,), dtype)
    pn = [f"p_{r}" for r in range(p_size)]

    def fvec(t, y, p):
        return (jnp.asarray(f_flat(t, y, p), dtype),)

    def vjp(t, y, p, ct):
        _, back = jax.vjp(lambda t, y, p: jnp.asarray(f_flat(t, y, p), dtype), t, y, p)
        return back(ct)

    def obj(names):
        return np.array(names, dtype=object)

    def rhs(t: str, ys: list[str], outs: list[str]) -> str:
        lines, (out,) = translate(fvec, [t_ex, y_ex, p_ex],
                                  [obj(t), obj(ys), obj(pn).reshape(p_size)])
        return _block(lines, [(outs, out)])

    def rhs_vjp(t, ys, ct, out_t, out_y, out_p) -> str:
        lines, (ct_t, ct_y, ct_p) = translate(
            vjp, [t_ex, y_ex, p_ex, y_ex],
            [obj(t), obj(ys), obj(pn).reshape(p_size), obj(ct)])
        return _block(lines, [([out_t], ct_t), (out_y, ct_y), (out_p, ct_p)])

    a, b, e, c = (np.asarray(x, dtype=np.float64) for x in (solver.a, solver.b, solver.b_error, solver.c))
    s = len(b)
    fsal = bool(solver.fsal)
    # Stages the new state depends on; with FSAL y1 is the last stage's argument.
    b_eff = a[s - 1] if fsal else b
    s_used = s - 1 if fsal else s
    R = range(d)

    def decl(names):
        return "real " + ", ".join(names) + ";"

    def kn(i):
        return [f"k{i}_{r}" for r in R]

    def yn(i):
        return [f"Y{i}_{r}" for r in R]

    common = [
        "const real h = H[j], ta = TA[j];",
        *[f"const real y_{r} = YB[{r} * LANES + j];" for r in R],
        *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(p_size)],
    ]

    # -- forward: one whole step of one lane -----------------------------------------------
    fw = list(common) + ["const real rtol = RT[j], atol = AT[j];"]
    fw += [decl(kn(i)) for i in range(s)]
    if fsal:
        fw += [f"k0_{r} = K0[{r} * LANES + j];" for r in R]
    else:
        fw.append(rhs("ta", [f"y_{r}" for r in R], kn(0)))
    for i in range(1, s):
        comb = [_comb(a[i], [f"k{m}_{r}" for m in range(i)]) for r in R]
        fw += [f"const real Y{i}_{r} = y_{r} + h * {comb[r]};" if comb[r] else
               f"const real Y{i}_{r} = y_{r};" for r in R]
        fw.append(f"const real T{i} = ta + (real){float(c[i])!r} * h;")
        fw.append(rhs(f"T{i}", yn(i), kn(i)))
    for r in R:
        if fsal:
            fw.append(f"const real y1_{r} = Y{s - 1}_{r};")
        else:
            fw.append(f"const real y1_{r} = y_{r} + h * {_comb(b, [f'k{m}_{r}' for m in range(s)])};")
        ec = _comb(e, [f"k{m}_{r}" for m in range(s)]) or "(real)0"
        fw.append(f"const real e_{r} = h * {ec};")
    fw.append("real acc = 0, bad = 0;")
    for r in R:
        fw.append(f"{{ const real sc = atol + rtol * rmax(std::abs(y_{r}), std::abs(y1_{r}));"
                  f" const real q = e_{r} / sc; acc += q * q; bad += y1_{r} - y1_{r}; }}")
    fw.append(f"real err = std::sqrt(acc / (real){d});")
    fw.append("bad += err - err;")
    fw.append("err = (bad == 0) ? err : (real)INFINITY;")
    fw.append("const bool act = ACT[j] != 0;")
    fw.append("EMAX[j] = act ? rmax(EMAX[j], err) : EMAX[j];")
    fw += [f"YB[{r} * LANES + j] = act ? y1_{r} : y_{r};" for r in R]
    if fsal:
        fw += [f"K0[{r} * LANES + j] = act ? k{s - 1}_{r} : k0_{r};" for r in R]
    forward_step = "\n      ".join(fw)
    init = [*[f"const real y_{r} = YB[{r} * LANES + j];" for r in R],
            *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(p_size)],
            decl(kn(0)), rhs("ta", [f"y_{r}" for r in R], kn(0)),
            *[f"K0[{r} * LANES + j] = FRESH[j] ? k0_{r} : K0[{r} * LANES + j];" for r in R]]
    fsal_init = "\n      ".join(init)

    # -- reverse: recompute the stages, then the adjoint recursion ------------------------
    bw = list(common)
    bw += [f"const real l_{r} = LAM[{r} * LANES + j];" for r in R]
    bw += [decl(kn(i)) for i in range(s_used)]
    bw.append(rhs("ta", [f"y_{r}" for r in R], kn(0)))
    bw += [f"const real Y0_{r} = y_{r};" for r in R]
    bw.append("const real T0 = ta;")
    for i in range(1, s_used):
        for r in R:
            comb = _comb(a[i], [f"k{m}_{r}" for m in range(i)]) or "(real)0"
            bw.append(f"const real cb{i}_{r} = {comb};")
            bw.append(f"const real Y{i}_{r} = y_{r} + h * cb{i}_{r};")
        bw.append(f"const real T{i} = ta + (real){float(c[i])!r} * h;")
        bw.append(rhs(f"T{i}", yn(i), kn(i)))
    for i in range(s_used - 1, -1, -1):
        for r in R:
            terms = []
            if b_eff[i] != 0.0:
                terms.append(f"(real){float(b_eff[i])!r} * l_{r}")
            for m in range(i + 1, s_used):
                if a[m, i] != 0.0:
                    terms.append(f"(real){float(a[m, i])!r} * mu{m}_{r}")
            bw.append(f"const real kap{i}_{r} = h * ({' + '.join(terms) if terms else '(real)0'});")
        bw.append(decl([f"mu{i}_{r}" for r in R] + [f"ctt{i}"]
                       + [f"pi{i}_{r}" for r in range(p_size)]))
        bw.append(rhs_vjp(f"T{i}", yn(i), [f"kap{i}_{r}" for r in R], f"ctt{i}",
                          [f"mu{i}_{r}" for r in R], [f"pi{i}_{r}" for r in range(p_size)]))
    bw.append("const bool act = ACT[j] != 0;")
    for r in range(p_size):
        tot = " + ".join(f"pi{i}_{r}" for i in range(s_used))
        bw.append(f"CTP[{r} * LANES + j] += act ? ({tot}) : (real)0;")
    ch = []
    for r in R:
        bs = _comb(b_eff, [f"k{m}_{r}" for m in range(s_used)]) or "(real)0"
        ch.append(f"({bs}) * l_{r}")
        ch += [f"cb{i}_{r} * mu{i}_{r}" for i in range(1, s_used)]
    ch += [f"(real){float(c[i])!r} * ctt{i}" for i in range(1, s_used) if c[i] != 0.0]
    bw.append(f"const real ch = {' + '.join(ch)};")
    bw.append(f"const real ctt = {' + '.join(f'ctt{i}' for i in range(s_used))};")
    bw.append("CH[j] = act ? ch : (real)0;")
    bw.append("CT[j] = act ? ctt - ch : (real)0;")
    for r in R:
        dl = " + ".join(f"mu{i}_{r}" for i in range(s_used))
        bw.append(f"LAM[{r} * LANES + j] = act ? l_{r} + ({dl}) : l_{r};")
    backward_step = "\n      ".join(bw)

    return _TEMPLATE.format(
        real=real, ffi_type="F64" if real == "double" else "F32", D=d, P=max(p_size, 1),
        S=s, LANES=LANES, FSAL=int(fsal), forward_step=forward_step, fsal_init=fsal_init,
        backward_step=backward_step, P_REAL=p_size,
    )


_TEMPLATE = r"""
// Generated by gradsolve._kernel.source: do not edit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
typedef {real} real;
#define D {D}
#define P {P}
#define P_REAL {P_REAL}
#define S {S}
#define LANES {LANES}
#define FSAL {FSAL}

namespace {{

struct Problem {{
  int64_t n, s1, k;
  const real* times; const int32_t* n_eff; const real* p; const int32_t* save;
  std::vector<int64_t> order;
}};

void sort_by_length(Problem& pr) {{
  pr.order.resize(pr.n);
  std::iota(pr.order.begin(), pr.order.end(), 0);
  std::stable_sort(pr.order.begin(), pr.order.end(),
                   [&](int64_t a, int64_t b) {{ return pr.n_eff[a] < pr.n_eff[b]; }});
}}

// Work is split over threads by striding through the length-sorted order (longest
// first), so every thread gets a similar mix; GRADSOLVE_KERNEL_THREADS caps the count.
template <typename Fn>
void for_threads(int64_t n, Fn fn) {{
  int64_t hw = std::thread::hardware_concurrency();
  if (const char* env = std::getenv("GRADSOLVE_KERNEL_THREADS")) hw = std::atoi(env);
  int64_t threads = std::min<int64_t>(hw > 0 ? hw : 1, n / (16 * LANES));
  if (threads <= 1) {{ fn(0, 1); return; }}
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < threads; ++w) pool.emplace_back([&, w] {{ fn(w, threads); }});
  for (auto& th : pool) th.join();
}}

static inline real rmax(real a, real b) {{ return (a > b || a != a) ? a : b; }}

// Lanes are refilled as their trajectory finishes, so a ragged ensemble costs the sum
// of its step counts plus at most LANES - 1 idle lanes at the tail of each thread.
struct Queue {{
  const Problem& pr; int64_t next, stride;
  int64_t pop() {{
    if (next >= pr.n) return -1;
    int64_t t = pr.order[pr.n - 1 - next];  // longest first
    next += stride;
    return t;
  }}
}};

void forward_thread(const Problem& pr, int64_t w, int64_t threads, const real* y0,
                    const real* tol, real* ys, real* y1out, real* errout, real* states,
                    int32_t* cost) {{
  Queue queue{{pr, w, threads}};
  alignas(64) real YB[D * LANES] = {{0}}, K0[D * LANES] = {{0}}, PB[P * LANES] = {{0}};
  alignas(64) real H[LANES] = {{0}}, TA[LANES] = {{0}}, EMAX[LANES] = {{0}}, RT[LANES] = {{0}}, AT[LANES] = {{0}};
  alignas(64) int ACT[LANES] = {{0}}, FRESH[LANES] = {{0}};
  int64_t traj[LANES]; int32_t kk[LANES] = {{0}}, N[LANES] = {{0}};
  int64_t idle = 0, last = -1;
  auto load = [&](int j) {{
    const int64_t t = queue.pop();
    traj[j] = t;
    if (t < 0) return;
    kk[j] = 0; N[j] = pr.n_eff[t]; FRESH[j] = 1;
    for (int r = 0; r < D; ++r) {{ YB[r * LANES + j] = y0[t * D + r]; states[t * pr.s1 * D + r] = y0[t * D + r]; }}
    for (int r = 0; r < P_REAL; ++r) PB[r * LANES + j] = pr.p[t * P_REAL + r];
    TA[j] = pr.times[t * pr.s1];
    EMAX[j] = 0; RT[j] = tol[t * 2]; AT[j] = tol[t * 2 + 1];
  }};
  auto finish = [&](int j) {{
    const int64_t t = traj[j];
    for (int r = 0; r < D; ++r) y1out[t * D + r] = YB[r * LANES + j];
    errout[t] = EMAX[j];
    cost[t] = N[j];
    last = t;
    for (int64_t m = 0; m < pr.k; ++m) {{
      int64_t node = std::min<int64_t>(std::max<int32_t>(pr.save[t * pr.k + m], 0), N[j]);
      for (int r = 0; r < D; ++r) ys[(t * pr.k + m) * D + r] = states[(t * pr.s1 + node) * D + r];
    }}
  }};
  for (int j = 0; j < LANES; ++j) load(j);
  for (;;) {{
    int busy = 0, fresh = 0;
    for (int j = 0; j < LANES; ++j) {{
      while (traj[j] >= 0 && kk[j] >= N[j]) {{ finish(j); load(j); }}
      busy += traj[j] >= 0;
      fresh += traj[j] >= 0 && FRESH[j];
    }}
    if (!busy) break;
    if (FSAL && fresh) {{
      // First stage f(t0, y0) of newly loaded trajectories: the carried FSAL stage.
      #pragma omp simd
      for (int j = 0; j < LANES; ++j) {{
        const real ta = TA[j];
        {fsal_init}
      }}
    }}
    for (int j = 0; j < LANES; ++j) {{
      FRESH[j] = 0;
      ACT[j] = traj[j] >= 0;
      idle += !ACT[j];
      if (!ACT[j]) {{ H[j] = 0; continue; }}
      const real* tr = pr.times + traj[j] * pr.s1;
      TA[j] = tr[kk[j]];
      H[j] = tr[kk[j] + 1] - tr[kk[j]];
    }}
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {{
      {forward_step}
    }}
    for (int j = 0; j < LANES; ++j) {{
      if (!ACT[j]) continue;
      ++kk[j];
      for (int r = 0; r < D; ++r) states[(traj[j] * pr.s1 + kk[j]) * D + r] = YB[r * LANES + j];
    }}
  }}
  if (last >= 0) cost[last] += (int32_t)idle;
}}

void backward_thread(const Problem& pr, int64_t w, int64_t threads, const real* states,
                     const real* ct_ys, const real* ct_y1, real* ct_times, real* ct_y0,
                     real* ct_p) {{
  Queue queue{{pr, w, threads}};
  alignas(64) real YB[D * LANES] = {{0}}, LAM[D * LANES] = {{0}}, CTP[P * LANES] = {{0}}, PB[P * LANES] = {{0}};
  alignas(64) real H[LANES] = {{0}}, TA[LANES] = {{0}}, CH[LANES] = {{0}}, CT[LANES] = {{0}};
  alignas(64) int ACT[LANES] = {{0}};
  int64_t traj[LANES], ptr[LANES]; int32_t kk[LANES] = {{0}}, N[LANES] = {{0}};
  auto node_of = [&](int j, int64_t m) -> int64_t {{
    return std::min<int64_t>(std::max<int32_t>(pr.save[traj[j] * pr.k + m], 0), N[j]);
  }};
  auto add_saves = [&](int j, int64_t node) {{
    const int64_t t = traj[j];
    while (ptr[j] >= 0 && node_of(j, ptr[j]) >= node) {{
      for (int r = 0; r < D; ++r) LAM[r * LANES + j] += ct_ys[(t * pr.k + ptr[j]) * D + r];
      --ptr[j];
    }}
  }};
  auto load = [&](int j) {{
    const int64_t t = queue.pop();
    traj[j] = t;
    if (t < 0) return;
    N[j] = pr.n_eff[t]; kk[j] = N[j] - 1; ptr[j] = pr.k - 1;
    for (int r = 0; r < D; ++r) LAM[r * LANES + j] = ct_y1[t * D + r];
    for (int r = 0; r < P_REAL; ++r) {{ PB[r * LANES + j] = pr.p[t * P_REAL + r]; CTP[r * LANES + j] = 0; }}
    std::memset(ct_times + t * pr.s1, 0, sizeof(real) * pr.s1);
    add_saves(j, N[j]);
  }};
  auto finish = [&](int j) {{
    const int64_t t = traj[j];
    for (int r = 0; r < D; ++r) ct_y0[t * D + r] = LAM[r * LANES + j];
    for (int r = 0; r < P_REAL; ++r) ct_p[t * P_REAL + r] = CTP[r * LANES + j];
  }};
  for (int j = 0; j < LANES; ++j) load(j);
  for (;;) {{
    int busy = 0;
    for (int j = 0; j < LANES; ++j) {{
      while (traj[j] >= 0 && kk[j] < 0) {{ finish(j); load(j); }}
      ACT[j] = traj[j] >= 0;
      busy += ACT[j];
      if (!ACT[j]) {{ H[j] = 0; continue; }}
      const real* tr = pr.times + traj[j] * pr.s1;
      TA[j] = tr[kk[j]];
      H[j] = tr[kk[j] + 1] - tr[kk[j]];
      for (int r = 0; r < D; ++r) YB[r * LANES + j] = states[(traj[j] * pr.s1 + kk[j]) * D + r];
    }}
    if (!busy) break;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {{
      {backward_step}
    }}
    for (int j = 0; j < LANES; ++j) {{
      if (!ACT[j]) continue;
      real* ct = ct_times + traj[j] * pr.s1;
      ct[kk[j]] += CT[j];
      ct[kk[j] + 1] += CH[j];
      add_saves(j, kk[j]);
      --kk[j];
    }}
  }}
}}

}}  // namespace
static ffi::Error FwdImpl(ffi::Buffer<ffi::{ffi_type}> times, ffi::Buffer<ffi::S32> n_eff,
                          ffi::Buffer<ffi::{ffi_type}> y0, ffi::Buffer<ffi::{ffi_type}> p,
                          ffi::Buffer<ffi::S32> save, ffi::Buffer<ffi::{ffi_type}> tol,
                          ffi::ResultBuffer<ffi::{ffi_type}> ys, ffi::ResultBuffer<ffi::{ffi_type}> y1,
                          ffi::ResultBuffer<ffi::{ffi_type}> err,
                          ffi::ResultBuffer<ffi::{ffi_type}> states,
                          ffi::ResultBuffer<ffi::S32> cost) {{
  Problem pr;
  pr.n = n_eff.element_count();
  if (pr.n == 0) return ffi::Error::Success();
  pr.s1 = times.element_count() / pr.n;
  pr.k = save.element_count() / pr.n;
  pr.times = times.typed_data(); pr.n_eff = n_eff.typed_data(); pr.p = p.typed_data();
  pr.save = save.typed_data();
  sort_by_length(pr);
  for_threads(pr.n, [&](int64_t w, int64_t threads) {{
    forward_thread(pr, w, threads, y0.typed_data(), tol.typed_data(), ys->typed_data(),
                   y1->typed_data(), err->typed_data(), states->typed_data(), cost->typed_data());
  }});
  return ffi::Error::Success();
}}

static ffi::Error BwdImpl(ffi::Buffer<ffi::{ffi_type}> times, ffi::Buffer<ffi::S32> n_eff,
                          ffi::Buffer<ffi::{ffi_type}> p, ffi::Buffer<ffi::S32> save,
                          ffi::Buffer<ffi::{ffi_type}> states, ffi::Buffer<ffi::{ffi_type}> ct_ys,
                          ffi::Buffer<ffi::{ffi_type}> ct_y1,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_times,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_y0,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_p) {{
  Problem pr;
  pr.n = n_eff.element_count();
  if (pr.n == 0) return ffi::Error::Success();
  pr.s1 = times.element_count() / pr.n;
  pr.k = save.element_count() / pr.n;
  pr.times = times.typed_data(); pr.n_eff = n_eff.typed_data(); pr.p = p.typed_data();
  pr.save = save.typed_data();
  sort_by_length(pr);
  for_threads(pr.n, [&](int64_t w, int64_t threads) {{
    backward_thread(pr, w, threads, states.typed_data(), ct_ys.typed_data(), ct_y1.typed_data(),
                    ct_times->typed_data(), ct_y0->typed_data(), ct_p->typed_data());
  }});
  return ffi::Error::Success();
}}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Fwd, FwdImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(Bwd, BwdImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>());
"""
