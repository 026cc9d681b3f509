"""Rosenbrock methods (Rodas5P, Rosenbrock23) on the compiled CPU kernel against the XLA
replay of the same mesh.

The kernel translates the solver's whole ``step`` (Jacobian, ``W``, its pivoted LU, the
stage solves) and its VJP to C++ (`gradsolve.drivers.kernel.rosenbrock_source`), so on one
mesh its values and gradients must equal those of `gs.drivers.Batched` (vmapped steps,
JAX's AD) to rounding: 1e-10 here. Also: central differences of the fixed-mesh replay on
Robertson, the C++ record against the XLA record, ``gs.solve`` with ``driver=Kernel()``,
known-time events, and where the kernel refuses (too many states, a step the translator
does not handle) without a warning about the field.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
import models
from conftest import kernel_builds
from gradsolve.drivers.kernel.driver import ROSENBROCK_MAX_STATES

pytestmark = pytest.mark.skipif(
    not kernel_builds(), reason="no working C++ compiler: the kernel falls back to XLA")

KERNEL, XLA = gs.drivers.Kernel(), gs.drivers.Batched()
SOLVERS = [gs.Rodas5P(), gs.Rosenbrock23()]
IDS = ["Rodas5P", "Rosenbrock23"]

robertson = models.robertson().vector_field  # the zoo's field, dict parameters k1, k2, k3


def forced_vdp(t, y, p):
    """Van der Pol with mu = 1000 (stiff) and a periodic forcing (non-autonomous: the
    step's df/dt term enters)."""
    x, v = y[0], y[1]
    return jnp.stack([v, p["mu"] * (1.0 - x * x) * v - x + p["a"] * jnp.cos(p["w"] * t)])


def _robertson(n):
    spread = 1 + 0.1 * jnp.linspace(-1, 1, n)
    p = {"k1": 0.04 * spread, "k2": 3e7 / spread, "k3": 1e4 * spread}
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), (n, 1))
    # rtol by solver: Rosenbrock23 (order 2) is meant for loose tolerances
    return robertson, 1e3, y0, p, jnp.logspace(-3, 3, 7), jnp.array([1.0, 1e4, 1.0])


def _forced_vdp(n):
    spread = 1 + 0.05 * jnp.linspace(-1, 1, n)
    p = {"mu": 1000.0 * spread, "a": 0.5 * spread, "w": 20.0 / spread}
    y0 = jnp.tile(jnp.array([2.0, 0.0]), (n, 1)) * spread[:, None]
    return forced_vdp, 1.0, y0, p, jnp.linspace(0.1, 1.0, 5), jnp.array([1.0, 1e3])


PROBLEMS = {"robertson": _robertson, "forced_vdp": _forced_vdp}
RTOL = {"Rodas5P": 1e-6, "Rosenbrock23": 1e-4}


def _record(problem, solver, n=11, **kw):
    f, t1, y0, p, ts, w = PROBLEMS[problem](n)
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, solver=solver, rtol=RTOL[type(solver).__name__],
                     atol=1e-10, driver=XLA, **kw)
    return f, y0, p, ts, w, mesh


# Robertson with Rodas5P in the normal suite; the forced Van der Pol (another kernel build
# per solver, ~12 s each with a cold cache) and Robertson with Rosenbrock23 (~20 s) in the
# slow tier. The kernel translates any Rosenbrock method's own ``step`` and its VJP the same
# way (`rosenbrock_source`), which Rodas5P checks here; Rosenbrock23's kernel is built and
# checked against the XLA record in the normal suite
# (test_kernel_record_matches_xla_record[Rosenbrock23]).
@pytest.mark.parametrize("problem, solver", [
    pytest.param("robertson", SOLVERS[0], id="robertson-Rodas5P"),
    pytest.param("robertson", SOLVERS[1], id="robertson-Rosenbrock23", marks=pytest.mark.slow),
    pytest.param("forced_vdp", SOLVERS[0], id="forced_vdp-Rodas5P", marks=pytest.mark.slow),
    pytest.param("forced_vdp", SOLVERS[1], id="forced_vdp-Rosenbrock23", marks=pytest.mark.slow),
])
def test_kernel_matches_xla_replay_values_and_gradients(problem, solver):
    f, y0, p, ts, w, mesh = _record(problem, solver)
    n = y0.shape[0]
    with_ts = problem == "robertson"  # save-time gradients: the kernel's bwdt variant
    ts_b = jnp.broadcast_to(ts, (n, ts.shape[0]))

    def loss(driver):
        def fn(y, q, t):
            sol = gs.replay(f, mesh, y, q, ts=t if with_ts else None, driver=driver)
            return jnp.sum(jnp.sin(sol.ys * w)) + jnp.sum((sol.y1 * w) ** 2), sol
        return jax.value_and_grad(fn, argnums=(0, 1, 2) if with_ts else (0, 1), has_aux=True)

    (val, sol), grads = loss(KERNEL)(y0, p, ts_b)
    (val_x, sol_x), grads_x = loss(XLA)(y0, p, ts_b)
    assert sol.route == "gradsolve-kernel" and sol_x.route == "gradsolve-batched"
    scale = float(jnp.max(jnp.abs(sol_x.ys)))
    np.testing.assert_allclose(sol.ys, sol_x.ys, rtol=1e-10, atol=1e-13 * scale)
    np.testing.assert_allclose(sol.y1, sol_x.y1, rtol=1e-10, atol=1e-13 * scale)
    # The error estimate is a difference of close solutions: rounding shows sooner.
    np.testing.assert_allclose(sol.error_ratio, sol_x.error_ratio, rtol=1e-6)
    for g, gx in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_x)):
        np.testing.assert_allclose(g, gx, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(gx))))
    if with_ts:
        assert np.abs(np.asarray(grads[2])[:, 1:-1]).max() > 0


def test_robertson_gradient_against_central_differences():
    """The kernel's discrete adjoint is the derivative of the fixed-mesh replay: central
    differences of that replay in log k and y0 agree to ~1e-5 relative."""
    f, y0, p, ts, w, mesh = _record("robertson", gs.Rodas5P(), n=3)
    keys = ("k1", "k2", "k3")

    @jax.jit
    def loss(logk, y):
        q = {k: jnp.exp(logk[:, i]) for i, k in enumerate(keys)}
        ys = gs.replay(f, mesh, y, q, driver=KERNEL).ys
        return jnp.sum(jnp.log(jnp.abs(ys[:, :, 1]))) + jnp.sum(ys[:, :, 0] * ys[:, :, 2])

    logk = jnp.log(jnp.stack([p[k] for k in keys], axis=1))
    y = y0.at[:, 1].set(1e-6)
    g_k, g_y = jax.grad(loss, argnums=(0, 1))(logk, y)

    def central(x, g, step, fn):
        fd = np.zeros(x.size)
        for i in range(x.size):
            e = np.zeros(x.size)
            e[i] = step(np.asarray(x).reshape(-1)[i])
            e = jnp.asarray(e.reshape(x.shape))
            fd[i] = (float(fn(x + e)) - float(fn(x - e))) / (2 * float(e.reshape(-1)[i]))
        np.testing.assert_allclose(np.asarray(g).reshape(-1), fd, rtol=1e-5,
                                   atol=1e-7 * np.abs(fd).max())

    central(logk, g_k, lambda v: 1e-4, lambda x: loss(x, y))
    central(y, g_y, lambda v: 1e-4 * max(abs(v), 1e-3), lambda x: loss(logk, x))


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_kernel_record_matches_xla_record(solver):
    f, t1, y0, p, ts, _ = _robertson(9)
    kw = dict(ts=ts, solver=solver, rtol=RTOL[type(solver).__name__], atol=1e-10)
    mk = gs.record(f, 0.0, t1, y0, p, driver=KERNEL, **kw)
    mx = gs.record(f, 0.0, t1, y0, p, driver=XLA, **kw)
    np.testing.assert_array_equal(mk.status, 0)
    np.testing.assert_array_equal(mk.n_steps, mx.n_steps)
    np.testing.assert_array_equal(mk.n_rejected, mx.n_rejected)
    np.testing.assert_array_equal(mk.save_index, mx.save_index)
    # The same steps; step sizes follow error estimates (differences of close solutions),
    # so the last bits of the first step grow along the controller's sequence.
    np.testing.assert_allclose(mk.times, mx.times, rtol=1e-4)


def test_solve_with_the_kernel_driver():
    f, t1, y0, p, ts, w = _robertson(5)
    kw = dict(ts=ts, solver=gs.Rodas5P(), rtol=1e-7, atol=1e-12)
    sol = gs.solve(f, 0.0, t1, y0, p, driver=KERNEL, **kw)
    ref = gs.solve(f, 0.0, t1, y0, p, driver=XLA, **kw)
    assert sol.route == "gradsolve-kernel"
    np.testing.assert_allclose(sol.ys * w, ref.ys * w, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(jnp.sum(sol.ys, axis=-1), 1.0, rtol=1e-10)  # mass conserved
    # its gradient is the kernel's adjoint on the mesh it recorded
    g = jax.grad(lambda q: jnp.sum(gs.solve(f, 0.0, t1, y0, q, driver=KERNEL, **kw).ys[..., 1]))(p)
    gm = jax.grad(lambda q: jnp.sum(gs.replay(f, sol.mesh, y0, q, driver=KERNEL).ys[..., 1]))(p)
    for k in p:
        np.testing.assert_allclose(g[k], gm[k], rtol=1e-12)
        assert np.all(np.isfinite(g[k])) and np.any(g[k] != 0)


def test_conditions_spread_over_the_kernel_threads():
    """A stiff call's trajectories (a PEtab problem's conditions are the lanes of one call)
    run on a thread per lane group of 8, at most the threads allowed, one where the call
    has at most 8; values and gradients of the record, replay and adjoint on two threads
    equal those on one (each trajectory's arithmetic is the same on any lane and thread)."""
    from gradsolve.drivers.kernel import build
    from gradsolve.drivers.kernel.driver import kernel_target

    f, t1, y0, p, ts, w = _robertson(20)
    prefix = kernel_target(f, gs.Rodas5P(), y0, p).prefix
    assert [build.threads(prefix, 20, k) for k in (1, 2, 3, 8)] == [1, 2, 3, 3]
    assert [build.threads(prefix, n, 8) for n in (1, 8, 9, 16, 17)] == [1, 1, 2, 2, 3]
    kw = dict(ts=ts, solver=gs.Rodas5P(), rtol=1e-7, atol=1e-12)

    def value_and_grad(threads):
        def loss(y, q):
            sol = gs.solve(f, 0.0, t1, y, q, driver=gs.drivers.Kernel(threads=threads), **kw)
            return jnp.sum(jnp.log(jnp.abs(sol.ys * w) + 1e-9))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(y0, p)

    (v1, g1), (v2, g2) = value_and_grad(1), value_and_grad(2)
    np.testing.assert_allclose(v2, v1, rtol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(g2), jax.tree_util.tree_leaves(g1)):
        assert np.all(np.isfinite(b)) and np.any(b != 0)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)


def pk(t, y, p):
    """Absorption and elimination with a zero-order infusion on [p2, p3) (test_events)."""
    rate = jnp.where((t >= p[2]) & (t < p[3]), p[4], 0.0)
    return jnp.stack([-p[0] * y[0], p[0] * y[0] - p[1] * y[1] + rate])


def test_known_time_events_match_the_xla_replay():
    n = 3
    p = jnp.array([1.2, 0.15, 30.0, 32.0, 10.0]) * jnp.array([[1.0], [1.1], [0.9]]) ** jnp.array(
        [1, 1, 0, 0, 1])
    dose_t = jnp.array([0.0, 12.0, 24.0])
    dose = jnp.array([100.0, 100.0, 50.0])
    sizes = lambda d: jnp.stack([d, jnp.zeros_like(d)], axis=-1)
    y0 = jnp.zeros((n, 2))
    ts = jnp.array([1.0, 6.0, 12.0, 13.0, 25.0, 31.0, 40.0])
    mesh = gs.record(pk, 0.0, 48.0, y0, p, ts=ts, jumps=(dose_t, sizes(dose)),
                     tstops=jnp.array([30.0, 32.0]), solver=gs.Rodas5P(), rtol=1e-8,
                     atol=1e-10, driver=XLA)

    def loss(driver):
        def fn(d, q, dt):
            sol = gs.replay(pk, mesh, y0, q, jumps=(dt, sizes(d)), driver=driver)
            return jnp.sum(sol.ys[..., 1] * jnp.linspace(1, 2, ts.shape[0])) + \
                0.1 * jnp.sum(sol.ys[..., 0]), sol
        return jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)

    # dose times moved off the recorded ones (not at t0), each a node of the mesh
    dt_moved = jnp.tile(dose_t + jnp.array([0.0, 1e-3, -1e-3]), (n, 1))
    (_, sol), g = loss(KERNEL)(dose, p, dt_moved)
    (_, sol_x), gx = loss(XLA)(dose, p, dt_moved)
    assert np.abs(np.asarray(g[2])[:, 1:]).min() > 0  # the dose times' gradient
    assert sol.route == "gradsolve-kernel"
    np.testing.assert_allclose(sol.ys, sol_x.ys, rtol=1e-10, atol=1e-10)
    for a, b in zip(g, gx):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.slow  # ~18 s; the Rodas5P kernel's values and adjoint against the XLA replay in
# the normal suite: test_kernel_matches_xla_replay_values_and_gradients[robertson-Rodas5P]
def test_a_step_split_over_several_lane_loops(monkeypatch):
    """Past `CHUNK` statements a lane's step runs as several loops, the values crossing
    them through lane buffers (larger fields: Boehm's 8 states make ~10 loops per sweep);
    forced here on Robertson, record, replay and adjoint."""
    from gradsolve.drivers.kernel import rosenbrock_source

    monkeypatch.setattr(rosenbrock_source, "CHUNK", 60)
    f = lambda t, y, p: robertson(t, y, p)  # another field: a kernel of its own
    _, t1, y0, p, ts, w = _robertson(5)
    kw = dict(ts=ts, solver=gs.Rodas5P(), rtol=1e-6, atol=1e-10)
    mk = gs.record(f, 0.0, t1, y0, p, driver=KERNEL, **kw)
    mx = gs.record(f, 0.0, t1, y0, p, driver=XLA, **kw)
    np.testing.assert_array_equal(mk.n_steps, mx.n_steps)
    loss = lambda drv: jax.value_and_grad(
        lambda y, q: jnp.sum(gs.replay(f, mx, y, q, driver=drv).ys * w), argnums=(0, 1))
    (v, g), (vx, gx) = loss(KERNEL)(y0, p), loss(XLA)(y0, p)
    np.testing.assert_allclose(v, vx, rtol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(gx)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(b))))


class _OwnStep(gs.Rodas5P):
    """Rodas5P with a ``step`` of its own (the same arithmetic): translated whole, not in
    loop form."""

    def step(self, f, t0, h, y0, params, state):
        return super().step(f, t0, h, y0, params, state)


def test_where_the_kernel_refuses_a_rosenbrock_method():
    """Rodas5P and Rosenbrock23 run in loop form on any number of states; a method with a
    step of its own is translated whole, and refused past `ROSENBROCK_MAX_STATES`."""
    from gradsolve.drivers.kernel.rosenbrock_source import loop_kind

    assert [loop_kind(s) for s in (*SOLVERS, _OwnStep())] == [0, 1, None]
    d = ROSENBROCK_MAX_STATES + 1
    f = lambda t, y, p: -p * y
    y0, p = jnp.ones((2, d)), jnp.ones((2, d))
    reason = KERNEL.replay_reason(f, _OwnStep(), y0, p)
    assert f"up to {ROSENBROCK_MAX_STATES} states" in reason and "_OwnStep" in reason
    with warnings.catch_warnings():  # Auto passes the kernel over without a warning
        warnings.simplefilter("error")
        auto = gs.drivers.Auto()
        assert auto.choose("replay", f, _OwnStep(), y0, p).name == "gradsolve-batched"
        assert auto.explain("replay", f, _OwnStep(), y0, p).startswith(
            f"gradsolve-batched: gradsolve-kernel passed over: {reason}")
    assert KERNEL.replay_reason(f, gs.Tsit5(), y0, p) is None  # explicit solvers: any size


def test_a_jacobian_too_large_to_translate_is_refused_early():
    """A stiff field whose Jacobian's column groups (one forward-mode pass each) form arrays
    past the translator's limits (a PEtab model of 504 states: 4,602 nonzeros in 145
    groups; here 64 states coupled densely: 64 groups of 64) is refused, with the counts
    and what is missing, once ``f`` is translated: no build starts, Auto takes the XLA
    replay without a warning about the field."""
    d = 64
    f = lambda t, y, p: p * y - y * jnp.sum(y) / d  # every state reaches every output
    y0, p = jnp.full((2, d), 0.5), jnp.ones((2, d))
    reason = KERNEL.replay_reason(f, gs.Rodas5P(), y0, p)
    assert reason is not None
    for what in ("64 states", "4,096 structural nonzeros in 64 column groups",
                 "an array of 4,160 entries", "4,096 entries an array",
                 "no translation of the Jacobian group by group"):
        assert what in reason, reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto = gs.drivers.Auto()
        assert auto.choose("replay", f, gs.Rodas5P(), y0, p).name == "gradsolve-batched"


def chain(t, y, k):
    """A chain of ``d`` states, the first fed by the last (``2 d`` Jacobian nonzeros),
    non-autonomous through a forcing of the first."""
    prev = jnp.roll(y, 1)
    force = jnp.zeros_like(y).at[0].set(0.1 * jnp.sin(3.0 * t))
    return k[:-1] * prev / (1.0 + prev) - k[1:] * y + force


@pytest.mark.slow  # a kernel build of its own (~10 s of compiler CPU); the loop form against
# the XLA replay in the normal suite: robertson-Rodas5P above
@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_more_states_than_the_old_limit(solver):
    """A 12-state chain (past the 10 states the unrolled step allowed), stiff rates
    spread over four decades: values and gradients w.r.t. y0, the rates and the save times
    equal the XLA replay's on one mesh."""
    d, n = 12, 3
    k = jnp.logspace(-1, 3, d + 1)[None] * (1 + 0.1 * jnp.arange(n))[:, None]
    y0 = jnp.ones((n, d)) * jnp.linspace(0.5, 1.5, d)
    ts = jnp.linspace(0.2, 2.0, 5)
    mesh = gs.record(chain, 0.0, 2.0, y0, k, ts=ts, solver=solver,
                     rtol=RTOL[type(solver).__name__], atol=1e-10, driver=XLA)
    ts_b = jnp.broadcast_to(ts, (n, ts.shape[0]))
    w = jnp.linspace(1.0, 2.0, d)

    def loss(driver):
        def fn(y, q, t):
            sol = gs.replay(chain, mesh, y, q, ts=t, driver=driver)
            return jnp.sum(jnp.sin(sol.ys * w)) + jnp.sum(sol.y1 ** 2), sol
        return jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)

    (v, sol), g = loss(KERNEL)(y0, k, ts_b)
    (vx, sol_x), gx = loss(XLA)(y0, k, ts_b)
    assert sol.route == "gradsolve-kernel"
    np.testing.assert_allclose(sol.ys, sol_x.ys, rtol=1e-10, atol=1e-13)
    for a, b in zip(g, gx):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(b))))


def test_a_singular_w_gives_a_nan_row_not_a_number():
    """A step whose W = I / gamma - h J is exactly singular (``h gamma J`` has the
    eigenvalue 1) cannot be taken: that trajectory's values past it are NaN and its error
    ratio infinite, never a finite wrong number; the other trajectories are untouched. The
    record meets such a step as a rejected one (its error estimate is not finite) and
    shrinks it, so it solves the same problem."""
    import equinox as eqx

    f = lambda t, y, p: p * y  # J = p: W = 1 / gamma - h p
    y0 = jnp.ones((3, 1))
    p = jnp.array([[0.5], [1.0], [0.7]])
    ts = jnp.array([0.5, 1.0])
    mesh = gs.record(f, 0.0, 1.0, y0, p, ts=ts, solver=gs.Rodas5P(), driver=XLA)
    # A uniform mesh of 8 steps (h = 1/8 exactly, so h * 8 / gamma is exactly 1 / gamma)
    N, width = 8, mesh.times.shape[1]
    assert width > N
    grid = jnp.concatenate([jnp.linspace(0.0, 1.0, N + 1), jnp.ones(width - N - 1)])
    mesh = eqx.tree_at(lambda m: (m.times, m.n_steps, m.save_index), mesh,
                       (jnp.tile(grid, (3, 1)), jnp.full((3,), N, mesh.n_steps.dtype),
                        jnp.tile(jnp.array([N // 2, N], mesh.save_index.dtype), (3, 1))))
    q = (1.0 / gs.Rodas5P.gamma) * N
    p_sing = p.at[1, 0].set(q)
    sol = gs.replay(f, mesh, y0, p_sing, driver=KERNEL)
    ref = gs.replay(f, mesh, y0, p_sing, driver=XLA)
    assert sol.route == "gradsolve-kernel"
    assert np.all(np.isnan(sol.ys[1])) and np.all(np.isnan(sol.y1[1]))
    assert sol.error_ratio[1] == np.inf
    for r in (0, 2):
        np.testing.assert_allclose(sol.ys[r, :, 0], np.exp(p[r, 0] * ts), rtol=1e-4)
        np.testing.assert_allclose(sol.ys[r], ref.ys[r], rtol=1e-12)
    g = jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q, driver=KERNEL).ys))(p_sing)
    assert np.isnan(g[1, 0]) and np.all(np.isfinite(g[::2]))
    # the record of the same problem steps around it
    rec = gs.record(f, 0.0, 1.0, y0, p_sing, ts=ts, solver=gs.Rodas5P(), driver=KERNEL)
    np.testing.assert_array_equal(rec.status, 0)
    np.testing.assert_allclose(gs.replay(f, rec, y0, p_sing, driver=KERNEL).y1[:, 0],
                               np.exp(p_sing[:, 0]), rtol=1e-5)


@pytest.mark.slow
def test_forward_mode_second_order_vmap_and_float32():
    f, y0, p, ts, w, mesh = _record("forced_vdp", gs.Rodas5P(), n=3)
    loss = lambda q: jnp.sum(gs.replay(f, mesh, y0, q, driver=KERNEL).ys ** 2)
    loss_x = lambda q: jnp.sum(gs.replay(f, mesh, y0, q, driver=XLA).ys ** 2)
    for tr in (jax.jacfwd, jax.hessian, lambda fn: jax.vmap(jax.grad(fn))):
        arg = jax.tree_util.tree_map(lambda x: jnp.stack([x, 1.01 * x]), p) \
            if tr not in (jax.jacfwd, jax.hessian) else p
        out, ref = tr(loss)(arg), tr(loss_x)(arg)
        for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * float(jnp.max(jnp.abs(b))))
    # float32
    f, t1, y0, p, ts, w = _robertson(5)
    p32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), p)
    y32 = y0.astype(jnp.float32)
    mesh = gs.record(f, 0.0, t1, y32, p32, ts=ts.astype(jnp.float32), solver=gs.Rodas5P(),
                     rtol=1e-4, atol=1e-7, driver=XLA)
    g = lambda drv: jax.grad(
        lambda q: jnp.sum(gs.replay(f, mesh, y32, q, driver=drv).ys[..., 0]))(p32)
    sol = gs.replay(f, mesh, y32, p32, driver=KERNEL)
    assert sol.ys.dtype == jnp.float32 and sol.route == "gradsolve-kernel"
    np.testing.assert_allclose(sol.ys, gs.replay(f, mesh, y32, p32, driver=XLA).ys, rtol=1e-4,
                               atol=1e-6)
    gk, gx = g(KERNEL), g(XLA)
    for k in p32:
        np.testing.assert_allclose(gk[k], gx[k], rtol=1e-3)
