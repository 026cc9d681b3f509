"""SPEC §8.1: known-time events (``jumps=``, ``tstops=``) on record, replay and solve.

The reference is a linear two-compartment oral PK model, ``a_gut' = -ka a_gut``,
``a_c' = ka a_gut - ke a_c + r(t)``, with boluses into the gut and a zero-order infusion
``r`` into the central compartment: its closed form is a superposition of Bateman
functions and the infusion formula, independent of any solver.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import kernel_builds

T0, T1 = 0.0, 48.0
TOL = dict(rtol=1e-10, atol=1e-10)
P = jnp.array([1.0, 0.2, 30.0, 32.0, 5.0])  # ka, ke, infusion on, off, rate
Y0 = jnp.zeros(2)
DOSE_T = jnp.array([0.0, 12.0, 24.0])
DOSE = jnp.array([100.0, 100.0, 50.0])
TSTOPS = jnp.array([30.0, 32.0])
# Save times equal to dose times (0, 12, 24) read the state before the dose.
TS = jnp.array([0.0, 1.0, 6.0, 12.0, 13.0, 20.0, 24.0, 25.0, 31.0, 33.0, 40.0, 48.0])
TS_GRAD = jnp.array([1.0, 6.0, 13.0, 20.0, 25.0, 31.0, 33.0, 40.0, 48.0])
W = jnp.linspace(1.0, 2.0, TS_GRAD.shape[0])


def pk(t, y, p):
    rate = jnp.where((t >= p[2]) & (t < p[3]), p[4], 0.0)
    return jnp.stack([-p[0] * y[0], p[0] * y[0] - p[1] * y[1] + rate])


def gut_sizes(d):
    return jnp.stack([d, jnp.zeros_like(d)], axis=-1)


def closed_form(ts, dose_t, dose, p):
    """``(k, 2)`` amounts at ``ts``; a dose at ``tau`` counts for ``t > tau`` only (a save
    time equal to a dose time reads the state before it). Padded doses (``inf``) are inert."""
    ka, ke, on, off, rate = p
    dt = ts[:, None] - dose_t[None, :]
    after = dt > 0
    dts = jnp.where(after, dt, 0.0)
    gut = jnp.sum(jnp.where(after, dose * jnp.exp(-ka * dts), 0.0), axis=1)
    bateman = dose * ka / (ka - ke) * (jnp.exp(-ke * dts) - jnp.exp(-ka * dts))
    central = jnp.sum(jnp.where(after, bateman, 0.0), axis=1)
    during = rate / ke * (1 - jnp.exp(-ke * jnp.clip(ts - on, 0.0, off - on)))
    infusion = jnp.where(ts <= off, during, during * jnp.exp(-ke * jnp.maximum(ts - off, 0.0)))
    return jnp.stack([gut, central + infusion], axis=1)


def loss_closed(dose_t, dose, p):
    ys = closed_form(TS_GRAD, dose_t, dose, p)
    return jnp.sum(W * ys[:, 1]) + 0.1 * jnp.sum(W * ys[:, 0])


def loss_of(ys):
    return jnp.sum(W * ys[:, 1]) + 0.1 * jnp.sum(W * ys[:, 0])


@pytest.fixture(scope="module")
def grad_mesh():
    return gs.record(pk, T0, T1, Y0, P, ts=TS_GRAD, jumps=(DOSE_T, gut_sizes(DOSE)),
                     tstops=TSTOPS, **TOL)


@pytest.fixture(scope="module")
def obs_mesh():
    """Save times at the dose times too."""
    return gs.record(pk, T0, T1, Y0, P, ts=TS, jumps=(DOSE_T, gut_sizes(DOSE)), tstops=TSTOPS,
                     **TOL)


# The replay drivers that apply events: the batched driver (JAX's AD through the steps), the
# lanes replay and the compiled kernel (hand-written adjoints); each is checked against the
# closed form.
REPLAY_DRIVERS = [gs.drivers.Batched(), gs.drivers.Lanes()] + (
    [gs.drivers.Kernel()] if kernel_builds() else [])


@pytest.fixture(scope="module", params=REPLAY_DRIVERS, ids=lambda d: d.name)
def driver(request):
    return request.param


def replay_loss(mesh, dose_t, dose, p, driver=None):
    return loss_of(gs.replay(pk, mesh, Y0, p, jumps=(dose_t, gut_sizes(dose)), driver=driver).ys)


@pytest.fixture(scope="module")
def grads(grad_mesh, driver):
    """Reverse-mode gradient of the frozen-mesh loss w.r.t. dose times, doses, params (one
    jitted program: un-jitted, the transform compiles hundreds of small ones)."""
    return jax.jit(jax.grad(lambda t, d, p: replay_loss(grad_mesh, t, d, p, driver),
                            argnums=(0, 1, 2)))(DOSE_T, DOSE, P)


def test_values_match_the_closed_form_with_pre_dose_saves(obs_mesh, driver):
    sol = gs.replay(pk, obs_mesh, Y0, P, jumps=(DOSE_T, gut_sizes(DOSE)), driver=driver)
    assert sol.route == driver.name
    ref = closed_form(TS, DOSE_T, DOSE, P)
    np.testing.assert_allclose(sol.ys, ref, rtol=1e-7, atol=1e-7)
    # Pre-dose trough: at 12 h the gut holds what is left of the first dose, not 100 more.
    assert float(sol.ys[3, 0]) < 1e-3 and float(sol.ys[0, 0]) == 0.0
    np.testing.assert_allclose(sol.y1, ref[-1], rtol=1e-7, atol=1e-7)
    mesh = sol.mesh
    # Each jump owns a node after a node at the same time; tstops are nodes.
    np.testing.assert_array_equal(mesh.times[mesh.jump_index], DOSE_T)
    np.testing.assert_array_equal(mesh.times[mesh.jump_index - 1], DOSE_T)
    np.testing.assert_array_equal(mesh.times[mesh.tstop_index], TSTOPS)
    assert np.all(np.asarray(mesh.save_index)[[0, 3, 6]] < np.asarray(mesh.jump_index))


def test_jump_at_t1_changes_y1_only(driver):
    f = lambda t, y, p: -p * y
    sol = gs.solve(f, 0.0, 1.0, jnp.ones(1), jnp.array(0.5), driver=driver,
                   jumps=(jnp.array([1.0]), jnp.array([[2.0]])), ts=jnp.array([0.5, 1.0]))
    e = np.exp(-0.5)
    np.testing.assert_allclose(sol.ys[:, 0], [np.exp(-0.25), e], rtol=1e-6)
    np.testing.assert_allclose(sol.y1, [e + 2.0], rtol=1e-6)
    # d y1 / d size = 1; d y1 / d y0 = exp(-0.5): the jump adds after the last step.
    g = jax.jit(jax.grad(lambda y0, s: gs.solve(f, 0.0, 1.0, y0, jnp.array(0.5), driver=driver,
                                                jumps=(jnp.array([1.0]), s)).y1[0],
                         argnums=(0, 1)))(jnp.ones(1), jnp.array([[2.0]]))
    np.testing.assert_allclose(g[0], [e], rtol=1e-6)
    np.testing.assert_allclose(g[1], [[1.0]], rtol=1e-12)


def test_gradients_match_closed_form_and_finite_differences(grad_mesh, grads, driver):
    g = grads
    gc = jax.jit(jax.grad(loss_closed, argnums=(0, 1, 2)))(DOSE_T, DOSE, P)
    # the frozen-mesh replay loss, compiled once for all the differences below
    rl = jax.jit(lambda t, d, p: replay_loss(grad_mesh, t, d, p, driver))
    for a, b in zip(g, gc):
        np.testing.assert_allclose(a[:2] if a.shape == (5,) else a, b[:2] if b.shape == (5,)
                                   else b, rtol=1e-6)
    # Central differences of the frozen-mesh replay (moved jump nodes, new parameters).
    h = 1e-5
    fd = lambda fn, x, e: (fn(x + h * e) - fn(x - h * e)) / (2 * h)
    eye3, eye5 = jnp.eye(3), jnp.eye(5)
    for i in (1, 2):  # the dose at t0 can only move forward: one-sided below
        got = fd(lambda x: rl(x, DOSE, P), DOSE_T, eye3[i])
        np.testing.assert_allclose(g[0][i], got, rtol=1e-6)
    one_sided = lambda fn, x, e: (-3 * fn(x) + 4 * fn(x + h * e) - fn(x + 2 * h * e)) / (2 * h)
    got = one_sided(lambda x: rl(x, DOSE, P), DOSE_T, eye3[0])
    np.testing.assert_allclose(g[0][0], got, rtol=1e-6)
    got = fd(lambda x: rl(DOSE_T, x, P), DOSE, eye3[0])
    np.testing.assert_allclose(g[1][0], got, rtol=1e-6)
    for i in (0, 1):  # ka, ke
        got = fd(lambda x: rl(DOSE_T, DOSE, x), P, eye5[i])
        np.testing.assert_allclose(g[2][i], got, rtol=1e-6)


def _ragged():
    inf = jnp.inf
    times = jnp.array([[0.0, 12.0, 24.0], [0.0, 8.0, inf], [6.0, 6.0, inf]])
    doses = jnp.array([[100.0, 100.0, 50.0], [80.0, 60.0, jnp.nan], [40.0, 30.0, 0.0]])
    tstops = jnp.array([[30.0, 32.0], [10.0, 11.0], [inf, inf]])
    p = jnp.array([[1.0, 0.2, 30.0, 32.0, 5.0], [0.7, 0.1, 10.0, 11.0, 2.0],
                   [1.3, 0.3, 99.0, 99.0, 0.0]])
    return times, doses, tstops, p


def test_ragged_ensemble_equals_single_solves():
    times, doses, tstops, p = _ragged()
    tol = dict(rtol=1e-8, atol=1e-8)
    sol = gs.solve(pk, T0, T1, jnp.zeros((3, 2)), p, ts=TS, jumps=(times, gut_sizes(doses)),
                   tstops=tstops, **tol)
    assert sol.route == ("gradsolve-kernel" if kernel_builds() else "gradsolve-lanes")
    counts = [3, 2, 2]
    for i, c in enumerate(counts):
        # Row 0's schedule as given; the others padded the same way (one compiled shape):
        # the closed form below, over the live doses only, shows the padding is inert.
        one = gs.solve(pk, T0, T1, Y0, p[i], ts=TS, jumps=(times[i], gut_sizes(doses[i])),
                       tstops=tstops[i], **tol)
        np.testing.assert_allclose(sol.ys[i], one.ys, rtol=1e-12, atol=1e-12)
        ref = closed_form(TS, times[i, :c], doses[i, :c], p[i])
        np.testing.assert_allclose(sol.ys[i], ref, rtol=1e-5, atol=1e-5)
    # Row 2 unpadded (two doses at one time, no tstops): the same solution.
    one = gs.solve(pk, T0, T1, Y0, p[2], ts=TS, jumps=(times[2, :2], gut_sizes(doses[2, :2])),
                   **tol)
    np.testing.assert_allclose(sol.ys[2], one.ys, rtol=1e-12, atol=1e-12)
    # Row algebra keeps the events with their rows (declared in Mesh.PER_TRAJECTORY).
    rows = jnp.array([2, 0])
    sub = sol.mesh.select(rows)
    for k in ("jump_times", "jump_sizes", "jump_index", "tstops", "tstop_index"):
        np.testing.assert_array_equal(getattr(sub, k), getattr(sol.mesh, k)[rows])
    assert sol.mesh.row(1).jump_index.shape == (3,)
    both = gs.Mesh.concatenate([sol.mesh.select(jnp.array([0])), sol.mesh.select(jnp.array([1, 2]))])
    np.testing.assert_array_equal(both.jump_index, sol.mesh.jump_index)
    with pytest.raises(ValueError, match="jumps"):
        gs.Mesh.union([sol.mesh])


@pytest.mark.parametrize("driver", [d for d in REPLAY_DRIVERS if d != gs.drivers.Batched()],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("moving", [True, False], ids=["times-differentiated", "sizes-only"])
def test_ragged_gradients_agree_between_replay_drivers(driver, moving):
    """Padded (inert, NaN-sized) jumps, two jumps at one time, a jump at t0 and tstops, in
    one ensemble: the hand-written adjoints equal JAX's AD through the batched steps, with
    jump and save times differentiated or held (the adjoint without node-time
    cotangents)."""
    times, doses, tstops, p = _ragged()
    mesh = gs.record(pk, T0, T1, jnp.zeros((3, 2)), p, ts=TS, jumps=(times, gut_sizes(doses)),
                     tstops=tstops, rtol=1e-8, atol=1e-8)

    def loss(driver, jt, d, p, ts):
        sol = gs.replay(pk, mesh, jnp.full((3, 2), 0.5), p, ts=ts, jumps=(jt, gut_sizes(d)),
                        driver=driver)
        return jnp.sum(sol.ys ** 2 * jnp.arange(1.0, 3.0)) + jnp.sum(sol.y1)

    live = jnp.isfinite(times)
    ts = jnp.broadcast_to(TS, (3, TS.shape[0]))
    args = (times, doses, p, ts)
    argnums = (0, 1, 2, 3) if moving else (1, 2)

    def grad(drv):  # jitted over the differentiated arguments only: the others stay concrete
        def fn(*diff):
            full = list(args)
            for i, a in zip(argnums, diff):
                full[i] = a
            return loss(drv, *full)
        return jax.jit(jax.grad(fn, argnums=tuple(range(len(argnums)))))(
            *(args[i] for i in argnums))

    ref = grad(gs.drivers.Batched())
    got = grad(driver)
    for a, b in zip(got, ref):
        a, b = np.where(np.isfinite(b), a, 0.0), np.where(np.isfinite(b), b, 0.0)
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * np.max(np.abs(b)))
    # Padded jumps get zero gradient, their NaN sizes included.
    sizes = got[1] if moving else got[0]
    assert np.all(np.asarray(sizes)[~np.asarray(live)] == 0.0)
    # The forward values too: bitwise where the kernel and lanes run the same arithmetic
    # is not promised, to rounding is.
    a = gs.replay(pk, mesh, jnp.full((3, 2), 0.5), p, ts=ts, jumps=(times, gut_sizes(doses)),
                  driver=driver)
    b = gs.replay(pk, mesh, jnp.full((3, 2), 0.5), p, ts=ts, jumps=(times, gut_sizes(doses)),
                  driver=gs.drivers.Batched())
    assert a.route == driver.name
    np.testing.assert_allclose(a.ys, b.ys, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.y1, b.y1, rtol=1e-12, atol=1e-12)


def test_jit_vmap_and_forward_mode(grad_mesh, grads, driver):
    # gs.solve under jit, differentiated: the value and gradient of the frozen-mesh replay
    # (the mesh it records is the same one).
    solve_loss = lambda t, d: loss_of(gs.solve(pk, T0, T1, Y0, P, ts=TS_GRAD,
                                               jumps=(t, gut_sizes(d)), tstops=TSTOPS,
                                               **TOL).ys)
    value, g = jax.jit(jax.value_and_grad(solve_loss, argnums=(0, 1)))(DOSE_T, DOSE)
    np.testing.assert_allclose(value, replay_loss(grad_mesh, DOSE_T, DOSE, P, driver), rtol=1e-12)
    np.testing.assert_allclose(g[0], grads[0], rtol=1e-10)
    np.testing.assert_allclose(g[1], grads[1], rtol=1e-10)
    # vmap over dose sizes of a frozen-mesh replay: linear in the doses, as it must be.
    rep = lambda d: gs.replay(pk, grad_mesh, Y0, P, jumps=(DOSE_T, gut_sizes(d)),
                              driver=driver).ys
    vm = jax.jit(jax.vmap(rep))(jnp.stack([DOSE, 2 * DOSE, 0 * DOSE]))
    np.testing.assert_allclose(vm[1], 2 * vm[0] - vm[2], rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(loss_of(vm[0]), value, rtol=1e-12)
    # vmap over gs.solve itself (each element records its own mesh).
    ds = jnp.stack([DOSE, 2 * DOSE])
    vs = jax.jit(jax.vmap(lambda d: gs.solve(pk, T0, T1, Y0, P, ts=TS_GRAD,
                                             jumps=(DOSE_T, gut_sizes(d)), tstops=TSTOPS,
                                             **TOL).ys))(ds)
    np.testing.assert_allclose(vs[0], vm[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vs[1], closed_form(TS_GRAD, DOSE_T, 2 * DOSE, P), rtol=1e-7,
                               atol=1e-7)
    # Forward mode (jacfwd) equals reverse mode, for jump times and sizes.
    jf = jax.jit(jax.jacfwd(lambda t, d: loss_of(gs.replay(
        pk, grad_mesh, Y0, P, jumps=(t, gut_sizes(d)), driver=driver).ys),
        argnums=(0, 1)))(DOSE_T, DOSE)
    np.testing.assert_allclose(jf[0], grads[0], rtol=1e-10)
    np.testing.assert_allclose(jf[1], grads[1], rtol=1e-10)


def test_traced_invalid_events_give_status_and_nan(grad_mesh):
    bad_t = jnp.array([0.0, 24.0, 12.0])
    out = jax.jit(lambda t: gs.solve(pk, T0, T1, Y0, P, ts=TS_GRAD,
                                     jumps=(t, gut_sizes(DOSE)), rtol=1e-6, atol=1e-6))(bad_t)
    assert int(out.stats["status"]) == gs.Status.INVALID_INPUT
    assert bool(jnp.all(jnp.isnan(out.ys)))
    # A replay whose traced jump time moves past a neighbouring node: the same.
    rep = jax.jit(lambda t: gs.replay(pk, grad_mesh, Y0, P, jumps=(t, gut_sizes(DOSE))))
    out = rep(DOSE_T.at[1].set(20.0))
    assert int(out.stats["status"]) == gs.Status.INVALID_INPUT
    assert bool(jnp.all(jnp.isnan(out.ys)))
    assert int(rep(DOSE_T).stats["status"]) == gs.Status.OK


def test_drivers_that_refuse_events_say_why(grad_mesh):
    jumps = (DOSE_T, gut_sizes(DOSE))
    with pytest.raises(ValueError, match="known-time events"):
        gs.replay(pk, grad_mesh, Y0, P, jumps=jumps, driver=gs.drivers.Diffrax())
    y0b, pb = Y0[None], P[None]
    # With events: the kernel (CPU; stiff solvers too), else the lanes replay (explicit
    # solvers), else the batched driver, as without them.
    assert gs.drivers.Auto().choose("replay", pk, gs.Tsit5(), y0b, pb, events=True).name == \
        ("gradsolve-kernel" if kernel_builds() else "gradsolve-lanes")
    assert gs.drivers.Auto().choose("replay", pk, gs.Rodas5P(), y0b, pb, events=True).name == \
        ("gradsolve-kernel" if kernel_builds() else "gradsolve-batched")
    assert gs.drivers.Auto().choose("record", pk, gs.Tsit5(), y0b, pb, events=True).name == \
        ("gradsolve-kernel" if kernel_builds() else "gradsolve-batched")
    r = gs.replay(pk, grad_mesh, Y0, P, jumps=jumps, driver=gs.drivers.Batched())
    assert r.route == "gradsolve-batched"


# The Diffrax driver's solve: jax.vmap(diffrax.diffeqsolve) segment by segment between
# event times, its own adaptive steps. An ensemble with per-trajectory schedules: a dose at
# t0 (after the save at t0), pre-dose saves, a dose at t1 (in y1 only), +inf padding; the
# infusion's switches are tstops.
DX_TIMES = jnp.array([[0.0, 12.0, 24.0], [6.0, 48.0, jnp.inf]])
DX_DOSES = jnp.array([[100.0, 100.0, 50.0], [80.0, 30.0, 0.0]])
DX_GRAD_ROWS = np.searchsorted(np.asarray(TS), np.asarray(TS_GRAD))  # TS_GRAD inside TS


def dx_solve(driver, dose_t, dose, p):
    y0 = jnp.zeros((2, 2))
    params = jnp.stack([p, p])
    return gs.solve(pk, T0, T1, y0, params, ts=TS, jumps=(dose_t, gut_sizes(dose)),
                    tstops=TSTOPS, driver=driver, **TOL)


def dx_loss(driver, dose_t, dose, p):
    sol = dx_solve(driver, dose_t, dose, p)
    return sum(loss_of(y[DX_GRAD_ROWS]) for y in sol.ys), sol


@pytest.mark.slow  # ~8 s: events on the Diffrax driver; the gradsolve drivers are tested here
def test_diffrax_driver_solves_between_events_values_and_gradients():
    vg = jax.value_and_grad(dx_loss, argnums=(1, 2, 3), has_aux=True)
    (_, sol), g = vg(gs.drivers.Diffrax(), DX_TIMES, DX_DOSES, P)
    assert sol.route == "diffrax-diffeqsolve" and sol.mesh is None
    assert np.all(np.asarray(sol.stats["status"]) == gs.Status.OK)
    for row in range(2):
        ref = closed_form(TS, DX_TIMES[row], DX_DOSES[row], P)
        np.testing.assert_allclose(sol.ys[row], ref, rtol=1e-7, atol=1e-7)
    assert float(sol.ys[0, 0, 0]) == 0.0  # the save at t0 reads y0, before the dose at t0
    y1_ref = closed_form(jnp.array([T1]), DX_TIMES[1], DX_DOSES[1], P)[0]
    np.testing.assert_allclose(sol.y1[1], y1_ref + jnp.array([30.0, 0.0]), rtol=1e-7)
    # Gradients: the closed form's (dose times, doses, ka and ke; the tstops' times in p
    # carry none, as on every driver), and the default driver's recorded-mesh replay.
    (_, ref), g_auto = vg(gs.drivers.Auto(), DX_TIMES, DX_DOSES, P)
    assert ref.route != sol.route
    closed = lambda t, d, p: sum(loss_closed(t[r], d[r], p) for r in range(2))
    g_closed = jax.grad(closed, argnums=(0, 1, 2))(DX_TIMES, DX_DOSES, P)
    live = np.isfinite(np.asarray(DX_TIMES))
    for a, b, c in zip(g, g_auto, g_closed):
        a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
        if a.shape == (5,):
            a, b, c = a[[0, 1, 4]], b[[0, 1, 4]], c[[0, 1, 4]]
        else:
            assert np.all(a[~live] == 0.0)  # the padded jump is inert
            a, b, c = a[live], b[live], c[live]
        # the dose at t1 reaches the loss through no save: zero, up to rounding
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-10)


def test_diffrax_driver_traced_invalid_events_give_status_and_nan():
    f = lambda t, y, p: -p * y
    run = jax.jit(lambda t: gs.solve(f, 0.0, 2.0, jnp.ones(1), jnp.array(0.5),
                                     jumps=(t, jnp.ones((2, 1))), driver=gs.drivers.Diffrax()))
    bad = run(jnp.array([1.5, 0.5]))
    assert int(bad.stats["status"]) == gs.Status.INVALID_INPUT
    assert bool(jnp.all(jnp.isnan(bad.y1)))
    good = run(jnp.array([0.5, 1.5]))
    assert int(good.stats["status"]) == gs.Status.OK
    e = np.exp(-0.25)  # decay over 0.5 time units
    np.testing.assert_allclose(good.y1, [((e + 1.0) * e * e + 1.0) * e], rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(jumps=(jnp.array([0.0, 50.0]), jnp.ones((2, 2)))), "`jumps` times must lie inside"),
        (dict(jumps=(jnp.array([-1.0]), jnp.ones((1, 2)))), "`jumps` times must lie inside"),
        (dict(jumps=(jnp.array([5.0, 1.0]), jnp.ones((2, 2)))), "`jumps` times must be sorted"),
        (dict(jumps=(jnp.array([jnp.inf, 1.0]), jnp.ones((2, 2)))), "`jumps` times must be sorted"),
        (dict(jumps=(jnp.array([jnp.nan]), jnp.ones((1, 2)))), "`jumps` times contain NaN"),
        (dict(jumps=(jnp.array([1.0, 2.0]), jnp.ones((3, 2)))), "`jumps` sizes must have shape"),
        (dict(jumps=(jnp.array([1.0]), jnp.ones((1, 3)))), "`jumps` sizes must have shape"),
        (dict(jumps=(jnp.array([1.0]), jnp.array([[jnp.nan, 0.0]]))), "`jumps` sizes must be finite"),
        (dict(jumps=(jnp.ones((2, 1)), jnp.ones((1, 2)))), "`jumps` times must have shape"),
        (dict(jumps=jnp.array([1.0])), "`jumps` must be a pair"),
        (dict(tstops=jnp.array([30.0, 60.0])), "`tstops` must lie inside"),
        (dict(tstops=jnp.array([32.0, 30.0])), "`tstops` must be sorted"),
    ],
)
@pytest.mark.parametrize("fn", ["record", "solve"])
def test_bad_event_input_names_the_argument(fn, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        getattr(gs, fn)(pk, T0, T1, Y0, P, **kwargs)


def test_bad_per_trajectory_events_name_the_trajectory():
    times = jnp.array([[0.0, 12.0], [12.0, 0.0]])
    with pytest.raises(ValueError, match="`jumps` times of trajectory 1 must be sorted"):
        gs.record(pk, T0, T1, jnp.zeros((2, 2)), jnp.tile(P, (2, 1)),
                  jumps=(times, jnp.ones((2, 2, 2))))
    sizes = jnp.ones((2, 2, 2)).at[1, 0, 0].set(jnp.inf)
    with pytest.raises(ValueError, match="`jumps` sizes of trajectory 1 must be finite"):
        gs.record(pk, T0, T1, jnp.zeros((2, 2)), jnp.tile(P, (2, 1)),
                  jumps=(jnp.array([[0.0, 12.0], [0.0, 12.0]]), sizes))
    with pytest.raises(ValueError, match="`tstops` of trajectory 0 must lie inside"):
        gs.record(pk, T0, T1, jnp.zeros((2, 2)), jnp.tile(P, (2, 1)),
                  tstops=jnp.array([[60.0], [1.0]]))


def test_replay_needs_the_recorded_jumps(grad_mesh, obs_mesh):
    jumps = (DOSE_T, gut_sizes(DOSE))
    with pytest.raises(ValueError, match="recorded with `jumps`"):
        gs.replay(pk, grad_mesh, Y0, P)
    plain = gs.record(pk, T0, T1, Y0, P, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="recorded without jumps"):
        gs.replay(pk, plain, Y0, P, jumps=jumps)
    with pytest.raises(ValueError, match="recorded shape"):
        gs.replay(pk, grad_mesh, Y0, P, jumps=(DOSE_T[:2], gut_sizes(DOSE[:2])))
    with pytest.raises(ValueError, match="padding"):
        gs.replay(pk, grad_mesh, Y0, P, jumps=(DOSE_T.at[2].set(jnp.inf), gut_sizes(DOSE)))
    with pytest.raises(ValueError, match="moved past neighbouring"):
        gs.replay(pk, grad_mesh, Y0, P, jumps=(DOSE_T.at[1].set(20.0), gut_sizes(DOSE)))
    # A save time equal to a dose time stays before it: moving the dose earlier is invalid.
    with pytest.raises(ValueError, match="moved past neighbouring"):
        gs.replay(pk, obs_mesh, Y0, P, jumps=(DOSE_T.at[1].set(12.0 - 1e-9), gut_sizes(DOSE)))
    later = gs.replay(pk, obs_mesh, Y0, P,
                      jumps=(DOSE_T.at[1].set(12.0 + 1e-9), gut_sizes(DOSE)))
    assert bool(jnp.all(jnp.isfinite(later.ys)))


def test_a_switch_carried_by_an_indicator_state_has_the_exact_gradient_of_its_time():
    # dx/dt = k [t >= tau] - d x, x(0) = 0: the switch as a state s that jumps 0 -> 1 at tau
    # (what gs.DoseSchedule does for input rates and the PEtab importer for lag times)
    k, d = 2.0, 0.5
    ts = jnp.array([0.5, 1.0, 2.0, 3.0, 4.5, 6.0])

    def f(t, y, p):
        return jnp.stack([k * y[1] - d * y[0], 0.0 * y[1]])

    def loss(tau):
        sol = gs.solve(f, 0.0, 6.0, jnp.zeros(2), {}, ts=ts, rtol=1e-10, atol=1e-12,
                       jumps=(jnp.reshape(tau, (1,)), jnp.array([[0.0, 1.0]])))
        return jnp.sum(sol.ys[:, 0])

    def exact(tau):
        t = np.asarray(ts)
        return float(np.sum(np.where(t >= tau, k / d * (1 - np.exp(-d * (t - tau))), 0.0)))

    value, g = jax.jit(jax.value_and_grad(loss))(1.2)
    assert float(value) == pytest.approx(exact(1.2), rel=1e-9)
    fd = (exact(1.2 + 1e-6) - exact(1.2 - 1e-6)) / 2e-6
    assert float(g) == pytest.approx(fd, rel=1e-6)
