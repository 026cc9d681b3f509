"""gs.MeshReuse: a kept mesh, re-recorded where stale, inside jit; its gradient is the replay's
on the mesh it used, and that mesh meets the requested tolerances."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import gradsolve as gs
from conftest import lotka_volterra

N = 4
P = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.05 * jnp.arange(N)[:, None])
Y0 = jnp.ones((N, 2))
TS = jnp.linspace(0.5, 6.0, 12)


def _reference(p, y0):
    """SciPy DOP853 at rtol 1e-12 for every trajectory: ``(n, k, d)``."""
    out = []
    for pi, yi in zip(np.asarray(p), np.asarray(y0)):
        rhs = lambda t, y: np.asarray(lotka_volterra(t, jnp.asarray(y), jnp.asarray(pi)))
        out.append(solve_ivp(rhs, (0.0, 6.0), yi, method="DOP853", t_eval=np.asarray(TS),
                             rtol=1e-12, atol=1e-12).y.T)
    return np.stack(out)


def _loss_and_state(reuse):
    def step(q, state):
        def loss(q):
            sol, new = reuse.solve(state, Y0, q)
            return jnp.sum(sol.ys ** 2), (new, sol)
        (value, (state, sol)), g = jax.value_and_grad(loss, has_aux=True)(q)
        return value, g, state, sol
    return jax.jit(step)


def test_reuse_replays_until_stale_and_its_gradient_is_the_replays():
    """Small moves replay the kept mesh (no record); the gradient equals the replay's
    gradient on the mesh in use (to rounding) and central differences of that frozen-mesh
    loss; the values meet the requested tolerance against SciPy; a large move re-records
    exactly the rows that went stale."""
    reuse = gs.MeshReuse(lotka_volterra, 0.0, 6.0, ts=TS, rtol=1e-6, atol=1e-9)
    state = reuse.init(Y0, P)
    assert int(state.n_records) == 1 and int(state.n_rows_recorded) == N
    step = _loss_and_state(reuse)
    q = P * (1 + 1e-4)
    value, g, new, sol = step(q, state)
    assert int(new.n_records) == 1  # no re-record for a 1e-4 move
    frozen = lambda q: jnp.sum(gs.replay(lotka_volterra, state.mesh, Y0, q).ys ** 2)
    np.testing.assert_allclose(g, jax.grad(frozen)(q), rtol=1e-12)
    h = 1e-6
    e = jnp.zeros_like(q).at[1, 2].set(h * q[1, 2])
    fd = (frozen(q + e) - frozen(q - e)) / (2 * e[1, 2])
    np.testing.assert_allclose(g[1, 2], fd, rtol=1e-6)
    ref = _reference(q, Y0)
    np.testing.assert_allclose(np.asarray(sol.ys), ref, rtol=2e-4, atol=1e-6)
    # Move only rows 2 and 3 by 30 %: those two (drift > 0.1) are re-recorded, and the
    # result is the replay on the refreshed mesh, whose error ratio holds.
    far = q.at[2:].multiply(1.3)
    value, g, new2, sol = step(far, new)
    assert int(new2.n_records) == 2 and int(new2.n_rows_recorded) == N + 2
    assert not bool(jnp.any(new2.stale))
    np.testing.assert_array_equal(np.asarray(new2.mesh.times[:2]), np.asarray(new.mesh.times[:2]))
    assert bool(jnp.all(sol.error_ratio * reuse.record_tol_factor <= 1.0))
    np.testing.assert_allclose(np.asarray(sol.ys), _reference(far, Y0), rtol=2e-4, atol=1e-6)
    on_mesh = lambda q: jnp.sum(gs.replay(lotka_volterra, new2.mesh, Y0, q).ys ** 2)
    np.testing.assert_allclose(g, jax.grad(on_mesh)(far), rtol=1e-12)


@pytest.mark.parametrize("check", ["after", "before"])
def test_reuse_rerecords_on_error_ratio_and_for_one_trajectory(check):
    """With a huge drift_tol only the error estimate triggers: ``check="before"`` re-records
    at the call that finds the mesh too coarse, ``"after"`` returns that call's replay (its
    error ratio says so) and re-records at the next. One trajectory (y0 (d,)), eager."""
    reuse = gs.MeshReuse(lotka_volterra, 0.0, 6.0, ts=TS, drift_tol=1e9, check=check)
    state = reuse.init(Y0[0], P[0])
    sol, same = reuse.solve(state, Y0[0], P[0])
    assert int(same.n_records) == 1 and sol.ys.shape == (12, 2) and not bool(same.stale)
    ok = lambda s: float(s.error_ratio) * reuse.record_tol_factor <= 1.0
    sol, new = reuse.solve(same, Y0[0], P[0] * 1.5)
    if check == "after":
        assert int(new.n_records) == 1 and not ok(sol) and bool(new.stale)
        sol, new = reuse.solve(new, Y0[0], P[0] * 1.5)
    assert int(new.n_records) == 2 and ok(sol) and not bool(new.stale)
    np.testing.assert_allclose(np.asarray(sol.ys), _reference(P[:1] * 1.5, Y0[:1])[0], rtol=2e-4,
                               atol=1e-6)


def test_mesh_where_swaps_rows_under_jit():
    """Mesh.where keeps shapes (jittable) and replays to the rows it took."""
    a = gs.record(lotka_volterra, 0.0, 6.0, Y0, P, ts=TS, max_steps=256).padded()
    b = gs.record(lotka_volterra, 0.0, 6.0, Y0, P * 1.2, ts=TS, max_steps=256).padded()
    mask = jnp.array([True, False, True, False])
    mixed = jax.jit(lambda m: a.where(m, b))(mask)
    q = jnp.where(mask[:, None], P * 1.2, P)
    out = gs.replay(lotka_volterra, mixed, Y0, q).ys
    np.testing.assert_array_equal(out[0], gs.replay(lotka_volterra, b, Y0, P * 1.2).ys[0])
    np.testing.assert_array_equal(out[1], gs.replay(lotka_volterra, a, Y0, P).ys[1])
    with pytest.raises(ValueError, match="capacity"):
        a.where(mask, b.with_capacity(300))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        a.where(jnp.array([True]), b)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(drift_tol=0.0), "`drift_tol`"),
    (dict(max_error_ratio=-1.0), "`max_error_ratio`"),
    (dict(record_tol_factor=2.0), "`record_tol_factor`"),
    (dict(max_steps=0), "`max_steps`"),
    (dict(check="never"), "`check`"),
])
def test_reuse_rejects_bad_settings(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        gs.MeshReuse(lotka_volterra, 0.0, 6.0, **kwargs)
