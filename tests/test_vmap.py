"""Recording and replaying under ``jax.vmap`` (a batch of ensembles: NumPyro's vectorised
chains, a vmapped loss).

The XLA record folds the mapped axis into the ensemble axis: ``B`` vmapped records of ``n`` trajectories must be exactly one record of the ``B * n``
concatenated trajectories (each trajectory's steps do not depend on the others), including
with events; inputs that cannot fold (a mapped tolerance, a mapped value ``f`` closes over)
fall back to a plain ``vmap`` and still agree with calls one by one. The replays run one
loop over a batch of meshes of different lengths (to the longest); each member's values and
gradients must equal its own replay's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs

from conftest import lotka_volterra as f

B, N = 3, 5
TS = jnp.linspace(0.0, 8.0, 9)


@pytest.fixture
def batch():
    key = jax.random.PRNGKey(3)
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * jax.random.uniform(key, (B, N, 4)))
    y0 = jnp.broadcast_to(jnp.array([1.0, 0.5]), (N, 2))
    return y0, p


def _rows(m):
    return (m.times, m.n_steps, m.n_rejected, m.status, m.save_index, m.y_last, m.dt_next)


@pytest.mark.parametrize("events", [False, True])
def test_vmapped_record_is_one_record_of_the_concatenated_ensemble(batch, events):
    y0, p = batch
    jumps = (jnp.array([2.0, 5.0]), jnp.array([[0.3, 0.0], [0.0, 0.2]])) if events else None
    drv = gs.drivers.Batched()

    def rec(y, q):
        return _rows(gs.record(f, 0.0, 8.0, y, q, ts=TS, driver=drv, jumps=jumps))

    mapped = jax.jit(jax.vmap(rec, in_axes=(None, 0)))(y0, p)
    flat = jax.jit(rec)(jnp.tile(y0, (B, 1)), p.reshape(B * N, 4))
    for a, b in zip(mapped, flat):
        np.testing.assert_array_equal(np.asarray(a).reshape(b.shape), np.asarray(b))


def test_nested_vmap_folds_both_axes(batch):
    y0, p = batch
    drv = gs.drivers.Batched()
    rec = lambda q: gs.record(f, 0.0, 8.0, y0, q, ts=TS, driver=drv).times
    nested = jax.jit(jax.vmap(jax.vmap(rec)))(jnp.stack([p, p * 1.01]))
    flat = jax.jit(jax.vmap(rec))(jnp.concatenate([p, p * 1.01]))
    np.testing.assert_array_equal(np.asarray(nested).reshape(flat.shape), np.asarray(flat))


@pytest.mark.parametrize("case", [
    pytest.param("closure_float", marks=pytest.mark.slow),  # ~8 s each; rtol's fallback
    pytest.param("closure_index", marks=pytest.mark.slow),  # is the same path
    "rtol"])
def test_inputs_that_cannot_fold_fall_back_and_agree(batch, case):
    y0, p = batch
    scales = jnp.array([1.0, 1.1, 0.9])
    drv = gs.drivers.Batched()

    def rec(i):
        if case == "closure_float":
            g, rtol = (lambda t, y, q: scales[0] * 0 + i * f(t, y, q)), 1e-6
        elif case == "closure_index":
            g, rtol = (lambda t, y, q: scales[i] * f(t, y, q)), 1e-6
        else:
            g, rtol = f, i
        m = gs.record(g, 0.0, 8.0, y0, p[0], ts=TS, driver=drv, rtol=rtol)
        return m.n_steps, m.y_last

    xs = {"closure_float": scales, "closure_index": jnp.arange(3),
          "rtol": jnp.array([1e-5, 1e-6, 1e-8])}[case]
    mapped = jax.vmap(rec)(xs)
    for j, x in enumerate(xs):
        n_steps, y_last = rec(x)
        np.testing.assert_array_equal(mapped[0][j], n_steps)
        np.testing.assert_allclose(mapped[1][j], y_last, rtol=1e-9)


def test_gradient_through_vmapped_solve_matches_calls_one_by_one(batch):
    y0, p = batch
    drv = gs.drivers.Batched()
    loss = lambda q: jnp.sum(gs.solve(f, 0.0, 8.0, y0, q, ts=TS, driver=drv).ys ** 2)
    mapped = jax.jit(jax.vmap(jax.grad(loss)))(p)
    one = jax.jit(jax.grad(loss))  # one compile for the B calls
    for j in range(B):
        np.testing.assert_allclose(mapped[j], one(p[j]), rtol=1e-9)


def _spread(batch):
    """Parameters whose step counts differ several-fold across the batch."""
    y0, p = batch
    return y0, p * jnp.array([0.5, 1.0, 2.5])[:, None, None]


# ~10-20 s each: the lanes driver with and without events in the normal suite, the batched
# driver (the same vmap rule over another replay) in the slow tier
@pytest.mark.parametrize("driver", [pytest.param("batched", marks=pytest.mark.slow), "lanes"])
@pytest.mark.parametrize("events", [False, True])
def test_vmapped_replay_of_meshes_of_different_lengths_matches_each_replay(batch, driver, events):
    y0, p = _spread(batch)
    drv = gs.drivers.Batched() if driver == "batched" else gs.drivers.Lanes()
    jt = jnp.array([2.0, 5.0])
    js = jnp.array([[0.3, 0.0], [0.0, 0.2]])
    jumps = (jt, js) if events else None
    rec = jax.jit(jax.vmap(lambda q: gs.record(f, 0.0, 8.0, y0, q, ts=TS, jumps=jumps,
                                               max_steps=512)))
    meshes = rec(p)
    steps = np.asarray(meshes.n_steps)
    assert steps.max(axis=1).min() * 2 < steps.max()          # lengths differ across members

    def loss(q, sizes, mesh):
        j = (jt, sizes) if events else None
        return jnp.sum(gs.replay(f, mesh, y0, q, ts=TS, jumps=j, driver=drv).ys ** 2)

    value, (gp, gs_) = jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)),
                                        in_axes=(0, None, 0)))(p, js, meshes)
    one = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))  # one compile for the B members
    for j in range(B):
        m = jax.tree_util.tree_map(lambda x: x[j], meshes)
        one_v, (one_p, one_s) = one(p[j], js, m)
        np.testing.assert_allclose(value[j], one_v, rtol=1e-13)
        np.testing.assert_allclose(gp[j], one_p, rtol=1e-12, atol=1e-14)
        if events:
            np.testing.assert_allclose(gs_[j], one_s, rtol=1e-12, atol=1e-14)


def test_nested_vmapped_replay_matches_each_replay(batch):
    y0, p = _spread(batch)
    P = jnp.stack([p, p * 1.1])                                      # (2, B, N, 4)
    rec = jax.jit(jax.vmap(jax.vmap(lambda q: gs.record(f, 0.0, 8.0, y0, q, ts=TS,
                                                        max_steps=512))))
    meshes = rec(P)
    loss = lambda q, m: jnp.sum(gs.replay(f, m, y0, q, driver=gs.drivers.Lanes()).ys ** 2)
    g = jax.jit(jax.vmap(jax.vmap(jax.grad(loss))))(P, meshes)
    one = jax.jit(jax.grad(loss))  # one compile for the 2 B members
    for a in range(2):
        for b in range(B):
            m = jax.tree_util.tree_map(lambda x: x[a, b], meshes)
            np.testing.assert_allclose(g[a, b], one(P[a, b], m), rtol=1e-12)
