"""Property-based tests (Hypothesis) on random small ODE systems.

A *system* is generated Python source: ``d`` states (1 to 6), each right-hand side a sum of
terms drawn from polynomial, rational (guarded denominators such as ``1 + y**2``),
transcendental (``sin``, ``exp`` of bounded arguments, ``tanh``, ``log1p``, ``sqrt``),
``jnp.where`` (a C2 ramp and the double-``where`` ``sin(x)/x``), forcing in ``t``, and a
whole-vector idiom (``A @ y``, slices, ``y[::-1]``, a constant-index permutation, a
reduction), assembled with ``jnp.stack``, ``jnp.concatenate`` or ``.at[i].set``. Every
coefficient is a per-trajectory parameter (so an ensemble's meshes are ragged), and the
damping ``-c * y - 0.1 * y**3`` keeps every system bounded and non-stiff over the short
interval. Tolerances, save times, initial states, solver (Tsit5, Dopri5, Vern7) and dtype
(float64, float32) are drawn too.

Properties, each on the recorded mesh of a drawn case:

1. the replay's values at ``ts`` match SciPy's DOP853 at ``rtol=1e-12`` within a bound that
   follows from the requested tolerances;
2. the replay gradient w.r.t. ``params`` and ``y0`` matches central differences of the same
   replay on the same (frozen) mesh (float64);
3. every driver that applies (Kernel, Lanes, Batched, Diffrax) gives the same values and
   gradients on the mesh; a driver that does not apply raises ``ValueError`` with its
   reason, Batched always applies and Diffrax applies to Tsit5 and Dopri5 (its twins);
4. ``jax.jacfwd`` equals ``jax.jacrev`` of the replay output w.r.t. ``params``.

Cost: each new vector field (or solver, or dtype) compiles a C++ kernel and new XLA
programs (seconds to tens of seconds), so most cases draw their *structure* from a fixed
pool of systems (`POOL`) whose coefficients, states, tolerances and save times are all
drawn; the default tier uses one pool system, the slow tier all of them and, in
``test_fresh_structures``, structures drawn by Hypothesis itself. The lanes replay's cost
limit (it refuses long expressions, where it would be slow) is lifted in this module so that
every field it can translate is replayed by it. Examples are derandomized: CI reruns the
same cases.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.integrate import solve_ivp

import gradsolve as gs
from gradsolve.drivers import lanes as _lanes

# --- systems ---------------------------------------------------------------------------------

# Scalar terms (coefficient a, shift b; indices j, k into the state). Every term is bounded
# or at most quadratic; the cubic damping dominates the quadratic ones.
KINDS = ("linear", "poly2", "rational", "rational_p", "sin", "exp", "exp_tanh", "tanh",
         "where", "sinc", "forcing", "log1p", "sqrt")
VECTORS = ("none", "matvec", "roll", "reverse", "perm", "tanh_sum", "dot")
ASSEMBLIES = ("stack", "concat", "at_set")


def _term(kind: str, j: int, k: int, m: int) -> str:
    a, b, yj, yk = f"a[{m}]", f"b[{m}]", f"y[{j}]", f"y[{k}]"
    return {
        "linear": f"{a} * {yj}",
        "poly2": f"{a} * {yj} * {yk}",
        "rational": f"{a} * {yj} / (1 + {yk} ** 2)",
        "rational_p": f"{a} / (1 + {b} ** 2 + {yj} ** 2)",
        "sin": f"{a} * xp.sin({yj} + {b})",
        "exp": f"{a} * xp.exp(-({yj} - {b}) ** 2)",
        "exp_tanh": f"{a} * xp.exp({b} * xp.tanh({yj}))",
        "tanh": f"{a} * xp.tanh({yj} + {b} * {yk})",
        # a C2 ramp: zero below b, then (s^3 / (1 + s^2)), s = y_j - b
        "where": f"{a} * xp.where({yj} > {b}, ({yj} - {b}) ** 3 / (1 + ({yj} - {b}) ** 2), 0 * {yj})",
        # sin(x)/x with the double-where guard (finite value and gradient at x = 0)
        "sinc": (f"{a} * xp.where(xp.abs({yj}) < 1e-3, 1 - {yj} ** 2 / 6, "
                 f"xp.sin(xp.where(xp.abs({yj}) < 1e-3, 1.0, {yj})) / "
                 f"xp.where(xp.abs({yj}) < 1e-3, 1.0, {yj}))"),
        "forcing": f"{a} * xp.cos(2 * t + {b})",
        "log1p": f"{a} * xp.log1p({yj} ** 2)",
        "sqrt": f"{a} * (xp.sqrt(1 + {yj} ** 2) - 1)",
    }[kind]


def _vector(vector: str, perm: tuple[int, ...]) -> str:
    return {
        "none": "0",
        "matvec": 'p["A"] @ y',
        "roll": 'p["v"] * xp.concatenate([y[1:], y[:1]])',
        "reverse": 'p["v"] * y[::-1]',
        "perm": f'p["v"] * y[np.array({list(perm)})]',
        "tanh_sum": 'p["v"] * xp.tanh(xp.sum(y))',
        "dot": 'p["v"] * y * xp.dot(y, y) / (1 + xp.dot(y, y))',
    }[vector]


@dataclasses.dataclass(frozen=True)
class Structure:
    """The shape of a system: ``terms`` are ``(component, kind, j, k)``."""

    d: int
    terms: tuple[tuple[int, str, int, int], ...]
    vector: str = "none"
    assembly: str = "stack"
    perm: tuple[int, ...] = ()

    def source(self, backend: str = "jax") -> str:
        """The vector field as Python source (``xp`` is ``jax.numpy`` or ``numpy``)."""
        comps = [[] for _ in range(self.d)]
        for m, (i, kind, j, k) in enumerate(self.terms):
            comps[i].append(_term(kind, j, k, m))
        lines = ["def f(t, y, p):", '    a, b, c = p["a"], p["b"], p["c"]']
        for i, c in enumerate(comps):
            lines.append(f"    r{i} = " + (" + ".join(c) if c else f"0 * y[{i}]"))
        names = [f"r{i}" for i in range(self.d)]
        if self.assembly == "stack":
            lines.append(f"    out = xp.stack([{', '.join(names)}])")
        elif self.assembly == "concat":
            lines.append(f"    out = xp.concatenate([{', '.join(f'xp.reshape({r}, (1,))' for r in names)}])")
        elif backend == "jax":
            lines.append("    out = xp.zeros_like(y)")
            lines += [f"    out = out.at[{i}].set({r})" for i, r in enumerate(names)]
        else:
            lines.append(f"    out = xp.array([{', '.join(names)}])")
        lines.append(f"    return out - c * y - 0.1 * y ** 3 + {_vector(self.vector, self.perm)}")
        return "\n".join(lines)

    def param_shapes(self) -> dict:
        m = len(self.terms)
        shapes = {"a": (m,), "b": (m,), "c": (self.d,)}
        if self.vector == "matvec":
            shapes["A"] = (self.d, self.d)
        elif self.vector != "none":
            shapes["v"] = (self.d,)
        return shapes


@functools.cache
def field(structure: Structure, backend: str = "jax"):
    """The vector field of ``structure``: one function object (and code object) per
    structure, so its compiled kernel and XLA programs are reused across examples."""
    namespace = {"xp": jnp if backend == "jax" else np, "np": np}
    exec(compile(structure.source(backend), f"<system {hash(structure) & 0xFFFFFF:06x}>", "exec"),
         namespace)
    return namespace["f"]


def T(*terms):
    return tuple(terms)


# Fixed systems; together they use every kind, vector idiom and assembly. Each is
# (structure, solver, dtype, k save times); the default tier uses the first.
POOL = [
    (Structure(2, T((0, "poly2", 0, 1), (0, "forcing", 0, 0), (1, "rational", 0, 1),
                    (1, "where", 1, 0), (1, "sin", 0, 0)), "matvec", "stack"),
     "Tsit5", "float64", 4),
    (Structure(5, T((0, "exp", 4, 0), (1, "sinc", 0, 0), (2, "log1p", 3, 0), (3, "sqrt", 2, 0),
                    (4, "rational_p", 1, 0)), "roll", "concat"),
     "Vern7", "float32", 3),
    (Structure(2, T((0, "poly2", 1, 1), (1, "tanh", 0, 1), (1, "where", 1, 0)), "reverse",
               "at_set"),
     "Dopri5", "float32", 4),
    (Structure(1, T((0, "sin", 0, 0), (0, "exp", 0, 0)), "tanh_sum", "stack"),
     "Tsit5", "float32", 2),
    (Structure(6, T((0, "linear", 5, 0), (1, "poly2", 0, 2), (2, "rational", 1, 4),
                    (3, "sinc", 3, 0), (4, "forcing", 0, 0), (5, "tanh", 2, 3)),
               "perm", "stack", perm=(3, 0, 5, 1, 4, 2)),
     "Dopri5", "float64", 5),
    (Structure(4, T((0, "exp_tanh", 1, 0), (1, "log1p", 0, 0), (2, "where", 3, 0),
                    (3, "rational_p", 2, 0)), "dot", "concat"),
     "Tsit5", "float64", 3),
    (Structure(2, T((0, "tanh", 1, 0), (1, "sinc", 0, 0)), "matvec", "stack"), "Vern7", "float64", 1),
    (Structure(3, T((0, "sqrt", 1, 0), (1, "exp", 2, 0), (2, "poly2", 0, 1)), "roll", "at_set"),
     "Tsit5", "float64", 3),
]
FRESH_EXAMPLES = 4

SOLVERS = {"Tsit5": gs.Tsit5, "Dopri5": gs.Dopri5, "Vern7": gs.Vern7}
DIFFRAX_TWINS = {"Tsit5", "Dopri5"}  # the Diffrax driver runs these as diffrax.Tsit5/Dopri5
DRIVERS = {"Kernel": gs.drivers.Kernel, "Lanes": gs.drivers.Lanes,
           "Batched": gs.drivers.Batched, "Diffrax": gs.drivers.Diffrax}
N = 3  # trajectories in a pool case's ensemble


@dataclasses.dataclass(frozen=True, eq=False)
class Case:
    structure: Structure
    solver: str
    dtype: str
    t1: float
    y0: np.ndarray  # (n, d)
    params: dict  # leaves (n, ...)
    ts: np.ndarray  # (k,) or (n, k)
    rtol: float
    atol: float
    seed: int  # for the finite-difference directions and loss weights

    def __repr__(self):
        arrays = {"y0": self.y0, "ts": self.ts, **{f'params["{k}"]': v for k, v in self.params.items()}}
        body = "\n".join(f"{k} = np.array({np.asarray(v).tolist()!r})" for k, v in arrays.items())
        return (f"Case(solver=gs.{self.solver}(), dtype={self.dtype}, t0=0.0, t1={self.t1!r}, "
                f"rtol={self.rtol!r}, atol={self.atol!r}, seed={self.seed})\n"
                f"{self.structure.source()}\n{body}")

    @property
    def f(self):
        return field(self.structure)

    def arrays(self):
        """``y0``, ``params``, ``ts`` as JAX arrays of the case's dtype."""
        dt = jnp.dtype(self.dtype)
        cast = lambda x: jnp.asarray(x, dt)  # noqa: E731
        return cast(self.y0), jax.tree_util.tree_map(cast, self.params), cast(self.ts)


def _floats(lo, hi):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _array(draw, shape, lo, hi):
    size = int(np.prod(shape))
    return np.array(draw(st.lists(_floats(lo, hi), min_size=size, max_size=size)),
                    dtype=np.float64).reshape(shape)


@st.composite
def structures(draw):
    d = draw(st.integers(1, 6))
    index = st.integers(0, d - 1)
    terms = tuple(draw(st.lists(st.tuples(index, st.sampled_from(KINDS), index, index),
                                max_size=2 * d)))
    perm = tuple(draw(st.permutations(range(d))))
    return Structure(d, terms, draw(st.sampled_from(VECTORS)), draw(st.sampled_from(ASSEMBLIES)),
                     perm)


@st.composite
def cases(draw, pool=None):
    """A case from a ``pool`` system (coefficients etc. drawn), or a fresh structure."""
    if pool is not None:
        structure, solver, dtype, k = draw(st.sampled_from(pool))
        n = N
    else:
        structure = draw(structures())
        solver = draw(st.sampled_from(sorted(SOLVERS)))
        dtype = draw(st.sampled_from(["float64", "float32"]))
        k, n = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    ranges = {"a": (-1.0, 1.0), "b": (-1.0, 1.0), "c": (0.3, 2.0), "A": (-0.5, 0.5), "v": (-1.0, 1.0)}
    params = {name: _array(draw, (n, *shape), *ranges[name])
              for name, shape in structure.param_shapes().items()}
    y0 = _array(draw, (n, structure.d), -1.5, 1.5)
    t1 = draw(_floats(0.5, 2.0))
    # ts: sorted fractions of [0, t1] (Hypothesis likes 0, 1 and repeats: ends and ties),
    # shared or one row per trajectory.
    rows = 1 if draw(st.booleans()) else n
    ts = np.sort(_array(draw, (rows, k), 0.0, 1.0), axis=1) * t1
    ts = ts[0] if rows == 1 else ts
    # float32 cannot honour tolerances much below its 1.2e-7 epsilon.
    lo = -8.0 if dtype == "float64" else -5.0
    rtol = 10.0 ** draw(_floats(lo, -4.0))
    atol = rtol * 10.0 ** draw(_floats(-3.0, 0.0))
    seed = draw(st.integers(0, 2**16))
    return Case(structure, solver, dtype, t1, y0, params, ts, rtol, atol, seed)


# --- the mesh of a case -------------------------------------------------------------------------


CAPACITY = 256  # one mesh capacity (`Mesh.with_capacity` changes no value): one compiled replay


@functools.partial(jax.jit, static_argnums=(0, 1))
def _record(structure, solver, t1, y0, params, ts, rtol, atol):
    # Under jit the interval, save times and tolerances are traced: one compiled record per
    # system, not one per drawn tolerance (outside jit they are compile-time constants).
    return gs.record(field(structure), 0.0, t1, y0, params, ts=ts, solver=SOLVERS[solver](),
                     rtol=rtol, atol=atol)


def record(case: Case):
    """The recorded mesh, with `CAPACITY` step slots (or the next power of 4 above)."""
    y0, p, ts = case.arrays()
    dt = jnp.dtype(case.dtype)
    mesh = _record(case.structure, case.solver, jnp.asarray(case.t1, dt), y0, p, ts,
                   jnp.asarray(case.rtol, dt), jnp.asarray(case.atol, dt))
    assert np.all(np.asarray(mesh.status) == 0), np.asarray(mesh.status)
    steps = int(np.max(np.asarray(mesh.n_steps)))
    cap = CAPACITY
    while cap < steps:
        cap *= 4
    return mesh.with_capacity(cap)


def loss_weights(case: Case, shape):
    return jnp.asarray(np.random.default_rng(case.seed).normal(size=shape), case.dtype)


def loss(case: Case, sol):
    """A smooth scalar of a replay: weighted states at ``ts`` plus a square at ``t1``."""
    return jnp.sum(loss_weights(case, sol.ys.shape) * sol.ys) + jnp.sum(sol.y1 ** 2)


@pytest.fixture(scope="module", autouse=True)
def _lanes_without_cost_limit():
    """The lanes replay refuses fields with long expressions because it would be slow there,
    not wrong; this module checks its correctness on every field it can translate."""
    mp = pytest.MonkeyPatch()
    mp.setattr(_lanes, "lanes_pays", lambda d, ops: True)
    yield
    mp.undo()


SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run_examples(check, pool, examples):
    """``check`` on ``examples`` cases drawn (reproducibly) from the systems in ``pool``
    (``None``: fresh structures)."""

    @settings(max_examples=examples, **SETTINGS)
    @given(st.data())
    def run(data):
        check(data.draw(cases(pool), label="case"))

    run()


def tiers(dtype=None):
    """pytest parameters ``(system, examples)``: the default tier runs pool system 0 (8
    examples), the slow tier every pool system (of ``dtype``), 16 examples each."""
    fast = [pytest.param(0, 8, id="system0")]
    slow = [pytest.param(i, 16, id=f"system{i}-slow", marks=pytest.mark.slow)
            for i, system in enumerate(POOL) if dtype in (None, system[2])]
    return fast + slow


# --- 1. values against SciPy ----------------------------------------------------------------------


def scipy_reference(case: Case) -> np.ndarray:
    """DOP853 at rtol 1e-12 on the NumPy version of the field (same source, ``xp = numpy``),
    in float64 from the case's inputs rounded to its dtype: ``(n, k, d)`` at ``ts``."""
    fn = field(case.structure, "numpy")
    y0j, pj, tsj = case.arrays()
    y0 = np.asarray(y0j, np.float64)
    p = {k: np.asarray(v, np.float64) for k, v in pj.items()}
    ts = np.broadcast_to(np.asarray(tsj, np.float64), (y0.shape[0], np.shape(tsj)[-1]))
    out = []
    for i in range(y0.shape[0]):
        pi = {k: v[i] for k, v in p.items()}
        sol = solve_ivp(lambda t, y: fn(t, y, pi), (0.0, float(np.float64(case.t1))), y0[i],
                        method="DOP853", rtol=1e-12, atol=1e-14, dense_output=True)
        assert sol.success, sol.message
        out.append(sol.sol(ts[i]).T)
    return np.stack(out)


def check_against_scipy(case: Case):
    y0, p, _ = case.arrays()
    mesh = record(case)
    sol = gs.replay(case.f, mesh, y0, p)
    got = np.asarray(sol.ys, np.float64)
    ref = scipy_reference(case)
    # The controller keeps each step's estimated local error below atol + rtol |y| (RMS
    # over components); the propagated solution is the higher-order one, whose local
    # error is usually far smaller. The global error is at most the sum of the local ones
    # carried forward: over these short, damped intervals (tens of steps, growth factors
    # of a few) 100 times the tolerance bounds it (the pool's cases reach about 3 times),
    # while a lost order or a wrong error estimate exceeds it. DOP853 at 1e-12 adds
    # nothing visible; rounding adds up to ~10 epsilon per step (visible in float32).
    eps = float(jnp.finfo(case.dtype).eps)
    steps = float(np.max(np.asarray(mesh.n_steps)))
    bound = 100 * (case.atol + case.rtol * np.abs(ref)) + 10 * steps * eps * np.maximum(1.0, np.abs(ref))
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (
        f"replay vs DOP853: |error| {err[worst]:.3e} > bound {bound[worst]:.3e} at {worst} "
        f"(route {sol.route}, steps {np.asarray(mesh.n_steps)})")
    # Replayed where it was recorded, the replay's own error estimate accepts every step.
    slack = 1e-6 if case.dtype == "float64" else 1e-3
    assert np.all(np.asarray(sol.error_ratio) <= 1 + slack), np.asarray(sol.error_ratio)


@pytest.mark.parametrize("system, examples", tiers())
def test_replay_matches_scipy(system, examples):
    run_examples(check_against_scipy, [POOL[system]], examples)


# --- 2. gradient against central differences on the frozen mesh ------------------------------------


def check_gradient_fd(case: Case):
    if case.dtype != "float64":
        return
    y0, p, _ = case.arrays()
    mesh = record(case)
    f = case.f

    def value(y, q):
        return loss(case, gs.replay(f, mesh, y, q))

    val, (g_y, g_p) = jax.value_and_grad(value, argnums=(0, 1))(y0, p)
    rng = np.random.default_rng(case.seed + 1)
    v_y = jnp.asarray(rng.normal(size=y0.shape))
    v_p = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape)), p)
    # Central differences with h = 1e-6 (inputs, directions and weights are O(1)):
    # truncation h^2 |L'''| / 6 ~ 1e-12 |L'''|, rounding ~ (ulps of L) / h ~ 1e-10 |L|.
    # The bound's first term is what catches a wrong adjoint (relative to |g| |v|, the
    # scale of any directional derivative); its second covers both errors where the
    # directional derivative is (close to) zero. The pool's cases stay below 1/1000 of a
    # bound ten times this one.
    h = 1e-6
    for name, g, v, at in (("y0", g_y, v_y, lambda s: (y0 + s * v_y, p)),
                           ("params", g_p, v_p,
                            lambda s: (y0, jax.tree_util.tree_map(lambda x, w: x + s * w, p, v_p)))):
        gv = sum(float(jnp.vdot(a, b)) for a, b in zip(jax.tree_util.tree_leaves(g),
                                                      jax.tree_util.tree_leaves(v)))
        fd = (float(value(*at(h))) - float(value(*at(-h)))) / (2 * h)
        scale = np.sqrt(sum(float(jnp.vdot(a, a)) for a in jax.tree_util.tree_leaves(g))) * \
            np.sqrt(sum(float(jnp.vdot(a, a)) for a in jax.tree_util.tree_leaves(v)))
        assert abs(gv - fd) <= 1e-7 * scale + 1e-9 * (1 + abs(float(val))), (
            f"d loss / d {name} along a random direction: adjoint {gv!r}, central "
            f"difference {fd!r} (|g| |v| = {scale:.3e})")


@pytest.mark.parametrize("system, examples", tiers(dtype="float64"))
def test_gradient_matches_central_differences(system, examples):
    run_examples(check_gradient_fd, [POOL[system]], examples)


# --- 3. every driver against every other on one mesh -------------------------------------------------


def _agree(a_tree, b_tree, rtol, what):
    """Norm-wise relative agreement leaf by leaf."""
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(a_tree)[0],
                            jax.tree_util.tree_leaves(b_tree)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        name = what + jax.tree_util.keystr(path)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert np.all(np.isfinite(a)), name
        err, scale = np.linalg.norm(a - b), np.linalg.norm(b)
        assert err <= rtol * scale or (scale == 0 and err == 0), (
            f"{name}: |a - b| = {err:.3e}, |b| = {scale:.3e} ({err / max(scale, 1e-300):.2e} relative)")


def driver_tolerance(dtype):
    # Same steps, same arithmetic up to association and fused multiply-adds: differences
    # are rounding carried through the steps (float64 ~1e-14; float32 ~1e-6 after the
    # amplification of tens of steps and of the adjoint's sums).
    return 1e-10 if dtype == "float64" else 1e-4


def check_drivers(case: Case):
    y0, p, _ = case.arrays()
    mesh = record(case)
    f, solver = case.f, SOLVERS[case.solver]()
    results = {}
    for name, make in DRIVERS.items():
        drv = make()
        reason = drv.replay_reason(f, solver, y0, p)
        if name == "Batched":
            assert reason is None, reason
        if name == "Diffrax":
            assert (reason is None) == (case.solver in DIFFRAX_TWINS), reason
        if reason is not None:
            assert isinstance(reason, str) and reason.strip()
            with pytest.raises(ValueError, match=re.escape(reason)):
                gs.replay(f, mesh, y0, p, driver=drv)
            continue

        routes = []

        def value(y, q, drv=drv):
            sol = gs.replay(f, mesh, y, q, driver=drv)
            routes.append(sol.route)
            return loss(case, sol), (sol.ys, sol.y1)

        (_, (ys, y1)), (g_y, g_p) = jax.value_and_grad(value, argnums=(0, 1), has_aux=True)(y0, p)
        assert routes and all(r.startswith(drv.name) for r in routes), routes
        results[name] = {"ys": ys, "y1": y1, "g_y0": g_y, "g_params": g_p}
    names = list(results)
    tol = driver_tolerance(case.dtype)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            _agree(results[a], results[b], tol, f"{a} vs {b}: ")


# in the slow tier only: every driver against every other on fresh structures is ~20 s; the
# drivers' agreement on fixed problems is test_drivers.py's (normal suite)
@pytest.mark.parametrize("system, examples", [p for p in tiers() if p.marks])
def test_drivers_agree(system, examples):
    run_examples(check_drivers, [POOL[system]], examples)


# --- 4. forward mode equals reverse mode -------------------------------------------------------------


def check_jacfwd_jacrev(case: Case):
    y0, p, _ = case.arrays()
    mesh = record(case)
    out = lambda q: gs.replay(case.f, mesh, y0, q).ys  # noqa: E731
    fwd, rev = jax.jacfwd(out)(p), jax.jacrev(out)(p)
    _agree(fwd, rev, driver_tolerance(case.dtype), "jacfwd vs jacrev: ")


@pytest.mark.parametrize("system, examples", tiers())
def test_jacfwd_equals_jacrev(system, examples):
    run_examples(check_jacfwd_jacrev, [POOL[system]], examples)


# --- fresh structures: all four properties ------------------------------------------------------------


def check_all(case: Case):
    check_against_scipy(case)
    check_gradient_fd(case)
    check_drivers(case)
    check_jacfwd_jacrev(case)


@pytest.mark.slow
def test_fresh_structures():
    """Structures drawn by Hypothesis (each compiles its own kernel and programs)."""
    run_examples(check_all, None, FRESH_EXAMPLES)
