"""C++ source of the compiled kernel for one (vector field, explicit RK tableau, dtype).

``LANES`` trajectories advance together, one step per iteration: a lane's whole step is
straight-line code inside an ``omp simd`` loop over lanes (vectorised by the compiler), so
no stage leaves registers, and a lane whose trajectory ends is refilled from a queue
(longest first), so ragged ensembles cost the sum of their steps. Three XLA FFI handlers:

- ``Fwd``: the replay. Stores the state at every mesh node for the reverse sweep
  (``n * (S+1) * d`` numbers). Known-time events: after the step into a jump's node the
  state jumps (the stored node state is the one before, what a save there reads), and
  after a jump or tstop node the carried first stage is recomputed at the node, as the
  record does (`gradsolve._events`).
- ``Bwd``: the exact discrete adjoint of the same steps. Per step (last to first) it
  recomputes the stages from the stored state and runs the Runge–Kutta adjoint recursion
  (Hairer, Lubich & Wanner, *Geometric Numerical Integration*, VI.4; Sandu, "On the
  properties of Runge–Kutta discrete adjoints", 2006):

      kappa_i = h b_i lambda + h sum_{j>i} a_ji mu_j,
      (mu_i, pi_i, tau_i) = (d f / d(y, p, t))(T_i, Y_i)^T kappa_i,
      lambda <- lambda + sum_i mu_i,  grad_p += sum_i pi_i,

  plus the cotangents of the two node times through ``h`` and the stage times (only in
  the ``GS_PART_BWDT`` build). A step out of a jump's node starts from the stored state
  plus the jump (the forward's sum, bitwise), and the jump size's cotangent is
  ``lambda`` there, before the saves at the node add theirs. With FSAL the
  carried first stage is ``f(t_k, y_k)`` recomputed, the same function of ``y_k``.
- ``Rec``: the adaptive record, with `gradsolve._controller`'s initial step and controller
  written per lane. Mesh slots past a trajectory's ``n_steps`` are written only when the
  ``fill`` attribute asks: under ``jit`` the buffer has ``max_steps`` slots per trajectory,
  and filling it would make the record's cost (first-touch page faults of a fresh buffer)
  grow with ``max_steps`` rather than with the steps taken.

Each handler is compiled as its own shared library from this one source, selected by a
macro (``GS_PART_FWD``, ``GS_PART_BWD``, ``GS_PART_BWDT``, ``GS_PART_REC``): the builds run
in parallel, and ``GS_PART_BWDT`` (``Bwd`` with node-time cotangents, for ``ts`` given to
the replay) is built only when first needed. See `gradsolve.drivers.kernel.build`.

The vector field and its VJP come from `gradsolve.drivers.kernel.codegen`.
"""

from __future__ import annotations

import numpy as np

from .codegen import translate

LANES = 8

# libm functions with SIMD variants in glibc's libmvec (>= 2.35; sin, cos, exp, log, pow
# since 2.22), one and two arguments, double and float.
_UNARY = ("sin", "cos", "tan", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
          "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "cbrt",
          "erf", "erfc")
_BINARY = ("pow", "atan2")
_VECTOR_MATH_DECLS = "\n".join(
    f"#pragma omp declare simd notinbranch\n"
    f"{t} {name}{suffix}({', '.join([t] * arity)}) noexcept __attribute__((const));"
    for names, arity in ((_UNARY, 1), (_BINARY, 2))
    for name in names
    for t, suffix in (("double", ""), ("float", "f"))
)


# Elementwise functions without a libm counterpart, emitted by
# `gradsolve.drivers.kernel.codegen` (plain C++ on a ``real`` typedef; also compiled alone
# by the tests against scipy).
SPECIAL_FUNCTIONS = r"""// Elementwise functions without a libm counterpart (gradsolve.drivers.kernel.codegen).
// gs_total_key: an integer ordered as XLA's total order of floats (-NaN < -inf < ... <
// -0 < +0 < ... < inf < NaN), for lt_to / le_to / eq_to.
static inline int64_t gs_total_key(double x) {
  int64_t b; std::memcpy(&b, &x, sizeof b);
  return b < 0 ? b ^ std::numeric_limits<int64_t>::max() : b;
}
static inline int32_t gs_total_key(float x) {
  int32_t b; std::memcpy(&b, &x, sizeof b);
  return b < 0 ? b ^ std::numeric_limits<int32_t>::max() : b;
}
static inline long long gs_total_key(long long x) { return x; }
static inline int gs_total_key(int x) { return x; }

// digamma: reflection to x > 0 (psi(x) = psi(1 - x) - pi / tan(pi x), NaN at the poles
// x = 0, -1, ... as in XLA), the recurrence psi(x) = psi(x + 1) - 1 / x up to x >= 10,
// then the asymptotic series (its next term is below 1e-16 there).
static inline real gs_digamma(real x) {
  const real pi = (real)3.141592653589793238462643383279502884;
  real shift = 0;
  if (x <= 0) {
    if (x == std::floor(x)) return (real)NAN;
    shift = -pi / std::tan(pi * (x - std::round(x)));  // tan has period pi; |arg| <= pi/2
    x = 1 - x;
  }
  for (int i = 0; i < 10; ++i) {
    const bool small = x < 10;
    shift -= small ? 1 / x : (real)0;
    x += small ? (real)1 : (real)0;
  }
  const real r = 1 / (x * x);
  const real series = r * ((real)1 / 12 - r * ((real)1 / 120 - r * ((real)1 / 252 - r * (
      (real)1 / 240 - r * ((real)1 / 132 - r * ((real)691 / 32760 - r * ((real)1 / 12)))))));
  return shift + std::log(x) - (real)0.5 / x - series;
}

// erfinv: Giles' single-precision approximation ("Approximating the erfinv function",
// GPU Computing Gems, 2011) refined by Halley steps: on erf (|x| <= 0.5), else on
// log(erfc(y) / (1 - |x|)) (1 - |x| exact; nearly quadratic in y, so the steps converge
// from the rougher start near |x| = 1, and erfc keeps the tail's relative accuracy).
static inline real gs_erfinv(real x) {
  const real a = std::abs(x);
  if (!(a < 1)) return a == 1 ? x * (real)INFINITY : (real)NAN;
  real w = -std::log((1 - a) * (1 + a)), p;
  if (w < 5) {
    w -= (real)2.5;
    p = (real)2.81022636e-08;
    p = (real)3.43273939e-07 + p * w; p = (real)-3.5233877e-06 + p * w;
    p = (real)-4.39150654e-06 + p * w; p = (real)0.00021858087 + p * w;
    p = (real)-0.00125372503 + p * w; p = (real)-0.00417768164 + p * w;
    p = (real)0.246640727 + p * w; p = (real)1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3;
    p = (real)-0.000200214257;
    p = (real)0.000100950558 + p * w; p = (real)0.00134934322 + p * w;
    p = (real)-0.00367342844 + p * w; p = (real)0.00573950773 + p * w;
    p = (real)-0.0076224613 + p * w; p = (real)0.00943887047 + p * w;
    p = (real)1.00167406 + p * w; p = (real)2.83297682 + p * w;
  }
  real y = p * a;
  const real c = (real)1.128379167095512573896158903121545172;  // 2 / sqrt(pi)
  if (a <= (real)0.5) {
    for (int i = 0; i < 2; ++i) {  // f = erf(y) - a: f' = c exp(-y^2), f'' = -2 y f'
      const real f = std::erf(y) - a;
      y -= f / (c * std::exp(-y * y) + y * f);
    }
  } else {
    const real q = 1 - a;
    for (int i = 0; i < 3; ++i) {  // g = log(erfc(y) / q): g'' = -2 y g' - g'^2
      const real e = std::erfc(y), g = std::log(e / q), dg = -c * std::exp(-y * y) / e;
      y -= 2 * g / (2 * dg + g * (2 * y + dg));
    }
  }
  return x < 0 ? -y : y;
}
"""


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


class _Source:
    """The C++ statements of one explicit Runge–Kutta step of one lane, forward and
    reverse, for the flattened vector field ``f_flat(t, y (d,), p (p_size,))`` and the
    solver's tableau (the stages' names: ``k{i}_{r}``, ``Y{i}_{r}``, ``T{i}``)."""

    def __init__(self, f_flat, d: int, p_size: int, dtype, solver):
        import jax
        import jax.numpy as jnp

        self.d, self.p_size, self.dtype = d, p_size, dtype
        self.ex = (jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((d,), dtype),
                   jax.ShapeDtypeStruct((p_size,), dtype))
        self.pn = [f"p_{r}" for r in range(p_size)]
        self.fvec = lambda t, y, p: (jnp.asarray(f_flat(t, y, p), dtype),)

        def vjp(t, y, p, ct):
            _, back = jax.vjp(lambda t, y, p: jnp.asarray(f_flat(t, y, p), dtype), t, y, p)
            return back(ct)

        self.vjp = vjp
        self.a, self.b, self.e, self.c = (np.asarray(x, dtype=np.float64) for x in (
            solver.a, solver.b, solver.b_error, solver.c))
        self.s = len(self.b)
        self.fsal = bool(solver.fsal)
        # Stages the new state depends on; with FSAL y1 is the last stage's argument.
        self.b_eff = self.a[self.s - 1] if self.fsal else self.b
        self.s_used = self.s - 1 if self.fsal else self.s
        self.R = range(d)
        self.common = [
            "const real h = H[j], ta = TA[j];",
            *[f"const real y_{r} = YB[{r} * LANES + j];" for r in self.R],
            *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(p_size)],
        ]

    def rhs(self, t: str, ys: list[str], outs: list[str]) -> str:
        t_ex, y_ex, p_ex = self.ex
        lines, (out,) = translate(self.fvec, [t_ex, y_ex, p_ex],
                                  [_obj(t), _obj(ys), _obj(self.pn).reshape(self.p_size)])
        return _block(lines, [(outs, out)])

    def rhs_vjp(self, t, ys, ct, out_t, out_y, out_p) -> str:
        t_ex, y_ex, p_ex = self.ex
        lines, (ct_t, ct_y, ct_p) = translate(
            self.vjp, [t_ex, y_ex, p_ex, y_ex],
            [_obj(t), _obj(ys), _obj(self.pn).reshape(self.p_size), _obj(ct)])
        return _block(lines, [([out_t], ct_t), (out_y, ct_y), (out_p, ct_p)])

    def kn(self, i):
        return [f"k{i}_{r}" for r in self.R]

    def yn(self, i):
        return [f"Y{i}_{r}" for r in self.R]

    def stages(self, upto):
        """Stages 1..upto-1 from ``k0``: ``cb{i}`` (their combination), ``Y{i}``, ``T{i}``, ``k{i}``."""
        out = []
        for i in range(1, upto):
            for r in self.R:
                comb = _comb(self.a[i], [f"k{m}_{r}" for m in range(i)]) or "(real)0"
                out.append(f"const real cb{i}_{r} = {comb};")
                out.append(f"const real Y{i}_{r} = y_{r} + h * cb{i}_{r};")
            out.append(f"const real T{i} = ta + (real){float(self.c[i])!r} * h;")
            out.append(self.rhs(f"T{i}", self.yn(i), self.kn(i)))
        return out

    def forward(self) -> tuple[str, str, str]:
        """``(forward_step, record_step, rhs_eval)``: a replay step (``YB`` advanced where
        ``ACT``), a record step (``Y1``, ``ERR`` for the controller) and ``f`` at
        ``(TQ, YQ)`` for the lanes flagged in ``FRESH``."""
        R, s, d, b, e, fsal = self.R, self.s, self.d, self.b, self.e, self.fsal
        fw = list(self.common) + ["const real rtol = RT[j], atol = AT[j];"]
        fw += [_decl(self.kn(i)) for i in range(s)]
        if fsal:
            fw += [f"k0_{r} = K0[{r} * LANES + j];" for r in R]
        else:
            fw.append(self.rhs("ta", [f"y_{r}" for r in R], self.kn(0)))
        fw += self.stages(s)
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
        # The record keeps y1, err and the last stage for its controller.
        rec = fw + [f"Y1[{r} * LANES + j] = y1_{r};" for r in R] + ["ERR[j] = err;"]
        if fsal:
            rec += [f"KL[{r} * LANES + j] = k{s - 1}_{r};" for r in R]
        fw.append("const bool act = ACT[j] != 0;")
        fw.append("EMAX[j] = act ? rmax(EMAX[j], err) : EMAX[j];")
        fw += [f"YB[{r} * LANES + j] = act ? y1_{r} : y_{r};" for r in R]
        if fsal:
            fw += [f"K0[{r} * LANES + j] = act ? k{s - 1}_{r} : k0_{r};" for r in R]
        ev = [*[f"const real y_{r} = YQ[{r} * LANES + j];" for r in R],
              *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(self.p_size)],
              "const real ta = TQ[j];",
              _decl(self.kn(0)), self.rhs("ta", [f"y_{r}" for r in R], self.kn(0)),
              *[f"FQ[{r} * LANES + j] = FRESH[j] ? k0_{r} : FQ[{r} * LANES + j];" for r in R]]
        return "\n      ".join(fw), "\n      ".join(rec), "\n      ".join(ev)

    def backward(self) -> str:
        """The reverse step: recompute the stages, then the adjoint recursion (``LAM``,
        ``CTP`` and, under ``TIMES``, the node-time cotangents ``CH``, ``CT``)."""
        R, p_size, s_used, a, b_eff, c = (self.R, self.p_size, self.s_used, self.a,
                                          self.b_eff, self.c)
        bw = list(self.common)
        bw += [f"const real l_{r} = LAM[{r} * LANES + j];" for r in R]
        bw += [_decl(self.kn(i)) for i in range(s_used)]
        bw.append(self.rhs("ta", [f"y_{r}" for r in R], self.kn(0)))
        bw += [f"const real Y0_{r} = y_{r};" for r in R]
        bw.append("const real T0 = ta;")
        bw += self.stages(s_used)
        for i in range(s_used - 1, -1, -1):
            for r in R:
                terms = []
                if b_eff[i] != 0.0:
                    terms.append(f"(real){float(b_eff[i])!r} * l_{r}")
                for m in range(i + 1, s_used):
                    if a[m, i] != 0.0:
                        terms.append(f"(real){float(a[m, i])!r} * mu{m}_{r}")
                bw.append(f"const real kap{i}_{r} = h * ({' + '.join(terms) if terms else '(real)0'});")
            bw.append(_decl([f"mu{i}_{r}" for r in R] + [f"ctt{i}"]
                            + [f"pi{i}_{r}" for r in range(p_size)]))
            bw.append(self.rhs_vjp(f"T{i}", self.yn(i), [f"kap{i}_{r}" for r in R], f"ctt{i}",
                                   [f"mu{i}_{r}" for r in R], [f"pi{i}_{r}" for r in range(p_size)]))
        # No `ACT` selects here: an idle lane's accumulators are never read again (its last
        # trajectory was finished before it went idle), and selects let the compiler sink the
        # stage VJPs into branches, which stops vectorisation once they call libm.
        for r in range(p_size):
            tot = " + ".join(f"pi{i}_{r}" for i in range(s_used))
            bw.append(f"CTP[{r} * LANES + j] += {tot};")
        # Node-time cotangents: needed only where a save time moved a node (``subst``); the
        # kernel instantiates the sweep with and without them (``TIMES``).
        bw.append("if constexpr (TIMES) {")
        ch = []
        for r in R:
            bs = _comb(b_eff, [f"k{m}_{r}" for m in range(s_used)]) or "(real)0"
            ch.append(f"({bs}) * l_{r}")
            ch += [f"cb{i}_{r} * mu{i}_{r}" for i in range(1, s_used)]
        ch += [f"(real){float(c[i])!r} * ctt{i}" for i in range(1, s_used) if c[i] != 0.0]
        bw.append(f"const real ch = {' + '.join(ch)};")
        bw.append(f"const real ctt = {' + '.join(f'ctt{i}' for i in range(s_used))};")
        bw.append("CH[j] = ch;")
        bw.append("CT[j] = ctt - ch;")
        bw.append("}")
        for r in R:
            dl = " + ".join(f"mu{i}_{r}" for i in range(s_used))
            bw.append(f"LAM[{r} * LANES + j] = l_{r} + ({dl});")
        return "\n      ".join(bw)


def _obj(names):
    return np.array(names, dtype=object)


def _decl(names):
    return "real " + ", ".join(names) + ";"


def generate(f_flat, d: int, p_size: int, dtype, solver) -> str:
    """Full C++ source. ``f_flat(t, y (d,), p (p_size,))`` is the flattened vector field."""
    real = "double" if np.dtype(dtype) == np.float64 else "float"
    src = _Source(f_flat, d, p_size, dtype, solver)
    forward_step, record_step, rhs_eval = src.forward()
    return _TEMPLATE.format(
        real=real, ffi_type="F64" if real == "double" else "F32", D=d, P=max(p_size, 1),
        S=src.s, LANES=LANES, FSAL=int(src.fsal), forward_step=forward_step,
        rhs_eval=rhs_eval, record_step=record_step, ERROR_ORDER=int(solver.error_order),
        backward_step=src.backward(), P_REAL=p_size, vector_math=_VECTOR_MATH_DECLS,
        special_functions=SPECIAL_FUNCTIONS,
    )


_TEMPLATE = r"""
// Generated by gradsolve.drivers.kernel.source: do not edit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>
#ifdef __linux__
#include <sched.h>
#endif
#include "xla/ffi/api/ffi.h"
#ifdef GRADSOLVE_VECTOR_MATH
// SIMD variants of libm (glibc's libmvec, <= 4 ulp): without them one transcendental call
// in a lane's step turns the whole `omp simd` loop into scalar code (Pendulum's sin cost 5x
// a polynomial field of the same size). glibc declares these only under -ffast-math, which
// the kernel avoids to keep IEEE semantics; build.py falls back to scalar libm when the
// library is missing.
extern "C" {{
{vector_math}
}}
#endif

namespace ffi = xla::ffi;
typedef {real} real;
#define D {D}
#define P {P}
#define P_REAL {P_REAL}
#define S {S}
#define PF_STEPS 8
#define LANES {LANES}
#define FSAL {FSAL}
#define ERROR_ORDER {ERROR_ORDER}

namespace {{

struct Problem {{
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
}};

// A cursor over one trajectory's sorted jump (or tstop) nodes. `ahead(node)` visits nodes
// in increasing order (the forward sweep), `behind(node)` in decreasing order (the reverse
// sweep); both return the first slot at `node` or -1, O(1) amortised.
struct EventCursor {{
  const int32_t* row; int64_t len, c;
  void start_up(const int32_t* r, int64_t l) {{ row = r; len = l; c = 0; }}
  void start_down(const int32_t* r, int64_t l) {{
    row = r; len = l; c = l - 1;
    while (c >= 0 && row[c] <= 0) --c;  // padding (node 0) sits at the end
  }}
  int64_t ahead(int64_t node) {{
    while (c < len && row[c] > 0 && row[c] < node) ++c;
    return (c < len && row[c] == node) ? c : -1;
  }}
  int64_t behind(int64_t node) {{
    while (c >= 0 && row[c] > node) --c;
    return (c >= 0 && row[c] == node) ? c : -1;
  }}
}};

// Mesh node times: the recorded ones, except nodes that a save slot with `subst` moves to
// its `tsave` value, and a jump's node and its free landing node, which sit at the jump's
// time. Steps visit nodes monotonically, so cursors over the (sorted) save and jump rows
// find them in O(1) amortised: `up` for the forward sweep, `down` for the reverse.
struct Nodes {{
  const Problem* pr; int64_t t; int64_t c; int64_t jc; bool rising;
  void start_up(int64_t traj) {{ t = traj; c = 0; jc = 0; rising = true; }}
  void start_down(int64_t traj) {{ t = traj; c = pr->k - 1; jc = pr->J - 1; rising = false; }}
  // The jump time of `node` if it is a jump's node or landing node, else `recorded`.
  real jump_time(int64_t node, real recorded) {{
    if (!pr->J) return recorded;
    const int32_t* ji = pr->jidx + t * pr->J; const int32_t* la = pr->land + t * pr->J;
    if (rising) {{
      while (jc < pr->J && ji[jc] < node) ++jc;  // padding (node 0) is passed over
    }} else {{
      while (jc >= 0 && (ji[jc] <= 0 || (la[jc] >= 0 ? la[jc] : ji[jc]) > node)) --jc;
    }}
    const bool hit = jc >= 0 && jc < pr->J && ji[jc] > 0 && (ji[jc] == node || la[jc] == node);
    return hit ? pr->jt[t * pr->J + jc] : recorded;
  }}
  int64_t up(int64_t node) {{  // slot moving `node`, or -1; nodes must not decrease
    const int32_t* row = pr->save + t * pr->k; const int32_t* sub = pr->subst + t * pr->k;
    while (c < pr->k && (!sub[c] || row[c] < node)) ++c;
    return (c < pr->k && row[c] == node) ? c : -1;
  }}
  int64_t down(int64_t node) {{  // the same, nodes must not increase
    const int32_t* row = pr->save + t * pr->k; const int32_t* sub = pr->subst + t * pr->k;
    while (c >= 0 && (!sub[c] || row[c] > node)) --c;
    return (c >= 0 && row[c] == node) ? c : -1;
  }}
  real time(int64_t node, int64_t slot) {{
    return slot >= 0 ? pr->tsave[t * pr->k + slot]
                     : jump_time(node, pr->times[t * pr->s1 + node]);
  }}
}};

void sort_by_length(Problem& pr) {{
  pr.order.resize(pr.n);
  std::iota(pr.order.begin(), pr.order.end(), 0);
  std::stable_sort(pr.order.begin(), pr.order.end(),
                   [&](int64_t a, int64_t b) {{ return pr.n_eff[a] < pr.n_eff[b]; }});
}}

// The CPUs this process may run on: its affinity mask (taskset, a batch scheduler's
// allocation), not the machine's core count.
static int64_t usable_cpus() {{
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return std::thread::hardware_concurrency();
}}

// Work is split over threads by striding through the length-sorted order (longest
// first), so every thread gets a similar mix. `requested` (the driver's `threads`, an FFI
// attribute) caps the count; 0 means the CPUs this process may use, or
// GRADSOLVE_KERNEL_THREADS where that is set.
template <typename Fn>
void for_threads(int64_t n, int64_t requested, Fn fn) {{
  int64_t hw = usable_cpus();
  if (const char* env = std::getenv("GRADSOLVE_KERNEL_THREADS")) hw = std::atoi(env);
  if (requested > 0) hw = requested;
  int64_t threads = std::min<int64_t>(hw > 0 ? hw : 1, n / (16 * LANES));
  if (threads <= 1) {{ fn(0, 1); return; }}
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < threads; ++w) pool.emplace_back([&, w] {{ fn(w, threads); }});
  for (auto& th : pool) th.join();
}}

// Each lane walks its own trajectory's rows of `times` and `states`, so eight interleaved
// streams miss the cache at every new line (the reverse sweep measured ~40 % of its time in
// those loads at n = 10,000); fetch the lines a few steps ahead.
static inline void prefetch_ahead(const Problem& pr, int64_t t, int64_t kk, int64_t n,
                                  const real* states) {{
  const int64_t ahead = std::min<int64_t>(kk + PF_STEPS, n);
  __builtin_prefetch(pr.times + t * pr.s1 + ahead);
  __builtin_prefetch(states + (pr.soff[t] + ahead) * pr.sw, 1);
}}
static inline void prefetch_back(const Problem& pr, int64_t t, int64_t kk, const real* states,
                                 const real* ct_ys, int64_t save_slot) {{
  const int64_t back = std::max<int64_t>(kk - PF_STEPS, 0);
  if (pr.sw == D) __builtin_prefetch(pr.times + t * pr.s1 + back);
  __builtin_prefetch(states + (pr.soff[t] + back) * pr.sw);
  if (save_slot >= 0) __builtin_prefetch(ct_ys + (t * pr.k + save_slot) * D);
}}

static inline real rmax(real a, real b) {{ return (a > b || a != a) ? a : b; }}

{special_functions}
// f(TQ, YQ) into FQ for the lanes flagged in FRESH.
static void eval_rhs(const real* TQ, const real* YQ, const real* PB, const int* FRESH, real* FQ) {{
  #pragma omp simd
  for (int j = 0; j < LANES; ++j) {{
    {rhs_eval}
  }}
}}

// Lanes are refilled as their trajectory finishes, so a ragged ensemble costs the sum
// of its step counts plus at most LANES - 1 idle lanes at the tail of each thread.
struct Queue {{
  const int64_t* order; int64_t n, next, stride;
  int64_t pop() {{
    if (next >= n) return -1;
    int64_t t = order[n - 1 - next];  // from the back: longest first when sorted
    next += stride;
    return t;
  }}
}};

#ifdef GS_PART_FWD
void forward_thread(const Problem& pr, int64_t w, int64_t threads, const real* y0,
                    const real* tol, real* ys, real* y1out, real* errout, real* states,
                    int32_t* cost) {{
  Queue queue{{pr.order.data(), pr.n, w, threads}};
  alignas(64) real YB[D * LANES] = {{0}}, K0[D * LANES] = {{0}}, PB[P * LANES] = {{0}};
  alignas(64) real H[LANES] = {{0}}, TA[LANES] = {{0}}, EMAX[LANES] = {{0}}, RT[LANES] = {{0}}, AT[LANES] = {{0}};
  real TB[LANES] = {{0}};
  alignas(64) int ACT[LANES] = {{0}}, FRESH[LANES] = {{0}};
  int64_t traj[LANES]; int32_t kk[LANES] = {{0}}, N[LANES] = {{0}};
  int64_t idle = 0, last = -1;
  Nodes NODES[LANES];
  EventCursor JUMPS[LANES], STOPS[LANES];
  const bool events = pr.J > 0 || pr.L > 0;
  for (int j = 0; j < LANES; ++j) NODES[j].pr = &pr;
  auto load = [&](int j) {{
    const int64_t t = queue.pop();
    traj[j] = t;
    if (t < 0) return;
    kk[j] = 0; N[j] = pr.n_eff[t]; FRESH[j] = 1;
    JUMPS[j].start_up(pr.jidx + t * pr.J, pr.J);
    STOPS[j].start_up(pr.tidx + t * pr.L, pr.L);
    for (int r = 0; r < D; ++r) {{ YB[r * LANES + j] = y0[t * D + r]; states[pr.soff[t] * pr.sw + r] = y0[t * D + r]; }}
    for (int r = 0; r < P_REAL; ++r) PB[r * LANES + j] = pr.p[t * P_REAL + r];
    NODES[j].start_up(t);
    TA[j] = NODES[j].time(0, NODES[j].up(0));
    if (pr.sw > D) states[pr.soff[t] * pr.sw + D] = TA[j];
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
      for (int r = 0; r < D; ++r) ys[(t * pr.k + m) * D + r] = states[(pr.soff[t] + node) * pr.sw + r];
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
    if (FSAL && fresh) eval_rhs(TA, YB, PB, FRESH, K0);
    for (int j = 0; j < LANES; ++j) {{
      FRESH[j] = 0;
      ACT[j] = traj[j] >= 0;
      idle += !ACT[j];
      if (!ACT[j]) {{ H[j] = 0; continue; }}
      if (pr.plain) {{
        const real* row = pr.times + traj[j] * pr.s1 + kk[j];
        TA[j] = row[0];
        TB[j] = row[1];
      }} else {{
        Nodes& nd = NODES[j];
        TA[j] = nd.time(kk[j], nd.up(kk[j]));
        TB[j] = nd.time(kk[j] + 1, nd.up(kk[j] + 1));
      }}
      H[j] = TB[j] - TA[j];
      prefetch_ahead(pr, traj[j], kk[j], N[j], states);
    }}
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {{
      {forward_step}
    }}
    for (int j = 0; j < LANES; ++j) {{
      if (!ACT[j]) continue;
      ++kk[j];
      real* row = states + (pr.soff[traj[j]] + kk[j]) * pr.sw;
      for (int r = 0; r < D; ++r) row[r] = YB[r * LANES + j];
      if (pr.sw > D) row[D] = TB[j];
      if (events) {{
        // The stored state is the one before the node's jump (what a save there reads);
        // after a jump or a tstop node the carried stage is recomputed at the node, as the
        // record does.
        bool reset = false;
        for (int64_t m = JUMPS[j].ahead(kk[j]); m >= 0 && m < pr.J && pr.jidx[traj[j] * pr.J + m] == kk[j]; ++m) {{
          const real* sz = pr.jsz + (traj[j] * pr.J + m) * D;
          for (int r = 0; r < D; ++r) YB[r * LANES + j] += sz[r];
          reset = true;
        }}
        reset = reset || STOPS[j].ahead(kk[j]) >= 0;
        if (FSAL && reset) {{
          FRESH[j] = 1;
          TA[j] = NODES[j].time(kk[j], NODES[j].up(kk[j]));
        }}
      }}
    }}
  }}
  if (last >= 0) cost[last] += (int32_t)idle;
}}

#endif  // GS_PART_FWD

#if defined(GS_PART_BWD) || defined(GS_PART_BWDT)
// TIMES: some save time moves a node (`subst`), so node times carry cotangents.
template <bool TIMES>
void backward_thread(const Problem& pr, int64_t w, int64_t threads, const real* states,
                     const real* ct_ys, const real* ct_y1, real* ct_tsave, real* ct_y0,
                     real* ct_p, real* ct_jsz) {{
  Queue queue{{pr.order.data(), pr.n, w, threads}};
  alignas(64) real YB[D * LANES] = {{0}}, LAM[D * LANES] = {{0}}, CTP[P * LANES] = {{0}}, PB[P * LANES] = {{0}};
  alignas(64) real H[LANES] = {{0}}, TA[LANES] = {{0}}, CH[LANES] = {{0}}, CT[LANES] = {{0}};
  alignas(64) int ACT[LANES] = {{0}};
  int64_t traj[LANES], ptr[LANES]; int32_t kk[LANES] = {{0}}, N[LANES] = {{0}};
  int64_t M0[LANES], M1[LANES], JS[LANES];
  Nodes NODES[LANES];
  EventCursor JUMPS[LANES];
  for (int j = 0; j < LANES; ++j) NODES[j].pr = &pr;
  // A jump size's cotangent is that of the state after its node: LAM right after the step
  // out of that node is adjoined, before the saves at the node add theirs.
  auto jump_cotangents = [&](int j, int64_t first, int64_t node) {{
    const int64_t t = traj[j];
    for (int64_t m = first; m >= 0 && pr.jidx[t * pr.J + m] == node; --m)
      for (int r = 0; r < D; ++r) ct_jsz[(t * pr.J + m) * D + r] = LAM[r * LANES + j];
  }};
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
    NODES[j].start_down(t);
    for (int r = 0; r < D; ++r) LAM[r * LANES + j] = ct_y1[t * D + r];
    for (int r = 0; r < P_REAL; ++r) {{ PB[r * LANES + j] = pr.p[t * P_REAL + r]; CTP[r * LANES + j] = 0; }}
    std::memset(ct_tsave + t * pr.k, 0, sizeof(real) * pr.k);
    if (pr.J) {{
      std::memset(ct_jsz + t * pr.J * D, 0, sizeof(real) * pr.J * D);
      JUMPS[j].start_down(pr.jidx + t * pr.J, pr.J);
      jump_cotangents(j, JUMPS[j].behind(N[j]), N[j]);  // jumps at the last node
    }}
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
      // The same node times as the forward sweep's (save times and jumps moved): stored
      // beside the states, or found again.
      const real* row = states + (pr.soff[traj[j]] + kk[j]) * pr.sw;
      M0[j] = M1[j] = -1;
      if (pr.sw > D) {{
        TA[j] = row[D];
        H[j] = row[pr.sw + D] - row[D];
        if (TIMES) {{  // the save slots that moved the two nodes, whose times get cotangents
          M1[j] = NODES[j].down(kk[j] + 1);
          M0[j] = NODES[j].down(kk[j]);
        }}
      }} else if (pr.plain) {{
        const real* tr = pr.times + traj[j] * pr.s1 + kk[j];
        TA[j] = tr[0];
        H[j] = tr[1] - tr[0];
      }} else {{
        Nodes& nd = NODES[j];
        M1[j] = nd.down(kk[j] + 1);
        const real tb = nd.time(kk[j] + 1, M1[j]);
        M0[j] = nd.down(kk[j]);
        TA[j] = nd.time(kk[j], M0[j]);
        H[j] = tb - TA[j];
      }}
      for (int r = 0; r < D; ++r) YB[r * LANES + j] = row[r];
      JS[j] = -1;
      if (pr.J) {{
        // The step starts from the state after the node's jump, the same sum as forward.
        JS[j] = JUMPS[j].behind(kk[j]);
        for (int64_t m = JS[j]; m >= 0 && pr.jidx[traj[j] * pr.J + m] == kk[j]; --m) {{
          const real* sz = pr.jsz + (traj[j] * pr.J + m) * D;
          for (int r = 0; r < D; ++r) YB[r * LANES + j] += sz[r];
        }}
      }}
      prefetch_back(pr, traj[j], kk[j], states, ct_ys, ptr[j]);
    }}
    if (!busy) break;
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {{
      {backward_step}
    }}
    for (int j = 0; j < LANES; ++j) {{
      if (!ACT[j]) continue;
      // Node times carry a cotangent only where a save time moved them.
      if (TIMES && M0[j] >= 0) ct_tsave[traj[j] * pr.k + M0[j]] += CT[j];
      if (TIMES && M1[j] >= 0) ct_tsave[traj[j] * pr.k + M1[j]] += CH[j];
      if (JS[j] >= 0) jump_cotangents(j, JS[j], kk[j]);
      add_saves(j, kk[j]);
      --kk[j];
    }}
  }}
}}

#endif  // GS_PART_BWD || GS_PART_BWDT

#ifdef GS_PART_REC
// Adaptive record: the same step, one attempt per lane per iteration, with the controller of
// gradsolve._controller / gradsolve._record written per lane (see there for the rules).
struct RecordIn {{
  int64_t n, k, cap;
  bool fill;  // write the slots past n_steps (repeat the last time) or leave them untouched
  const real *t01, *y0, *p, *ts, *tol, *dt0, *ctrl;
  // Known-time events: J jump times (sorted, +inf padding) and sizes, L tstops per
  // trajectory; J = L = 0 without them.
  int64_t J = 0, L = 0;
  const real *jt = nullptr, *jsz = nullptr, *tst = nullptr;
  std::vector<int64_t> order;
}};

void record_thread(const RecordIn& in, int64_t w, int64_t threads, real* times, int32_t* n_steps,
                   int32_t* n_rej_out, int32_t* status, int32_t* save_index, real* dt_next,
                   real* y_last, int32_t* jump_index, int32_t* tstop_index) {{
  const int64_t attempts_cap = 4 * in.cap + 64;
  const real eps = std::numeric_limits<real>::epsilon();
  alignas(64) real YB[D * LANES] = {{0}}, K0[D * LANES] = {{0}}, PB[P * LANES] = {{0}};
  alignas(64) real Y1[D * LANES] = {{0}}, KL[D * LANES] = {{0}}, YQ[D * LANES] = {{0}}, F1[D * LANES] = {{0}};
  alignas(64) real H[LANES] = {{0}}, TA[LANES] = {{0}}, ERR[LANES] = {{0}}, RT[LANES] = {{0}}, AT[LANES] = {{0}}, TQ[LANES] = {{0}};
  alignas(64) real FAC[LANES] = {{0}};
  alignas(64) int ACT[LANES] = {{0}}, FRESH[LANES] = {{0}};
  int64_t traj[LANES];
  real T[LANES], HS[LANES], EPREV[LANES], T1[LANES], HNEXT[LANES];
  int32_t NA[LANES], NR[LANES], SP[LANES], ST[LANES];
  // Events (the XLA record's rules, gradsolve.drivers.batched): an iteration that finds a
  // jump pending at its time takes no step but adds the jump's node there (ISJ), applies
  // the jump and recomputes the carried stage (RESET), as after landing on a tstop.
  const bool events = in.J > 0 || in.L > 0;
  const real inf = std::numeric_limits<real>::infinity();
  int32_t JP[LANES] = {{0}}, LP[LANES] = {{0}};
  alignas(64) int RESET[LANES] = {{0}};
  bool ISJ[LANES] = {{false}};
  real Y0KEEP[D * LANES];
  bool START_JUMPED[LANES] = {{false}};
  auto next_jump = [&](int j) -> real {{
    return JP[j] < in.J ? in.jt[traj[j] * in.J + JP[j]] : inf;
  }};
  Queue queue{{in.order.data(), in.n, w, threads}};
  const real pco = in.ctrl[0], ico = in.ctrl[1], safety = in.ctrl[2], fmin = in.ctrl[3], fmaxc = in.ctrl[4];
  auto load = [&](int j) {{
    const int64_t t = queue.pop();
    traj[j] = t;
    if (t < 0) return;
    T[j] = in.t01[t * 2]; T1[j] = in.t01[t * 2 + 1];
    for (int r = 0; r < D; ++r) YB[r * LANES + j] = in.y0[t * D + r];
    for (int r = 0; r < P_REAL; ++r) PB[r * LANES + j] = in.p[t * P_REAL + r];
    RT[j] = in.tol[t * 2]; AT[j] = in.tol[t * 2 + 1];
    NA[j] = 0; NR[j] = 0; ST[j] = 0; EPREV[j] = 1; FRESH[j] = 1;
    const real* tsr = in.ts + t * in.k;
    int32_t ptr = 0;
    while (ptr < in.k && tsr[ptr] <= T[j]) ++ptr;
    SP[j] = ptr;
    for (int64_t m = 0; m < in.k; ++m) save_index[t * in.k + m] = 0;
    times[t * (in.cap + 1)] = T[j];
    if (events) {{
      JP[j] = 0; RESET[j] = 0;
      LP[j] = 0;
      while (LP[j] < in.L && in.tst[t * in.L + LP[j]] <= T[j]) ++LP[j];
      for (int64_t m = 0; m < in.J; ++m) jump_index[t * in.J + m] = 0;
      for (int64_t m = 0; m < in.L; ++m) tstop_index[t * in.L + m] = 0;
      // With jumps at t0 the initial step is picked at the jumped state (restored after).
      START_JUMPED[j] = false;
      for (int64_t m = 0; m < in.J && in.jt[t * in.J + m] <= T[j]; ++m) {{
        if (!START_JUMPED[j])
          for (int r = 0; r < D; ++r) Y0KEEP[r * LANES + j] = YB[r * LANES + j];
        START_JUMPED[j] = true;
        for (int r = 0; r < D; ++r) YB[r * LANES + j] += in.jsz[(t * in.J + m) * D + r];
      }}
    }}
  }};
  auto finish = [&](int j) {{
    const int64_t t = traj[j];
    if (in.fill) {{
      real* row = times + t * (in.cap + 1);
      for (int64_t m = NA[j] + 1; m <= in.cap; ++m) row[m] = T[j];
    }}
    n_steps[t] = NA[j]; n_rej_out[t] = NR[j]; status[t] = ST[j]; dt_next[t] = HS[j];
    for (int r = 0; r < D; ++r) y_last[t * D + r] = YB[r * LANES + j];
  }};
  int done[LANES];
  for (int j = 0; j < LANES; ++j) {{ load(j); done[j] = traj[j] < 0; }}
  for (;;) {{
    int busy = 0, fresh = 0;
    for (int j = 0; j < LANES; ++j) {{
      while (traj[j] >= 0 && done[j]) {{ finish(j); load(j); done[j] = traj[j] < 0; }}
      busy += traj[j] >= 0;
      fresh += traj[j] >= 0 && FRESH[j];
    }}
    if (!busy) break;
    if (fresh) {{
      // First stage and Hairer's initial step (gradsolve._controller.initial_step).
      for (int j = 0; j < LANES; ++j) TQ[j] = T[j];
      eval_rhs(TQ, YB, PB, FRESH, K0);
      real D0[LANES], D1[LANES], H0[LANES];
      for (int j = 0; j < LANES; ++j) {{
        if (!(traj[j] >= 0 && FRESH[j])) continue;
        real s0 = 0, s1 = 0;
        for (int r = 0; r < D; ++r) {{
          const real sc = AT[j] + std::abs(YB[r * LANES + j]) * RT[j];
          const real a = YB[r * LANES + j] / sc, b = K0[r * LANES + j] / sc;
          s0 += a * a; s1 += b * b;
        }}
        D0[j] = std::sqrt(s0 / D); D1[j] = std::sqrt(s1 / D);
        const bool small = D0[j] < (real)1e-5 || D1[j] < (real)1e-5;
        H0[j] = small ? (real)1e-6 : (real)0.01 * D0[j] / D1[j];
        TQ[j] = T[j] + H0[j];
        for (int r = 0; r < D; ++r) YQ[r * LANES + j] = YB[r * LANES + j] + H0[j] * K0[r * LANES + j];
      }}
      eval_rhs(TQ, YQ, PB, FRESH, F1);
      for (int j = 0; j < LANES; ++j) {{
        if (!(traj[j] >= 0 && FRESH[j])) continue;
        const int64_t t = traj[j];
        real h;
        if (in.dt0[t] == in.dt0[t]) {{
          h = in.dt0[t];
        }} else {{
          real s2 = 0;
          for (int r = 0; r < D; ++r) {{
            const real sc = AT[j] + std::abs(YB[r * LANES + j]) * RT[j];
            const real q = (F1[r * LANES + j] - K0[r * LANES + j]) / sc;
            s2 += q * q;
          }}
          const real d2 = std::sqrt(s2 / D) / H0[j];
          const real dmax = rmax(D1[j], d2);
          const real h1 = dmax <= (real)1e-15 ? std::max((real)1e-6, H0[j] * (real)1e-3)
                                              : std::pow((real)0.01 / dmax, (real)1 / ERROR_ORDER);
          h = std::min((real)100 * H0[j], h1);
          if (!std::isfinite(h)) h = (real)1e-6;
        }}
        HS[j] = std::min(h, T1[j] - T[j]);
        FRESH[j] = 0;
        if (events && START_JUMPED[j]) {{
          for (int r = 0; r < D; ++r) YB[r * LANES + j] = Y0KEEP[r * LANES + j];
          START_JUMPED[j] = false;
        }}
      }}
    }}
    if (FSAL && events) {{
      int any = 0;
      for (int j = 0; j < LANES; ++j) {{ RESET[j] = RESET[j] && traj[j] >= 0; any += RESET[j]; TQ[j] = T[j]; }}
      if (any) eval_rhs(TQ, YB, PB, RESET, K0);
      for (int j = 0; j < LANES; ++j) RESET[j] = 0;
    }}
    for (int j = 0; j < LANES; ++j) {{
      ACT[j] = traj[j] >= 0;
      if (!ACT[j]) {{ H[j] = 0; continue; }}
      const real* tsr = in.ts + traj[j] * in.k;
      real target = SP[j] < in.k ? tsr[SP[j]] : T1[j];
      ISJ[j] = false;
      if (events) {{
        const real jn = next_jump(j);
        ISJ[j] = jn <= T[j];
        const real sn = LP[j] < in.L ? in.tst[traj[j] * in.L + LP[j]] : inf;
        target = std::min(target, std::min(jn, sn));
      }}
      const real t_try = T[j] + HS[j];
      const bool clipped = t_try >= target;
      const real t_new = ISJ[j] ? T[j] : (clipped ? target : t_try);
      TA[j] = T[j];
      H[j] = t_new - T[j];  // the replay recomputes h this way: bitwise the same step
      HNEXT[j] = clipped ? 1 : 0;
    }}
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {{
      {record_step}
    }}
    // The controller's powers for every lane at once (libmvec's SIMD pow where it links):
    // one scalar libm pow per lane and attempt was a third of the record's time.
    #pragma omp simd
    for (int j = 0; j < LANES; ++j) {{
      const real inv = 1 / std::max(ERR[j], (real)1e-10);
      FAC[j] = safety * std::pow(inv, (pco + ico) / ERROR_ORDER);
    }}
    if (pco != 0) {{
      #pragma omp simd
      for (int j = 0; j < LANES; ++j)
        FAC[j] *= std::pow(1 / std::max(EPREV[j], (real)1e-10), -pco / ERROR_ORDER);
    }}
    for (int j = 0; j < LANES; ++j) {{
      if (!ACT[j]) continue;
      const int64_t t = traj[j];
      if (ISJ[j]) {{
        // The jump's own node at the current time; the step size carries over.
        NA[j] += 1;
        times[t * (in.cap + 1) + NA[j]] = T[j];
        for (int r = 0; r < D; ++r) YB[r * LANES + j] += in.jsz[(t * in.J + JP[j]) * D + r];
        jump_index[t * in.J + JP[j]] = NA[j];
        ++JP[j];
        RESET[j] = 1;
        const bool finished = T[j] >= T1[j] && !(next_jump(j) <= T[j]);
        const real tiny = 10 * eps * std::abs(T[j]);
        const bool underflow = !finished && HS[j] <= tiny;
        const bool over = !finished && (NA[j] >= in.cap || NA[j] + NR[j] >= attempts_cap);
        if (underflow) ST[j] = 3;
        else if (over) ST[j] = 1;
        done[j] = finished || underflow || over;
        continue;
      }}
      const real err = ERR[j];
      const bool clipped = HNEXT[j] != 0;
      const real t_new = T[j] + H[j];
      const bool accept = err <= 1;
      real fac = FAC[j];
      const real fmax = accept ? fmaxc : safety;
      if (!std::isfinite(err)) fac = fmin;
      fac = std::min(std::max(fac, fmin), fmax);
      real h_next = H[j] * fac;
      if (accept && clipped) h_next = std::max(h_next, HS[j]);
      if (accept) {{
        NA[j] += 1;
        times[t * (in.cap + 1) + NA[j]] = t_new;
        const real* tsr = in.ts + t * in.k;
        while (SP[j] < in.k && tsr[SP[j]] <= t_new) save_index[t * in.k + SP[j]++] = NA[j];
        T[j] = t_new;
        for (int r = 0; r < D; ++r) YB[r * LANES + j] = Y1[r * LANES + j];
        if (FSAL) for (int r = 0; r < D; ++r) K0[r * LANES + j] = KL[r * LANES + j];
        EPREV[j] = std::max(err, (real)1e-4);
        if (events) {{
          const real* tr = in.tst + t * in.L;
          const int32_t before = LP[j];
          while (LP[j] < in.L && tr[LP[j]] <= t_new) tstop_index[t * in.L + LP[j]++] = NA[j];
          RESET[j] = LP[j] > before;
        }}
      }} else {{
        NR[j] += 1;
      }}
      HS[j] = h_next;
      const bool finished = accept && t_new >= T1[j] && !(events && next_jump(j) <= t_new);
      const real tiny = 10 * eps * std::max(std::abs(t_new), std::abs(TA[j]));
      const bool underflow = !finished && h_next <= tiny;
      const bool over = !finished && (NA[j] >= in.cap || NA[j] + NR[j] >= attempts_cap);
      if (underflow) ST[j] = std::isfinite(err) ? 3 : 2;
      else if (over) ST[j] = 1;
      done[j] = finished || underflow || over;
    }}
  }}
}}
#endif  // GS_PART_REC

}}  // namespace
// The replay's problem from its buffers, trajectories sorted by step count; false if empty.
static bool setup(Problem& pr, ffi::Buffer<ffi::{ffi_type}> times, ffi::Buffer<ffi::S32> n_eff,
                  ffi::Buffer<ffi::{ffi_type}> p, ffi::Buffer<ffi::S32> save,
                  ffi::Buffer<ffi::{ffi_type}> tsave, ffi::Buffer<ffi::S32> subst) {{
  pr.n = n_eff.element_count();
  if (pr.n == 0) return false;
  pr.s1 = times.element_count() / pr.n;
  pr.k = save.element_count() / pr.n;
  pr.times = times.typed_data(); pr.n_eff = n_eff.typed_data(); pr.p = p.typed_data();
  pr.save = save.typed_data(); pr.tsave = tsave.typed_data(); pr.subst = subst.typed_data();
  sort_by_length(pr);
  pr.soff.resize(pr.n);
  return true;
}}

// Known-time events of the replay (zero-width buffers without them).
static void set_events(Problem& pr, ffi::Buffer<ffi::S32> jidx, ffi::Buffer<ffi::{ffi_type}> jsz,
                       ffi::Buffer<ffi::S32> land, ffi::Buffer<ffi::{ffi_type}> jt,
                       const ffi::Buffer<ffi::S32>* tidx) {{
  pr.J = jidx.element_count() / pr.n;
  pr.jidx = jidx.typed_data(); pr.jsz = jsz.typed_data();
  pr.land = land.typed_data(); pr.jt = jt.typed_data();
  if (tidx) {{ pr.L = tidx->element_count() / pr.n; pr.tidx = tidx->typed_data(); }}
  pr.plain = pr.J == 0 && std::none_of(pr.subst, pr.subst + pr.n * pr.k,
                                       [](int32_t s) {{ return s != 0; }});
}}

// The forward's packed layout of the stored states: `rows` (see Problem::soff) and the
// offsets. Row offsets relative to t * s1 are int32; past that range the rows keep the
// capacity stride (offsets 0).
static void pack_rows(Problem& pr, int32_t* rows) {{
  int64_t row = 0;
  for (int64_t t = 0; t < pr.n; ++t) {{ pr.soff[t] = row; row += std::max<int32_t>(pr.n_eff[t], 0) + 1; }}
  const bool fits = pr.n * pr.s1 < ((int64_t)1 << 31);
  for (int64_t t = 0; t < pr.n; ++t) {{
    if (!fits) pr.soff[t] = t * pr.s1;
    rows[t] = (int32_t)(pr.soff[t] - t * pr.s1);
  }}
}}

static void unpack_rows(Problem& pr, const int32_t* rows) {{
  for (int64_t t = 0; t < pr.n; ++t) pr.soff[t] = t * pr.s1 + rows[t];
}}

#ifdef GS_PART_FWD
static ffi::Error FwdImpl(ffi::Buffer<ffi::{ffi_type}> times, ffi::Buffer<ffi::S32> n_eff,
                          ffi::Buffer<ffi::{ffi_type}> y0, ffi::Buffer<ffi::{ffi_type}> p,
                          ffi::Buffer<ffi::S32> save, ffi::Buffer<ffi::{ffi_type}> tol,
                          ffi::Buffer<ffi::{ffi_type}> tsave, ffi::Buffer<ffi::S32> subst,
                          ffi::Buffer<ffi::S32> jidx, ffi::Buffer<ffi::{ffi_type}> jsz,
                          ffi::Buffer<ffi::S32> land, ffi::Buffer<ffi::{ffi_type}> jt,
                          ffi::Buffer<ffi::S32> tidx,
                          ffi::ResultBuffer<ffi::{ffi_type}> ys, ffi::ResultBuffer<ffi::{ffi_type}> y1,
                          ffi::ResultBuffer<ffi::{ffi_type}> err,
                          ffi::ResultBuffer<ffi::{ffi_type}> states,
                          ffi::ResultBuffer<ffi::S32> rows,
                          ffi::ResultBuffer<ffi::S32> cost, int32_t threads_attr) {{
  Problem pr;
  if (!setup(pr, times, n_eff, p, save, tsave, subst)) return ffi::Error::Success();
  set_events(pr, jidx, jsz, land, jt, &tidx);
  pr.sw = states->element_count() / (pr.n * pr.s1);
  pack_rows(pr, rows->typed_data());
  for_threads(pr.n, threads_attr, [&](int64_t w, int64_t threads) {{
    forward_thread(pr, w, threads, y0.typed_data(), tol.typed_data(), ys->typed_data(),
                   y1->typed_data(), err->typed_data(), states->typed_data(), cost->typed_data());
  }});
  return ffi::Error::Success();
}}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Fwd, FwdImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>()
        .Attr<int32_t>("threads"));
#endif  // GS_PART_FWD

#if defined(GS_PART_BWD) || defined(GS_PART_BWDT)
// The library built with GS_PART_BWDT carries node-time cotangents (`ts` given), the one
// built with GS_PART_BWD does not (the common case, a third less code to compile).
#ifdef GS_PART_BWDT
#define GS_TIMES true
#else
#define GS_TIMES false
#endif
static ffi::Error BwdImpl(ffi::Buffer<ffi::{ffi_type}> times, ffi::Buffer<ffi::S32> n_eff,
                          ffi::Buffer<ffi::{ffi_type}> p, ffi::Buffer<ffi::S32> save,
                          ffi::Buffer<ffi::{ffi_type}> states, ffi::Buffer<ffi::S32> rows,
                          ffi::Buffer<ffi::{ffi_type}> ct_ys,
                          ffi::Buffer<ffi::{ffi_type}> ct_y1,
                          ffi::Buffer<ffi::{ffi_type}> tsave, ffi::Buffer<ffi::S32> subst,
                          ffi::Buffer<ffi::S32> jidx, ffi::Buffer<ffi::{ffi_type}> jsz,
                          ffi::Buffer<ffi::S32> land, ffi::Buffer<ffi::{ffi_type}> jt,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_tsave,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_y0,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_p,
                          ffi::ResultBuffer<ffi::{ffi_type}> ct_jsz, int32_t threads_attr) {{
  Problem pr;
  if (!setup(pr, times, n_eff, p, save, tsave, subst)) return ffi::Error::Success();
  set_events(pr, jidx, jsz, land, jt, nullptr);
  pr.sw = states.element_count() / (pr.n * pr.s1);
  unpack_rows(pr, rows.typed_data());
  for_threads(pr.n, threads_attr, [&](int64_t w, int64_t threads) {{
    backward_thread<GS_TIMES>(pr, w, threads, states.typed_data(), ct_ys.typed_data(),
                              ct_y1.typed_data(), ct_tsave->typed_data(),
                              ct_y0->typed_data(), ct_p->typed_data(), ct_jsz->typed_data());
  }});
  return ffi::Error::Success();
}}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Bwd, BwdImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Attr<int32_t>("threads"));

#endif  // GS_PART_BWD || GS_PART_BWDT

#ifdef GS_PART_REC
static ffi::Error RecImpl(ffi::Buffer<ffi::{ffi_type}> t01, ffi::Buffer<ffi::{ffi_type}> y0,
                          ffi::Buffer<ffi::{ffi_type}> p, ffi::Buffer<ffi::{ffi_type}> ts,
                          ffi::Buffer<ffi::{ffi_type}> tol, ffi::Buffer<ffi::{ffi_type}> dt0,
                          ffi::Buffer<ffi::{ffi_type}> ctrl,
                          ffi::Buffer<ffi::{ffi_type}> jt, ffi::Buffer<ffi::{ffi_type}> jsz,
                          ffi::Buffer<ffi::{ffi_type}> tst,
                          ffi::ResultBuffer<ffi::{ffi_type}> times, ffi::ResultBuffer<ffi::S32> n_steps,
                          ffi::ResultBuffer<ffi::S32> n_rej, ffi::ResultBuffer<ffi::S32> status,
                          ffi::ResultBuffer<ffi::S32> save_index,
                          ffi::ResultBuffer<ffi::{ffi_type}> dt_next,
                          ffi::ResultBuffer<ffi::{ffi_type}> y_last,
                          ffi::ResultBuffer<ffi::S32> jump_index,
                          ffi::ResultBuffer<ffi::S32> tstop_index, bool fill,
                          int32_t threads_attr) {{
  RecordIn in;
  in.fill = fill;
  in.n = dt0.element_count();
  if (in.n == 0) return ffi::Error::Success();
  in.k = ts.element_count() / in.n;
  in.cap = times->element_count() / in.n - 1;
  in.t01 = t01.typed_data(); in.y0 = y0.typed_data(); in.p = p.typed_data();
  in.ts = ts.typed_data(); in.tol = tol.typed_data(); in.dt0 = dt0.typed_data();
  in.ctrl = ctrl.typed_data();
  in.J = jt.element_count() / in.n; in.L = tst.element_count() / in.n;
  in.jt = jt.typed_data(); in.jsz = jsz.typed_data(); in.tst = tst.typed_data();
  in.order.resize(in.n);
  std::iota(in.order.begin(), in.order.end(), 0);
  for_threads(in.n, threads_attr, [&](int64_t w, int64_t threads) {{
    record_thread(in, w, threads, times->typed_data(), n_steps->typed_data(), n_rej->typed_data(),
                  status->typed_data(), save_index->typed_data(), dt_next->typed_data(),
                  y_last->typed_data(), jump_index->typed_data(), tstop_index->typed_data());
  }});
  return ffi::Error::Success();
}}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Rec, RecImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>().Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Arg<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>().Ret<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::{ffi_type}>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>()
        .Attr<bool>("fill").Attr<int32_t>("threads"));
#endif  // GS_PART_REC
"""
