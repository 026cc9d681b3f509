"""The kernel's sparse elimination (`gradsolve.drivers.kernel._sparse`, ``cc/sparse_lu.h``).

- The Jacobian's structural pattern from the jaxpr: a hand-written field whose pattern is
  known (a constant matrix with zeros, a ``select_n`` on a state comparison, a
  ``stop_gradient``), and that ``jax.jacfwd`` at random points never leaves it.
- The symbolic factorisation's tables, run by a numpy transcription of the C++ loops,
  against `scipy.linalg.lu_factor`/``lu_solve`` (``W x = b`` and ``W^T x = b``) on random
  diagonally dominant matrices with random sparse patterns; fill on patterns whose fill
  is known (tridiagonal, arrow).
- The C++ policy (``SparseElimination``, as `_sparse.choose` emits it) compiled in a small
  harness with the kernel's own compiler flags (`gradsolve.drivers.kernel.build`), against
  SciPy: random lanes; a zero pivot served by the dense fallback; a singular ``W`` marked
  failed; a small pivot that causes no growth taken, one that does refused.
- Column groups: the Jacobian's nonzeros from fewer forward passes equal ``jax.jacfwd``.
- Slow: the same on the collection's real patterns (Boehm 8 states, Zheng 15, Bachmann
  25, Isensee 32, Laske 34, Chen 504) and the models' own ``W`` at steps up to 1e3; and
  the whole loop-form Rodas5P kernel with the sparse policy on Zheng (15 states) against
  the XLA replay on one mesh (objective and gradient to 1e-10).

The harness also times a factorisation and the two solves, sparse against dense
(``python -c`` on `Harness.run` with ``reps``; the numbers are in `_sparse.SparseLU`).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from gradsolve.drivers.kernel import _sparse
from gradsolve.drivers.kernel import build as kbuild

CC = Path(_sparse.__file__).parent / "cc"
LANES = 8


# ---------------------------------------------------------------------- the pattern


def _field(t, y, p):
    a = jnp.array([[1.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0],
                   [0.0, 0.0, 0.0, 0.0]])
    lin = a @ y  # rows: y0 + 2 y2, 0, 3 y1, 0
    switch = jnp.where(y[0] > y[3], p[0] * y[1], jnp.exp(y[2]))  # y3 only in the predicate
    frozen = jax.lax.stop_gradient(y[3]) * y[0]
    return jnp.stack([lin[0] * t, switch, lin[2] + frozen, y[3] ** 2 + p[1]])


def test_pattern_of_a_known_field():
    pattern = _sparse.jacobian_pattern(_field, 4, 2)
    want = np.zeros((4, 4), dtype=bool)
    want[0, [0, 2]] = True
    want[1, [1, 2]] = True
    want[2, [0, 1]] = True
    want[3, 3] = True
    np.testing.assert_array_equal(pattern, want)
    jac = jax.jacfwd(lambda y: _field(0.7, y, jnp.array([1.3, 0.2])))
    for seed in range(5):
        y = np.random.default_rng(seed).normal(size=4)
        assert not ((np.asarray(jac(y)) != 0) & ~pattern).any()


# ---------------------------------------------------------------------- the tables


def _random_w(pattern, rng, lanes=1):
    """Lanes of ``W = alpha I - beta J`` with ``J`` on ``pattern`` and dominant
    diagonal; returns ``(J nonzeros (m, lanes), alpha, beta, W (lanes, n, n))``."""
    n = pattern.shape[0]
    rows, cols = np.nonzero(pattern)
    jnz = rng.normal(size=(rows.size, lanes))
    alpha = 1.0 + rng.random(lanes) + np.abs(jnz).sum(0)
    beta = 0.5 + rng.random(lanes)
    w = np.zeros((lanes, n, n))
    w[:, np.arange(n), np.arange(n)] = alpha[:, None]
    for k, (r, c) in enumerate(zip(rows, cols)):
        w[:, r, c] -= beta * jnz[k]
    return jnz, alpha, beta, w


def _numpy_policy(lu, jnz, alpha, beta):
    """The C++ loops of ``sparse_lu.h`` for one lane in numpy: the factor slots."""
    v = np.zeros(lu.nnz)
    v[lu.diag] = alpha
    for k, s in enumerate(lu.entry_slot):
        v[s] = v[s] - beta * jnz[k]
    for k in range(lu.n):
        rec = 1.0 / v[lu.diag[k]]
        us = lu.uslot[lu.uptr[k]:lu.uptr[k + 1]]
        for e in range(lu.lptr[k], lu.lptr[k + 1]):
            v[lu.lslot[e]] *= rec
            tg = lu.target[lu.tptr[e]:lu.tptr[e] + us.size]
            v[tg] -= v[lu.lslot[e]] * v[us]
    return v


def _numpy_solve(lu, v, b, transposed=False):
    x = b[lu.order].copy()
    if not transposed:
        for k in range(lu.n):
            for e in range(lu.lptr[k], lu.lptr[k + 1]):
                x[lu.lrow[e]] -= v[lu.lslot[e]] * x[k]
        for k in range(lu.n - 1, -1, -1):
            for m in range(lu.uptr[k], lu.uptr[k + 1]):
                x[k] -= v[lu.uslot[m]] * x[lu.ucol[m]]
            x[k] /= v[lu.diag[k]]
    else:
        for k in range(lu.n):
            x[k] /= v[lu.diag[k]]
            for m in range(lu.uptr[k], lu.uptr[k + 1]):
                x[lu.ucol[m]] -= v[lu.uslot[m]] * x[k]
        for k in range(lu.n - 1, -1, -1):
            for e in range(lu.lptr[k], lu.lptr[k + 1]):
                x[k] -= v[lu.lslot[e]] * x[lu.lrow[e]]
    out = np.empty_like(x)
    out[lu.order] = x
    return out


def _random_pattern(n, density, rng):
    return rng.random((n, n)) < density


@pytest.mark.parametrize("order", ["natural", "rcm", "mindegree", None])
@pytest.mark.parametrize("n,density,seed", [(1, 1.0, 0), (6, 0.3, 1), (25, 0.08, 2),
                                            (34, 0.05, 3), (40, 0.5, 4)])
def test_tables_solve_as_scipy(n, density, seed, order):
    rng = np.random.default_rng(seed)
    pattern = _random_pattern(n, density, rng)
    lu = _sparse.symbolic(pattern, order=order)
    assert lu.fills[lu.order_name] == lu.nnz
    if order is None:
        assert lu.nnz == min(lu.fills.values())
    assert sorted(lu.order) == list(range(n))
    jnz, alpha, beta, w = _random_w(pattern, rng)
    v = _numpy_policy(lu, jnz[:, 0], alpha[0], beta[0])
    b = rng.normal(size=n)
    factors = scipy.linalg.lu_factor(w[0])
    for transposed in (False, True):
        want = scipy.linalg.lu_solve(factors, b, trans=int(transposed))
        got = _numpy_solve(lu, v, b, transposed)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_fill_of_a_tridiagonal_and_an_arrow():
    n = 12
    tri = np.eye(n, k=1, dtype=bool) | np.eye(n, k=-1, dtype=bool)
    lu = _sparse.symbolic(tri)
    assert lu.nnz == 3 * n - 2 and lu.updates == n - 1  # no fill
    arrow = np.zeros((n, n), dtype=bool)
    arrow[0, :] = arrow[:, 0] = True  # natural order fills everything, the hub last none
    lu = _sparse.symbolic(arrow)
    assert lu.fills["natural"] == n * n
    assert lu.nnz == 3 * n - 2 and 0 in lu.order[-2:]  # the hub among the last two


def test_rule_sparse_or_dense():
    n = 40
    assert not _sparse.symbolic(np.ones((n, n), dtype=bool)).use_sparse()
    tri = np.eye(n, k=1, dtype=bool) | np.eye(n, k=-1, dtype=bool)
    assert _sparse.symbolic(tri).use_sparse()


def test_slots_refuse_an_entry_outside_the_pattern():
    lu = _sparse.symbolic(np.eye(3, k=1, dtype=bool))
    np.testing.assert_array_equal(lu.slots([0, 1], [1, 2]), lu.entry_slot)
    with pytest.raises(ValueError, match=r"entry \(2, 0\)"):
        lu.slots([2], [0])


# ---------------------------------------------------------------------- the C++ policy

_HARNESS = r"""
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
typedef double real;
#define D @N@
#define LANES @LANES@
#define P_REAL 1
struct Model {
  static constexpr int NNZ = @M@;
  static constexpr int ROW[@MM@] = {@ROW@};
  static constexpr int COL[@MM@] = {@COL@};
};
#include "rosenbrock.h"
@POLICY@
static @TYPE@<Model> el;
static DenseElimination<Model> dense;
// in: JNZ[m][LANES], ALPHA, BETA, ACT, B[n][LANES]; out: FAIL, x = W^-1 b, W^-T b, fallbacks
int main(int argc, char** argv) {
  const int m = Model::NNZ > 0 ? Model::NNZ : 1;
  static real JNZ[m * LANES], ALPHA[LANES], BETA[LANES], ACTR[LANES], B[D * LANES],
      X[D * LANES], XT[D * LANES], FAILR[LANES];
  int ACT[LANES], FAIL[LANES];
  FILE* in = std::fopen(argv[1], "rb");
  size_t got = std::fread(JNZ, sizeof(real), Model::NNZ * LANES, in);
  got += std::fread(ALPHA, sizeof(real), LANES, in) + std::fread(BETA, sizeof(real), LANES, in);
  got += std::fread(ACTR, sizeof(real), LANES, in) + std::fread(B, sizeof(real), D * LANES, in);
  std::fclose(in);
  if (got != (size_t)(Model::NNZ * LANES + 3 * LANES + D * LANES)) return 3;
  for (int j = 0; j < LANES; ++j) ACT[j] = ACTR[j] != 0;
  el.factor(JNZ, ALPHA, BETA, ACT, FAIL);
  std::memcpy(X, B, sizeof(X)); el.solve(X);
  std::memcpy(XT, B, sizeof(XT)); el.solve_transposed(XT);
  for (int j = 0; j < LANES; ++j) FAILR[j] = FAIL[j];
  real fb = (real)el.fallbacks;
  FILE* out = std::fopen(argv[2], "wb");
  std::fwrite(FAILR, sizeof(real), LANES, out); std::fwrite(X, sizeof(real), D * LANES, out);
  std::fwrite(XT, sizeof(real), D * LANES, out); std::fwrite(&fb, sizeof(real), 1, out);
  std::fclose(out);
  if (argc > 3) {  // ns per lane: a factorisation; a solve and a transposed solve
    const int reps = std::atoi(argv[3]);
    for (int which = 0; which < 4; ++which) {
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        switch (which) {
          case 0: el.factor(JNZ, ALPHA, BETA, ACT, FAIL); break;
          case 1: std::memcpy(X, B, sizeof(X)); el.solve(X); el.solve_transposed(X); break;
          case 2: dense.factor(JNZ, ALPHA, BETA, ACT, FAIL); break;
          default: std::memcpy(X, B, sizeof(X)); dense.solve(X); dense.solve_transposed(X);
        }
        asm volatile("" : : "r"(X), "r"(FAIL) : "memory");
      }
      auto t1 = std::chrono::steady_clock::now();
      static const char* names[] = {"sparse_factor", "sparse_solves", "dense_factor",
                                    "dense_solves"};
      std::printf("%s %.3f\n", names[which],
                  std::chrono::duration<double, std::nano>(t1 - t0).count() / reps / LANES);
      if (which == 1) el.factor(JNZ, ALPHA, BETA, ACT, FAIL);  // dense fills nothing of el
      if (which == 2) dense.factor(JNZ, ALPHA, BETA, ACT, FAIL);
    }
  }
  return 0;
}
"""


def _flags():
    """The kernel build's compiler flags, for an executable instead of a shared library."""
    return [f for f in kbuild._FLAGS if f not in ("-shared", "-fPIC")]


class Harness:
    """``SparseElimination`` (and ``DenseElimination``, timed beside it) compiled for one
    pattern; `run` feeds it lanes and reads back the solves."""

    def __init__(self, pattern, folder, order=None):
        self.pattern = np.asarray(pattern, dtype=bool)
        self.lu = _sparse.symbolic(self.pattern, order=order)
        rows, cols = np.nonzero(self.pattern)
        n, m = self.lu.n, rows.size
        if order is None:  # what the kernel gets
            policy, code, _ = _sparse.choose(rows, cols, n) or (None, None, None)
        if order is not None or policy is None:  # a named order, or a pattern best dense
            code = "\n".join([(CC / "sparse_lu.h").read_text(), self.lu.cpp_struct("Tables"),
                              "template <class M> using Policy = SparseElimination<M, Tables>;"])
            policy = "Policy"
        text = (_HARNESS.replace("@N@", str(n)).replace("@LANES@", str(LANES))
                .replace("@M@", str(m)).replace("@MM@", str(max(m, 1)))
                .replace("@ROW@", ",".join(map(str, rows)) or "0")
                .replace("@COL@", ",".join(map(str, cols)) or "0")
                .replace("@POLICY@", code).replace("@TYPE@", policy))
        self.folder = Path(folder)
        src = self.folder / f"harness_{n}_{m}.cc"
        src.write_text(text)
        self.exe = src.with_suffix("")
        t = time.perf_counter()
        res = subprocess.run([kbuild.compiler(), *_flags(), f"-I{CC}", str(src), "-o",
                              str(self.exe)], capture_output=True, text=True)
        self.compile_s = time.perf_counter() - t
        assert res.returncode == 0, res.stderr[-3000:]

    def run(self, jnz, alpha, beta, b, act=None, reps=0):
        n = self.lu.n
        act = np.ones(LANES) if act is None else np.asarray(act, dtype=float)
        inp, out = self.folder / "in.bin", self.folder / "out.bin"
        np.concatenate([np.asarray(jnz, float).reshape(-1), alpha, beta, act,
                        np.asarray(b, float).T.reshape(-1)]).tofile(inp)
        cmd = [str(self.exe), str(inp), str(out)] + ([str(reps)] if reps else [])
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        raw = np.fromfile(out)
        fail = raw[:LANES]
        x = raw[LANES:LANES + n * LANES].reshape(n, LANES).T
        xt = raw[LANES + n * LANES:LANES + 2 * n * LANES].reshape(n, LANES).T
        times = dict(line.split() for line in res.stdout.split("\n") if line)
        return fail, x, xt, int(raw[-1]), {k: float(v) for k, v in times.items()}


def timing(pattern, reps: int = 200) -> dict:
    """ns per lane of a factorisation and of a solve plus a transposed solve, sparse and
    dense, on random diagonally dominant lanes with ``pattern`` (for measuring, e.g.
    ``python -c "import sys; sys.path.insert(0, 'tests'); import numpy as np,
    test_kernel_sparse as t; print(t.timing(np.load('pattern.npy')))"``)."""
    with tempfile.TemporaryDirectory() as folder:
        h = Harness(pattern, folder)
        rng = np.random.default_rng(0)
        jnz, alpha, beta, _ = _random_w(h.pattern, rng, LANES)
        out = h.run(jnz, alpha, beta, rng.normal(size=(LANES, h.lu.n)), reps=reps)[4]
    return {**out, "fill": h.lu.nnz, "order": h.lu.order_name, "use_sparse": h.lu.use_sparse()}


needs_compiler = pytest.mark.skipif(kbuild.compiler() is None, reason="no C++ compiler")


def _check(harness, seed, tol=1e-12):
    """Random lanes on the harness's pattern against SciPy's LU solves."""
    rng = np.random.default_rng(seed)
    jnz, alpha, beta, w = _random_w(harness.pattern, rng, LANES)
    b = rng.normal(size=(LANES, harness.lu.n))
    fail, x, xt, fallbacks, _ = harness.run(jnz, alpha, beta, b)
    assert not fail.any() and fallbacks == 0
    for j in range(LANES):
        f = scipy.linalg.lu_factor(w[j])
        for got, trans in ((x[j], 0), (xt[j], 1)):
            want = scipy.linalg.lu_solve(f, b[j], trans=trans)
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def _w_of(pattern, jnz, alpha, beta):
    n = pattern.shape[0]
    rows, cols = np.nonzero(pattern)
    w = np.zeros((alpha.size, n, n))
    w[:, np.arange(n), np.arange(n)] = alpha[:, None]
    for k, (r, q) in enumerate(zip(rows, cols)):
        w[:, r, q] -= beta * jnz[k]
    return w


@needs_compiler
def test_policy_solves_as_scipy_and_falls_back(tmp_path):
    rng = np.random.default_rng(7)
    n = 30
    pattern = _random_pattern(n, 0.08, rng)
    pattern[np.arange(n), np.arange(n)] = True
    pattern[0, 1] = pattern[1, 0] = True
    h = Harness(pattern, tmp_path, order="natural")
    _check(h, 0)
    # Lane 3: W[0, 0] = 0, the first pivot of the (natural) order, with W[0, 1] and
    # W[1, 0] nonzero: W is regular but cannot be factored without a row exchange. The
    # dense policy (partial pivoting) serves the block, as SciPy.
    jnz, alpha, beta, _ = _random_w(pattern, rng, LANES)
    rows, cols = np.nonzero(pattern)
    zero_pivot, singular = 3, 5
    beta[[zero_pivot, singular]] = 1.0  # W's zeros exact, with or without a fused multiply-add
    for k, (r, q) in enumerate(zip(rows, cols)):
        if r == q == 0:
            jnz[k, zero_pivot] = alpha[zero_pivot]
    # Lane 5: W's row 2 is zero, W singular: the lane fails (the step marks it NaN).
    for k, (r, q) in enumerate(zip(rows, cols)):
        if r == 2:
            jnz[k, singular] = alpha[singular] if q == 2 else 0.0
    w = _w_of(pattern, jnz, alpha, beta)
    assert w[zero_pivot, 0, 0] == 0 and np.linalg.cond(w[zero_pivot]) < 1e8
    assert not w[singular, 2].any()
    b = rng.normal(size=(LANES, n))
    fail, x, xt, fallbacks, _ = h.run(jnz, alpha, beta, b)
    assert fallbacks == 1
    np.testing.assert_array_equal(np.flatnonzero(fail), [singular])
    for j in range(LANES):
        if j == singular:
            continue
        f = scipy.linalg.lu_factor(w[j])
        np.testing.assert_allclose(x[j], scipy.linalg.lu_solve(f, b[j]), rtol=1e-10,
                                   atol=1e-12)
        np.testing.assert_allclose(xt[j], scipy.linalg.lu_solve(f, b[j], trans=1),
                                   rtol=1e-10, atol=1e-12)
    # Both lanes inactive: no fallback (their values are never read).
    act = np.ones(LANES)
    act[[zero_pivot, singular]] = 0
    fail, x, _, fallbacks, _ = h.run(jnz, alpha, beta, b, act=act)
    assert fallbacks == 0 and fail[zero_pivot] and fail[singular]
    f = scipy.linalg.lu_factor(w[0])
    np.testing.assert_allclose(x[0], scipy.linalg.lu_solve(f, b[0]), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------- the collection

DATA = Path(__file__).parent / "data" / "petab"
COLLECTION = Path(__file__).resolve().parents[2] / "shared" / "petab-benchmark-collection"
_in_collection = pytest.mark.skipif(not COLLECTION.is_dir(),
                                    reason="the benchmark collection is not here")


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize("path", [
    pytest.param(DATA / "Boehm_JProteomeRes2014", id="Boehm"),
    *[pytest.param(COLLECTION / name, id=name.split("_")[0], marks=_in_collection)
      for name in ("Zheng_PNAS2012", "Bachmann_MSB2011", "Isensee_JCB2018",
                   "Laske_PLOSComputBiol2019", "Chen_MSB2009")]])
def test_policy_on_the_collection(path, tmp_path):
    """The model's structural pattern holds ``jax.jacfwd``'s nonzeros at perturbed
    states; on it the C++ policy solves as SciPy for random diagonally dominant ``W``,
    and for the model's own ``W = I / gamma - h J`` at its initial state with steps from
    1e-4 to 1e3 with a backward error under 1e-13 (no pivoting in the build's order)."""
    pytest.importorskip("petab")
    import gradsolve as gs
    import models

    problem = models.load_petab(path, hierarchical=False, solver=gs.Rodas5P())
    y0, p, _, _ = problem._inputs(jnp.asarray(problem.nominal))
    y0, p = np.asarray(y0)[0], np.asarray(p)[0]
    n = y0.size
    pattern = _sparse.jacobian_pattern(problem.vector_field, n, p.size)
    jac = jax.jit(jax.jacfwd(lambda y: problem.vector_field(0.0, y, p)))
    rng = np.random.default_rng(0)
    ys = [y0 * np.exp(0.3 * rng.normal(size=n)) + 0.01 * rng.random(n) for _ in range(3)]
    for y in ys:
        assert not ((np.asarray(jac(y)) != 0) & ~pattern).any()
    h = Harness(pattern, tmp_path)
    _check(h, 1, tol=1e-11)
    rows, cols = np.nonzero(pattern)
    jnz = np.stack([np.asarray(jac(ys[j % 3]))[rows, cols] for j in range(LANES)], axis=1)
    gamma = float(gs.Rodas5P().gamma)
    alpha = np.full(LANES, 1 / gamma)
    beta = np.logspace(-4, 3, LANES)
    b = rng.normal(size=(LANES, n))
    fail, x, xt, _, _ = h.run(jnz, alpha, beta, b)
    w = _w_of(pattern, jnz, alpha, beta)
    for j in range(LANES):
        if fail[j]:  # refused pivot, no dense fallback at this size: NaN-marked by the step
            assert n > 64
            continue
        norm = np.abs(w[j]).sum(1).max()
        for got, mat in ((x[j], w[j]), (xt[j], w[j].T)):
            backward = np.abs(mat @ got - b[j]).max() / (norm * np.abs(got).max())
            assert backward < 1e-13, (j, beta[j], backward)


@needs_compiler
def test_policy_refuses_growth_not_small_pivots(tmp_path):
    """A pivot 1e-12 of its column is taken where its row is zero (it updates nothing:
    the solves' backward error stays at rounding), and refused, with the dense policy
    serving the block, where its row is not (the update would grow by 1e12)."""
    n = 6
    pattern = np.zeros((n, n), dtype=bool)
    pattern[:, 0] = pattern[0, :] = True
    pattern[np.arange(n), np.arange(n)] = True
    h = Harness(pattern, tmp_path, order="natural")
    rows, cols = np.nonzero(pattern)
    alpha, beta = np.ones(LANES), np.ones(LANES)
    jnz = np.empty((rows.size, LANES))
    for k, (r, q) in enumerate(zip(rows, cols)):
        # W = I - J: W[0, 0] ~ 1e-12, W[i, 0] = 1, W[i, i] = 3, W[0, j] = 0 (1 in lane 5)
        jnz[k] = 1 - 1e-12 if r == q == 0 else -2.0 if r == q else -1.0 if q == 0 else 0.0
        if r == 0 and q > 0:
            jnz[k, 5] = -1.0
    w = _w_of(pattern, jnz, alpha, beta)
    b = np.random.default_rng(3).normal(size=(LANES, n))

    def backward_error(x, j, transposed):
        mat = w[j].T if transposed else w[j]
        return np.abs(mat @ x - b[j]).max() / (np.abs(mat).sum(1).max() * np.abs(x).max())

    act = np.ones(LANES)
    act[5] = 0  # lane 5 inactive: the block is served by the sparse factors
    fail, x, xt, fallbacks, _ = h.run(jnz, alpha, beta, b, act=act)
    assert fallbacks == 0 and list(np.flatnonzero(fail)) == [5]
    for j in range(LANES):
        if j != 5:
            assert backward_error(x[j], j, False) < 1e-16
            assert backward_error(xt[j], j, True) < 1e-16
    fail, x, xt, fallbacks, _ = h.run(jnz, alpha, beta, b)
    assert fallbacks == 1 and not fail.any()
    f = scipy.linalg.lu_factor(w[5])
    np.testing.assert_allclose(x[5], scipy.linalg.lu_solve(f, b[5]), rtol=1e-12)
    np.testing.assert_allclose(xt[5], scipy.linalg.lu_solve(f, b[5], trans=1), rtol=1e-12)


@needs_compiler
def test_chosen_policy_solves_as_scipy(tmp_path):
    """`_sparse.choose`'s C++, as the kernel gets it, on a Laske-sized random pattern."""
    rng = np.random.default_rng(11)
    pattern = _random_pattern(34, 0.05, rng)
    rows, cols = np.nonzero(pattern)
    policy, _, reason = _sparse.choose(rows, cols, 34)
    assert "sparse LU" in reason
    h = Harness(pattern, tmp_path)
    _check(h, 2)
    dense = np.ones((12, 12), dtype=bool)
    assert _sparse.choose(*np.nonzero(dense), 12) is None


# ---------------------------------------------------------------------- the whole kernel


@pytest.mark.slow
@needs_compiler
@_in_collection
@pytest.mark.parametrize("name", ["Zheng_PNAS2012"])
def test_kernel_with_the_sparse_policy_equals_the_xla_replay(name):
    """A collection problem of more than 10 states on the loop-form Rodas5P kernel, whose
    Jacobian is sparse enough for the sparse policy (checked in the generated source):
    the objective and its gradient on one recorded mesh equal the XLA replay's (JAX's
    dense LU with partial pivoting, JAX's AD) to 1e-10. The mesh is recorded by the kernel
    at the problem's tolerances, off the nominal point (2 % of each bound range)."""
    pytest.importorskip("petab")
    import gradsolve as gs
    import models
    from gradsolve.drivers.kernel import build as kb

    kernel, xla = gs.drivers.Kernel(), gs.drivers.Batched()
    problem = models.load_petab(COLLECTION / name, hierarchical=False, solver=gs.Rodas5P())
    assert len(problem.state_ids) > 10
    lo, hi = (np.asarray(b) for b in problem.bounds)
    x0 = np.asarray(problem.nominal)
    x = x0 + 0.02 * (hi - lo) * np.sign((lo + hi) / 2 - x0)
    meshes = {}

    def record(key, f, t0, t1, y0, params, *, ts=None, jumps=None):
        meshes[key] = gs.record(f, t0, t1, y0, params, ts=ts, solver=problem.solver,
                                rtol=problem.rtol, atol=problem.atol,
                                max_steps=problem.max_steps, jumps=jumps, driver=kernel)
        return gs.replay(f, meshes[key], y0, params, jumps=jumps, driver=kernel)

    problem.log_likelihood(x, solve=record)
    assert all(np.all(np.asarray(m.status) == 0) for m in meshes.values())

    def objective(driver, routes):
        def replay(key, f, t0, t1, y0, params, *, ts=None, jumps=None):
            sol = gs.replay(f, meshes[key], y0, params, jumps=jumps, driver=driver)
            routes.add(sol.route)
            return sol
        return lambda x: -problem.log_likelihood(x, solve=replay)

    routes_k, routes_x = set(), set()
    value_k, grad_k = jax.jit(jax.value_and_grad(objective(kernel, routes_k)))(x)
    value_x, grad_x = jax.jit(jax.value_and_grad(objective(xla, routes_x)))(x)
    assert routes_k == {"gradsolve-kernel"} and routes_x == {"gradsolve-batched"}
    sources = [b.source for b in kb._built.values()]
    assert any("GsSparseElimination<Model>" in s for s in sources)
    assert float(value_k) == pytest.approx(float(value_x), rel=1e-10)
    grad_k, grad_x = np.asarray(grad_k), np.asarray(grad_x)
    np.testing.assert_allclose(grad_k, grad_x, rtol=1e-10, atol=1e-12 * np.abs(grad_x).max())


def test_column_groups_give_the_jacobian_in_fewer_passes():
    rng = np.random.default_rng(5)
    n = 40
    pattern = _random_pattern(n, 0.06, rng) | np.eye(n, dtype=bool)
    groups = _sparse.column_groups(pattern)
    assert groups.max() + 1 >= pattern.sum(1).max() and groups.max() + 1 < n / 2
    a = np.where(pattern, rng.normal(size=(n, n)), 0.0)
    f = lambda y: jnp.tanh(jnp.asarray(a) @ y) + y ** 2  # df/dy on a's pattern
    y = rng.normal(size=n)
    passes = [jax.jvp(f, (y,), ((groups == g).astype(float),))[1]
              for g in range(groups.max() + 1)]
    rows, cols = np.nonzero(pattern)
    got = np.array([passes[groups[j]][i] for i, j in zip(rows, cols)])
    np.testing.assert_allclose(got, np.asarray(jax.jacfwd(f)(y))[rows, cols], rtol=1e-14)
