"""Population models: NUTS effective samples per second and one log-density gradient.

Theophylline (`models.theophylline`, the 12-subject Boeckmann–Sheiner–Beal data) in one
process, the same program, data, warmup and draws on every side, chains vectorised:

- gradsolve: ``inference.sample(models.theophylline(), data)`` (default mesh policy and
  MAP initialisation, everything counted);
- NumPyro + ``gs.solve``: plain NumPyro ``NUTS`` on ``inference.population_program(model)``
  run without gradsolve's handlers, so its ``inference.ode`` site is ``gs.solve`` (a record
  at every evaluation): what a user can write today; at NumPyro's default
  ``target_accept_prob`` 0.8 and, like for like, at the target ``inference.sample`` used
  (0.9 for a population model);
- NumPyro + Diffrax (``--diffrax``; slow, tens of minutes): the same program with
  ``jax.vmap(diffrax.diffeqsolve)`` over subjects, doses as piecewise solves between dose
  times (Tsit5, PIDController, default adjoint).

ESS is the smallest bulk ESS over the population parameters (``lKa``, ``lCl``, ``lKe``,
``omega``, ``sigma``), per second of total wall time. Then one log-density gradient (4
chains' points, vectorised) against the number of subjects ``S`` (12, 100, 1,000:
theophylline's subjects repeated): replay of a recorded mesh, ``gs.solve`` and Diffrax.

Usage::

    python benchmarks/bench_population.py             # 4 chains x (500 + 1,000)
    python benchmarks/bench_population.py --quick     # 4 chains x (200 + 300)
    python benchmarks/bench_population.py --diffrax   # also NumPyro + Diffrax NUTS
    python benchmarks/bench_population.py --study 200 # the simulated 200-subject study
    python benchmarks/bench_population.py --study-gradient 200  # its gradient, kernel vs XLA
    python benchmarks/bench_population.py --study 200 --cpu-devices 2  # chains on 2 devices
    python benchmarks/bench_population.py --study 200 --sides gradsolve --float32  # on a TPU

Writes ``benchmarks/results/bench_population[_quick].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import sys

import jax

# float64 unless --float32 (an accelerator's precision: a TPU emulates float64 slowly)
FLOAT32 = "--float32" in sys.argv
jax.config.update("jax_enable_x64", not FLOAT32)

import arviz as az  # noqa: E402
import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

import inference  # noqa: E402
import models  # noqa: E402
from inference.problem._program import ProgramProblem  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
POP = ["lKa", "lCl", "lKe", "omega", "sigma"]
TWO_CPT = ["lKa", "lCl", "lV1", "lQ", "lV2", "omega", "sigma_add", "sigma_prop"]
RTOL, ATOL = inference.TOLERANCES.rtol, inference.TOLERANCES.atol


def diffrax_program(model):
    """``model``'s program with ``jax.vmap(diffrax.diffeqsolve)`` over subjects: one solve
    per dose interval, each saving at the subject's times inside it (a time equal to a
    dose time reads the state before the dose, as gradsolve's)."""
    term = diffrax.ODETerm(lambda t, y, p: model.vector_field(t, y, p))

    def program(data):
        ts, ys = data.observations()
        theta = model.latent(data)
        p = model.individual(theta, data)
        y0, jumps = model.dosing(theta, p, data)
        t0, t1 = float(model.t0), float(np.max(ts))
        S = ts.shape[0]
        jt, js = (np.zeros((S, 0)), jnp.zeros((S, 0, y0.shape[-1]))) if jumps is None else jumps
        bounds = np.concatenate([np.full((S, 1), t0), np.minimum(jt, t1), np.full((S, 1), t1)], 1)

        def one(y0_i, p_i, ts_i, b_i, js_i):
            y, out = y0_i, jnp.zeros(ts_i.shape + y0_i.shape)
            for k in range(b_i.shape[0] - 1):
                a, b = b_i[k], b_i[k + 1]
                last = k == b_i.shape[0] - 2
                inside = (ts_i >= a) & ((ts_i <= b) if last else (ts_i < b))
                sol = diffrax.diffeqsolve(
                    term, diffrax.Tsit5(), a, b, None, y, args=p_i,
                    saveat=diffrax.SaveAt(ts=jnp.clip(ts_i, a, b), t1=True),
                    stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
                    max_steps=4096, throw=False)
                out = jnp.where(inside[:, None], sol.ys[:-1], out)
                y = sol.ys[-1] + (js_i[k] if k < js_i.shape[0] else 0.0)
            return out

        states = jax.vmap(one)(y0, p, jnp.asarray(ts), jnp.asarray(bounds), js)
        pred = model.observation(theta, p, ts, states)
        ok = jnp.all(jnp.isfinite(pred))
        numpyro.factor("solver_failure", jnp.where(ok, 0.0, -jnp.inf))
        numpyro.sample("obs", model.observations(theta, jnp.where(ok, pred, 1.0)), obs=ys)

    return program


def min_ess(idata, pop=POP):
    ess = az.ess(idata, var_names=pop)
    return float(min(np.min(ess[k].values) for k in pop))


def summary(idata, pop=POP):
    s = az.summary(idata, var_names=pop)
    return {k: [float(s.loc[k, "mean"]), float(s.loc[k, "sd"]), float(s.loc[k, "r_hat"])]
            for k in s.index}


def run_gradsolve(model, data, warm, draws, chains, seed, pop=POP, rerecord=None, sampler=None):
    t = time.perf_counter()
    idata = inference.sample(model, data, num_warmup=warm, num_samples=draws,
                             num_chains=chains, seed=seed, progress=False, rerecord=rerecord,
                             sampler=sampler)
    total = time.perf_counter() - t
    attrs = idata.posterior.attrs
    return dict(total_s=total, min_ess=min_ess(idata, pop), sampler=str(sampler or "nuts"),
                chains=int(idata.posterior.sizes["chain"]),
                target_accept=float(attrs.get("target_accept", np.nan)),
                retunes=int(attrs.get("retunes", 0)),
                ess_per_s=min_ess(idata, pop) / total, policy=idata.posterior.attrs["mesh_policy"],
                divergences=int(idata.sample_stats["diverging"].sum()),
                max_error_ratio=float(idata.posterior.attrs["max_error_ratio"]),
                sampling_mesh=idata.posterior.attrs["sampling_mesh"],
                leapfrog_steps=int(idata.sample_stats["n_steps"].sum()),
                warmup_s=float(attrs.get("warmup_time_s", np.nan)),
                sampling_s=float(attrs.get("sampling_time_s", np.nan)),
                init=str(attrs.get("init", "")), chain_method=str(attrs.get("chain_method", "")),
                chain_devices=int(attrs.get("chain_devices", 1)), posterior=summary(idata, pop))


def run_numpyro(program, data, warm, draws, chains, seed, pop=POP, target_accept=0.8):
    t = time.perf_counter()
    mcmc = MCMC(NUTS(program, target_accept_prob=target_accept), num_warmup=warm,
                num_samples=draws, num_chains=chains, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), data, extra_fields=("num_steps", "diverging"))
    # MCMC.run returns before the vectorised chains finish (JAX dispatches asynchronously):
    # the clock stops when the draws exist
    jax.block_until_ready((mcmc.get_samples(), mcmc.get_extra_fields()))
    total = time.perf_counter() - t
    idata = az.from_numpyro(mcmc)
    ex = mcmc.get_extra_fields()
    return dict(total_s=total, min_ess=min_ess(idata, pop), target_accept=target_accept,
                ess_per_s=min_ess(idata, pop) / total, divergences=int(np.sum(ex["diverging"])),
                leapfrog_steps=int(np.sum(ex["num_steps"])), posterior=summary(idata, pop))


def study(warm, draws, chains, seed, subjects, sides=None, sampler=None):
    """The simulated multiple-dose study (`models.simulated_study`): `inference.sample`
    under its default policy and under ``rerecord="warmup"`` (the mesh reused through
    sampling), and NumPyro + ``gs.solve`` (``sides``: a subset of those rows' names); each
    row with its z-scores against the truth."""
    model = models.two_compartment_oral()
    data, _ = models.simulated_study(n_subjects=subjects, seed=0)
    truth = np.concatenate([np.ravel(models.TWO_COMPARTMENT_TRUTH[k]) for k in TWO_CPT])
    print(f"simulated study, {subjects} subjects, {chains} chains x ({warm} + {draws}):",
          flush=True)
    out = {}
    for name, run in (
            ("gradsolve", lambda: run_gradsolve(model, data, warm, draws, chains, seed, TWO_CPT,
                                                sampler=sampler)),
            ("gradsolve_warmup", lambda: run_gradsolve(model, data, warm, draws, chains, seed,
                                                       TWO_CPT, rerecord="warmup",
                                                       sampler=sampler)),
            ("numpyro_gs_solve", lambda: run_numpyro(inference.population_program(model), data,
                                                     warm, draws, chains, seed, TWO_CPT))):
        if sides is not None and name not in sides:
            continue
        r = run()
        est = np.array([v[:2] for v in r["posterior"].values()])
        r["max_abs_z"] = float(np.max(np.abs((est[:, 0] - truth) / est[:, 1])))
        r["max_r_hat"] = float(max(v[2] for v in r["posterior"].values()))
        out[name] = r
        print(f"  {name:17s} {r['total_s']:7.1f} s, min ESS {r['min_ess']:6.0f}, "
              f"{r['ess_per_s']:6.2f} ESS/s, {r['divergences']} divergences, max |z| vs truth "
              f"{r['max_abs_z']:.2f}, max R-hat {r['max_r_hat']:.3f}"
              + (f" (warmup {r['warmup_s']:.0f} s, sampling {r['sampling_s']:.0f} s)"
                 if "warmup_s" in r else ""), flush=True)
    return out


def repeated(data, S):
    """Theophylline's subjects repeated to ``S`` subjects (new ids)."""
    subs = [data.subjects[i % data.n_subjects]._replace(id=i + 1) for i in range(S)]
    return models.PopulationDataset(subs, data.covariate_names, name=data.name)


def gradient_times(model, data, sizes, reps=20):
    """Milliseconds of one log-density gradient at 4 points (vectorised), per ``S``."""
    out = []
    for S in sizes:
        d = repeated(data, S)
        prob = ProgramProblem(inference.population_program(model), d, rtol=RTOL, atol=ATOL,
                              max_steps=4096)
        u = prob.space.to_unconstrained(prob.model.defaults)
        U = jnp.asarray(u) + 0.05 * jax.random.normal(jax.random.PRNGKey(0), (4, u.shape[0]))
        mesh = prob.record(U, 0.1)
        stack = mesh.chains(4, mesh.capacity)
        replay = jax.jit(jax.vmap(jax.grad(lambda v, m: prob.log_density(v, m)[0])))
        solve = jax.jit(jax.vmap(jax.grad(lambda v: prob.log_density(v, None)[0])))
        dprob = diffrax_program(model)
        x_of = prob.space.from_unconstrained

        def dlp(v):
            lp, _ = numpyro.infer.util.log_density(dprob, (d,), {}, x_of(v))
            return lp + prob.space.log_abs_det_jacobian(v)
        dfx = jax.jit(jax.vmap(jax.grad(dlp)))
        row = dict(S=S)
        for name, fn, args in (("replay_ms", replay, (U, stack)), ("solve_ms", solve, (U,)),
                               ("diffrax_ms", dfx, (U,))):
            jax.block_until_ready(fn(*args))
            t = time.perf_counter()
            for _ in range(reps):
                jax.block_until_ready(fn(*args))
            row[name] = 1e3 * (time.perf_counter() - t) / reps
        out.append(row)
        print(f"  S={S:5d}: replay {row['replay_ms']:.2f} ms, gs.solve {row['solve_ms']:.2f} "
              f"ms, Diffrax {row['diffrax_ms']:.2f} ms", flush=True)
    return out


def driver_gradient_times(subjects, reps=20):
    """Milliseconds of one log-density gradient of the simulated ``subjects``-subject study
    at 4 points (vectorised), with the compiled kernel and with the XLA drivers (lanes
    replay, XLA record loop) in one process: replay of a recorded mesh and ``gs.solve``;
    and the largest relative difference of the two drivers' gradients."""
    import gradsolve as gs

    model = models.two_compartment_oral()
    data, _ = models.simulated_study(n_subjects=subjects, seed=0)
    rows, grads = {}, {}
    for kernel in (True, False):
        with gs.use_compiled_kernel(kernel):
            prob = ProgramProblem(inference.population_program(model), data, rtol=RTOL,
                                  atol=ATOL, max_steps=4096)
            u = prob.space.to_unconstrained(prob.model.defaults)
            U = jnp.asarray(u) + 0.05 * jax.random.normal(jax.random.PRNGKey(0), (4, u.shape[0]))
            mesh = prob.record(U, 0.1)
            stack = mesh.chains(4, mesh.capacity)
            replay = jax.jit(jax.vmap(jax.grad(lambda v, m: prob.log_density(v, m)[0])))
            solve = jax.jit(jax.vmap(jax.grad(lambda v: prob.log_density(v, None)[0])))
            name = "kernel" if kernel else "xla"
            for what, fn, args in (("replay", replay, (U, stack)), ("solve", solve, (U,))):
                grads[name, what] = np.asarray(jax.block_until_ready(fn(*args)))
                best = np.inf
                for _ in range(3):
                    t = time.perf_counter()
                    for _ in range(reps):
                        jax.block_until_ready(fn(*args))
                    best = min(best, (time.perf_counter() - t) / reps)
                rows[f"{name}_{what}_ms"] = 1e3 * best
    for what in ("replay", "solve"):
        a, b = grads["kernel", what], grads["xla", what]
        rows[f"{what}_max_rel_diff"] = float(np.max(np.abs(a - b) / np.abs(b)))
        print(f"  {subjects} subjects, {what}: kernel {rows[f'kernel_{what}_ms']:.1f} ms, XLA "
              f"drivers {rows[f'xla_{what}_ms']:.1f} ms "
              f"({rows[f'xla_{what}_ms'] / rows[f'kernel_{what}_ms']:.1f}x), gradients agree "
              f"to {rows[f'{what}_max_rel_diff']:.0e}", flush=True)
    return rows


def _config(warm, draws, chains, seed, **extra):
    return dict(warmup=warm, draws=draws, chains=chains, seed=seed, **extra,
                devices=jax.device_count(), backend=jax.default_backend(),
                dtype="float32" if FLOAT32 else "float64",
                date=time.strftime("%Y-%m-%d"), machine=platform.platform(), cpus=os.cpu_count())


def _write(res, name):
    out = os.path.join(os.path.dirname(__file__), "results", f"{name}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 chains x (200 + 300)")
    ap.add_argument("--diffrax", action="store_true", help="also NumPyro + Diffrax NUTS (slow)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", default="12,100,1000", help="subjects for the gradient timing")
    ap.add_argument("--study", type=int, default=0, metavar="S",
                    help="run only the simulated S-subject study (e.g. 200), 4 chains x "
                         "(500 + 500) (--quick: 200 + 300): both mesh policies and NumPyro + "
                         "gs.solve")
    ap.add_argument("--study-gradient", type=int, default=0, metavar="S",
                    help="run only the S-subject study's gradient, kernel against XLA drivers")
    ap.add_argument("--sides", default="gradsolve,gradsolve_warmup,numpyro_gs_solve",
                    help="with --study: which rows to run (comma-separated)")
    ap.add_argument("--cpu-devices", type=int, default=1,
                    help="JAX CPU devices (jax_num_cpu_devices): above 1, inference.sample "
                         "runs its chains in parallel over them")
    ap.add_argument("--sampler", default=None,
                    help="inference.sample's sampler= (nuts, hmc, chees); default NUTS")
    ap.add_argument("--chains", type=int, default=None,
                    help="chains (default 4, as NumPyro's row)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup draws (overrides)")
    ap.add_argument("--samples", type=int, default=None, help="kept draws (overrides)")
    ap.add_argument("--float32", action="store_true",
                    help="run in float32 (read at import: jax_enable_x64 stays off)")
    a = ap.parse_args(argv)
    if a.cpu_devices > 1:
        # before any computation: JAX fixes its devices when the backend starts
        jax.config.update("jax_num_cpu_devices", a.cpu_devices)
    if a.study_gradient:
        res = dict(config=_config(0, 0, 4, a.seed, subjects=a.study_gradient),
                   gradient=driver_gradient_times(a.study_gradient))
        _write(res, f"bench_population_study_gradient_{a.study_gradient}")
        return
    nc = a.chains or 4
    if a.study:
        sw, sd = (200, 300) if a.quick else (500, 500)
        sw, sd = a.warmup or sw, a.samples or sd
        res = dict(config=_config(sw, sd, nc, a.seed, subjects=a.study, sampler=a.sampler),
                   **study(sw, sd, nc, a.seed, a.study, a.sides.split(","), a.sampler))
        tag = f"{'_quick' if a.quick else ''}{'_' + a.sampler if a.sampler else ''}"
        _write(res, f"bench_population_study_{a.study}{tag}")
        return
    warm, draws, chains = (200, 300, nc) if a.quick else (500, 1000, nc)
    warm, draws = a.warmup or warm, a.samples or draws
    model, data = models.theophylline(), models.load_dataset("theophylline")
    print(f"theophylline, {chains} chains x ({warm} + {draws}), {platform.machine()}, "
          f"jax {jax.__version__}, {jax.devices()[0].platform}", flush=True)
    res = dict(config=_config(warm, draws, chains, a.seed))
    res["gradsolve"] = run_gradsolve(model, data, warm, draws, chains, a.seed,
                                     sampler=a.sampler)
    line = ("{total_s:7.1f} s, min ESS {min_ess:6.0f}, {ess_per_s:6.1f} ESS/s, {divergences} "
            "divergences, target_accept {target_accept:g}")
    print("  inference.sample:   " + line.format(**res["gradsolve"]), flush=True)
    # NumPyro at its default target, and at the one inference.sample used (like for like)
    program = inference.population_program(model)
    res["numpyro_gs_solve"] = run_numpyro(program, data, warm, draws, chains, a.seed)
    print("  NumPyro + gs.solve: " + line.format(**res["numpyro_gs_solve"]), flush=True)
    same = res["gradsolve"]["target_accept"]
    if same != 0.8:
        res["numpyro_gs_solve_same_target"] = run_numpyro(program, data, warm, draws, chains,
                                                          a.seed, target_accept=same)
        print("  NumPyro + gs.solve: " + line.format(**res["numpyro_gs_solve_same_target"]),
              flush=True)
    if a.diffrax:
        res["numpyro_diffrax"] = run_numpyro(diffrax_program(model), data, warm, draws,
                                             chains, a.seed)
        print("  NumPyro + Diffrax:  " + line.format(**res["numpyro_diffrax"]), flush=True)
    g = res["gradsolve"]["ess_per_s"]
    for key in ("numpyro_gs_solve", "numpyro_gs_solve_same_target", "numpyro_diffrax"):
        if key in res:
            r = res[key]
            print(f"  ESS/s ratio inference.sample / {key} (target_accept "
                  f"{r['target_accept']:g}): {g / r['ess_per_s']:.2f}x", flush=True)
    print("one log-density gradient, 4 points vectorised:", flush=True)
    res["gradient"] = gradient_times(model, data, [int(s) for s in a.sizes.split(",")])
    _write(res, f"bench_population{'_quick' if a.quick else ''}")


if __name__ == "__main__":
    main()
