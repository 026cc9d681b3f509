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
    python benchmarks/bench_vs_stan.py --sampler chees     # ours: ChEES-HMC, 16 chains

``--sampler chees`` samples our side with the lockstep ensemble (``--chees-chains``, 16 by
default) instead of NUTS on Stan's number of chains: the same draws per chain, more
chains; the ratio compares min bulk ESS per second of the whole call, as for NUTS.

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

STUDY_STAN = """
functions {
  vector pk2(real t, vector a, real ka, real cl, real v1, real q, real v2) {
    vector[3] da;
    real c = a[2] / v1;
    real x = q * (c - a[3] / v2);
    da[1] = -ka * a[1];
    da[2] = ka * a[1] - cl * c - x;
    da[3] = x;
    return da;
  }
}
data {
  int<lower=1> S;
  int<lower=1> J;                   // dose intervals (a dose opens each)
  int<lower=1> M;                   // most outputs in one interval
  array[J] real t_dose;
  real dose;
  array[S, J] int<lower=0> n_out;   // outputs of interval j: its samples, then the next dose
  array[S, J, M] real t_out;
  array[S, J, M] int<lower=0, upper=1> is_obs;
  array[S, J, M] real conc;
  vector[S] wt;
}
parameters {
  real lKa;
  real lCl;
  real lV1;
  real lQ;
  real lV2;
  vector<lower=0>[3] omega;
  real<lower=0> sigma_add;
  real<lower=0> sigma_prop;
  array[S] vector[3] eta;
}
model {
  lKa ~ normal(log(1.0), 0.5);
  lCl ~ normal(log(5.0), 0.5);
  lV1 ~ normal(log(50.0), 0.5);
  lQ ~ normal(log(10.0), 0.5);
  lV2 ~ normal(log(100.0), 0.5);
  omega ~ normal(0, 0.5);
  sigma_add ~ normal(0, 0.5);
  sigma_prop ~ normal(0, 0.5);
  for (s in 1:S) {
    real ka = exp(lKa + omega[1] * eta[s][1]);
    real cl = exp(lCl + omega[2] * eta[s][2]) * pow(wt[s] / 70, 0.75);
    real v1 = exp(lV1 + omega[3] * eta[s][3]);
    real q = exp(lQ);
    real v2 = exp(lV2);
    vector[3] a = rep_vector(0, 3);
    eta[s] ~ std_normal();
    for (j in 1:J) {
      int n = n_out[s, j];
      a[1] += dose;
      if (n > 0) {
        array[n] vector[3] ys = ode_rk45_tol(pk2, a, t_dose[j], t_out[s, j, 1:n], 1e-6,
                                             1e-8, 100000, ka, cl, v1, q, v2);
        for (k in 1:n) {
          if (is_obs[s, j, k]) {
            real c = ys[k][2] / v1;
            conc[s, j, k] ~ normal(c, sigma_add + sigma_prop * abs(c));
          }
        }
        a = ys[n];
      }
    }
  }
}
"""

SETTINGS = {"lynx_hare": dict(chains=2, warmup=500, draws=1000),
            "theophylline": dict(chains=4, warmup=500, draws=1000),
            "study": dict(chains=4, warmup=500, draws=500)}
PARAMS = {"lynx_hare": ["theta", "z_init", "sigma"],
          "theophylline": ["lKa", "lCl", "lKe", "omega", "sigma"],
          "study": ["lKa", "lCl", "lV1", "lQ", "lV2", "omega", "sigma_add", "sigma_prop"]}
STUDY_SUBJECTS = 200
"""Subjects of ``study`` (``models.simulated_study``); ``--subjects`` changes it."""


def _study_stan_data(data) -> dict:
    """``STUDY_STAN``'s data from a `models.simulated_study` dataset: each subject's
    outputs cut at its dose times (interval j: its samples in (t_j, t_j+1), then t_j+1,
    where the next dose is given)."""
    import numpy as np

    subs = data.subjects
    t_dose = np.asarray(subs[0].dose_times, float)
    amount = float(np.asarray(subs[0].dose_amounts)[0])
    for sub in subs:
        if not (np.array_equal(sub.dose_times, t_dose)
                and np.all(np.asarray(sub.dose_amounts) == amount)):
            raise RuntimeError("study: expected the same dosing for every subject")
    J = len(t_dose)
    out = []
    for sub in subs:
        rows = []
        for j in range(J):
            hi = t_dose[j + 1] if j + 1 < J else np.inf
            sel = (sub.ts > t_dose[j]) & (sub.ts < hi)
            ts, ys = list(sub.ts[sel]), list(sub.ys[sel])
            obs = [1] * len(ts)
            if j + 1 < J:
                ts, ys, obs = ts + [float(hi)], ys + [0.0], obs + [0]
            rows.append((ts, ys, obs))
        out.append(rows)
    M = max(len(r[0]) for rows in out for r in rows)
    pad = lambda v, fill: list(v) + [fill] * (M - len(v))  # noqa: E731
    return dict(S=len(subs), J=J, M=M, t_dose=t_dose.tolist(), dose=amount,
                n_out=[[len(r[0]) for r in rows] for rows in out],
                t_out=[[pad(r[0], 1e9) for r in rows] for rows in out],
                is_obs=[[pad(r[2], 0) for r in rows] for rows in out],
                conc=[[pad(r[1], 0.0) for r in rows] for rows in out],
                wt=[float(np.asarray(sub.covariates["WT"]).ravel()[0]) for sub in subs])


def _data(model: str):
    import numpy as np

    import models

    if model == "study":
        data, _ = models.simulated_study(n_subjects=STUDY_SUBJECTS, seed=0)
        return models.two_compartment_oral(), data, _study_stan_data(data)
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


def _iterations(model: str, quick: bool, iterations: str | None) -> tuple[int, int]:
    """(warmup, draws) of a chain: ``--iterations W,D``, else ``--quick``'s or the model's."""
    if iterations:
        w, d = (int(v) for v in iterations.split(","))
        return w, d
    s = SETTINGS[model]
    return (200, 300) if quick else (s["warmup"], s["draws"])


def worker_gradsolve(model: str, quick: bool, seed: int, cpu_devices: int = 1,
                     iterations: str | None = None, sampler: str = "nuts",
                     chees_chains: int = 16) -> dict:
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
    warm, draws = _iterations(model, quick, iterations)
    t1 = time.perf_counter()
    if sampler == "chees":
        # the lockstep ensemble wants many chains (it adapts from statistics across them)
        kw = dict(sampler="chees", num_chains=int(chees_chains))
    else:
        kw = dict(sampler="nuts", num_chains=s["chains"])
    idata = inference.sample(m, data, num_warmup=warm, num_samples=draws, seed=seed,
                             progress=False, **kw)
    total = time.perf_counter() - t1
    a = idata.posterior.attrs
    out = _summary(idata, PARAMS[model], 0.0, a["warmup_time_s"], a["sampling_time_s"], total,
                   idata.sample_stats["n_steps"].sum(), idata.sample_stats["diverging"].sum())
    out.update(import_s=t_import, init_fit_s=a.get("init_fit_wall_time_s", 0.0),
               mass_matrix=a.get("mass_matrix", ""), chain_method=a.get("chain_method", ""),
               chain_devices=int(a.get("chain_devices", 1)), sampler=a.get("kernel", ""),
               chains=int(a["num_chains"]), draws=int(a["num_chains"]) * draws)
    return out


def gradient_probe(reps: int = 10) -> dict:
    """The simulated study's log-density gradient at the simulated truth, Stan's
    (``grad_log_prob`` through httpstan, its HTTP round trip included: ``log_prob`` timed
    too) and gradsolve's (``jax.grad`` of the NUTS potential, a fresh ``gs.solve``), with
    both log densities' difference between the truth and a nearby point (they must agree:
    the same model on both sides, Stan dropping constants)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import stan

    import models
    from inference.problem._program import problem_for

    m, data, sd = _data("study")
    _, truth = models.simulated_study(n_subjects=STUDY_SUBJECTS, seed=0)
    pos = ("omega", "sigma_add", "sigma_prop")

    def unconstrained(th):
        return np.concatenate(
            [np.ravel([th[k] for k in ("lKa", "lCl", "lV1", "lQ", "lV2")]),
             np.log(np.asarray(th["omega"])), np.log([th["sigma_add"], th["sigma_prop"]]),
             np.asarray(th["eta"]).ravel()])

    th0 = {k: np.asarray(v) for k, v in truth.items()}
    rng = np.random.default_rng(1)
    th1 = {k: v * np.exp(0.1 * rng.standard_normal(v.shape)) if k in pos
           else v + 0.1 * rng.standard_normal(v.shape) for k, v in th0.items()}
    t0 = time.perf_counter()
    post = stan.build(STUDY_STAN, data=sd, random_seed=0)
    t_build = time.perf_counter() - t0
    u0, u1 = unconstrained(th0).tolist(), unconstrained(th1).tolist()
    stan_diff = post.log_prob(u1) - post.log_prob(u0)

    def timed(fn, n):
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return 1e3 * (time.perf_counter() - t) / n

    stan_grad_ms = timed(lambda: post.grad_log_prob(u0), reps)
    stan_lp_ms = timed(lambda: post.log_prob(u0), reps)
    problem = problem_for(m, data, solver=None, rtol=1e-6, atol=1e-8, max_steps=4096)
    space = problem.space

    def flat(th):
        return jnp.asarray(space.to_unconstrained({k: jnp.asarray(v) for k, v in th.items()}))

    lp = jax.jit(lambda u: problem.log_density(u, None)[0])
    grad = jax.jit(jax.grad(lambda u: problem.log_density(u, None)[0]))
    v0, v1 = flat(th0), flat(th1)
    ours_diff = float(lp(v1) - lp(v0))
    ours_grad_ms = timed(lambda: jax.block_until_ready(grad(v0)), reps)
    return dict(subjects=STUDY_SUBJECTS, stan_build_s=t_build, stan_grad_ms=stan_grad_ms,
                stan_log_prob_ms=stan_lp_ms, gradsolve_grad_ms=ours_grad_ms,
                log_density_difference=dict(stan=stan_diff, gradsolve=ours_diff))


def worker_stan(model: str, quick: bool, seed: int, iterations: str | None = None) -> dict:
    import arviz as az
    import stan

    _, _, data = _data(model)
    s = SETTINGS[model]
    warm, draws = _iterations(model, quick, iterations)
    code = {"lynx_hare": LYNX_STAN, "theophylline": THEOPH_STAN, "study": STUDY_STAN}[model]
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
    out.update(chains=s["chains"], draws=s["chains"] * draws)
    return out


def _spawn(side: str, model: str, quick: bool, seed: int, env: dict,
           cpu_devices: int = 1, iterations: str | None = None, sampler: str = "nuts",
           chees_chains: int = 16) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--models", model,
           "--seed", str(seed), "--cpu-devices", str(cpu_devices),
           "--subjects", str(STUDY_SUBJECTS), "--sampler", sampler,
           "--chees-chains", str(chees_chains)] + (["--quick"] if quick else []) + (
               ["--iterations", iterations] if iterations else [])
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: dict) -> None:
    cols = list(rows)
    fields = [("build (s)", lambda r: f"{r['build_s']:.1f}"),
              ("warmup (s)", lambda r: f"{r['warmup_s']:.1f}"),
              ("sampling (s)", lambda r: f"{r['sampling_s']:.1f}"),
              ("total from the call (s)", lambda r: f"{r['total_s']:.1f}"),
              ("min bulk ESS", lambda r: f"{r['min_ess']:.0f}"),
              ("ESS/s, total", lambda r: f"{r['min_ess'] / r['total_s']:.1f}"),
              ("chains x draws", lambda r: f"{r['chains']} x {r['draws'] // r['chains']}"),
              ("leapfrog steps a draw", lambda r: f"{r['leapfrog_steps'] / r['draws']:.1f}"),
              ("divergences", lambda r: str(r["divergences"])),
              ("chains", lambda r: (f"{r['sampler']}, {r['chain_method']} on "
                                    f"{r['chain_devices']} devices"
                                    if "chain_method" in r else "parallel processes"))]
    out = [[""] + cols]
    for name, fn in fields:
        out.append([name] + [fn(rows[c]) if "error" not in rows[c] else "failed" for c in cols])
    w = [max(len(r[i]) for r in out) for i in range(len(cols) + 1)]
    for r in out:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


def main() -> None:
    global STUDY_SUBJECTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lynx_hare,theophylline")
    ap.add_argument("--quick", action="store_true", help="200 warmup + 300 draws")
    ap.add_argument("--iterations", metavar="W,D",
                    help="warmup and draws of each chain (overrides --quick)")
    ap.add_argument("--subjects", type=int, default=STUDY_SUBJECTS,
                    help="subjects of the simulated study (model 'study')")
    ap.add_argument("--runs", default="first,second",
                    help="which runs: first (every cache empty), second (caches warm)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-devices", type=int, default=os.cpu_count() or 1,
                    help="JAX CPU devices of gradsolve's process (default: one per core; "
                         "1: every chain vectorised on one device)")
    ap.add_argument("--sides", default="gradsolve,stan",
                    help="which sides to run (comma-separated)")
    ap.add_argument("--gradient-probe", action="store_true",
                    help="only time one log-density gradient of the simulated study, Stan's "
                         "and ours, at the truth (--subjects; a posterior of it from Stan "
                         "takes hours here)")
    ap.add_argument("--sampler", choices=["nuts", "chees"], default="nuts",
                    help="gradsolve's sampler: NUTS on the model's chains (as Stan), or the "
                         "lockstep ensemble ChEES-HMC on --chees-chains")
    ap.add_argument("--chees-chains", type=int, default=16,
                    help="chains of --sampler chees (default 16, ChEES's own)")
    ap.add_argument("--worker", choices=["gradsolve", "stan"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    STUDY_SUBJECTS = int(args.subjects)
    if args.worker:
        if args.worker == "gradsolve":
            out = worker_gradsolve(args.models, args.quick, args.seed, args.cpu_devices,
                                   args.iterations, args.sampler, args.chees_chains)
        else:
            out = worker_stan(args.models, args.quick, args.seed, args.iterations)
        print(json.dumps(out))
        return
    if args.gradient_probe:
        jax_cfg = __import__("jax").config
        jax_cfg.update("jax_enable_x64", True)
        print(json.dumps(gradient_probe(), default=float))
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
        warm, per_chain = _iterations(model, args.quick, args.iterations)
        with tempfile.TemporaryDirectory() as gs_dir, tempfile.TemporaryDirectory() as st_dir:
            gs_env = {"GRADSOLVE_KERNEL_CACHE": os.path.join(gs_dir, "kernels"),
                      "GRADSOLVE_XLA_CACHE": os.path.join(gs_dir, "xla")}
            st_env = {"XDG_CACHE_HOME": st_dir}
            rows = {}
            for run in args.runs.split(","):
                if "gradsolve" in args.sides:
                    rows[f"gradsolve {run}"] = _spawn("gradsolve", model, args.quick,
                                                      args.seed, gs_env, args.cpu_devices,
                                                      args.iterations, args.sampler,
                                                      args.chees_chains)
                if have_stan and "stan" in args.sides:
                    rows[f"Stan {run}"] = _spawn("stan", model, args.quick, args.seed, st_env,
                                                 iterations=args.iterations)
        ours = (f"{args.chees_chains} ChEES chains" if args.sampler == "chees"
                else f"{s['chains']} NUTS chains")
        print(f"\n{model}: ours {ours}, Stan {s['chains']} chains, each ({warm} warmup + "
              f"{per_chain} draws), 2-core CPU")
        _table(rows)
        for k, r in rows.items():
            if "error" in r:
                print(f"{k} failed:\n{r['error']}")
        both = [run for run in args.runs.split(",")
                if all("error" not in rows.get(f"{side} {run}", {"error": ""})
                       for side in ("gradsolve", "Stan"))]
        for run in both:
            g, st = rows[f"gradsolve {run}"], rows[f"Stan {run}"]
            print(f"ESS/s ratio, {run} runs (gradsolve / Stan): "
                  f"{(g['min_ess'] / g['total_s']) / (st['min_ess'] / st['total_s']):.2f}x")
        if both:
            g, st = rows[f"gradsolve {both[-1]}"], rows[f"Stan {both[-1]}"]
            print("posterior mean (sd): gradsolve | Stan; |mean diff| / Stan sd")
            for k in g["mean"]:
                dm = abs(g["mean"][k] - st["mean"][k]) / st["sd"][k]
                print(f"  {k:<12} {g['mean'][k]:9.4f} ({g['sd'][k]:.4f}) | "
                      f"{st['mean'][k]:9.4f} ({st['sd'][k]:.4f});  {dm:.2f}")
            eff = {k: [a / b for a, b in zip(g["ess"][k], st["ess"][k])] for k in g["ess"]}
            print("bulk ESS per draw, gradsolve / Stan:",
                  {k: [round(x, 2) for x in v] for k, v in eff.items()})
        results[model] = rows
    dd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(dd, exist_ok=True)
    path = os.path.join(dd, "vs_stan.json")
    with open(path, "w") as fh:
        json.dump(dict(results=results, quick=args.quick, seed=args.seed,
                       sampler=args.sampler, chees_chains=args.chees_chains,
                       date=time.strftime("%Y-%m-%d %H:%M:%S"), cpus=os.cpu_count()), fh,
                  indent=1, default=float)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
