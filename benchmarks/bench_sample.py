"""NUTS effective samples per second: inference.sample vs NumPyro NUTS on Diffrax.

The lynx–hare model (Carpenter's Stan model) on the embedded Hudson's Bay data, 2 chains,
vectorised, in one process:

- gradsolve: ``inference.sample`` at its defaults (mesh policy: per-chain meshes re-recorded
  between warmup windows, one frozen mesh for sampling; MAP-fit initialisation; a dense
  mass matrix, as for any ODE model of at most 50 parameters), and again with
  ``dense_mass=False``;
- NumPyro + Diffrax: ``NUTS`` on a NumPyro program whose ODE is ``diffrax.diffeqsolve``
  (Tsit5, PIDController rtol 1e-6 atol 1e-8, default ``RecursiveCheckpointAdjoint``),
  initialised at the model's defaults, at NumPyro's default diagonal mass matrix and again
  with ``dense_mass=True``.

Reported: the smallest bulk ESS over all parameters (ArviZ), wall times (total with
compilation and initialisation; sampling phase alone), ESS/s and the ratios: defaults
against defaults (what each user gets unasked), and at the same mass matrix on both sides
(what the gradient and the mesh reuse give alone). Usage::

    python benchmarks/bench_sample.py           # 2 chains x (500 warmup + 1000 draws)
    python benchmarks/bench_sample.py --quick   # 2 chains x (200 + 300)

Writes ``benchmarks/results/bench_sample[_quick].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.infer import MCMC, NUTS, init_to_value  # noqa: E402

import inference  # noqa: E402
import models  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)


def min_ess(idata, names):
    ess = az.ess(idata, var_names=names)
    return float(min(np.min(ess[k].values) for k in names))


def run_gradsolve(m, data, warm, draws, seed, dense=None):
    t0 = time.perf_counter()
    idata = inference.sample(m, data, num_warmup=warm, num_samples=draws, num_chains=2,
                             seed=seed, progress=False, dense_mass=dense)
    total = time.perf_counter() - t0
    a = idata.posterior.attrs
    ess = min_ess(idata, list(m.priors))
    return idata, dict(total_s=total, dense_mass=a["mass_matrix"] == "dense", sampling_s=a["sampling_time_s"],
                       warmup_s=a["warmup_time_s"], min_ess=ess,
                       divergences=int(idata.sample_stats["diverging"].sum()),
                       max_error_ratio=float(a["max_error_ratio"]),
                       leapfrog_steps=int(idata.sample_stats["n_steps"].sum()))


def run_diffrax(m, data, warm, draws, seed, dense=False):
    program = inference.diffrax_numpyro_model(m, data)

    mcmc = MCMC(NUTS(program, init_strategy=init_to_value(values=dict(m.defaults)),
                     dense_mass=dense),
                num_warmup=warm, num_samples=draws, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    t0 = time.perf_counter()
    mcmc.warmup(jax.random.PRNGKey(seed), extra_fields=("num_steps",))
    jax.block_until_ready(mcmc.post_warmup_state.z)
    t1 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed + 1), extra_fields=("num_steps",))
    jax.block_until_ready(mcmc.get_samples())
    t2 = time.perf_counter()
    idata = az.from_numpyro(mcmc)
    ess = min_ess(idata, list(m.priors))
    return idata, dict(total_s=t2 - t0, sampling_s=t2 - t1, warmup_s=t1 - t0, min_ess=ess,
                       dense_mass=bool(dense),
                       divergences=int(idata.sample_stats["diverging"].sum()),
                       leapfrog_steps=int(np.sum(mcmc.get_extra_fields()["num_steps"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 chains x (200 + 300)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    warm, draws = (200, 300) if args.quick else (500, 1000)
    m, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    print(f"lynx-hare NUTS, 2 chains x ({warm} warmup + {draws} draws)")
    gi, g = run_gradsolve(m, data, warm, draws, args.seed)
    _, g_diag = run_gradsolve(m, data, warm, draws, args.seed, dense=False)
    di, d = run_diffrax(m, data, warm, draws, args.seed)
    _, d_dense = run_diffrax(m, data, warm, draws, args.seed, dense=True)
    runs = {"gradsolve": g, "gradsolve diag": g_diag, "numpyro+diffrax": d,
            "numpyro+diffrax dense": d_dense}
    for r in runs.values():
        r["ess_per_s_total"] = r["min_ess"] / r["total_s"]
        r["ess_per_s_sampling"] = r["min_ess"] / r["sampling_s"]
        # vectorised chains: one call evaluates both chains' gradients
        r["ms_per_vectorised_gradient"] = 1e3 * r["sampling_s"] / (r["leapfrog_steps"] / 2)
    ratio_total = g["ess_per_s_total"] / d["ess_per_s_total"]
    ratio_sampling = g["ess_per_s_sampling"] / d["ess_per_s_sampling"]
    ratios = dict(
        defaults=(ratio_total, ratio_sampling),
        dense=(g["ess_per_s_total"] / d_dense["ess_per_s_total"],
               g["ess_per_s_sampling"] / d_dense["ess_per_s_sampling"]),
        diagonal=(g_diag["ess_per_s_total"] / d["ess_per_s_total"],
                  g_diag["ess_per_s_sampling"] / d["ess_per_s_sampling"]))
    cols = list(runs)
    table = [
        ("mass matrix", lambda r: "dense" if r["dense_mass"] else "diagonal"),
        ("min bulk ESS", lambda r: f"{r['min_ess']:.0f}"),
        ("leapfrog steps a draw", lambda r: f"{r['leapfrog_steps'] / (2 * draws):.1f}"),
        ("wall total (s)", lambda r: f"{r['total_s']:.1f}"),
        ("wall sampling (s)", lambda r: f"{r['sampling_s']:.1f}"),
        ("ESS/s total", lambda r: f"{r['ess_per_s_total']:.2f}"),
        ("ESS/s sampling", lambda r: f"{r['ess_per_s_sampling']:.2f}"),
        ("ms per gradient (2 chains, sampling)",
         lambda r: f"{r['ms_per_vectorised_gradient']:.3f}"),
        ("divergences", lambda r: str(r["divergences"])),
    ]
    rows = [("", *cols)] + [(name, *(fn(runs[c]) for c in cols)) for name, fn in table]
    w = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    for name, (tot, smp) in ratios.items():
        what = {"defaults": "gradsolve vs numpyro+diffrax, each at its defaults",
                "dense": "gradsolve vs numpyro+diffrax dense (both dense)",
                "diagonal": "gradsolve diag vs numpyro+diffrax (both diagonal)"}[name]
        print(f"ESS/s ratio, {what}: {tot:.2f}x total, {smp:.2f}x sampling")
    s_g = az.summary(gi, var_names=list(m.priors))[["mean", "sd", "r_hat"]]
    s_d = az.summary(di, var_names=list(m.priors))[["mean", "sd", "r_hat"]]
    print("posterior (gradsolve | numpyro+diffrax):")
    s_g.columns = [f"{c} gs" for c in s_g.columns]
    s_d.columns = [f"{c} dfx" for c in s_d.columns]
    print(s_g.join(s_d).to_string())
    out = dict(benchmark="sample", model="lynx_hare", num_warmup=warm, num_samples=draws,
               num_chains=2, gradsolve=g, gradsolve_diagonal=g_diag, diffrax=d,
               diffrax_dense=d_dense, ratio_ess_per_s_total=ratio_total,
               ratio_ess_per_s_sampling=ratio_sampling,
               ratios_total_sampling={k: list(v) for k, v in ratios.items()},
               quick=args.quick,
               jax=jax.__version__, machine=platform.platform(), cpus=os.cpu_count(),
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    dd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(dd, exist_ok=True)
    path = os.path.join(dd, "bench_sample_quick.json" if args.quick else "bench_sample.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2, default=float)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
