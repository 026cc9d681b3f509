"""Replay values and gradients against independent references: Diffrax on the same mesh,
Diffrax's default adjoint on its own mesh, closed forms and central finite differences."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import decay, lotka_volterra, van_der_pol

DIFFRAX_TWIN = [(gs.Tsit5, diffrax.Tsit5), (gs.Dopri5, diffrax.Dopri5)]


def _diffrax_on_mesh(f, dsolver, times, y0, p, ts):
    term = diffrax.ODETerm(lambda t, y, a: f(t, y, a))
    sol = diffrax.diffeqsolve(
        term, dsolver, times[0], times[-1], None, y0, args=p, saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.StepTo(ts=times), max_steps=len(times) + 1,
    )
    return sol.ys


@pytest.mark.parametrize("gs_solver, dfx_solver", [
    DIFFRAX_TWIN[0], pytest.param(*DIFFRAX_TWIN[1], marks=pytest.mark.slow)])  # ~10 s each
def test_same_mesh_matches_diffrax_stepto(lv_ensemble, gs_solver, dfx_solver):
    f, y0, p, ts = lv_ensemble
    mesh = gs.record(f, 0.0, 10.0, y0, p, ts=ts, solver=gs_solver(), rtol=1e-7, atol=1e-9)
    assert np.all(np.asarray(mesh.status) == 0)

    def loss_gs(y0_, p_):
        ys_ = gs.replay(f, mesh, y0_, p_).ys
        return jnp.sum(ys_ ** 2), ys_

    # values and gradient in one jitted program (un-jitted, the transform compiles hundreds
    # of small programs)
    (_, ys), (g_y0, g_p) = jax.jit(jax.value_and_grad(loss_gs, argnums=(0, 1), has_aux=True))(
        y0, p)
    i = 7  # one member of the ensemble (each Diffrax mesh length is its own compile)
    times = jnp.asarray(np.asarray(mesh.times[i, : int(mesh.n_steps[i]) + 1]))
    ref_loss = lambda a, b: jnp.sum(_diffrax_on_mesh(f, dfx_solver(), times, a, b, ts) ** 2)
    ref = jax.jit(lambda a, b: (_diffrax_on_mesh(f, dfx_solver(), times, a, b, ts),
                                jax.grad(ref_loss, argnums=(0, 1))(a, b)))
    ref_ys, ref_g = ref(y0[i], p[i])
    np.testing.assert_allclose(ys[i], ref_ys, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g_y0[i], ref_g[0], rtol=1e-12)
    np.testing.assert_allclose(g_p[i], ref_g[1], rtol=1e-12)


def test_gradient_matches_diffrax_default_adjoint(lv_ensemble):
    f, y0, p, ts = lv_ensemble
    term = diffrax.ODETerm(lambda t, y, a: f(t, y, a))

    def dfx_loss(y0_, p_):
        def one(a, b):
            sol = diffrax.diffeqsolve(
                term, diffrax.Tsit5(), 0.0, 10.0, None, a, args=b,
                saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=1e-9, atol=1e-11),
                max_steps=100000,
            )
            return sol.ys
        return jnp.sum(jax.vmap(one)(y0_, p_) ** 2)

    def gs_loss(y0_, p_):
        return jnp.sum(gs.solve(f, 0.0, 10.0, y0_, p_, ts=ts, rtol=1e-9, atol=1e-11).ys ** 2)

    ref = jax.jit(jax.grad(dfx_loss, argnums=(0, 1)))(y0, p)
    got = jax.jit(jax.grad(gs_loss, argnums=(0, 1)))(y0, p)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5)


@pytest.mark.parametrize("solver", [gs.Tsit5(), gs.Dopri5(), gs.Vern7()], ids=lambda s: type(s).__name__)
def test_exponential_decay_closed_form(solver):
    k, y0, ts = 0.7, jnp.array([2.0]), jnp.linspace(0.0, 3.0, 7)

    def out(k_, y0_):
        return gs.solve(decay, 0.0, 3.0, y0_, {"k": k_}, ts=ts, solver=solver, rtol=1e-11, atol=1e-13).ys[:, 0]

    e = jnp.exp(-k * ts)
    np.testing.assert_allclose(out(k, y0), 2.0 * e, rtol=1e-8)
    jk, jy = jax.jit(jax.jacrev(out, (0, 1)))(k, y0)
    np.testing.assert_allclose(jk, -ts * 2.0 * e, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(jy[:, 0], e, rtol=1e-8)


def test_frozen_mesh_gradient_vs_finite_differences():
    n = 6
    mu = jnp.linspace(0.5, 2.0, n)
    y0 = jnp.stack([jnp.linspace(1.0, 2.0, n), jnp.zeros(n)], axis=1)
    ts = jnp.linspace(0.0, 5.0, 11)
    mesh = gs.record(van_der_pol, 0.0, 5.0, y0, {"mu": mu}, ts=ts, rtol=1e-6, atol=1e-9)

    @jax.jit  # one compile for all the differences below
    def loss(mu_, y0_):
        sol = gs.replay(van_der_pol, mesh, y0_, {"mu": mu_})
        return jnp.sum(jnp.sin(sol.ys[..., 0]) + sol.ys[..., 1] ** 2)

    g_mu, g_y0 = jax.jit(jax.grad(loss, argnums=(0, 1)))(mu, y0)
    eps = 1e-5
    for i in range(n):
        dm = jnp.zeros(n).at[i].set(eps)
        fd = (loss(mu + dm, y0) - loss(mu - dm, y0)) / (2 * eps)
        np.testing.assert_allclose(g_mu[i], fd, rtol=1e-6)
        for j in range(2):
            dy = jnp.zeros((n, 2)).at[i, j].set(eps)
            fd = (loss(mu, y0 + dy) - loss(mu, y0 - dy)) / (2 * eps)
            np.testing.assert_allclose(g_y0[i, j], fd, rtol=1e-6)


@pytest.mark.slow  # ~15 s of compiles; forward mode through a replay equals reverse mode in
# test_events.py::test_jit_vmap_and_forward_mode, and Hessians (forward over reverse) match
# closed forms in test_equal_save_times_each_get_their_own_derivative and
# test_derivatives_wrt_interval_ends_match_diffrax
def test_forward_mode_equals_reverse_mode(lv_ensemble):
    f, y0, p, ts = lv_ensemble
    y0, p = y0[:4], p[:4]
    mesh = gs.record(f, 0.0, 10.0, y0, p, ts=ts)
    fn = lambda q: gs.replay(f, mesh, y0, q).ys[:, ::5]
    # the three transforms in one jitted program (un-jitted, each compiles hundreds of
    # small programs)
    jf, jr, hess = jax.jit(lambda q: (jax.jacfwd(fn)(q), jax.jacrev(fn)(q),
                                      jax.hessian(lambda r: jnp.sum(fn(r) ** 2))(q)))(p)
    np.testing.assert_allclose(jf, jr, rtol=1e-10, atol=1e-12)
    assert hess.shape == (4, 4, 4, 4) and np.all(np.isfinite(hess))


def test_gradient_wrt_save_times_is_vector_field(lv_ensemble):
    f, y0, p, _ = lv_ensemble
    y0, p = y0[:3], p[:3]
    ts = jnp.array([0.0, 1.3, 2.7, 4.1, 6.0])  # t0 and t1 pinned, the rest interior
    mesh = gs.record(f, 0.0, 6.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12)
    sol = gs.replay(f, mesh, y0, p, ts=ts)
    jac = jax.jit(jax.jacfwd(lambda s: gs.replay(f, mesh, y0, p, ts=s).ys))(ts)  # (n, k, d, k)
    for i in range(3):
        for j in range(len(ts)):
            expected = f(ts[j], sol.ys[i, j], p[i])
            np.testing.assert_allclose(jac[i, j, :, j], expected, rtol=1e-6, atol=1e-8)
    jr = jax.jit(jax.jacrev(lambda s: gs.replay(f, mesh, y0, p, ts=s).ys))(ts)
    np.testing.assert_allclose(jr, jac, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kernel", [True, False])
def test_equal_save_times_each_get_their_own_derivative(kernel):
    """Equal save times share one mesh node; each still gets d y(t_j)/d t_j = y'(t_j) and
    d^2/d t_j^2 = y''(t_j), checked against the closed form y = 2 exp(-t/2), interior
    and pinned at t1. Replaying at times that separate them is refused."""
    f = lambda t, y, p: -p * y
    y0, p = jnp.array([2.0]), 0.5
    ts = jnp.array([0.5, 1.0, 1.0, 2.0, 2.0])  # t1 = 2
    exact_d1 = -0.5 * 2.0 * np.exp(-0.5 * np.asarray(ts))
    with gs.use_compiled_kernel(kernel):
        loss = lambda s: jnp.sum(gs.solve(f, 0.0, 2.0, y0, p, ts=s, rtol=1e-11, atol=1e-13).ys)
        # the Hessian (jacfwd of grad, as jax.hessian) and the gradient it differentiates
        # in one pass: no separate compile of the plain gradient
        grad_twice = lambda s: (jax.grad(loss)(s),) * 2
        hess, grad = jax.jit(jax.jacfwd(grad_twice, has_aux=True))(ts)
        np.testing.assert_allclose(grad, exact_d1, rtol=1e-8)
        np.testing.assert_allclose(jnp.diag(hess), -0.5 * exact_d1, rtol=1e-6)
        mesh = gs.record(f, 0.0, 2.0, y0, p, ts=ts, rtol=1e-11, atol=1e-13)
        assert int(mesh.save_index[1]) == int(mesh.save_index[2])
        apart = jnp.array([0.5, 0.9999, 1.0, 2.0, 2.0])  # within the neighbouring nodes
        with pytest.raises(ValueError, match="separates save times that were equal"):
            gs.replay(f, mesh, y0, p, ts=apart)
        ys = jax.jit(lambda s: gs.replay(f, mesh, y0, p, ts=s).ys)(apart)
        assert bool(jnp.isnan(ys[2]).all()) and bool(jnp.isfinite(ys[jnp.array([0, 1, 3, 4])]).all())


@pytest.mark.parametrize("solver", [  # ~12 s each with cold caches: Rodas5P in the slow tier
    pytest.param(gs.Tsit5(), id="tsit5"),
    pytest.param(gs.Rodas5P(), id="rodas5p", marks=pytest.mark.slow)])
def test_derivatives_wrt_interval_ends_match_diffrax(solver):
    """d/dt0 and d/dt1 of gs.solve (a Diffrax user differentiates these too) against
    Diffrax's default adjoint and the closed form, for y(t1) and a save time."""
    f = lambda t, y, p: jnp.stack([-p * y[0] + jnp.sin(t), -y[1]])
    y0 = jnp.array([1.0, 2.0])
    ts = jnp.array([0.7])

    def gs_out(t0, t1):
        sol = gs.solve(f, t0, t1, y0, 0.8, ts=ts, solver=solver, rtol=1e-10, atol=1e-12)
        return jnp.concatenate([sol.y1, sol.ys[0]])

    def dfx_out(t0, t1):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(f), diffrax.Tsit5(), t0, t1, None, y0, args=0.8,
            saveat=diffrax.SaveAt(ts=ts, t1=True),
            stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12))
        return jnp.concatenate([sol.ys[-1], sol.ys[0]])

    jg = jax.jit(jax.jacrev(gs_out, (0, 1)))(0.2, 1.5)
    jd = jax.jit(jax.jacrev(dfx_out, (0, 1)))(0.2, 1.5)
    np.testing.assert_allclose(jg[0], jd[0], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(jg[1], jd[1], rtol=1e-7, atol=1e-9)
    # closed form for the second state: y = 2 exp(-(t - t0))
    np.testing.assert_allclose(jg[1][1], -2 * np.exp(-1.3), rtol=1e-8)
    np.testing.assert_allclose(jg[0][1], 2 * np.exp(-1.3), rtol=1e-8)
    np.testing.assert_allclose(jg[0][3], 2 * np.exp(-0.5), rtol=1e-8)
    np.testing.assert_allclose(jg[1][3], 0.0, atol=1e-12)
    # second derivative w.r.t. t1 of y2(t1) = 2 exp(-(t1 - t0))
    h = jax.jit(jax.hessian(lambda t1: gs_out(0.2, t1)[1]))(1.5)
    np.testing.assert_allclose(h, 2 * np.exp(-1.3), rtol=1e-8)


@pytest.mark.parametrize("group_size", [4, 1024])
def test_ragged_ensemble_members_equal_single_solves(group_size):
    n = 12
    scale = jnp.geomspace(0.3, 3.0, n)  # step counts differ ~10x
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * scale[:, None]
    y0 = jnp.tile(jnp.array([1.0, 1.0]), (n, 1))
    ts = jnp.linspace(0.0, 8.0, 9)
    mesh = gs.record(lotka_volterra, 0.0, 8.0, y0, p, ts=ts)
    steps = np.asarray(mesh.n_steps)
    assert steps.max() > 5 * steps.min()
    sol = gs.replay(lotka_volterra, mesh, y0, p, group_size=group_size)
    gsum = jax.jit(jax.grad(lambda q: jnp.sum(
        gs.replay(lotka_volterra, mesh, y0, q, group_size=group_size).ys ** 2)))(p)
    # one jitted gradient of a single solve for the three members below (one compile)
    grad1 = jax.jit(jax.grad(lambda q, y: jnp.sum(gs.solve(lotka_volterra, 0.0, 8.0, y, q,
                                                           ts=ts).ys ** 2)))
    for i in [int(np.argmin(steps)), 5, int(np.argmax(steps))]:
        single = gs.solve(lotka_volterra, 0.0, 8.0, y0[i], p[i], ts=ts)
        assert int(single.mesh.n_steps) == steps[i]
        np.testing.assert_allclose(sol.ys[i], single.ys, rtol=1e-12, atol=1e-14)
        g1 = grad1(p[i], y0[i])
        np.testing.assert_allclose(gsum[i], g1, rtol=1e-12)
    if group_size == 4:
        # XLA replay, length-sorted groups: work is close to the sum of steps, not n * max.
        with gs.use_compiled_kernel(False):
            sol_x = gs.replay(lotka_volterra, mesh, y0, p, group_size=group_size)
        assert sol_x.route == "gradsolve-lanes"
        np.testing.assert_allclose(sol_x.ys, sol.ys, rtol=1e-12, atol=1e-14)
        work = float(sol_x.stats["replay_work"])
        assert work <= 1.5 * steps.sum() + 8 * n
        assert work < n * steps.max()


def test_ragged_ensemble_work_follows_the_sum_of_steps():
    # Step counts spread 10x over 400 trajectories, in random order.
    n = 400
    scale = jnp.asarray(np.random.default_rng(0).permutation(np.geomspace(0.3, 3.0, n)))
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * scale[:, None]
    y0 = jnp.tile(jnp.array([1.0, 1.0]), (n, 1))
    mesh = gs.record(lotka_volterra, 0.0, 8.0, y0, p, ts=jnp.linspace(0.0, 8.0, 9))
    steps = np.asarray(mesh.n_steps)
    assert steps.max() > 5 * steps.min()
    for kernel in (True, False):
        with gs.use_compiled_kernel(kernel):
            sol = gs.replay(lotka_volterra, mesh, y0, p, group_size=32)
        # Work counts every lane or group slot computed, idle ones included.
        assert float(sol.stats["replay_work"]) <= 1.5 * steps.sum(), sol.route


def test_default_group_size_follows_the_backend(monkeypatch):
    # 2,000 ragged trajectories: on CPU the default groups (256, length-sorted) replay
    # fewer steps than n * max; an accelerator gets one group (groups run one after another
    # there, each a sequence of kernel launches). Same values either way.
    n = 2000
    scale = jnp.asarray(np.random.default_rng(1).permutation(np.geomspace(0.3, 3.0, n)))
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * scale[:, None]
    y0 = jnp.tile(jnp.array([1.0, 1.0]), (n, 1))
    ts = jnp.linspace(0.0, 8.0, 9)
    mesh = gs.record(lotka_volterra, 0.0, 8.0, y0, p, ts=ts)
    steps = np.asarray(mesh.n_steps)
    chunk = 8
    one_group = n * chunk * np.ceil(steps.max() / chunk)
    batched = gs.drivers.Batched()  # (the lanes replay's groups: test_lanes.py)
    cpu = gs.replay(lotka_volterra, mesh, y0, p, driver=batched)
    explicit = gs.replay(lotka_volterra, mesh, y0, p, group_size=256, driver=batched)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    gpu = gs.replay(lotka_volterra, mesh, y0, p, driver=batched)
    assert cpu.route == gpu.route == "gradsolve-batched"
    assert float(cpu.stats["replay_work"]) == float(explicit.stats["replay_work"])
    assert float(cpu.stats["replay_work"]) < 0.9 * one_group
    assert float(gpu.stats["replay_work"]) == one_group
    np.testing.assert_array_equal(np.asarray(gpu.ys), np.asarray(cpu.ys))


def test_chunked_record_loop_gives_the_same_mesh(monkeypatch):
    """Off CPU the XLA record runs its attempt loop in chunks of 8 (one host sync per chunk
    on a GPU); the spare attempts after the last trajectory finishes change nothing. Ragged
    ensemble, with one trajectory stopped by max_steps."""
    from gradsolve.drivers import batched as _record

    assert _record.record_chunk("cpu") == 1 and _record.record_chunk("gpu") == 8
    n = 7
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * jnp.geomspace(0.5, 4.0, n)[:, None]
    y0 = jnp.ones((n, 2))
    ts = jnp.linspace(0.0, 8.0, 5)
    meshes = []
    with gs.use_compiled_kernel(False):
        for chunk in (1, 8):
            monkeypatch.setattr(_record, "record_chunk", lambda backend=None, c=chunk: c)
            f = lambda t, y, q: lotka_volterra(t, y, q)  # a fresh function: a fresh trace
            meshes.append(gs.record(f, 0.0, 8.0, y0, p, ts=ts, max_steps=120, throw=False))
    a, b = meshes
    assert int(np.sum(np.asarray(a.status) != 0)) >= 1  # the ragged, failing case is covered
    for name in ("times", "n_steps", "n_rejected", "status", "save_index", "dt_next", "y_last"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_replay_layout_is_rejected(lv_ensemble, bad):
    f, y0, p, ts = lv_ensemble
    mesh = gs.record(f, 0.0, 10.0, y0, p, ts=ts)
    with pytest.raises(ValueError, match="group_size"):
        gs.replay(f, mesh, y0, p, group_size=bad)
    with pytest.raises(ValueError, match="chunk_size"):
        gs.replay(f, mesh, y0, p, chunk_size=bad)


def test_error_ratio_flags_parameter_drift(lv_ensemble):
    f, y0, p, ts = lv_ensemble
    mesh = gs.record(f, 0.0, 10.0, y0, p, ts=ts, rtol=1e-6, atol=1e-9)
    at_record = gs.replay(f, mesh, y0, p).error_ratio
    assert at_record.shape == (32,)
    assert np.all(np.asarray(at_record) <= 1.0)
    far = gs.replay(f, mesh, y0, p * 2.0).error_ratio
    assert np.all(np.asarray(far) > 1.0)


def test_single_trajectory_shapes_and_jit():
    p = jnp.array([1.5, 1.0, 3.0, 1.0])
    y0 = jnp.array([1.0, 1.0])
    ts = jnp.linspace(0.0, 5.0, 6)
    sol = gs.solve(lotka_volterra, 0.0, 5.0, y0, p, ts=ts)
    assert sol.ys.shape == (6, 2) and sol.y1.shape == (2,) and sol.error_ratio.shape == ()
    assert sol.mesh.n_steps.shape == ()
    jitted = jax.jit(lambda a, b: gs.solve(lotka_volterra, 0.0, 5.0, a, b, ts=ts))(y0, p)
    np.testing.assert_allclose(jitted.ys, sol.ys, rtol=1e-13)
    np.testing.assert_allclose(sol.y1, sol.ys[-1], rtol=1e-14)
    # One trajectory's mesh from jit: Mesh.padded fills the slots past n_steps.
    times = np.asarray(jitted.mesh.padded().times)
    n = int(jitted.mesh.n_steps)
    assert times.shape == (jitted.mesh.capacity + 1,) and np.all(times[n:] == 5.0)
    np.testing.assert_allclose(times[: n + 1], sol.mesh.times[: n + 1], rtol=1e-6)
    # Without ts the solution is saved at t1 only, like Diffrax's default SaveAt(t1=True).
    assert gs.solve(lotka_volterra, 0.0, 5.0, y0, p).ys.shape == (1, 2)


def test_jit_capacity_cost_follows_steps_taken():
    p = jnp.array([1.5, 1.0, 3.0, 1.0])
    y0 = jnp.array([1.0, 1.0])
    solve = lambda m: jax.jit(lambda a: gs.solve(lotka_volterra, 0.0, 5.0, y0, a, max_steps=m))(p)
    small, large = solve(500), solve(50_000)
    assert small.mesh.capacity == 500 and large.mesh.capacity == 50_000
    np.testing.assert_allclose(small.ys, large.ys, rtol=1e-14)
    # Chunks past the last step are skipped: executed work is the same for both capacities.
    assert float(small.stats["replay_work"]) == float(large.stats["replay_work"])
    assert float(large.stats["replay_work"]) < 0.05 * 50_000


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "xla"])
def test_padding_slots_past_n_steps_are_never_read(lv_ensemble, kernel):
    """Inside jit the record leaves slots past n_steps unspecified (its cost then follows the
    steps taken); outside jit it fills them. Poisoning them with NaN changes nothing."""
    f, y0, p, ts = lv_ensemble
    n = y0.shape[0]
    with gs.use_compiled_kernel(kernel):
        eager = gs.record(f, 0.0, 10.0, y0, p, ts=ts, max_steps=1024)
        jitted = jax.jit(lambda a: gs.record(f, 0.0, 10.0, y0, a, ts=ts, max_steps=1024))(p)
        steps = np.asarray(eager.n_steps)
        times = np.asarray(eager.times)
        for i in range(n):  # outside jit: the last time repeats (zero-length steps)
            assert np.all(times[i, steps[i]:] == times[i, steps[i]])
        np.testing.assert_array_equal(jitted.n_steps, steps)
        # XLA may round the jitted program's last bits differently, and step sizes come
        # from error estimates (differences of close numbers), so nodes move slightly.
        filled = np.asarray(jitted.padded().times)
        np.testing.assert_allclose(filled[:, : eager.capacity + 1], times, rtol=1e-6)
        np.testing.assert_allclose(filled[:, eager.capacity + 1:],
                                   np.repeat(times[:, -1:], 1024 - eager.capacity, axis=1))
        slots = np.arange(1025)[None]
        poisoned = eqx.tree_at(lambda m: m.times, jitted,
                               jnp.where(slots > steps[:, None], jnp.nan, jitted.times))
        ts_n = jnp.broadcast_to(ts, (n, ts.shape[0])) + 0.0

        def run(mesh):
            loss = lambda a, t: jnp.sum(gs.replay(f, mesh, y0, a, ts=t).ys ** 2)
            sol = gs.replay(f, mesh, y0, p, ts=ts_n)
            return sol.ys, sol.error_ratio, *jax.jit(jax.grad(loss, argnums=(0, 1)))(p, ts_n)

        for got, want in zip(run(poisoned), run(jitted.padded())):
            assert np.all(np.isfinite(got))
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_user_vmap_over_replay(lv_ensemble):
    f, y0, p, ts = lv_ensemble
    mesh = gs.record(f, 0.0, 10.0, y0[:4], p[:4], ts=ts)
    scales = jnp.array([1.0, 1.001, 0.999])
    out = jax.vmap(lambda s: gs.replay(f, mesh, y0[:4], p[:4] * s).ys)(scales)
    ref = gs.replay(f, mesh, y0[:4], p[:4] * 1.001).ys
    np.testing.assert_allclose(out[1], ref, rtol=1e-13)


@pytest.mark.parametrize("kernel", [True, False])
def test_moved_save_times_out_of_order_under_jit(kernel):
    """Under jit a save time moved past a neighbouring mesh node (which `replay` refuses
    outside jit) gives NaN and Status.INVALID_INPUT for that trajectory only; the others
    keep their values and finite gradients."""
    f = lambda t, y, p: -p[0] * y
    y0 = jnp.ones((3, 1))
    p = jnp.array([[0.5], [1.0], [1.5]])
    ts = jnp.array([0.5, 1.0, 1.5])
    with gs.use_compiled_kernel(kernel):
        mesh = gs.record(f, 0.0, 2.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12)
        bad = jnp.tile(ts, (3, 1)).at[1, 1].set(1.45)  # sorted, but past nodes after t = 1
        with pytest.raises(ValueError, match="moved past"):
            gs.replay(f, mesh, y0, p, ts=bad)
        sol = jax.jit(lambda s: gs.replay(f, mesh, y0, p, ts=s))(bad)
        g = jax.jit(jax.grad(lambda q, s: jnp.sum(gs.replay(f, mesh, y0, q, ts=s).ys[jnp.array([0, 2])])))(p, bad)
    assert [int(s) for s in sol.stats["status"]] == [0, int(gs.Status.INVALID_INPUT), 0]
    assert bool(jnp.isnan(sol.ys[1]).all()) and bool(jnp.isnan(sol.y1[1]).all())
    exact = np.exp(-np.asarray(p)[:, :1] * np.asarray(ts)[None])
    np.testing.assert_allclose(np.asarray(sol.ys[jnp.array([0, 2]), :, 0]), exact[[0, 2]], rtol=1e-8)
    assert bool(jnp.all(jnp.isfinite(g)))
    # moving within the neighbouring nodes is fine
    ok = jnp.tile(ts, (3, 1)).at[1, 1].add(1e-5)
    assert [int(s) for s in jax.jit(lambda s: gs.replay(f, mesh, y0, p, ts=s))(ok).stats["status"]] == [0, 0, 0]


@pytest.mark.parametrize("jumps", [False, True])
@pytest.mark.parametrize("end", ["first", "last"])
def test_save_times_recorded_at_the_ends_cannot_move(end, jumps):
    """A save time recorded at ``t0`` or ``t1`` is the interval's end, a node that never
    moves: given as another time it is refused outside jit and INVALID_INPUT (NaN) under
    jit, instead of returning the end's state at the new time. Unmoved, the values are
    the closed form's."""
    f = lambda t, y, p: -p * y
    y0, p = jnp.array([1.0]), 0.5
    ts = jnp.linspace(0.0, 2.0, 5)
    ev = dict(jumps=(jnp.array([1.25]), jnp.array([[0.5]]))) if jumps else {}
    mesh = gs.record(f, 0.0, 2.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12, **ev)
    bad = ts.at[-1].set(1.8) if end == "last" else ts.at[0].set(0.1)
    with pytest.raises(ValueError, match="t0 or t1"):
        gs.replay(f, mesh, y0, p, ts=bad, **ev)
    sol = jax.jit(lambda s: gs.replay(f, mesh, y0, p, ts=s, **ev))(bad)
    assert int(sol.stats["status"]) == int(gs.Status.INVALID_INPUT)
    assert bool(jnp.isnan(sol.ys).all())
    good = jax.jit(lambda s: gs.replay(f, mesh, y0, p, ts=s, **ev))(ts)
    exact = np.exp(-0.5 * np.asarray(ts)) + (0.5 * np.exp(-0.5 * (np.asarray(ts) - 1.25))
                                             * (np.asarray(ts) > 1.25) if jumps else 0.0)
    assert int(good.stats["status"]) == 0
    np.testing.assert_allclose(np.asarray(good.ys[:, 0]), exact, rtol=1e-8)


def test_moved_check_sees_moved_neighbours_past_equal_save_times():
    """A moved save time is compared with its neighbouring node as moved, even when equal
    save times sit between them in ``ts`` (jit and eager agree)."""
    f = lambda t, y, p: -p * y
    y0, p = jnp.array([1.0]), 0.5
    mesh = gs.record(f, 0.0, 2.0, y0, p, ts=jnp.array([1.0, 1.0, 1.0 + 1e-3]), rtol=1e-10)
    i = int(mesh.save_index[0])
    assert int(mesh.save_index[2]) == i + 1  # the third save time is the next node
    moved = jnp.array([1.0 + 2e-3, 1.0 + 2e-3, 1.0 + 3e-3])  # both past the recorded 1.001
    eager = gs.replay(f, mesh, y0, p, ts=moved)  # accepted outside jit
    jitted = jax.jit(lambda s: gs.replay(f, mesh, y0, p, ts=s))(moved)
    assert int(jitted.stats["status"]) == 0
    np.testing.assert_allclose(np.asarray(jitted.ys), np.asarray(eager.ys), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(eager.ys[:, 0]), np.exp(-0.5 * np.asarray(moved)), rtol=1e-8)


@pytest.mark.parametrize("kernel", [True, False])
def test_replay_with_closed_over_per_trajectory_ts_under_jit_and_vmap(kernel):
    """A mesh and concrete ``(n, k)`` save times closed over by a jitted or vmapped function
    (only the parameters traced): values and gradients are the closed form, and an invalid
    ``ts`` is still refused when the function is traced."""
    f = lambda t, y, p: -p * y
    y0, p = jnp.ones((2, 1)), jnp.array([1.0, 2.0])
    ts = jnp.array([[0.5, 1.0], [0.25, 0.75]])
    exact = lambda q: np.exp(-np.asarray(q)[:, None] * np.asarray(ts))
    with gs.use_compiled_kernel(kernel):
        mesh = gs.record(f, 0.0, 1.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12)
        loss = lambda q: jnp.sum(gs.replay(f, mesh, y0, q, ts=ts).ys)
        np.testing.assert_allclose(float(jax.jit(loss)(p)), exact(p).sum(), rtol=1e-8)
        g = jax.jit(jax.grad(loss))(p)
        ys = jax.vmap(lambda s: gs.replay(f, mesh, y0, p * s, ts=ts).ys)(jnp.array([1.0, 1.01]))
        bad = ts.at[0, 0].set(0.95)  # 0.5 -> 0.95: past the mesh nodes between 0.5 and 1
        with pytest.raises(ValueError, match="moved past"):
            jax.jit(lambda q: gs.replay(f, mesh, y0, q, ts=bad).ys)(p)
    np.testing.assert_allclose(np.asarray(g), (-np.asarray(ts) * exact(p)).sum(axis=1), rtol=1e-7)
    np.testing.assert_allclose(np.asarray(ys[1, :, :, 0]), exact(1.01 * p), rtol=1e-8)


@pytest.mark.parametrize("driver", [gs.drivers.Auto(), gs.drivers.Batched()], ids=["auto", "batched"])
def test_field_with_custom_vjp_solves_and_differentiates(driver):
    """A vector field containing a ``jax.custom_vjp`` (which forward mode cannot enter)
    solves, replays and differentiates: the Taylor terms of t0/t1/ts, which need forward
    mode, run only where those times are traced."""
    @jax.custom_vjp
    def rate(p):
        return p

    rate.defvjp(lambda p: (p, None), lambda _, g: (g,))
    f = lambda t, y, p: -rate(p) * y
    y0, p, ts = jnp.ones((3, 1)), jnp.array([[0.5], [1.0], [2.0]]), jnp.linspace(0.0, 1.0, 5)
    exact = jnp.exp(-p * ts[None, :])[..., None]
    sol = gs.solve(f, 0.0, 1.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12, driver=driver)
    np.testing.assert_allclose(sol.ys, exact, rtol=1e-8)
    mesh = gs.record(f, 0.0, 1.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12, driver=driver)
    g = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q, ts=ts, driver=driver).ys)))(p)
    np.testing.assert_allclose(g, jnp.sum(-ts * jnp.exp(-p * ts), axis=1, keepdims=True),
                               rtol=1e-7)


# ~12-14 s each with cold caches: the lanes replay's in the slow tier
@pytest.mark.parametrize("driver", ["kernel", pytest.param("lanes", marks=pytest.mark.slow)])
def test_save_times_take_the_node_time_adjoint_only_when_differentiated(driver, monkeypatch):
    """The hand-written adjoints carry node-time cotangents only where the save times carry
    a derivative: ``ts`` traced but not differentiated (and concrete ``ts``) take the plain
    adjoint, with the gradient of the replay without ``ts``; ``grad`` w.r.t. ``ts`` takes
    the other and matches the batched driver (JAX's own derivative of the same steps)."""
    import gradsolve.drivers.kernel.build as build
    import gradsolve.drivers.lanes as lanes

    seen = []
    if driver == "kernel":
        load = build.load_part
        monkeypatch.setattr(build, "load_part", lambda prefix, part: seen.append(part == "bwdt")
                            or load(prefix, part))
        drv = gs.drivers.Kernel()
        if not drv.replay_reason(lotka_volterra, gs.Tsit5(), jnp.ones((2, 2)), jnp.ones((2, 4))) is None:
            pytest.skip("no working C++ compiler")
    else:
        group = lanes._backward_group
        # _backward_group(field, solver, nodes, n_eff, pf, save, states, ct_ys, ct_y1,
        #                 with_times, events)
        monkeypatch.setattr(lanes, "_backward_group",
                            lambda *a: seen.append(a[9]) or group(*a))
        drv = gs.drivers.Lanes()
    n = 3
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.05 * jnp.arange(n)[:, None])
    y0 = jnp.ones((n, 2))
    ts = jnp.linspace(0.5, 4.5, 5)
    mesh = gs.record(lotka_volterra, 0.0, 5.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10)
    loss = lambda q, s, d: jnp.sum(gs.replay(lotka_volterra, mesh, y0, q, ts=s, driver=d).ys ** 2)
    plain = jax.jit(jax.grad(lambda q: jnp.sum(
        gs.replay(lotka_volterra, mesh, y0, q, driver=drv).ys ** 2)))(p)
    seen.clear()
    g_traced = jax.jit(jax.grad(loss), static_argnums=2)(p, ts + 0.0, drv)
    assert seen and not any(seen)
    np.testing.assert_allclose(g_traced, plain, rtol=1e-13)
    seen.clear()
    g_concrete = jax.jit(jax.grad(lambda q: loss(q, ts, drv)))(p)  # ts closed over: concrete
    assert not any(seen)
    np.testing.assert_allclose(g_concrete, plain, rtol=1e-13)
    seen.clear()
    moved = ts + 1e-3
    gp, gt = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(p, moved, drv)
    assert seen and all(seen)
    rp, rt = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(p, moved, gs.drivers.Batched())
    np.testing.assert_allclose(gp, rp, rtol=1e-11)
    np.testing.assert_allclose(gt, rt, rtol=1e-10)
    # gs.solve likewise: its save times are recorded nodes, moved only when traced.
    solve = lambda q, s, d: jnp.sum(gs.solve(lotka_volterra, 0.0, 5.0, y0, q, ts=s, rtol=1e-8,
                                             atol=1e-10, driver=d).ys ** 2)
    seen.clear()
    g_solve = jax.jit(jax.grad(lambda q: solve(q, ts, drv)))(p)
    assert not any(seen)
    np.testing.assert_allclose(
        g_solve, jax.jit(jax.grad(lambda q: solve(q, ts, gs.drivers.Batched())))(p), rtol=1e-11)
    sp, st = jax.jit(jax.grad(solve, argnums=(0, 1)), static_argnums=2)(p, ts, drv)
    rp, rt = jax.jit(jax.grad(solve, argnums=(0, 1)), static_argnums=2)(p, ts, gs.drivers.Batched())
    np.testing.assert_allclose(sp, rp, rtol=1e-11)
    np.testing.assert_allclose(st, rt, rtol=1e-10)


def _n_eqns(jaxpr) -> int:
    """Equations of ``jaxpr`` and of every jaxpr nested in it."""
    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _n_eqns(inner)
    return count


def test_replay_at_the_recorded_save_times_is_the_replay_without_them():
    """Concrete ``ts`` equal to the recorded save times (what a fit passes) move nothing:
    under ``jit`` the replay compiles to the one without ``ts``, with the same values; other
    concrete ``ts`` still move their nodes (closed form)."""
    f = lambda t, y, p: -p[0] * y
    y0, p = jnp.ones((2, 1)), jnp.array([[1.0], [2.0]])
    ts = jnp.array([0.25, 0.5, 1.0])
    mesh = gs.record(f, 0.0, 1.0, y0, p, ts=ts, rtol=1e-10, atol=1e-12)
    with_ts = jax.make_jaxpr(lambda q: gs.replay(f, mesh, y0, q, ts=ts).ys)(p)
    without = jax.make_jaxpr(lambda q: gs.replay(f, mesh, y0, q).ys)(p)
    assert _n_eqns(with_ts.jaxpr) == _n_eqns(without.jaxpr)
    np.testing.assert_array_equal(gs.replay(f, mesh, y0, p, ts=ts).ys, gs.replay(f, mesh, y0, p).ys)
    moved = ts.at[1].add(1e-4)
    out = jax.jit(lambda q: gs.replay(f, mesh, y0, q, ts=moved).ys)(p)
    np.testing.assert_allclose(np.asarray(out[..., 0]), np.exp(-np.asarray(p) * np.asarray(moved)), rtol=1e-8)
