"""The Pallas driver under ``jax.vmap`` (``Pallas(interpret=True)``, on CPU): the mapped axis
is folded into the ensemble (``C`` calls of ``n`` trajectories run as one of ``C * n``,
`gradsolve.drivers.pallas._fold`). The mapped record, replay, solve and their gradients
equal the calls one chain at a time (and, where the mapped axis is a cotangent basis, the
lanes driver's Jacobian), for any mix of mapped and shared arguments, and the compiled
buffers grow per chain by that chain's trajectories, not by a whole padded tile."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from test_pallas import HeunEuler, _max_rel, forced, oral

PALLAS = gs.drivers.Pallas(interpret=True)
C, N = 3, 5
TS = (0.0, 1.0, 2.5, 4.0)
KW = dict(max_steps=256, solver=HeunEuler(), rtol=1e-2, atol=1e-4)


def _inputs(dtype):
    rng = np.random.default_rng(0)
    p = {"a": jnp.asarray(rng.uniform(0.5, 2.0, (C, N, 2)), dtype),
         "w": jnp.asarray(rng.uniform(0.5, 3.0, (C, N)), dtype)}
    y0 = jnp.asarray(rng.uniform(-1.0, 1.0, (C, N, 2)), dtype)
    return y0, p, jnp.asarray(TS, dtype)


def _chain(tree, c):
    return jax.tree_util.tree_map(lambda x: x[c], tree)


def _solve_loss(ts):
    def loss(y, q):
        s = gs.solve(forced, 0.0, 4.0, y, q, ts=ts, driver=PALLAS, **KW)
        return jnp.sum(s.ys ** 2) + jnp.sum(jnp.sin(s.y1)), (s.ys, s.y1, s.mesh.n_steps)

    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)


@pytest.mark.parametrize("dtype, tol", [
    (jnp.float64, 1e-12),
    pytest.param(jnp.float32, 1e-6, marks=pytest.mark.slow)])  # the same folding in float32
def test_vmapped_solve_and_gradients_equal_per_chain(dtype, tol):
    """``vmap`` over chains of ``gs.solve``'s value and gradient, chains mapped in both
    ``y0`` and the parameters, in the parameters only and in ``y0`` only: each chain's
    states, step counts (ragged across chains) and gradients are its own call's."""
    y0, p, ts = _inputs(dtype)
    run = _solve_loss(ts)
    one = jax.jit(run)
    cases = [((0, 0), y0, p), ((None, 0), y0[0], p), ((0, None), y0, _chain(p, 0))]
    for axes, y, q in cases:
        out = jax.jit(jax.vmap(run, in_axes=axes))(y, q)
        for c in range(C):
            ref = one(y if axes[0] is None else y[c], q if axes[1] is None else _chain(q, c))
            got = _chain(out, c)
            assert np.all(np.isfinite(np.asarray(ref[0][0])))
            assert _max_rel(got, ref) <= tol, (axes, c)
    steps = np.asarray(out[0][1][2])
    assert len(set(steps.ravel().tolist())) > 3  # ragged lanes within and across chains


def test_vmapped_record_and_replay_equal_per_chain():
    """``gs.record`` mapped over chains gives each chain's own mesh (same nodes, counts and
    save nodes); ``gs.replay`` of one shared mesh with mapped parameters, and its gradient,
    equal each chain's; ``jax.jacrev`` (``vmap`` over the cotangents of one forward, the
    residuals shared) equals the lanes driver's Jacobian."""
    y0, p, ts = _inputs(jnp.float64)

    def rec(y, q):
        return gs.record(forced, 0.0, 4.0, y, q, ts=ts, driver=PALLAS, **KW)

    meshes = jax.jit(jax.vmap(rec))(y0, p)
    one = jax.jit(rec)
    for c in range(C):
        ref, got = one(y0[c], _chain(p, c)), _chain(meshes, c)
        for name in ("times", "n_steps", "n_rejected", "status", "save_index", "y_last"):
            np.testing.assert_array_equal(np.asarray(getattr(got, name)),
                                          np.asarray(getattr(ref, name)), err_msg=name)
    mesh = one(y0[0], _chain(p, 0))

    def rep(q, m, driver=PALLAS):
        s = gs.replay(forced, m, y0[0], q, driver=driver)
        return jnp.sum(s.ys ** 3), s.ys

    run = jax.value_and_grad(rep, has_aux=True)
    out = eqx.filter_jit(jax.vmap(run, in_axes=(0, None)))(p, mesh)
    for c in range(C):
        assert _max_rel(_chain(out, c), eqx.filter_jit(run)(_chain(p, c), mesh)) <= 1e-12

    def ys(q, driver):
        return gs.replay(forced, mesh, y0[0], q, driver=driver).ys

    jac = jax.jit(jax.jacrev(lambda q: ys(q, PALLAS)))(_chain(p, 1))
    ref = jax.jit(jax.jacrev(lambda q: ys(q, gs.drivers.Lanes())))(_chain(p, 1))
    assert _max_rel(jac, ref) <= 1e-10


# ~20 s of CPU in interpret mode
@pytest.mark.slow
def test_vmapped_solve_with_doses_equals_per_chain():
    """Known-time events under ``vmap``: each chain its own bolus times and amounts and
    parameters, a shared ``y0`` and tstops; values and gradients w.r.t. the parameters and
    both dose fields equal each chain's call."""
    rng = np.random.default_rng(4)
    p = {"ka": jnp.asarray(rng.uniform(0.8, 1.5, (C, N))),
         "k": jnp.asarray(rng.uniform(0.1, 0.4, (C, N))),
         "on": jnp.full((C, N), 5.0), "off": jnp.full((C, N), 7.0)}
    y0 = jnp.asarray(rng.random((N, 2)))
    bt = jnp.asarray(rng.uniform(0.2, 1.0, (C, N, 1)))
    ba = jnp.asarray(rng.uniform(1.0, 3.0, (C, N, 1)))

    def loss(q, when, amount):
        s = gs.solve(oral, 0.0, 9.0, y0, q, ts=jnp.array([0.0, 3.5, 6.5, 9.0]),
                     doses=[gs.Bolus(time=when, amount=amount, cmt=0)],
                     tstops=jnp.array([5.0, 7.0]), solver=HeunEuler(), rtol=1e-3, atol=1e-5,
                     max_steps=512, driver=PALLAS)
        return jnp.sum(s.ys ** 2), s.ys

    run = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    out = jax.jit(jax.vmap(run))(p, bt, ba)
    one = jax.jit(run)
    for c in range(C):
        ref = one(_chain(p, c), bt[c], ba[c])
        assert np.all(np.isfinite(np.asarray(ref[0][1])))
        assert _max_rel(_chain(out, c), ref) <= 1e-12


def _temp_bytes(chains: int, n: int, max_steps: int) -> int:
    """Temporaries of ``vmap`` over chains of a loop whose body takes the gradient of a
    solve (as a sampler's leapfrog loop does: the loop body's program is traced once, then
    mapped), compiled, not run."""
    rng = np.random.default_rng(1)
    p = {"a": jnp.asarray(rng.uniform(0.5, 2.0, (chains, n, 2)), jnp.float32),
         "w": jnp.asarray(rng.uniform(0.5, 3.0, (chains, n)), jnp.float32)}
    y0 = jnp.asarray(rng.uniform(-1.0, 1.0, (chains, n, 2)), jnp.float32)

    def loss(y, q):
        s = gs.solve(forced, 0.0, 4.0, y, q, ts=jnp.asarray(TS, jnp.float32),
                     max_steps=max_steps, solver=HeunEuler(), rtol=1e-2, atol=1e-4,
                     driver=PALLAS)
        return jnp.sum(s.ys ** 2)

    def chain(y, q):
        body = lambda i, yq: jax.tree_util.tree_map(lambda a, g: a - 1e-3 * g, yq,
                                                    jax.grad(loss, argnums=(0, 1))(*yq))
        return jax.lax.fori_loop(0, 2, body, (y, q))

    return jax.jit(jax.vmap(chain)).lower(y0, p).compile().memory_analysis().temp_size_in_bytes


def test_vmapped_buffers_grow_by_the_chains_trajectories():
    """Compile only (float32, 64 trajectories a chain, capacity 4,096 steps, 2 and 34
    chains: one and three tiles folded): the temporaries of the mapped gradient grow per
    chain by a fraction of one padded tile (1,024 lanes of node times and states, what
    each chain took as its own grid entry), measured 0.17 of it (0.06 the folded tiles, the rest
    per-trajectory buffers). Also: the mapped loop compiles at all (each call's residuals
    have their unmapped shape)."""
    n, max_steps = 64, 4096
    small, large = _temp_bytes(2, n, max_steps), _temp_bytes(34, n, max_steps)
    per_chain = (large - small) / 32
    tile = (max_steps + 8) * (2 + 1) * 1024 * 4  # node states (d = 2) and times, 1,024 lanes
    assert per_chain < 0.5 * tile, (per_chain, tile)
