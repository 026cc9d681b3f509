"""Per-step profile of the compiled CPU kernel: nanoseconds per trajectory-step of its
record, forward replay and reverse sweep on ONE thread, beside a hand-vectorised kernel on
the same mesh (the limit this machine sets for the same arithmetic).

gradsolve's figures come from its public API under ``jit`` with
``GRADSOLVE_KERNEL_THREADS=1``, so they include XLA's handling of the call (small at these
sizes): ``forward`` is ``gs.replay`` (values only), ``reverse`` is the gradient (a forward
sweep that stores the states, then the reverse sweep) minus ``forward``, ``record`` is
``gs.record`` per attempted step (accepted and rejected). Steps are the mesh's accepted
steps summed over trajectories.

The hand-vectorised kernel is Lotka-Volterra only, written for the limit rather than for
generality: trajectories sorted by step count in blocks of 8 lanes (a lane past its last
step takes h = 0), structure of arrays, no branches in the step, states stored per step,
stages recomputed in the reverse sweep with the vector field's VJP written out by hand.
It takes gradsolve's Tsit5 tableau and mesh, and its ``y1`` and gradient are checked
against gradsolve's before anything is timed.

Usage: ``python benchmarks/bench_kernel_profile.py [--sizes 1000,10000] [--repeats 30]``
(needs g++). Writes ``benchmarks/results/kernel_profile.json``.
"""

from __future__ import annotations

import os

os.environ["GRADSOLVE_KERNEL_THREADS"] = "1"  # read by the kernel at every call

import argparse
import ctypes
import json
import platform
import subprocess
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_core  # noqa: E402
import gradsolve as gs  # noqa: E402
from problems import make  # noqa: E402

RTOL, ATOL = 1e-6, 1e-8
LANES = 8

_HAND = r"""
#include <algorithm>
#include <cstdint>
constexpr int L = %(L)d, D = 2, P = 4, S = %(S)d;
constexpr double A[S][S] = {%(A)s};
constexpr double B[S] = {%(B)s};

// One lane's step, all in scalars (the compiler keeps the stages in registers and
// vectorises the enclosing loop over lanes): stages Y_i, K_i = f(Y_i) of Lotka-Volterra.
#define LANE_STAGES(x, y, h, p0, p1, p2, p3, YX, YY, KX, KY)                        \
  _Pragma("GCC unroll 16") for (int i = 0; i < S; ++i) {                           \
    double ax = 0, ay = 0;                                                        \
    _Pragma("GCC unroll 16") for (int m = 0; m < i; ++m) {                         \
      ax += A[i][m] * KX[m]; ay += A[i][m] * KY[m];                               \
    }                                                                             \
    YX[i] = x + h * ax; YY[i] = y + h * ay;                                       \
    KX[i] = p0 * YX[i] - p1 * YX[i] * YY[i];                                      \
    KY[i] = -p2 * YY[i] + p3 * YX[i] * YY[i];                                     \
  }

extern "C" int64_t plan(int64_t n, const int32_t* nst, const int64_t* order, int64_t* blocks) {
  int64_t nb = (n + L - 1) / L, row = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int64_t steps = 0;
    for (int j = 0; j < L && b * L + j < n; ++j) steps = std::max<int64_t>(steps, nst[order[b * L + j]]);
    blocks[3 * b] = b * L; blocks[3 * b + 1] = steps; blocks[3 * b + 2] = row;
    row += steps + 1;
  }
  return row;
}

// Per block: the lanes' trajectories (-1: none), their step sizes per step (h = 0 past a
// lane's last step) and their starting values.
static void load(int64_t n, int64_t s1, const double* times, const int32_t* nst,
                 const int64_t* order, const int64_t* blk, const double* y0, const double* p,
                 int64_t* tr, double* Hs, double* Yv, double* Pb) {
  for (int j = 0; j < L; ++j) {
    const int64_t i = blk[0] + j;
    tr[j] = i < n ? order[i] : -1;
    const int64_t t = tr[j] < 0 ? order[blk[0]] : tr[j];
    for (int r = 0; r < D; ++r) Yv[r * L + j] = y0[t * D + r];
    for (int r = 0; r < P; ++r) Pb[r * L + j] = p[t * P + r];
    for (int64_t k = 0; k < blk[1]; ++k)
      Hs[k * L + j] = (tr[j] < 0 || k >= nst[t]) ? 0.0 : times[t * s1 + k + 1] - times[t * s1 + k];
  }
}

extern "C" void forward(int64_t n, int64_t s1, const double* times, const int32_t* nst,
                        const int64_t* order, const int64_t* blocks, const double* y0,
                        const double* p, double* states, double* y1, double* Hs) {
  const int64_t nb = (n + L - 1) / L;
  alignas(64) double Yv[D * L], Pb[P * L];
  int64_t tr[L];
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t* blk = blocks + 3 * b;
    load(n, s1, times, nst, order, blk, y0, p, tr, Hs, Yv, Pb);
    double* st = states + blk[2] * D * L;
    std::copy(Yv, Yv + D * L, st);
    for (int64_t k = 0; k < blk[1]; ++k) {
      const double* H = Hs + k * L;
      double* out = st + (k + 1) * D * L;
      #pragma omp simd
      for (int j = 0; j < L; ++j) {
        const double x = Yv[j], y = Yv[L + j], h = H[j];
        double YX[S], YY[S], KX[S], KY[S];
        LANE_STAGES(x, y, h, Pb[j], Pb[L + j], Pb[2 * L + j], Pb[3 * L + j], YX, YY, KX, KY)
        double bx = 0, by = 0;
        _Pragma("GCC unroll 16") for (int i = 0; i < S; ++i) { bx += B[i] * KX[i]; by += B[i] * KY[i]; }
        Yv[j] = x + h * bx; Yv[L + j] = y + h * by;
        out[j] = Yv[j]; out[L + j] = Yv[L + j];
      }
    }
    for (int j = 0; j < L; ++j)
      if (tr[j] >= 0) for (int r = 0; r < D; ++r) y1[tr[j] * D + r] = Yv[r * L + j];
  }
}

// Gradient of sum(y1^2) w.r.t. p: the stored states, stages recomputed, VJPs by hand.
extern "C" void backward(int64_t n, int64_t s1, const double* times, const int32_t* nst,
                         const int64_t* order, const int64_t* blocks, const double* p,
                         const double* states, const double* y1, double* gp, double* Hs) {
  const int64_t nb = (n + L - 1) / L;
  alignas(64) double LAM[D * L], Pb[P * L], PBAR[P * L];
  int64_t tr[L];
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t* blk = blocks + 3 * b;
    load(n, s1, times, nst, order, blk, y1, p, tr, Hs, LAM, Pb);
    for (int i = 0; i < D * L; ++i) LAM[i] *= 2;
    std::fill(PBAR, PBAR + P * L, 0.0);
    const double* st = states + blk[2] * D * L;
    for (int64_t k = blk[1] - 1; k >= 0; --k) {
      const double* H = Hs + k * L;
      const double* yk = st + k * D * L;
      #pragma omp simd
      for (int j = 0; j < L; ++j) {
        const double x = yk[j], y = yk[L + j], h = H[j];
        const double p0 = Pb[j], p1 = Pb[L + j], p2 = Pb[2 * L + j], p3 = Pb[3 * L + j];
        double YX[S], YY[S], KX[S], KY[S], BX[S], BY[S];
        LANE_STAGES(x, y, h, p0, p1, p2, p3, YX, YY, KX, KY)
        const double lx = LAM[j], ly = LAM[L + j];
        _Pragma("GCC unroll 16") for (int i = 0; i < S; ++i) { BX[i] = h * B[i] * lx; BY[i] = h * B[i] * ly; }
        double ax = lx, ay = ly, g0 = PBAR[j], g1 = PBAR[L + j], g2 = PBAR[2 * L + j], g3 = PBAR[3 * L + j];
        _Pragma("GCC unroll 16") for (int i = S - 1; i >= 0; --i) {
          const double u = YX[i], v = YY[i], v0 = BX[i], v1 = BY[i];
          const double yx = (p0 - p1 * v) * v0 + p3 * v * v1;
          const double yy = -p1 * u * v0 + (p3 * u - p2) * v1;
          g0 += u * v0; g1 -= u * v * v0; g2 -= v * v1; g3 += u * v * v1;
          _Pragma("GCC unroll 16") for (int m = 0; m < i; ++m) {
            BX[m] += h * A[i][m] * yx; BY[m] += h * A[i][m] * yy;
          }
          ax += yx; ay += yy;
        }
        LAM[j] = ax; LAM[L + j] = ay;
        PBAR[j] = g0; PBAR[L + j] = g1; PBAR[2 * L + j] = g2; PBAR[3 * L + j] = g3;
      }
    }
    for (int j = 0; j < L; ++j)
      if (tr[j] >= 0) for (int r = 0; r < P; ++r) gp[tr[j] * P + r] = PBAR[r * L + j];
  }
}
"""


def _hand_kernel(solver):
    """The hand-vectorised LV kernel for ``solver``'s tableau, compiled and loaded."""
    a, b = np.asarray(solver.a, float), np.asarray(solver.b, float)
    s = int(np.max(np.flatnonzero(b)) + 1)  # stages the propagated solution uses
    fmt = lambda v: ", ".join(repr(float(x)) for x in v)
    src = _HAND % dict(L=LANES, S=s, A=", ".join("{" + fmt(a[i, :s]) + "}" for i in range(s)), B=fmt(b[:s]))
    folder = tempfile.mkdtemp(prefix="gs_hand_")
    cc, so = os.path.join(folder, "hand.cc"), os.path.join(folder, "hand.so")
    with open(cc, "w") as fh:
        fh.write(src)
    subprocess.run(["g++", "-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared",
                    "-fPIC", "-o", so, cc], check=True)
    lib = ctypes.CDLL(so)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.plan.restype = i64
    lib.plan.argtypes = [i64, ptr, ptr, ptr]
    lib.forward.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.backward.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    return lib


class HandReplay:
    """The hand-vectorised kernel on one mesh: ``forward()`` -> y1, ``gradient()`` -> d
    sum(y1^2) / dp (a forward that stores the states, then the reverse sweep)."""

    def __init__(self, lib, mesh, y0, p):
        self.lib = lib
        self.times = np.ascontiguousarray(np.asarray(mesh.padded().times), np.float64)
        self.nst = np.ascontiguousarray(np.asarray(mesh.n_steps), np.int32)
        self.n, self.s1 = self.times.shape
        self.order = np.ascontiguousarray(np.argsort(self.nst, kind="stable"), np.int64)
        self.y0 = np.ascontiguousarray(np.asarray(y0), np.float64)
        self.p = np.ascontiguousarray(np.asarray(p), np.float64)
        self.blocks = np.zeros(((self.n + LANES - 1) // LANES, 3), np.int64)
        rows = lib.plan(self.n, self.nst.ctypes.data, self.order.ctypes.data, self.blocks.ctypes.data)
        self.states = np.empty((rows, 2, LANES))
        self.y1 = np.empty((self.n, 2))
        self.gp = np.empty((self.n, 4))
        self.hs = np.empty((max(1, int(self.blocks[:, 1].max())), LANES))

    def forward(self):
        c = lambda a: a.ctypes.data
        self.lib.forward(self.n, self.s1, c(self.times), c(self.nst), c(self.order),
                         c(self.blocks), c(self.y0), c(self.p), c(self.states), c(self.y1),
                         c(self.hs))
        return self.y1

    def gradient(self):
        self.forward()
        c = lambda a: a.ctypes.data
        self.lib.backward(self.n, self.s1, c(self.times), c(self.nst), c(self.order),
                          c(self.blocks), c(self.p), c(self.states), c(self.y1), c(self.gp),
                          c(self.hs))
        return self.gp


def profile(name: str, n: int, repeats: int, hand_lib=None) -> dict:
    """One problem at ``n`` trajectories: ns per trajectory-step, gradsolve and (LV) hand."""
    f, t1, y0, p, _, _ = make(name, n)
    mesh = gs.record(f, 0.0, t1, y0, p, rtol=RTOL, atol=ATOL)
    steps = int(np.sum(np.asarray(mesh.n_steps)))
    attempts = steps + int(np.sum(np.asarray(mesh.n_rejected)))
    loss = lambda q: jnp.sum(gs.replay(f, mesh, y0, q).y1 ** 2)
    fwd = jax.jit(lambda q: gs.replay(f, mesh, y0, q).y1)
    grad = jax.jit(jax.grad(loss))
    rec = jax.jit(lambda q: gs.record(f, 0.0, t1, y0, q, rtol=RTOL, atol=ATOL,
                                      max_steps=int(mesh.capacity)).times)
    fns = dict(fwd=lambda: fwd(p), grad=lambda: grad(p), rec=lambda: rec(p))
    if hand_lib is not None:
        hand = HandReplay(hand_lib, mesh, y0, p)
        np.testing.assert_allclose(hand.forward(), np.asarray(fwd(p)), rtol=1e-11)
        np.testing.assert_allclose(hand.gradient(), np.asarray(grad(p)), rtol=1e-9,
                                   atol=1e-12 * float(np.max(np.abs(np.asarray(grad(p))))))
        fns.update(hand_fwd=hand.forward, hand_grad=hand.gradient)
    for fn in fns.values():  # compile
        jax.block_until_ready(fn())
    t = bench_core._best(fns, repeats)
    row = dict(problem=name, n=n, steps=steps, attempts=attempts,
               record_ns=1e9 * t["rec"] / attempts, forward_ns=1e9 * t["fwd"] / steps,
               gradient_ns=1e9 * t["grad"] / steps,
               reverse_ns=1e9 * (t["grad"] - t["fwd"]) / steps)
    if hand_lib is not None:
        row.update(hand_forward_ns=1e9 * t["hand_fwd"] / steps,
                   hand_gradient_ns=1e9 * t["hand_grad"] / steps,
                   hand_reverse_ns=1e9 * (t["hand_grad"] - t["hand_fwd"]) / steps)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="lotka_volterra,lorenz,van_der_pol")
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--repeats", type=int, default=30, help="calls per function, interleaved")
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results",
                                                   "kernel_profile.json"))
    a = ap.parse_args(argv)
    lib = _hand_kernel(gs.Tsit5())
    print(f"one thread, Tsit5, rtol {RTOL:g}, atol {ATOL:g}, float64, {platform.machine()}; "
          "ns per trajectory-step (record: per attempted step)")
    print(f"{'problem':16s} {'n':>6s} {'steps':>6s} {'record':>7s} {'fwd':>6s} {'rev':>6s} "
          f"{'grad':>6s} | {'hand fwd':>8s} {'rev':>6s} {'grad':>6s} | {'grad/hand':>9s}")
    rows = []
    for name in a.problems.split(","):
        for n in (int(s) for s in a.sizes.split(",")):
            r = profile(name, n, a.repeats, lib if name == "lotka_volterra" else None)
            rows.append(r)
            hand = (f"{r['hand_forward_ns']:8.1f} {r['hand_reverse_ns']:6.1f} "
                    f"{r['hand_gradient_ns']:6.1f} | {r['gradient_ns'] / r['hand_gradient_ns']:8.2f}x"
                    if "hand_forward_ns" in r else f"{'-':>8s} {'-':>6s} {'-':>6s} | {'-':>9s}")
            print(f"{name:16s} {n:6d} {r['steps'] // n:6d} {r['record_ns']:7.1f} "
                  f"{r['forward_ns']:6.1f} {r['reverse_ns']:6.1f} {r['gradient_ns']:6.1f} | {hand}",
                  flush=True)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump(dict(machine=platform.machine(), jax=jax.__version__, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
