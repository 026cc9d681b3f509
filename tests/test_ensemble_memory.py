"""ChEES's compiled loop in blocks of chains (`inference.sampling._ensemble.blocked`).

References: the loop with all chains in one ``jax.vmap`` (the plain vectorisation every
block reduces to), for the draws; XLA's memory analysis of the compiled loop (no run, no
timing), for its temporaries by number of chains.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import inference
import models
from inference.problem._policy import MeshPolicy
from inference.problem._program import problem_of
from inference.sampling import ChEES
from inference.sampling._chains import CHUNK, Draws, SampleState, solve_capacity
from inference.sampling._ensemble import EnsembleKernel, _divisor_block, blocked


def test_blocked_is_vmap():
    """Any block gives ``jax.vmap``'s values (pytrees in and out, a block that does not
    divide the chains is refused by the kernel's rounding, `_divisor_block`)."""
    x = jnp.arange(24.0).reshape(6, 4)
    tree = {"a": jnp.arange(6.0), "b": (jnp.ones((6, 2, 2)),)}

    def f(v, t):
        return jnp.sin(v) * t["a"], t["b"][0] @ v[:2]

    want = jax.vmap(f)(x, tree)
    for block in (1, 2, 3, 6, 12):
        got = jax.jit(blocked(f, block))(x, tree)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_array_equal(g, w)
    assert [_divisor_block(12, b) for b in (None, 12, 8, 5, 4, 1, 100)] == [12, 12, 6, 4, 4, 1,
                                                                         12]


def test_chain_block_is_checked():
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="`chain_block`"):
            ChEES(num_chains=4, chain_block=bad)


def _draws(m, data, block, **kw):
    idata = inference.sample(m, data, sampler=ChEES(num_chains=4, chain_block=block),
                             seed=1, progress=False, **kw)
    out = {k: v.values for k, v in idata.posterior.items()}
    out.update({f"stat_{k}": idata.sample_stats[k].values for k in ("n_steps", "diverging")})
    return out, idata


def _same(got, ref, rtol):
    """The same draws: the same leapfrog counts and divergences, and positions equal to
    rounding grown over the iterations (a block changes the order of a few sums; float64
    differences of 1e-16 grow to ~1e-10 over 50 HMC iterations, where another draw would
    differ by the posterior's sd)."""
    for k in ref:
        if k.startswith("stat_"):
            np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=1e-12, err_msg=k)


def test_chain_blocks_give_the_same_draws(lynx, monkeypatch):
    """Lynx–hare, 4 chains x (30 + 20), float64: the draws of blocks of 1 chain, and of
    the blocks a device out of memory leaves (4 chains refused, then 2), are those of all
    4 in one vmap, warmup's adaptation included."""
    m, data = lynx
    kw = dict(num_warmup=30, num_samples=20, init=dict(m.defaults))
    ref, idata = _draws(m, data, None, **kw)
    assert idata.sample_stats["n_steps"].shape == (4, 20)
    _same(_draws(m, data, 1, **kw)[0], ref, 1e-7)

    build, seen, kernels = EnsembleKernel._build_loop, [], []

    def limited(self, block):
        loop = build(self, block)
        kernels.append(self)

        def run(*args):
            seen.append(block)
            if block > 2:
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in "
                                                 "memory space hbm")
            return loop(*args)
        return run

    monkeypatch.setattr(EnsembleKernel, "_build_loop", limited)
    _same(_draws(m, data, None, **kw)[0], ref, 1e-7)
    # refused once at 4 chains, then every call at 2 (kept for the next calls)
    assert seen[:2] == [4, 2] and set(seen[1:]) == {2}, seen
    assert kernels[-1].chain_block == 2


@pytest.mark.slow
def test_chain_blocks_give_the_same_draws_theophylline():
    """The theophylline population (``rerecord="always"``: ``gs.solve`` in every
    evaluation), 4 chains x (10 + 10) from the prior median, float64: blocks of 2 chains
    draw what one vmap of all 4 draws."""
    model, data = models.theophylline(), models.load_dataset("theophylline")
    init = dict(problem_of(model, data).model.defaults)
    kw = dict(num_warmup=10, num_samples=10, init=init)
    ref, idata = _draws(model, data, None, **kw)
    assert idata.posterior.attrs["mesh_policy"] == "always"
    _same(_draws(model, data, 2, **kw)[0], ref, 1e-7)


def _loop_temp_bytes(problem, C: int, block: int | None) -> int:
    """Temporaries of the compiled loop of ``C`` chains (``rerecord="always"``), from
    XLA's memory analysis of its lowering (nothing runs)."""
    policy = MeshPolicy.checked("sample", "always", record_tol_factor=0.1)
    D = problem.space.dim
    u = np.asarray(problem.space.to_unconstrained(problem.model.defaults))
    m1 = problem.record(u, 0.1).to_host()
    cap = solve_capacity(int(np.max(m1.n_steps)))
    o = dict(num_chains=C, num_warmup=10, target_accept=0.651, dense_mass=True, count=False)
    kernel = ChEES(chain_block=block).kernel(problem, policy, o, cap)
    assert isinstance(kernel, EnsembleKernel)
    mesh = m1.repeat(C)
    s = SampleState(None, mesh, mesh.capacity, cap, False, 0, 0, 0.651, 0, 0.1, 0)
    u0 = u[None] + 0.01 * np.random.default_rng(0).standard_normal((C, D))
    chains = kernel.init(u0, jax.random.PRNGKey(0), s)
    f = jnp.result_type(float)
    buf = Draws(jnp.zeros((C, CHUNK, D), f), jnp.zeros((C, CHUNK), bool),
                jnp.zeros((C, CHUNK), jnp.int32), *(jnp.zeros((C, CHUNK), f),) * 4)
    lowered = kernel._loop.lower(chains, kernel.meshes(s), CHUNK, buf)
    return int(lowered.compile().memory_analysis().temp_size_in_bytes)


@pytest.mark.slow  # compiles the loop four times (~40 s)
def test_blocked_loop_temporaries_grow_by_a_small_constant_per_chain(lynx):
    """Lynx–hare under ``rerecord="always"``: with all chains in one vmap the loop's
    temporaries grow by a solve's buffers per chain; in blocks of 2 chains they are one
    block's plus a small per-chain constant (the chains' states, under a tenth of it)."""
    m, data = lynx
    problem = problem_of(m, data, max_steps=None)
    whole = _loop_temp_bytes(problem, 8, None)
    per_chain = whole / 8
    b4, b8 = _loop_temp_bytes(problem, 4, 2), _loop_temp_bytes(problem, 8, 2)
    assert (b8 - b4) / 4 < 0.1 * per_chain, (whole, b4, b8)
    assert b8 < 0.5 * whole, (whole, b8)
