"""Memory of ChEES's compiled loop by number of chains: XLA's own analysis, no run.

The loop (`inference.sampling._ensemble.EnsembleKernel`) of a population posterior under
``rerecord="always"`` solves every subject with ``gs.solve`` in every leapfrog step of every
chain. This script builds the loop's inputs as `inference.sample` does (the chains'
starting state at the prior median plus jitter, the meshes of one record), lowers and
compiles the loop for 100 iterations (`CHUNK`) and prints
``jax.jit(...).lower(...).compile().memory_analysis()``: temporaries, arguments and
outputs, and temporaries per chain. Nothing is run, so sizes a device could not hold are
measured too.

``--pallas`` lowers the ode sites' record and replay on ``gs.drivers.Pallas(interpret=True)``,
the kernels `gs.drivers.Auto` picks on a TPU, through the Pallas interpreter on this host:
the same buffers (each chain's ensemble padded to at least 8 x 128 trajectories under
``jax.vmap``), so the analysis shows what the chip is asked for. Without it the XLA drivers
run (the lanes replay: what a GPU runs; the compiled CPU kernel is switched off).

``--block B`` evaluates the chains ``B`` at a time (`ChEES(chain_block=B)`); without it
the loop holds all chains at once (the default before a device runs out of memory).
``--max-steps K`` gives the ode sites a step capacity of ``K`` (`inference.sample`'s
``max_steps``; default 16,384): the solve's buffers scale with it.

Usage::

    python benchmarks/bench_sampler_memory.py --model theophylline --chains 16,32,64,128
    python benchmarks/bench_sampler_memory.py --model theophylline --pallas --block 8
    python benchmarks/bench_sampler_memory.py --model study200 --pallas --chains 16,128

float32 unless ``--x64`` (an accelerator's precision).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

jax.config.update("jax_enable_x64", "--x64" in sys.argv)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gradsolve as gs  # noqa: E402


def force_pallas_interpret() -> None:
    """Make `gs.drivers.Auto` take ``Pallas(interpret=True)`` first wherever it applies
    (what it takes on a TPU), for the lowering only."""
    import gradsolve.drivers.auto as auto
    from gradsolve.drivers.pallas import Pallas

    choose = auto.Auto._choose

    def first_pallas(self, kind, f, solver, y0, params, events):
        d = Pallas(interpret=True)
        if auto.reason_for(d, kind, f, solver, y0, params, events) is None:
            return d, []
        return choose(self, kind, f, solver, y0, params, events)

    auto.Auto._choose = first_pallas


def problem_and_point(name: str, max_steps: int | None = None):
    import models
    from inference.problem._program import problem_of

    if name == "theophylline":
        model, data = models.theophylline(), models.load_dataset("theophylline")
    elif name.startswith("study"):
        model = models.two_compartment_oral()
        data, _ = models.simulated_study(n_subjects=int(name[5:]), seed=0)
    else:
        raise SystemExit(f"--model must be theophylline or studyS (e.g. study200), got {name}")
    problem = problem_of(model, data, max_steps=max_steps)
    u = np.asarray(problem.space.to_unconstrained(problem.model.defaults))
    return problem, u


def loop_memory(problem, u, C: int, block: int | None):
    """``(memory_analysis, compile CPU seconds, the block used)`` of the loop of ``C``
    chains at ``u`` plus jitter."""
    from inference.problem._policy import MeshPolicy
    from inference.sampling._chains import CHUNK, Draws, SampleState, solve_capacity
    from inference.sampling._samplers import ChEES

    policy = MeshPolicy.checked("sample", "always", record_tol_factor=0.1)
    D = problem.space.dim
    m1 = problem.record(u, 0.1).to_host()
    need = int(np.max(m1.n_steps))
    o = dict(num_chains=C, num_warmup=500, target_accept=0.651, dense_mass=D <= 50,
             count=False)
    kernel = ChEES(chain_block=block).kernel(problem, policy, o, solve_capacity(need))
    mesh = m1.repeat(C)
    s = SampleState(None, mesh, mesh.capacity, solve_capacity(need), False, 0, 0, 0.651, 0,
                    0.1, 0)
    u0 = u[None] + 0.01 * np.random.default_rng(0).standard_normal((C, D))
    chains = kernel.init(u0, jax.random.PRNGKey(0), s)
    f = jnp.result_type(float)
    buf = Draws(jnp.zeros((C, CHUNK, D), f), jnp.zeros((C, CHUNK), bool),
                jnp.zeros((C, CHUNK), jnp.int32), *(jnp.zeros((C, CHUNK), f),) * 4)
    t = time.process_time()
    compiled = kernel._loop.lower(chains, kernel.meshes(s), CHUNK, buf).compile()
    return compiled.memory_analysis(), time.process_time() - t, kernel.chain_block


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="theophylline")
    ap.add_argument("--chains", default="16,32,64,128")
    ap.add_argument("--block", type=int, default=None,
                    help="chains evaluated at once (default: all)")
    ap.add_argument("--pallas", action="store_true",
                    help="the TPU's Pallas kernels, interpreted (see the docstring)")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="the ode sites' step capacity (default 16,384)")
    ap.add_argument("--x64", action="store_true")
    a = ap.parse_args()
    gs.use_compiled_kernel(False)
    if a.pallas:
        force_pallas_interpret()
    problem, u = problem_and_point(a.model, a.max_steps)
    print(f"{a.model}: D={problem.space.dim}, sites {problem.sizes}, site capacity "
          f"{problem.max_steps} steps, {'Pallas (interpreted)' if a.pallas else 'XLA'} "
          f"drivers, {jnp.dtype(jnp.result_type(float)).name}; loop of 100 iterations", flush=True)
    print(f"{'chains':>6} {'block':>5} {'temp GB':>9} {'args MB':>8} {'out MB':>8} "
          f"{'temp/chain MB':>14} {'compile CPU s':>13}", flush=True)
    for C in (int(c) for c in a.chains.split(",")):
        ma, cpu, block = loop_memory(problem, u, C, a.block)
        print(f"{C:6d} {block:5d} {ma.temp_size_in_bytes / 1e9:9.3f} "
              f"{ma.argument_size_in_bytes / 1e6:8.2f} {ma.output_size_in_bytes / 1e6:8.2f} "
              f"{ma.temp_size_in_bytes / C / 1e6:14.2f} {cpu:13.1f}", flush=True)


if __name__ == "__main__":
    main()
