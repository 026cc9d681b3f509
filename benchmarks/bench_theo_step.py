"""Theophylline's posterior with the lockstep ensemble sampler, and what one of its steps costs.

The zoo's theophylline population (12 subjects, 30 parameters) at ``C`` chains, in one
process, float32 unless ``--x64``:

- ``record``: one record of every chain's subjects (``C x 12`` trajectories) at ``C``
  prior draws, first and second call, and the mesh it gives (capacity, steps);
- ``grad``: ``jax.grad`` of the summed log density of the ``C`` points on that mesh,
  compiled, then the median of 10 calls: the cost of one leapfrog step of every chain on a
  kept mesh;
- ``solve_grad``: the same gradient with every subject solved adaptively (``gs.solve``, the
  sites' own capacity): one leapfrog step of every chain under ``rerecord="always"``, a
  population posterior's policy;
- ``sample``: ``inference.sample(model, data, sampler=ChEES(num_chains=C))`` with
  ``--warmup`` warmup iterations and ``--samples`` draws a chain (default: the sampler's),
  its phases (``init_fit_wall_time_s``: the MAP and ADVI start), leapfrog steps a draw and
  the smallest bulk ESS over every parameter (ArviZ).

Usage::

    python benchmarks/bench_theo_step.py --chains 128 --warmup 500            # on the chip
    JAX_PLATFORMS=cpu python benchmarks/bench_theo_step.py --chains 16 --warmup 500
    python benchmarks/bench_theo_step.py --chains 128 --warmup 500 --sample-only
    python benchmarks/bench_theo_step.py --study 200 --chains 128 --steps-only  # the study

``--study S`` takes the simulated S-subject multiple-dose study (`models.simulated_study`,
`models.two_compartment_oral`) instead of theophylline; ``--steps-only`` stops before the
posterior.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--samples", type=int, default=None, help="default: the sampler's")
    ap.add_argument("--sample-only", action="store_true", help="skip record and grad")
    ap.add_argument("--steps-only", action="store_true", help="skip the posterior")
    ap.add_argument("--study", type=int, default=0, metavar="S",
                    help="the simulated S-subject study instead of theophylline")
    ap.add_argument("--x64", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import jax

    if a.x64:
        jax.config.update("jax_enable_x64", True)
    import arviz as az
    import jax.numpy as jnp
    import numpy as np

    import inference
    import models
    from inference.petab._problem import problem_of

    warnings.filterwarnings("ignore")
    C = a.chains
    if a.study:
        model = models.two_compartment_oral()
        data, _ = models.simulated_study(n_subjects=a.study, seed=0)
    else:
        model, data = models.theophylline(), models.load_dataset("theophylline")
    out = dict(device=str(jax.devices()[0]), model=getattr(model, "name", "study"),
               subjects=a.study or 12, chains=C, warmup=a.warmup, samples=a.samples,
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if not a.sample_only:
        problem = problem_of(model, data)
        print("replay drivers", problem.replay_drivers, flush=True)
        u = jnp.asarray(problem.sample_starts(jax.random.PRNGKey(0), C),
                        jnp.result_type(float))
        for rep in range(2):
            t = time.perf_counter()
            mesh = problem.record(u)
            jax.block_until_ready(jax.tree_util.tree_leaves(mesh.meshes))
            out[f"record_{rep + 1}_s"] = time.perf_counter() - t
        for k, m in mesh.meshes.items():
            n = np.asarray(m.n_steps)
            out[f"{k}_capacity"], out[f"{k}_steps_max"] = int(m.capacity), int(n.max())
            out[f"{k}_steps_mean"] = float(n.mean())
        grad = jax.jit(jax.grad(lambda z, m: jnp.sum(problem.log_density(z, m)[0])))
        t = time.perf_counter()
        jax.block_until_ready(grad(u, mesh))
        out["grad_compile_s"] = time.perf_counter() - t
        ts = []
        for _ in range(10):
            t = time.perf_counter()
            jax.block_until_ready(grad(u, mesh))
            ts.append(time.perf_counter() - t)
        out["grad_ms"] = 1e3 * float(np.median(ts))
        solve = jax.jit(jax.grad(lambda z: jnp.sum(problem.log_density(z, None)[0])))
        t = time.perf_counter()
        jax.block_until_ready(solve(u))
        out["solve_grad_compile_s"] = time.perf_counter() - t
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(solve(u))
            ts.append(time.perf_counter() - t)
        out["solve_grad_ms"] = 1e3 * float(np.median(ts))
        print(json.dumps(out), flush=True)
    if a.steps_only:
        return

    t = time.perf_counter()
    idata = inference.sample(model, data, sampler=inference.sampling.ChEES(num_chains=C),
                             num_warmup=a.warmup, num_samples=a.samples, progress=False)
    wall = time.perf_counter() - t
    at = idata.posterior.attrs
    names = list(idata.posterior.data_vars)
    ess = min(float(az.ess(idata, var_names=[n]).to_array().min()) for n in names)
    rhat = max(float(az.rhat(idata, var_names=[n]).to_array().max()) for n in names)
    out.update(wall_s=wall, min_ess_bulk=ess, ess_per_s=ess / wall, max_rhat=rhat,
               leapfrog_per_draw=float(np.asarray(idata.sample_stats["n_steps"]).mean()),
               **{k: at[k] for k in ("warmup_time_s", "sampling_time_s", "init_fit_wall_time_s",
                                     "n_records") if k in at})
    print(json.dumps(out), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
