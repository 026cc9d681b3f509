"""Time to a posterior: gradsolve's ``inference.sample`` against Stan (PyStan), everything
counted, first run (every cache empty) and second run (caches warm), one after the other.

Models, the same on both sides (priors, likelihood, ODE tolerances rtol 1e-6, atol 1e-8):

- ``lynx_hare``: Carpenter's predator–prey model (posteriordb ``lotka_volterra``) on the
  Hudson's Bay data, 2 chains x (500 warmup + 1,000 draws); Stan's ``ode_rk45_tol``.
- ``theophylline``: the one-compartment oral population model of ``models.theophylline()``
  (non-centred random effects on ka and cl, 12 subjects), 4 chains x (500 + 1,000); Stan
  solves each subject's ODE with ``ode_rk45_tol``.

Each run is a new process. gradsolve's first run has empty kernel and XLA caches (fresh
``GRADSOLVE_KERNEL_CACHE`` and ``GRADSOLVE_XLA_CACHE`` folders), its second run reuses
them. Stan's first run builds the model in an empty httpstan cache (``XDG_CACHE_HOME`` a
fresh folder), its second run finds it built. Stan's chains start at the same point as
ours would not (they start from Stan's default random inits in (-2, 2) unconstrained);
its chains run in parallel processes (PyStan's default), ours vectorised in one process.
Reported per side and run: build (Stan's compile; our kernel build is inside the sample
call), warmup, sampling, total from the call, min bulk ESS (ArviZ) and per parameter,
leapfrog steps, divergences, ESS/s; then the posteriors side by side. Usage::

    python benchmarks/bench_vs_stan.py                    # both models
    python benchmarks/bench_vs_stan.py --models lynx_hare --quick
    python benchmarks/bench_vs_stan.py --cpu-devices 1     # our chains on one device

gradsolve's worker gives JAX one CPU device per core (``--cpu-devices``, default
``os.cpu_count()``), the one line a user adds (``jax.config.update("jax_num_cpu_devices",
n)``), and ``inference.sample`` splits the chains over them.

PyStan is an optional dependency (``pip install pystan``); without it only gradsolve runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

LYNX_STAN = """
functions {
  vector dz_dt(real t, vector z, array[] real theta) {
    vector[2] dz;
    dz[1] = (theta[1] - theta[2] * z[2]) * z[1];
    dz[2] = (-theta[3] + theta[4] * z[1]) * z[2];
    return dz;
  }
}
data {
  int<lower=0> N;
  array[N] real ts;
  array[2] real y_init;
  array[N, 2] real<lower=0> y;
}
parameters {
  array[4] real<lower=0> theta;
  array[2] real<lower=0> z_init;
  array[2] real<lower=0> sigma;
}
transformed parameters {
  array[N] vector[2] z = ode_rk45_tol(dz_dt, to_vector(z_init), 0, ts, 1e-6, 1e-8, 100000,
                                      theta);
}
model {
  theta[{1, 3}] ~ normal(1, 0.5);
  theta[{2, 4}] ~ normal(0.05, 0.05);
  sigma ~ lognormal(-1, 1);
  z_init ~ lognormal(log(10), 1);
  for (k in 1:2) {
    y_init[k] ~ lognormal(log(z_init[k]), sigma[k]);
    y[, k] ~ lognormal(log(z[, k]), sigma[k]);
  }
}
"""

THEOPH_STAN = """
functions {
  vector pk(real t, vector y, real ka, real ke) {
    vector[2] dy;
    dy[1] = -ka * y[1];
    dy[2] = ka * y[1] - ke * y[2];
    return dy;
  }
}
data {
  int<lower=1> S;
  int<lower=1> K;
  array[S] real dose;
  array[S, K] real ts;        // sorted; ts[s, 1] = 0 (the pre-dose sample)
  array[S, K] real conc;
}
parameters {
  real lKa;
  real lCl;
  real lKe;
  vector<lower=0>[2] omega;
  real<lower=0> sigma;
  array[S] vector[2] eta;
}
model {
  lKa ~ normal(0.5, 0.5);
  lCl ~ normal(-3.2, 0.5);
  lKe ~ normal(-2.5, 0.5);
  omega ~ normal(0, 1);
  sigma ~ normal(0, 2);
  for (s in 1:S) {
    real ka = exp(lKa + omega[1] * eta[s][1]);
    real cl = exp(lCl + omega[2] * eta[s][2]);
    real ke = exp(lKe);
    array[K - 1] vector[2] y = ode_rk45_tol(pk, [dose[s], 0]', 0, ts[s, 2:K], 1e-6, 1e-8,
                                            100000, ka, ke);
    eta[s] ~ std_normal();
    conc[s, 1] ~ normal(0, sigma);
    for (k in 2:K)
      conc[s, k] ~ normal(y[k - 1][2] * ke / cl, sigma);
  }
}
"""

SETTINGS = {"lynx_hare": dict(chains=2, warmup=500, draws=1000),
            "theophylline": dict(chains=4, warmup=500, draws=1000)}
PARAMS = {"lynx_hare": ["theta", "z_init", "sigma"],
          "theophylline": ["lKa", "lCl", "lKe", "omega", "sigma"]}


def _data(model: str):
    import numpy as np

    import models

    if model == "lynx_hare":
        m, data = models.lynx_hare(), models.load_dataset("lynx_hare")
        ys = np.asarray(data.ys, float)
        stan = dict(N=len(ys) - 1, ts=[float(t) for t in np.asarray(data.ts)[1:]],
                    y_init=ys[0].tolist(), y=ys[1:].tolist())
        return m, data, stan
    m, data = models.theophylline(), models.load_dataset("theophylline")
    ts, ys = data.observations()
    ts, ys = np.asarray(ts, float), np.asarray(ys, float)
    if np.isnan(ys).any() or not np.all(ts[:, 0] == 0):
        raise RuntimeError("theophylline: expected complete rows starting at the pre-dose time 0")
    _, sizes = data.jumps(1)
    dose = np.asarray(sizes)[:, 0, 0]
    stan = dict(S=ts.shape[0], K=ts.shape[1], dose=dose.tolist(), ts=ts.tolist(),
                conc=ys.tolist())
    return m, data, stan


def _summary(idata, names, t_build, t_warm, t_samp, t_total, steps, div):
    import arviz as az
    import numpy as np

    ess = az.ess(idata, var_names=names)
    per = {k: np.atleast_1d(ess[k].values).round(0).tolist() for k in names}
    summ = az.summary(idata, var_names=names, kind="stats", round_to="none")
    return dict(build_s=t_build, warmup_s=t_warm, sampling_s=t_samp, total_s=t_total,
                min_ess=float(min(min(v) for v in per.values())), ess=per,
                leapfrog_steps=int(steps), divergences=int(div),
                mean=summ["mean"].to_dict(), sd=summ["sd"].to_dict())


def worker_gradsolve(model: str, quick: bool, seed: int, cpu_devices: int = 1) -> dict:
    t0 = time.perf_counter()
    import jax

    if cpu_devices > 1:
        # the user's one line that gives JAX a device per core, before anything else:
        # inference.sample then splits the chains over them (as Stan runs its chains in
        # parallel processes)
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import inference

    t_import = time.perf_counter() - t0
    m, data, _ = _data(model)
    s = SETTINGS[model]
    warm, draws = (200, 300) if quick else (s["warmup"], s["draws"])
    t1 = time.perf_counter()
    idata = inference.sample(m, data, num_warmup=warm, num_samples=draws,
                             num_chains=s["chains"], seed=seed, progress=False)
    total = time.perf_counter() - t1
    a = idata.posterior.attrs
    out = _summary(idata, PARAMS[model], 0.0, a["warmup_time_s"], a["sampling_time_s"], total,
                   idata.sample_stats["n_steps"].sum(), idata.sample_stats["diverging"].sum())
    out.update(import_s=t_import, init_fit_s=a.get("init_fit_wall_time_s", 0.0),
               mass_matrix=a.get("mass_matrix", ""), chain_method=a.get("chain_method", ""),
               chain_devices=int(a.get("chain_devices", 1)))
    return out


def worker_stan(model: str, quick: bool, seed: int) -> dict:
    import arviz as az
    import stan

    _, _, data = _data(model)
    s = SETTINGS[model]
    warm, draws = (200, 300) if quick else (s["warmup"], s["draws"])
    code = LYNX_STAN if model == "lynx_hare" else THEOPH_STAN
    t0 = time.perf_counter()
    post = stan.build(code, data=data, random_seed=seed)
    t_build = time.perf_counter() - t0
    t1 = time.perf_counter()
    fit = post.sample(num_chains=s["chains"], num_warmup=warm, num_samples=draws)
    t_samp_all = time.perf_counter() - t1
    idata = az.from_pystan(posterior=fit)
    total = time.perf_counter() - t0
    steps = fit["n_leapfrog__"].sum()
    div = fit["divergent__"].sum()
    # PyStan does not time warmup and sampling apart: split its wall time by leapfrog
    # steps is not possible either (warmup steps are not kept), so both are reported whole
    out = _summary(idata, PARAMS[model], t_build, float("nan"), t_samp_all, total, steps, div)
    return out


def _spawn(side: str, model: str, quick: bool, seed: int, env: dict,
           cpu_devices: int = 1) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--models", model,
           "--seed", str(seed), "--cpu-devices", str(cpu_devices)] + (
               ["--quick"] if quick else [])
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: dict, draws: int) -> None:
    cols = list(rows)
    fields = [("build (s)", lambda r: f"{r['build_s']:.1f}"),
              ("warmup (s)", lambda r: f"{r['warmup_s']:.1f}"),
              ("sampling (s)", lambda r: f"{r['sampling_s']:.1f}"),
              ("total from the call (s)", lambda r: f"{r['total_s']:.1f}"),
              ("min bulk ESS", lambda r: f"{r['min_ess']:.0f}"),
              ("ESS/s, total", lambda r: f"{r['min_ess'] / r['total_s']:.1f}"),
              ("leapfrog steps a draw", lambda r: f"{r['leapfrog_steps'] / draws:.1f}"),
              ("divergences", lambda r: str(r["divergences"])),
              ("chains", lambda r: (f"{r['chain_method']} on {r['chain_devices']} devices"
                                    if "chain_method" in r else "parallel processes"))]
    out = [[""] + cols]
    for name, fn in fields:
        out.append([name] + [fn(rows[c]) if "error" not in rows[c] else "failed" for c in cols])
    w = [max(len(r[i]) for r in out) for i in range(len(cols) + 1)]
    for r in out:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lynx_hare,theophylline")
    ap.add_argument("--quick", action="store_true", help="200 warmup + 300 draws")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-devices", type=int, default=os.cpu_count() or 1,
                    help="JAX CPU devices of gradsolve's process (default: one per core; "
                         "1: every chain vectorised on one device)")
    ap.add_argument("--sides", default="gradsolve,stan",
                    help="which sides to run (comma-separated)")
    ap.add_argument("--worker", choices=["gradsolve", "stan"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.worker == "gradsolve":
            out = worker_gradsolve(args.models, args.quick, args.seed, args.cpu_devices)
        else:
            out = worker_stan(args.models, args.quick, args.seed)
        print(json.dumps(out))
        return
    try:
        import stan  # noqa: F401
        have_stan = True
    except ImportError:
        have_stan = False
        print("PyStan is not installed (pip install pystan): gradsolve only")
    results = {}
    for model in args.models.split(","):
        s = SETTINGS[model]
        draws = (300 if args.quick else s["draws"]) * s["chains"]
        with tempfile.TemporaryDirectory() as gs_dir, tempfile.TemporaryDirectory() as st_dir:
            gs_env = {"GRADSOLVE_KERNEL_CACHE": os.path.join(gs_dir, "kernels"),
                      "GRADSOLVE_XLA_CACHE": os.path.join(gs_dir, "xla")}
            st_env = {"XDG_CACHE_HOME": st_dir}
            rows = {}
            for run in ("first", "second"):
                if "gradsolve" in args.sides:
                    rows[f"gradsolve {run}"] = _spawn("gradsolve", model, args.quick,
                                                      args.seed, gs_env, args.cpu_devices)
                if have_stan and "stan" in args.sides:
                    rows[f"Stan {run}"] = _spawn("stan", model, args.quick, args.seed, st_env)
        print(f"\n{model}: {s['chains']} chains x ({200 if args.quick else s['warmup']} warmup"
              f" + {300 if args.quick else s['draws']} draws), 2-core CPU")
        _table(rows, draws)
        for k, r in rows.items():
            if "error" in r:
                print(f"{k} failed:\n{r['error']}")
        if len(rows) == 4 and all("error" not in r for r in rows.values()):
            for run in ("first", "second"):
                g, st = rows[f"gradsolve {run}"], rows[f"Stan {run}"]
                print(f"ESS/s ratio, {run} runs (gradsolve / Stan): "
                      f"{(g['min_ess'] / g['total_s']) / (st['min_ess'] / st['total_s']):.2f}x")
            g, st = rows["gradsolve second"], rows["Stan second"]
            print("posterior mean (sd): gradsolve | Stan; |mean diff| / Stan sd")
            for k in g["mean"]:
                dm = abs(g["mean"][k] - st["mean"][k]) / st["sd"][k]
                print(f"  {k:<12} {g['mean'][k]:9.4f} ({g['sd'][k]:.4f}) | {st['mean'][k]:9.4f}"
                      f" ({st['sd'][k]:.4f});  {dm:.2f}")
            eff = {k: [a / b for a, b in zip(g["ess"][k], st["ess"][k])] for k in g["ess"]}
            print("bulk ESS per draw, gradsolve / Stan:",
                  {k: [round(x, 2) for x in v] for k, v in eff.items()})
        results[model] = rows
    dd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(dd, exist_ok=True)
    path = os.path.join(dd, "vs_stan.json")
    with open(path, "w") as fh:
        json.dump(dict(results=results, quick=args.quick, seed=args.seed,
                       date=time.strftime("%Y-%m-%d %H:%M:%S"), cpus=os.cpu_count()), fh,
                  indent=1, default=float)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
