"""Where a sampler's time goes: ``inference.sample`` on lynx–hare, phase by phase, beside the
cost of the one thing a step must do (the potential's gradient for all chains on one mesh).

For each chain count ``C`` (in one process, so the second count's compiles are partly warm):

- ``sample``: the whole call at its defaults but for ``num_chains``, ``num_warmup`` and
  ``num_samples``; its own timings (``warmup_time_s``, ``sampling_time_s``, ``wall_time_s``;
  the rest of the wall time is the MAP start and the set-up);
- ``grad``: one ``jax.grad`` of the summed log density of ``C`` points on one recorded mesh
  (``problem.log_density``), compiled, then timed (median of repeats), the cost of a
  leapfrog step of all chains at once;
- ``leapfrogs``: gradient evaluations the sampling phase needed, counted the way the
  vectorised chains pay them: per iteration the largest tree of the ``C`` chains
  (``max_c n_steps``), summed over iterations;
- ``floor_s = leapfrogs * grad``: what the sampling phase would cost if a step were only
  its gradients; ``sampling_s / floor_s`` is the overhead factor a profile should remove.

Usage::

    python benchmarks/bench_sample_step.py --chains 2,64 --warmup 300 --samples 300 [--float32]

Prints a table and, with ``--json``, writes it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import jax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", default="2,64")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--float32", action="store_true")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not a.float32:
        jax.config.update("jax_enable_x64", True)

    import jax.numpy as jnp
    import numpy as np

    import inference
    import models
    from inference.petab._problem import problem_of

    warnings.filterwarnings("ignore")
    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    rows = []
    for C in [int(c) for c in a.chains.split(",")]:
        t = time.perf_counter()
        idata = inference.sample(model, data, num_chains=C, num_warmup=a.warmup,
                                 num_samples=a.samples, seed=0, progress=False)
        wall = time.perf_counter() - t
        at = idata.posterior.attrs
        n_steps = np.asarray(idata.sample_stats["n_steps"])          # (C, n)
        leapfrogs = int(n_steps.max(axis=0).sum())
        names = list(idata.posterior.data_vars)
        import arviz as az
        ess = float(min(float(az.ess(idata, var_names=[n]).to_array().min()) for n in names))

        problem = problem_of(model, data)
        z = problem.space.to_unconstrained(
            {k: jnp.asarray(np.asarray(idata.posterior[k])[:, -1]) for k in names})
        mesh = problem.record(z)
        grad = jax.jit(jax.grad(lambda z, m: jnp.sum(problem.log_density(z, m)[0])))
        jax.block_until_ready(grad(z, mesh))
        ts = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            jax.block_until_ready(grad(z, mesh))
            ts.append(time.perf_counter() - t)
        g = float(np.median(ts))
        floor = leapfrogs * g
        row = dict(chains=C, wall_s=wall, warmup_s=at.get("warmup_time_s"),
                   sampling_s=at.get("sampling_time_s"), min_ess=ess, ess_per_s=ess / wall,
                   grad_ms=1e3 * g, leapfrogs=leapfrogs, floor_s=floor,
                   overhead=(at.get("sampling_time_s") or float("nan")) / floor)
        rows.append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)
    out = dict(device=str(jax.devices()[0]), platform=platform.node(),
               float32=a.float32, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               rows=rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
