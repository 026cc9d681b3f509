"""The lanes replay (explicit solvers off the compiled kernel: GPU, no compiler) against
independent references: Diffrax on the same mesh, central finite differences, and the
batched replay (``driver=gs.drivers.Batched()``)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from gradsolve.drivers import lanes as _lanes
from conftest import lotka_volterra


def forced(t, y, p):
    """Non-autonomous, transcendental, parameters as a dict with a vector leaf."""
    a, w = p["a"], p["w"]
    return jnp.stack([y[1], -a[0] * y[0] - a[1] * jnp.sin(y[1]) + jnp.exp(-0.1 * t) * jnp.cos(w * t)])


@pytest.fixture
def kernel_off():
    with gs.use_compiled_kernel(False):
        yield


def _forced_problem(n=24):
    rng = np.random.default_rng(3)
    p = {"a": jnp.asarray(rng.uniform(0.5, 2.0, (n, 2))), "w": jnp.asarray(rng.uniform(0.5, 3.0, n))}
    y0 = jnp.asarray(rng.uniform(-1.0, 1.0, (n, 2)))
    return forced, y0, p, jnp.linspace(0.0, 6.0, 13)


def _both(fn):
    """``fn(driver)`` with the lanes replay (an explicit driver: it runs or raises), then
    with the batched replay."""
    return fn(gs.drivers.Lanes()), fn(gs.drivers.Batched())


def _close(a, b, rtol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol,
                                   atol=rtol * float(np.max(np.abs(np.asarray(y)))))


def test_lane_field_applies_and_refuses():
    y0, p = jnp.ones((3, 2)), jnp.ones((3, 4))
    assert _lanes.lane_field(lotka_volterra, gs.Tsit5(), y0, p).reason is None
    assert _lanes.lane_field(lotka_volterra, gs.Rodas5P(), y0, p).reason is not None  # stiff: batched
    # a custom derivative rule would be lost entry by entry: batched replay instead
    soft = lambda t, y, p: -jax.nn.softplus(p[0]) * y
    assert _lanes.lane_field(soft, gs.Tsit5(), y0, p).reason is not None
    looped = lambda t, y, p: jax.lax.while_loop(lambda c: c[0] < 2,
                                                lambda c: (c[0] + 1, c[1] * p[0]), (0, -y))[1]
    assert _lanes.lane_field(looped, gs.Tsit5(), y0, p).reason is not None


# In the slow tier (an XLA compile of each replay and its gradient, ~10 s each). In the
# normal suite the lanes replay's gradients equal the batched one's on this field with
# Tsit5 (dict parameters, moved save times, under jit, forward mode too) in
# test_lanes_under_jit_with_spare_capacity_and_moved_times below, and values and gradients
# with every solver in
# test_drivers.py's test_replay_drivers_agree_with_batched[lv-Tsit5-Lanes],
# [forced-Dopri5-Lanes] (a dict parameter with a vector leaf, moved save times) and
# [vdp-Vern7-Lanes], on ragged ensembles.
@pytest.mark.slow
@pytest.mark.parametrize("solver", [gs.Tsit5, gs.Dopri5, gs.Vern7], ids=["Tsit5", "Dopri5", "Vern7"])
def test_lanes_match_batched_replay(kernel_off, solver):
    f, y0, p, ts = _forced_problem()
    mesh = gs.record(f, 0.0, 6.0, y0, p, ts=ts, solver=solver(), rtol=1e-7, atol=1e-9)
    assert np.all(np.asarray(mesh.status) == 0)
    assert len(set(np.asarray(mesh.n_steps).tolist())) > 3  # ragged

    def run(driver):
        sol = gs.replay(f, mesh, y0, p, driver=driver)
        assert sol.route == driver.name

        def loss(y, q, tt):
            s = gs.replay(f, mesh, y, q, ts=tt, driver=driver)
            return jnp.sum(jnp.sin(s.ys)) + jnp.sum(s.y1 ** 2)

        return sol.ys, sol.y1, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(y0, p, ts)

    out, ref = _both(run)
    _close(out, ref, 1e-11)


def test_lanes_match_diffrax_on_the_same_mesh(kernel_off):
    f, y0, p, ts = _forced_problem(8)
    mesh = gs.record(f, 0.0, 6.0, y0, p, ts=ts, rtol=1e-7, atol=1e-9)
    loss = lambda y, q: jnp.sum(gs.replay(f, mesh, y, q).ys ** 2)
    g_y, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(y0, p)
    i = 5
    times = jnp.asarray(np.asarray(mesh.times[i, : int(mesh.n_steps[i]) + 1]))
    pi = jax.tree_util.tree_map(lambda x: x[i], p)

    def ref_loss(y, q):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: f(t, y, a)), diffrax.Tsit5(), 0.0, 6.0, None, y,
            args=q, saveat=diffrax.SaveAt(ts=ts), stepsize_controller=diffrax.StepTo(ts=times),
            max_steps=len(times) + 1)
        return jnp.sum(sol.ys ** 2)

    r_y, r_p = jax.jit(jax.grad(ref_loss, argnums=(0, 1)))(y0[i], pi)
    np.testing.assert_allclose(g_y[i], r_y, rtol=1e-10)
    for a, b in zip(jax.tree_util.tree_leaves(g_p), jax.tree_util.tree_leaves(r_p)):
        np.testing.assert_allclose(a[i], b, rtol=1e-10)


def test_lanes_gradient_matches_central_differences(kernel_off):
    f, y0, p, ts = _forced_problem(4)
    mesh = gs.record(f, 0.0, 6.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10)
    loss = jax.jit(lambda w: jnp.sum(gs.replay(f, mesh, y0, {"a": p["a"], "w": w}).ys[:, :, 0] ** 2))
    g = jax.jit(jax.grad(loss))(p["w"])
    eps = 1e-6
    for j in range(4):
        e = jnp.zeros(4).at[j].set(eps)
        fd = (loss(p["w"] + e) - loss(p["w"] - e)) / (2 * eps)
        np.testing.assert_allclose(g[j], fd, rtol=1e-6)


def test_lanes_under_jit_with_spare_capacity_and_moved_times(kernel_off):
    """Under jit the mesh has max_steps slots, those past n_steps unspecified; moved,
    duplicated and pinned save times; derivatives in every mode."""
    f, y0, p, _ = _forced_problem(10)
    ts = jnp.array([0.0, 1.0, 2.5, 2.5, 4.0, 6.0])

    def run(driver):
        def loss(y, q, tt):
            s = gs.solve(f, 0.0, 6.0, y, q, ts=tt, max_steps=512, driver=driver)
            return jnp.sum(s.ys ** 2)

        @jax.jit  # one program for both modes (they share the record)
        def both(y, q, tt):
            return (jax.grad(loss, argnums=(0, 1, 2))(y, q, tt),
                    jax.jvp(lambda s: loss(y, q, s), (tt,), (jnp.ones_like(tt),))[1])

        return both(y0, p, ts)

    out, ref = _both(run)
    _close(out, ref, 1e-10)
    assert np.all(np.isfinite(np.asarray(out[0][2])))


def test_lanes_failed_trajectory_is_nan_and_others_unchanged(kernel_off):
    f = lambda t, y, p: p[0] * y ** 2  # blows up at t = 1/p for y0 = 1
    y0 = jnp.ones((3, 1))
    p = jnp.array([[0.1], [2.0], [0.2]])
    mesh = jax.jit(lambda y, q: gs.record(f, 0.0, 1.0, y, q, max_steps=256))(y0, p)
    assert int(mesh.status[1]) != 0
    g = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q).y1[jnp.array([0, 2])])))(p)
    exact = 1.0 / (1.0 - p[jnp.array([0, 2]), 0]) ** 2  # d/dp of 1/(1 - p t) at t = 1
    np.testing.assert_allclose(np.asarray(g[jnp.array([0, 2]), 0]), np.asarray(exact), rtol=1e-5)
    assert np.all(np.isnan(np.asarray(gs.replay(f, mesh, y0, p).y1[1])))


def test_lanes_vmap_and_float32(kernel_off):
    y0 = jnp.ones((6, 2), jnp.float32)
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0], jnp.float32), (6, 1))
    mesh = gs.record(lotka_volterra, 0.0, 5.0, y0, p, rtol=1e-4, atol=1e-6)
    scales = jnp.array([0.9, 1.0, 1.1], jnp.float32)
    g = jax.jit(jax.vmap(lambda s: jax.grad(lambda q: jnp.sum(gs.replay(lotka_volterra, mesh, y0, q).y1))(s * p)))(scales)
    g1 = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(lotka_volterra, mesh, y0, q).y1)))(p)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(g[1]), np.asarray(g1), rtol=1e-5)



def test_lanes_groups_follow_the_backend(kernel_off, monkeypatch):
    """On CPU trajectories are sorted into groups of 1,024 by step count, each running only
    as many steps as its longest member; on GPU/TPU one group. Same values either way."""
    n = 2048
    scale = jnp.asarray(np.random.default_rng(1).permutation(np.geomspace(0.3, 3.0, n)))
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * scale[:, None]
    y0 = jnp.ones((n, 2))
    mesh = gs.record(lotka_volterra, 0.0, 8.0, y0, p, ts=jnp.linspace(0.0, 8.0, 9))
    steps = np.sort(np.asarray(mesh.n_steps))
    cpu = gs.replay(lotka_volterra, mesh, y0, p)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    gpu = gs.replay(lotka_volterra, mesh, y0, p)
    assert float(cpu.stats["replay_work"]) == 1024 * (steps[1023] + steps[-1])
    assert float(gpu.stats["replay_work"]) == n * steps[-1]
    np.testing.assert_array_equal(np.asarray(gpu.ys), np.asarray(cpu.ys))


def test_lanes_only_where_they_pay():
    """Few states with short expressions run the lanes replay; dense coupling or many
    states (where the lanes step compiles slowly and runs slower) the batched one."""
    def l96(t, y, p):
        return (jnp.roll(y, -1) - jnp.roll(y, 2)) * jnp.roll(y, 1) - y + p

    def dense(t, y, p):
        return jnp.tanh(p["A"] @ y) - 0.5 * y

    n = 3
    assert _lanes.lane_field(l96, gs.Tsit5(), jnp.ones((n, 8)), jnp.ones(n)).reason is None
    assert _lanes.lane_field(l96, gs.Tsit5(), jnp.ones((n, 20)), jnp.ones(n)).reason is not None
    p = {"A": jnp.ones((n, 4, 4))}
    assert _lanes.lane_field(dense, gs.Tsit5(), jnp.ones((n, 4)), p).reason is not None


def test_lanes_matrix_parameters(kernel_off, monkeypatch):
    """``dot_general`` and reductions in the vector field (a linear layer) translate
    correctly (such dense fields are left to the batched replay for speed, `lanes_pays`;
    forced on here)."""
    monkeypatch.setattr(_lanes, "lanes_pays", lambda d, ops: True)
    rng = np.random.default_rng(5)
    n, d = 6, 3
    p = {"A": jnp.asarray(rng.normal(size=(n, d, d)) * 0.5), "b": jnp.asarray(rng.normal(size=(n, d)))}
    f = lambda t, y, q: q["A"] @ jnp.tanh(y) + q["b"] - 0.1 * jnp.sum(y ** 2) * y
    y0 = jnp.asarray(rng.normal(size=(n, d)))
    mesh = gs.record(f, 0.0, 3.0, y0, p, ts=jnp.linspace(0.0, 3.0, 7))

    def run(driver):
        return jax.jit(jax.grad(lambda q, y: jnp.sum(gs.replay(f, mesh, y, q, driver=driver).ys ** 2),
                                argnums=(0, 1)))(p, y0)

    out, ref = _both(run)
    _close(out, ref, 1e-11)
