"""`inference.sample` on a PEtab problem, against the path it replaced.

Two sides in one process, the same posterior, the same starting points, chains vectorised:

- gradsolve: ``inference.sample(problem)`` at its defaults: the problem's NumPyro program
  (one site per parameter, the pre-equilibration and simulation as ``inference.ode``
  sites), its meshes recorded once per warmup window and replayed for every gradient;
- numpyro: plain NumPyro ``NUTS`` (dense mass, target 0.8) on the same program, whose ode
  sites are then ``gs.solve`` at every evaluation (an adaptive solve per gradient), which
  is what ``inference.sample`` ran for a PEtab problem until 2026-12-06, started at the
  same points (the gradsolve run's MAP start, jittered).

Reports wall time of the chains (the MAP fit is timed apart and shared), the smallest
bulk ESS, ESS per second, divergences, and each parameter's posterior mean and sd on both
sides with their difference in Monte Carlo standard errors.

Usage::

    python benchmarks/bench_petab_sample.py                         # Boehm, 4 x (500 + 1,000)
    python benchmarks/bench_petab_sample.py --quick                 # 4 x (200 + 300)
    python benchmarks/bench_petab_sample.py --quick --max-tree-depth 6
    python benchmarks/bench_petab_sample.py --problem Fujita_SciSignal2010
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np

import inference
import models
from inference.petab._problem import PetabProgramProblem, petab_program


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="Boehm_JProteomeRes2014")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="4 x (200 + 300)")
    ap.add_argument("--sides", default="gradsolve,numpyro")
    ap.add_argument("--max-tree-depth", type=int, default=10,
                    help="NUTS's, both sides (Boehm's flat directions reach depth 10)")
    a = ap.parse_args()
    if a.quick:
        a.warmup, a.samples = 200, 300
    jax.config.update("jax_enable_x64", True)
    import numpyro
    from numpyro.infer import MCMC, NUTS

    # every parameter outer: the program samples every one (noise levels included)
    problem = models.load_petab(a.problem, hierarchical=False)
    print(f"{a.problem}: {problem!r}")
    print(f"{a.chains} chains x ({a.warmup} + {a.samples}), vectorised; CPU devices: "
          f"{jax.device_count()}")
    t = time.perf_counter()
    fit = inference.fit(problem, n_starts=10, seed=0)
    t_fit = time.perf_counter() - t
    print(f"MAP fit (10 starts, LM): {t_fit:.1f} s, best -log p = {fit.loss:.4f}")
    wrapped = PetabProgramProblem(problem)
    centre = np.asarray(wrapped.start_point(fit.params))
    rng = np.random.default_rng(0)
    u0 = centre[None] + 0.05 * rng.standard_normal((a.chains, centre.size))
    init = dict(zip(problem.parameter_ids, np.asarray(wrapped.to_x(u0)).T))

    rows, draws = {}, {}
    if "gradsolve" in a.sides:
        t = time.perf_counter()
        idata = inference.sample(problem, num_warmup=a.warmup, num_samples=a.samples,
                                 num_chains=a.chains, seed=0, init=init,
                                 max_tree_depth=a.max_tree_depth)
        wall = time.perf_counter() - t
        rows["gradsolve"] = (wall, idata)
        print(f"gradsolve: {wall:.1f} s; records {idata.posterior.attrs['n_records']}, "
              f"mesh {idata.posterior.attrs['sampling_mesh']}")
    if "numpyro" in a.sides:
        program = petab_program(problem)
        mcmc = MCMC(NUTS(program, dense_mass=True, target_accept_prob=0.8,
                         max_tree_depth=a.max_tree_depth),
                    num_warmup=a.warmup, num_samples=a.samples, num_chains=a.chains,
                    chain_method="vectorized", progress_bar=False)
        t = time.perf_counter()
        # NumPyro takes a model's initial values in its unconstrained space
        mcmc.run(jax.random.PRNGKey(0), extra_fields=("diverging",),
                 init_params={p: jnp.asarray(u0[:, i])
                              for i, p in enumerate(problem.parameter_ids)})
        jax.block_until_ready(mcmc.get_samples())
        wall = time.perf_counter() - t
        rows["numpyro"] = (wall, az.from_numpyro(mcmc))
        print(f"numpyro: {wall:.1f} s")

    ids = problem.parameter_ids
    print(f"\n{'side':<10} {'wall s':>8} {'min ESS':>8} {'ESS/s':>8} {'diverging':>9}")
    for side, (wall, idata) in rows.items():
        post = idata.posterior[list(ids)]
        ess = float(min(az.ess(post)[p].item() for p in ids))
        div = int(np.asarray(idata.sample_stats["diverging"]).sum())
        draws[side] = (post, ess / wall)
        print(f"{side:<10} {wall:8.1f} {ess:8.0f} {ess / wall:8.2f} {div:9d}")
    if len(draws) == 2:
        (pa, ra), (pb, rb) = draws["gradsolve"], draws["numpyro"]
        print(f"\nESS/s gradsolve / numpyro: {ra / rb:.2f}x; "
              f"wall numpyro / gradsolve: {rows['numpyro'][0] / rows['gradsolve'][0]:.2f}x")
        print(f"\n{'parameter':<28} {'mean gs':>9} {'mean np':>9} {'sd gs':>7} {'sd np':>7} "
              f"{'diff/MCSE':>9}")
        mcse_a, mcse_b = az.mcse(pa), az.mcse(pb)
        for p in ids:
            ma, mb = float(pa[p].mean()), float(pb[p].mean())
            se = float(np.hypot(mcse_a[p].item(), mcse_b[p].item()))
            print(f"{p:<28} {ma:9.4f} {mb:9.4f} {float(pa[p].std()):7.4f} "
                  f"{float(pb[p].std()):7.4f} {(ma - mb) / se:9.2f}")


if __name__ == "__main__":
    main()
