"""A program's record over many points (chains, starts) in blocks when the device's memory
cannot hold them all at once: the same meshes as one record of every point."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.problem._program import problem_for

from test_program_plates import program


@pytest.fixture
def problem():
    ts = jnp.linspace(0.5, 4.0, 5)
    obs = jnp.exp(-jnp.outer(jnp.array([0.5, 0.8, 1.1]), ts))
    return problem_for(program, (ts, obs), rtol=1e-6, atol=1e-8, max_steps=None)


def _limit(pb, most):
    """``pb``'s record of many points refusing blocks above ``most`` points, as a device
    out of memory does."""
    whole = pb._record_many
    seen = []

    def record_many(u, tol):
        seen.append(u.shape[0])
        if u.shape[0] > most:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
        return whole(u, tol)

    pb._record_many = record_many
    return seen


def test_a_record_too_large_runs_in_blocks(problem):
    u = jax.random.normal(jax.random.PRNGKey(0), (5, problem.space.dim)) * 0.3
    once = problem.record(u)
    seen = _limit(problem, 2)
    blocks = problem.record(u)
    # refused at 5 and 3 points, then three blocks of 2 (the last padded)
    assert seen == [5, 3, 2, 2, 2] and problem._record_block == 2
    assert blocks.n == once.n == 5
    a, b = once.meshes["decay"], blocks.meshes["decay"]
    assert a.n == b.n == 15
    # each point's trajectories on the same steps, and the same density on them
    for i in range(a.n):
        ka, kb = int(a.n_steps[i]), int(b.n_steps[i])
        assert ka == kb
        np.testing.assert_allclose(np.asarray(a.ts)[i, :ka + 1], np.asarray(b.ts)[i, :kb + 1],
                                   rtol=0, atol=0)
    lp_once, _ = problem.log_density(u, once)
    lp_blocks, _ = problem.log_density(u, blocks)
    np.testing.assert_allclose(lp_blocks, lp_once, rtol=1e-12)
    # the next record starts at the block size that fit
    seen.clear()
    problem.record(u)
    assert max(seen) <= 2


def test_a_point_that_cannot_fit_says_what_to_change(problem):
    u = jnp.zeros((3, problem.space.dim))
    _limit(problem, 0)
    with pytest.raises(MemoryError, match="max_steps"):
        problem.record(u)


def test_a_jitted_scatter_of_points_equals_the_eager_one(problem):
    """`inference.fit` scatters re-recorded points into the device mesh inside `jax.jit`
    (the rows are traced); a program's meshes must take them as the host scatter does."""
    u = jax.random.normal(jax.random.PRNGKey(1), (4, problem.space.dim)) * 0.3
    mesh = problem.record(u).to_device()
    sub = problem.record(u[:2] * 1.5).to_device()
    rows = np.array([3, 1])
    eager = mesh.scatter(rows, sub)
    jitted = jax.jit(lambda m, r, s: m.scatter(r, s))(mesh, jnp.asarray(rows), sub)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    lp_eager, _ = problem.log_density(u, eager)
    lp_jit, _ = problem.log_density(u, jitted)
    np.testing.assert_array_equal(lp_eager, lp_jit)
