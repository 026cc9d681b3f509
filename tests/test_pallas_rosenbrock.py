"""Rosenbrock methods (`gs.Rodas5P`, `gs.Rosenbrock23`) in the Pallas kernels, run through
the Pallas interpreter in float64 (``Pallas(interpret=True)``: the kernels of the chip, on
CPU), against independent references: the XLA record and replay (`gs.drivers.Batched`,
LAPACK's LU and JAX's derivatives) on the same mesh, a closed-form solution, and
``scipy.linalg.lu_factor`` for the unrolled factorisation. Compiles are the cost (tens of
seconds per kernel), so each test checks several things on one compiled program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import gradsolve as gs
from gradsolve.drivers.pallas import _rosenbrock
from gradsolve.drivers.lanes import LaneArray

PALLAS = gs.drivers.Pallas(interpret=True)
BATCHED = gs.drivers.Batched()


def robertson(t, y, p):
    r1, r2, r3 = p[0] * y[0], p[1] * y[1] ** 2, p[2] * y[1] * y[2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


def _robertson(n=4):
    rng = np.random.default_rng(0)
    p = jnp.asarray(np.array([0.04, 3e7, 1e4]) * (1 + 0.2 * (rng.random((n, 3)) - 0.5)))
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), (n, 1))
    return y0, p, jnp.geomspace(1e-2, 100.0, 5)


def linear(t, y, p):
    """A fast mode ``p[0]`` (~1e3) fed by a slow one ``p[1]`` (~1): stiff, linear."""
    return jnp.stack([-p[0] * y[0] + p[1] * y[1], -p[1] * y[1]])


def linear_exact(t, y0, p):
    """`linear`'s solution at times ``t``."""
    e0, e1 = jnp.exp(-p[0] * t), jnp.exp(-p[1] * t)
    return jnp.stack([y0[0] * e0 + p[1] * y0[1] * (e1 - e0) / (p[0] - p[1]), y0[1] * e1], -1)


def _max_rel(a, b) -> float:
    out = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-300))
        out = max(out, rel if np.isfinite(rel) else np.inf)
    return out


def test_unrolled_lu_pivots_as_lapack():
    """`lu_factor` on lanes (one matrix per lane, rows needing each pivot choice: a zero
    diagonal, ties, a singular one) gives LAPACK's factors and pivots (scipy's
    ``lu_factor``) to rounding, and `lu_solve` the solution of ``W x = b``."""
    rng = np.random.default_rng(1)
    d, n = 4, 64
    a = rng.normal(size=(n, d, d)) * 10.0 ** rng.integers(-3, 4, size=(n, d, d))
    a[0, 0, 0] = 0.0                       # a zero pivot candidate
    a[1, :, 0] = [2.0, -2.0, 2.0, 1.0]     # ties: the first row of largest magnitude
    a[2] = np.triu(a[2]) + np.eye(d)       # no swaps at all
    b = rng.normal(size=(n, d))
    entries = [[jnp.asarray(a[:, i, j]) for j in range(d)] for i in range(d)]
    lu, swaps, inv = _rosenbrock.lu_factor(entries)
    x = _rosenbrock.lu_solve((lu, swaps, inv), LaneArray(jnp.asarray(b[:, i]) for i in range(d)))
    lu = np.moveaxis(np.asarray(lu), -1, 0)                    # (n, d, d)
    x = np.stack([np.asarray(r) for r in x.rows], 1)            # (n, d)
    # the row exchanged with row k (LAPACK's pivot index), from the masks
    piv = np.stack([k + np.max(np.stack([np.zeros(n, int)] + [
        np.asarray(sel) * (r + 1) for r, sel in enumerate(masks)]), axis=0)
        for k, masks in enumerate(swaps)], 1)                   # (n, d - 1)
    for m in range(n):
        ref_lu, ref_piv = scipy.linalg.lu_factor(a[m])
        np.testing.assert_allclose(lu[m], ref_lu, rtol=1e-12, atol=1e-12 * np.abs(ref_lu).max())
        np.testing.assert_array_equal(piv[m], ref_piv[:d - 1])
        np.testing.assert_allclose(x[m], np.linalg.solve(a[m], b[m]), rtol=1e-9)
    # a singular W: a non-finite solution (the record rejects such a step), not a wrong one
    sing = [[jnp.ones(1), jnp.ones(1)], [jnp.ones(1), jnp.ones(1)]]
    x = _rosenbrock.lu_solve(_rosenbrock.lu_factor(sing), LaneArray([jnp.ones(1), jnp.zeros(1)]))
    assert not np.all(np.isfinite(np.asarray(x.rows)))


@pytest.mark.parametrize("solver", [gs.Rodas5P(), gs.Rosenbrock23()])
def test_block_step_equals_the_solvers_step(solver):
    """One step on blocks (`BlockRosenbrock`, outside any kernel: ``(n,)`` lanes, run
    eagerly: XLA:CPU compiles its unrolled reverse step slowly) equals the solver's own
    step (``jax.vmap``, LAPACK's LU) on Robertson, from states along a trajectory and with
    step sizes from tiny to stiff: values, error estimates and their VJP w.r.t. the
    state, the rates, ``t0`` and ``h``. A zero step is an identity."""
    from gradsolve.drivers.pallas._field import kernel_solver, pallas_field

    n = 12
    rng = np.random.default_rng(4)
    _, p, _ = _robertson(n)
    y = jnp.asarray(np.stack([1 - 1e-2 * rng.random(n), 3e-5 * rng.random(n),
                              1e-2 * rng.random(n)], 1))
    t0 = jnp.asarray(rng.random(n))
    h = jnp.asarray(10.0 ** rng.uniform(-6, 1, n)).at[0].set(0.0)
    field = pallas_field(robertson, solver, y, p).field
    block = kernel_solver(solver)

    def ours(t0, h, y, q):
        y1, err, _ = block.step(field, t0, h, LaneArray.from_matrix(y),
                                LaneArray.from_matrix(q), None)
        return y1.matrix(), err.matrix()

    def xla(t0, h, y, q):
        return jax.vmap(lambda a, b, c, e: solver.step(robertson, a, b, c, e, None)[:2])(
            t0, h, y, q)

    out, back = jax.vjp(ours, t0, h, y, p)
    ref, back_ref = jax.vjp(xla, t0, h, y, p)
    assert _max_rel(out, ref) <= 1e-12
    np.testing.assert_array_equal(np.asarray(out[0][0]), np.asarray(y[0]))  # h = 0
    ct = (jnp.asarray(rng.normal(size=(n, 3))), jnp.asarray(rng.normal(size=(n, 3))))
    for g, g_ref in zip(back(ct), back_ref(ct)):
        assert _max_rel(g, g_ref) <= 1e-10


def test_reasons_and_auto_for_rosenbrock(monkeypatch):
    """Rodas5P and Rosenbrock23 run in the kernels up to `MAX_STATES` states; past that,
    or with a step of its own, the reason names it, and `Auto` on a TPU takes the batched
    XLA driver, saying why (`Auto.explain`)."""
    y0, p = jnp.ones((3, 3)), jnp.ones((3, 3))
    for solver in (gs.Rodas5P(), gs.Rosenbrock23()):
        assert PALLAS.replay_reason(robertson, solver, y0, p) is None
        assert PALLAS.record_reason(robertson, solver, y0, p, events=True) is None
    big = _rosenbrock.MAX_STATES + 1
    wide = lambda t, y, q: -q[0] * y
    reason = PALLAS.replay_reason(wide, gs.Rodas5P(), jnp.ones((3, big)), p)
    assert f"at most {_rosenbrock.MAX_STATES} states; this system has {big}" in reason

    class OwnStep(gs.Rodas5P):
        def step(self, f, t0, h, y0, params, state):
            return super().step(f, t0, h, y0, params, state)

    assert "has a step of its own" in PALLAS.replay_reason(robertson, OwnStep(), y0, p)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    f32 = jnp.float32
    for kind in ("record", "replay"):
        chosen = gs.drivers.Auto().choose(kind, robertson, gs.Rodas5P(), y0.astype(f32),
                                          p.astype(f32))
        assert isinstance(chosen, gs.drivers.Pallas)
        assert isinstance(gs.drivers.Auto().choose(kind, wide, gs.Rodas5P(),
                                                   jnp.ones((3, big), f32), p.astype(f32)),
                          gs.drivers.Batched)
        why = gs.drivers.Auto().explain(kind, wide, gs.Rodas5P(), jnp.ones((3, big), f32),
                                        p.astype(f32))
        assert why.startswith("gradsolve-batched:") and f"this system has {big}" in why


def _replay_grads(f, mesh, y0, p, ts, driver):
    """The replay's outputs and the gradient of a loss of them w.r.t. ``y0``, the
    parameters and the (moved) save times."""
    def loss(y, q, tt):
        s = gs.replay(f, mesh, y, q, ts=tt, driver=driver)
        return jnp.sum(jnp.log(s.ys ** 2 + 1e-30)) + jnp.sum(s.y1 ** 2), (s.ys, s.y1,
                                                                          s.error_ratio)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(y0, p, ts)


def _check_record_and_replay(f, solver, y0, p, ts, t1, rtol, atol):
    """The Pallas record takes the XLA record's steps; on its mesh the Pallas replay's
    values and gradients equal the XLA replay's to 1e-10. Returns the mesh."""
    kw = dict(ts=ts, rtol=rtol, atol=atol, max_steps=256, solver=solver)
    ref = gs.record(f, 0.0, t1, y0, p, driver=BATCHED, **kw)
    mesh = gs.record(f, 0.0, t1, y0, p, driver=PALLAS, **kw)
    for name in ("n_steps", "n_rejected", "status", "save_index"):
        np.testing.assert_array_equal(np.asarray(getattr(mesh, name)),
                                      np.asarray(getattr(ref, name)), err_msg=name)
    assert np.all(np.asarray(mesh.status) == 0)
    # the same steps, at times equal to rounding: the error estimate (an increment that
    # cancels digits; near rounding level where a step is far below the tolerance) moves
    # the next step size with the last bits of the LU (seen: 3e-7 on the linear problem)
    np.testing.assert_allclose(np.asarray(mesh.times), np.asarray(ref.times), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mesh.y_last), np.asarray(ref.y_last), rtol=1e-7,
                               atol=1e-12)
    (_, (ys, y1, err)), grads = _replay_grads(f, mesh, y0, p, ts, PALLAS)
    (_, (ys_x, y1_x, err_x)), grads_x = _replay_grads(f, mesh, y0, p, ts, BATCHED)
    assert _max_rel((ys, y1), (ys_x, y1_x)) <= 1e-10
    assert _max_rel(err, err_x) <= 1e-8 and np.all(np.asarray(err) <= 1.0)  # the mesh holds
    for g, g_x in zip(grads, grads_x):
        assert _max_rel(g, g_x) <= 1e-10
        assert np.any(np.asarray(g) != 0)
    return mesh, ys, grads


# ~25 s of CPU in interpret mode (two minutes on a busy 2-core machine); the step itself
# (test_block_step_equals_the_solvers_step) and Rosenbrock23 in the kernels
# (test_rosenbrock_on_a_linear_stiff_problem) stay in the normal suite
@pytest.mark.slow
def test_rodas5p_on_robertson_equals_xla():
    """Robertson (3 states, stiff, rates spread +-10 %), Rodas5P: the Pallas record's
    mesh is the XLA record's; on it the Pallas replay's states, error ratios and
    gradients w.r.t. y0, the rates and the save times equal the XLA replay's."""
    y0, p, ts = _robertson()
    mesh, ys, _ = _check_record_and_replay(robertson, gs.Rodas5P(), y0, p, ts, 100.0,
                                           1e-4, 1e-8)
    assert int(np.max(np.asarray(mesh.n_rejected))) > 0  # rejected steps were replayed out
    np.testing.assert_allclose(np.asarray(jnp.sum(ys, axis=-1)), 1.0, rtol=1e-9)  # mass


@pytest.mark.slow
def test_rosenbrock23_on_robertson_equals_xla():
    y0, p, ts = _robertson()
    _check_record_and_replay(robertson, gs.Rosenbrock23(), y0, p, ts, 100.0, 1e-3, 1e-8)


@pytest.mark.parametrize("solver, rtol, close", [
    (gs.Rosenbrock23(), 1e-4, 1e-2), pytest.param(gs.Rodas5P(), 1e-6, 1e-5,
                                                  marks=pytest.mark.slow)])
def test_rosenbrock_on_a_linear_stiff_problem(solver, rtol, close):
    """A linear 2-state problem with rates ~1e3 and ~1: the Pallas record and replay equal
    the XLA ones, and its states and gradients (w.r.t. y0, the rates and the save times)
    agree with the closed form's within ``close`` (the solver's accuracy at ``rtol``)."""
    n = 4
    rng = np.random.default_rng(2)
    p = jnp.asarray(np.stack([rng.uniform(5e2, 2e3, n), rng.uniform(0.5, 2.0, n)], 1))
    y0 = jnp.asarray(rng.uniform(0.5, 1.5, (n, 2)))
    ts = jnp.array([0.01, 0.5, 1.0, 3.0])
    _, ys, grads = _check_record_and_replay(linear, solver, y0, p, ts, 3.0, rtol, rtol * 1e-3)
    exact = jax.vmap(lambda y, q: linear_exact(ts, y, q))(y0, p)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(exact), rtol=close)

    def exact_loss(y, q, tt):
        e = jax.vmap(lambda a, b: linear_exact(tt, a, b))(y, q)
        e1 = jax.vmap(lambda a, b: linear_exact(jnp.array([3.0]), a, b)[0])(y, q)
        return jnp.sum(jnp.log(e ** 2 + 1e-30)) + jnp.sum(e1 ** 2)

    ref = jax.grad(exact_loss, argnums=(0, 1, 2))(y0, p, ts)
    for g, r in zip(grads, ref):
        assert _max_rel(g, r) <= close


def test_rosenbrock_kernels_lower_for_the_chip():
    """The Rodas5P record, replay and adjoint kernels in float32 lower to Mosaic for a TPU
    (checked without one: JAX lowers Pallas TPU kernels on any host)."""
    from gradsolve.drivers.base import ReplayLayout, ReplayNodes
    from gradsolve.drivers.pallas._field import pallas_field
    from gradsolve.drivers.pallas._record import pallas_record
    from gradsolve.drivers.pallas._replay import pallas_replay

    n, k, s1, f32 = 300, 5, 33, jnp.float32
    y0, p = jnp.ones((n, 3), f32), jnp.ones((n, 3), f32)
    solver = gs.Rodas5P()
    field = pallas_field(robertson, solver, y0, p).field
    times = jnp.tile(jnp.linspace(0.0, 1.0, s1, dtype=f32), (n, 1))
    save = jnp.tile(jnp.arange(k, dtype=jnp.int32) * 8, (n, 1))
    nodes = ReplayNodes(times, jnp.full((n,), s1 - 1, jnp.int32), save, times[:, :k] * 1,
                        jnp.ones((n, k), bool))

    def grad(y, q, tm):
        def loss(y, q, tm):
            out = pallas_replay(field, robertson, solver, nodes._replace(tsave=tm), y, q,
                                1e-4, 1e-8, True, ReplayLayout(None, 8, "tpu"), False)
            return jnp.sum(out.ys ** 2)
        return jax.grad(loss, argnums=(0, 1, 2))(y, q, tm)

    def record(y, q):
        return pallas_record(field, robertson, solver, gs.PIDController(), f32(0.0),
                             f32(1.0), y, q, times[:, :k], f32(1e-4), f32(1e-8), None, 64,
                             False, False).times

    for fn, args in ((grad, (y0, p, times[:, :k])), (record, (y0, p))):
        try:
            text = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
        except ValueError as e:  # a lowering rule that asks the (absent) chip its version
            if "TPU device kind" in str(e):
                pytest.skip(f"this JAX lowers a rule only on a TPU: {e}")
            raise
        assert "tpu_custom_call" in text


def oral(t, y, p):
    """Absorption from a depot into a central compartment, with a zero-order input into it
    from ``p["on"]`` to ``p["off"]`` (tstops there)."""
    rate = jnp.where((t >= p["on"]) & (t < p["off"]), 2.0, 0.0)
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["k"] * y[1] + rate])


# ~100 s in interpret mode on a busy 2-core machine; events on the explicit kernels:
# tests/test_pallas.py, Rosenbrock steps in the kernels: the tests above
@pytest.mark.slow
def test_rodas5p_with_doses_jumps_and_tstops_equals_xla():
    """Rodas5P with boluses, jumps of one's own (one at t0, one at a save time) and
    tstops: the Pallas record takes the XLA record's steps, jumps and tstops; on its mesh
    the Pallas replay's values and gradients (y0, parameters, save times, jump times and
    sizes, dose times and amounts) equal the XLA replay's."""
    n = 4
    rng = np.random.default_rng(2)
    p = {"ka": jnp.asarray(rng.uniform(0.8, 1.5, n)), "k": jnp.asarray(rng.uniform(0.1, 0.4, n)),
         "on": jnp.full((n,), 15.0), "off": jnp.full((n,), 17.0)}
    y0 = jnp.asarray(rng.random((n, 2)))
    ts = jnp.array([0.0, 3.5, 9.0, 15.5, 24.0])
    bt = jnp.asarray(np.stack([rng.uniform(0.2, 1.0, n), rng.uniform(8.2, 8.8, n)], 1))
    ba = jnp.asarray(rng.uniform(100, 300, (n, 2)))
    jt = jnp.tile(jnp.array([0.0, 9.0]), (n, 1))
    js = jnp.asarray(rng.uniform(1, 5, (n, 2, 2)))

    def doses(bt, ba):
        return [gs.Bolus(time=bt, amount=ba, cmt=0)]

    kw = dict(tstops=jnp.array([15.0, 17.0]), rtol=1e-6, atol=1e-6, solver=gs.Rodas5P())
    mesh, ref = (gs.record(oral, 0.0, 24.0, y0, p, ts=ts, doses=doses(bt, ba), jumps=(jt, js),
                           driver=driver, **kw) for driver in (PALLAS, BATCHED))
    for name in ("n_steps", "n_rejected", "status", "save_index", "jump_index", "tstop_index"):
        np.testing.assert_array_equal(np.asarray(getattr(mesh, name)),
                                      np.asarray(getattr(ref, name)), err_msg=name)
    # same steps; times to rounding, as in _check_record_and_replay (seen: 5e-8)
    np.testing.assert_allclose(np.asarray(mesh.times), np.asarray(ref.times), rtol=1e-6)

    def run(driver):
        def loss(y, q, tt, a, b, bt, ba):
            s = gs.replay(oral, mesh, y, q, ts=tt, jumps=(a, b), doses=doses(bt, ba),
                          driver=driver)
            return jnp.sum(jnp.sin(s.ys / 30)) + jnp.sum((s.y1 / 30) ** 2), (s.ys, s.y1)

        return jax.jit(jax.value_and_grad(loss, argnums=range(7), has_aux=True))(
            y0, p, ts, jt, js, bt, ba)

    (_, out), grads = run(PALLAS)
    (_, out_x), grads_x = run(BATCHED)
    assert _max_rel(out, out_x) <= 1e-10
    for g, g_x in zip(grads, grads_x):
        assert _max_rel(g, g_x) <= 1e-10
