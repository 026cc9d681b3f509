"""gradsolve against AMICI + pyPESTO on PEtab problems, one after the other, side by side.

What it measures, per problem (positional arguments; default ``Boehm_JProteomeRes2014``):

(1) Objective and objective + gradient at the nominal parameters (always).
    AMICI: ``pypesto.petab.PetabImporter.from_yaml(yaml, output_folder=<fresh temp dir>)
    .create_problem()``; its objective (negative log-likelihood, in pyPESTO's ``x_free``
    order, mapped from gradsolve's values by parameter id) on CVODES BDF, rtol 1e-8,
    atol 1e-16, one thread, with forward and with adjoint sensitivities; best of 5 after a
    warm-up; "first call" = import + model compilation + first objective-and-gradient.
    gradsolve: ``models.load_petab(yaml, hierarchical=False, rtol=1e-8, atol=1e-12)``,
    ``jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))``, best of 5 after a
    warm-up; "first call" = load + compile + first objective-and-gradient, measured in a
    fresh subprocess of this interpreter with empty kernel and XLA caches
    (``GRADSOLVE_KERNEL_CACHE``, ``GRADSOLVE_XLA_CACHE`` set to a new temp dir; a C++
    kernel whose build is estimated above ``GRADSOLVE_KERNEL_BACKGROUND_S`` is built in the
    background, so that first call runs the XLA drivers) (in-process time, and the
    subprocess's wall time with Python and JAX start-up). The warm timings of the in-process
    objective run whichever driver was ready when it was traced. Both objectives at nominal are printed with their
    difference.
(2) ``--profiles``: gradsolve ``inference.fit(problem, n_starts=10, seed=0)`` then
    ``inference.profile(problem, fit)`` (``hierarchical=False``: all estimated parameters are
    profiled, as in pyPESTO), timed. pyPESTO: one Fides run from gradsolve's optimum (both
    profile the same optimum; the Fides run is not in the profile time), then
    ``pypesto.profile.parameter_profile`` at its default options, timed; 95 % interval ends
    where the likelihood ratio crosses exp(-chi2_1(0.95)/2) = exp(-1.92)
    (``pypesto.profile.calculate_approximate_ci`` on the profile's ``x_path`` and
    ``ratio_path``; a side whose path never crosses is reported open, +-inf). Per
    parameter: both intervals, the difference of each end relative to gradsolve's interval
    width, and the time ratio.
(3) ``--multistart N``: pyPESTO ``optimize.minimize`` with ``FidesOptimizer()``, N starts,
    seed 0 (``np.random.seed(0)``), wall time; gradsolve ``inference.fit(problem,
    n_starts=N, seed=0)`` (hierarchical default), wall time (JIT compilation included).
    Converged = final objective within 0.1 of the best found by either tool; converged
    starts per minute.

The AMICI side runs in a second interpreter (``--amici-python``, default ``$AMICI_PYTHON``,
else ``/work/amici-venv/bin/python``) as ``<python> bench_vs_amici.py --side amici JOB.json``
and prints one line of JSON; everything else runs in this (the project's) interpreter.
AMICI compiles the model with swig and a C++ compiler: the subprocess puts the AMICI venv's
``bin`` (its pip ``swig`` 4.5) first on ``PATH``; Debian's swig 4.1 (``/usr/bin/swig``)
builds a module AMICI 1.0.1 fails to load (``'SwigPyObject' object has no attribute
'module'``).

Usage::

    .venv/bin/python benchmarks/bench_vs_amici.py                        # (1), Boehm
    .venv/bin/python benchmarks/bench_vs_amici.py --profiles --multistart 10
    .venv/bin/python benchmarks/bench_vs_amici.py Zheng_PNAS2012 Fujita_SciSignal2010
    .venv/bin/python benchmarks/bench_vs_amici.py --out /tmp/vs_amici.json

A problem is a name under ``--collection`` (``<collection>/<Name>/*.yaml``; default
``/work/shared/petab-benchmark-collection``), a YAML path, or a name shipped with `models`.

AMICI venv recipe (kept apart from the project's venv)::

    apt-get install libopenblas-dev libhdf5-serial-dev swig      # Debian
    python -m venv /work/amici-venv
    /work/amici-venv/bin/pip install amici==1.0.1 "pypesto==0.7.*" fides petab
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COLLECTION = "/work/shared/petab-benchmark-collection"
RTOL, ATOL_OURS, ATOL_AMICI = 1e-8, 1e-12, 1e-16
REPEATS = 5


def best_of(f, n=REPEATS):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts)


def resolve_yaml(name: str, collection: str) -> str:
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return str(p.resolve())
    d = Path(collection) / name
    if d.is_dir():
        ys = sorted(d.glob("*.yaml"))
        exact = [y for y in ys if y.stem == name]
        return str((exact or ys)[0])
    return name  # a problem shipped with `models`


# ---------------------------------------------------------------------------- gradsolve
def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def ours_first_call(yaml: str) -> dict:
    """Load + compile + first objective-and-gradient (run in a fresh subprocess)."""
    t0 = time.perf_counter()
    jax = _jax()
    import jax.numpy as jnp
    import models

    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    problem = models.load_petab(yaml, hierarchical=False, rtol=RTOL, atol=ATOL_OURS)
    t_load = time.perf_counter() - t
    vg = jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))
    x = jnp.asarray(problem.nominal)
    t = time.perf_counter()
    v, g = vg(x)
    jax.block_until_ready(g)
    t_first = time.perf_counter() - t
    return dict(import_s=t_import, load_s=t_load, first_call_s=t_first,
                total_s=t_load + t_first, fval=float(v))


def ours_nominal(yaml: str) -> dict:
    jax = _jax()
    import jax.numpy as jnp
    import models

    problem = models.load_petab(yaml, hierarchical=False, rtol=RTOL, atol=ATOL_OURS)
    x = jnp.asarray(problem.nominal)
    f = jax.jit(lambda x: -problem.log_likelihood(x))
    vg = jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))
    v = float(f(x))
    v2, g = vg(x)
    jax.block_until_ready(g)
    t_f = best_of(lambda: jax.block_until_ready(f(x)))
    t_fg = best_of(lambda: jax.block_until_ready(vg(x)))
    # first call in a fresh interpreter
    # cold, as AMICI's fresh model folder: empty kernel and XLA caches for the subprocess
    cold = tempfile.mkdtemp(prefix="gradsolve_cold_")
    env = dict(os.environ, GRADSOLVE_KERNEL_CACHE=f"{cold}/kernels",
               GRADSOLVE_XLA_CACHE=f"{cold}/xla")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--side", "ours-first", yaml],
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if out.returncode:
        first = dict(error=out.stderr.strip()[-2000:])
    else:
        first = json.loads(out.stdout.strip().splitlines()[-1])
    first["subprocess_wall_s"] = wall
    return dict(ids=list(problem.parameter_ids),
                nominal={p: float(v) for p, v in zip(problem.parameter_ids,
                                                      np.asarray(problem.nominal))},
                fval=v, fval_vg=float(v2), grad=np.asarray(g).tolist(), obj_s=t_f,
                obj_grad_s=t_fg, first=first, solver=str(problem.solver),
                solver_reason=getattr(problem, "solver_reason", ""))


def ours_profiles(yaml: str, n_starts: int, seed: int) -> dict:
    _jax()
    import inference
    import models

    problem = models.load_petab(yaml, hierarchical=False)
    t = time.perf_counter()
    res = inference.fit(problem, n_starts=n_starts, seed=seed)
    t_fit = time.perf_counter() - t
    t = time.perf_counter()
    prof = inference.profile(problem, res)
    t_prof = time.perf_counter() - t
    return dict(fit_s=t_fit, fit_loss=float(res.loss),
                optimum={p: float(v) for p, v in res.params.items()},
                profile_s=t_prof,
                intervals={p: [float(a) for a in prof.intervals[p]]
                           for p in prof.parameter_ids})


def ours_multistart(yaml: str, n_starts: int, seed: int) -> dict:
    _jax()
    import inference
    import models

    problem = models.load_petab(yaml)  # hierarchical default
    t = time.perf_counter()
    res = inference.fit(problem, n_starts=n_starts, seed=seed)
    wall = time.perf_counter() - t
    return dict(wall_s=wall, losses=[float(v) for v in np.asarray(res.losses)],
                hierarchical=list(problem.inner_parameter_ids))


# ---------------------------------------------------------------------------- AMICI side
def amici_side(job: dict) -> dict:
    """Everything on the AMICI + pyPESTO side, in the AMICI interpreter."""
    import logging

    import amici.sim.sundials as asd
    import petab.v1 as petab
    import pypesto.optimize as optimize
    import pypesto.petab
    import pypesto.profile as profile

    out: dict = {}
    yaml = job["yaml"]
    t = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="amici_model_")
    petab_problem = petab.Problem.from_yaml(yaml)
    # the comparison is of the likelihood (our side's `log_likelihood`): a table's objective
    # priors (Bachmann, Isensee) would make pyPESTO add them in an aggregate objective
    petab_problem.parameter_df = petab_problem.parameter_df.drop(
        columns=[c for c in ("objectivePriorType", "objectivePriorParameters")
                 if c in petab_problem.parameter_df.columns])
    importer = pypesto.petab.PetabImporter(petab_problem, output_folder=folder,
                                           model_name="m_" + Path(yaml).stem.replace("-", "_"))
    problem = importer.create_problem()
    obj = problem.objective
    solver = obj.amici_solver

    def configure(method):
        solver.set_relative_tolerance(RTOL)
        solver.set_absolute_tolerance(job.get("amici_atol", ATOL_AMICI))
        if hasattr(asd, "LinearMultistepMethod"):
            solver.set_linear_multistep_method(asd.LinearMultistepMethod.BDF)
        solver.set_sensitivity_method(method)
        obj.n_threads = 1

    configure(asd.SensitivityMethod.forward)
    names = [problem.x_names[i] for i in problem.x_free_indices]
    x_ours = job["nominal"]
    missing = [p for p in names if p not in x_ours]
    x = np.array([x_ours.get(p, np.nan) for p in names])
    if missing:  # fall back to PEtab's nominal values
        x = np.asarray(petab_problem.x_nominal_free_scaled, dtype=float)
    fval, grad = obj(x, sensi_orders=(0, 1))
    out["first_s"] = time.perf_counter() - t
    out["ids"] = names
    out["missing_ids"] = missing
    out["fval"] = float(fval)
    out["petab_nominal_maxdiff"] = float(np.max(np.abs(
        np.asarray(petab_problem.x_nominal_free_scaled, dtype=float) - x)))
    out["fval_obj"] = float(obj(x, sensi_orders=(0,)))
    out["obj_s"] = best_of(lambda: obj(x, sensi_orders=(0,)))
    for label, method in (("fwd", asd.SensitivityMethod.forward),
                          ("adj", asd.SensitivityMethod.adjoint)):
        configure(method)
        f, g = obj(x, sensi_orders=(0, 1))
        out[f"fval_{label}"] = float(f)
        out[f"grad_{label}"] = np.asarray(g).tolist()
        out[f"obj_grad_{label}_s"] = best_of(lambda: obj(x, sensi_orders=(0, 1)))
    configure(asd.SensitivityMethod.forward)  # pyPESTO's default for the optimisers

    fides = optimize.FidesOptimizer(verbose=logging.WARNING)
    if job.get("profiles"):
        try:
            out["profile"] = _amici_profiles(problem, job["optimum"], names, fides)
        except Exception as e:  # keep (1) and (3)
            out["profile"] = dict(error=f"{type(e).__name__}: {e}")
    n = job.get("multistart") or 0
    if n:
        problem.x_guesses_full = np.zeros((0, problem.dim_full))
        np.random.seed(0)
        try:
            t = time.perf_counter()
            res = optimize.minimize(problem, optimizer=fides, n_starts=n, progress_bar=False)
            wall = time.perf_counter() - t
            fv = [float(r.fval) for r in res.optimize_result.list]
            out["multistart"] = dict(wall_s=wall, losses=sorted(fv))
        except Exception as e:
            out["multistart"] = dict(error=f"{type(e).__name__}: {e}")
    return out


def _amici_profiles(problem, optimum: dict, names: list, fides) -> dict:
    """One Fides run from gradsolve's optimum, then pyPESTO's profiles at their defaults."""
    import pypesto.optimize as optimize
    import pypesto.profile as profile

    guess = np.clip(np.array([optimum[p] for p in names]), problem.lb, problem.ub)
    full = np.full(problem.dim_full, np.nan)
    full[problem.x_free_indices] = guess
    full[problem.x_fixed_indices] = problem.x_fixed_vals
    problem.set_x_guesses([full])
    res = optimize.minimize(problem, optimizer=fides, n_starts=1, progress_bar=False)
    t = time.perf_counter()
    res = profile.parameter_profile(problem, res, optimizer=fides, progress_bar=False,
                                    filename=None)
    wall = time.perf_counter() - t
    level = profile.chi2_quantile_to_ratio(0.95)
    intervals, points = {}, {}
    for i in problem.x_free_indices:
        path = res.profile_result.list[-1][i]
        xs, ratios = np.asarray(path.x_path[i]), np.asarray(path.ratio_path)
        order = np.argsort(xs)
        xs, ratios = xs[order], ratios[order]
        lo, hi = profile.calculate_approximate_ci(xs, ratios, level)
        if ratios[0] >= level:
            lo = -np.inf
        if ratios[-1] >= level:
            hi = np.inf
        intervals[problem.x_names[i]] = [float(lo), float(hi)]
        points[problem.x_names[i]] = int(len(xs))
    return dict(profile_s=wall, fval=float(res.optimize_result[0].fval),
                intervals=intervals, points=points)


def run_amici(python: str, job: dict) -> dict:
    path = Path(tempfile.mkstemp(prefix="bench_vs_amici_", suffix=".json")[1])
    path.write_text(json.dumps(job))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", AMICI_CXXFLAGS=os.environ.get("AMICI_CXXFLAGS", ""))
    # the AMICI venv's swig (pip package `swig`, 4.x matching the AMICI build) first; the
    # system swig 4.1 (/usr/bin) builds a model module AMICI 1.0.1 cannot load
    # ("'SwigPyObject' object has no attribute 'module'")
    env["PATH"] = f"{Path(python).parent}:{env.get('PATH', '')}:/usr/bin"
    t = time.perf_counter()
    out = subprocess.run([python, __file__, "--side", "amici", str(path)],
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    log = path.with_suffix(".log")
    log.write_text(out.stdout + "\n--- stderr ---\n" + out.stderr)
    if out.returncode:
        return dict(error=(out.stderr.strip() or out.stdout.strip())[-3000:] + f"\n(log {log})")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["subprocess_wall_s"] = wall
    return res


# ---------------------------------------------------------------------------- report
def report(name: str, ours: dict, amici: dict, prof: dict | None, ms: dict | None) -> None:
    print(f"\n=== {name} ===")
    print(f"gradsolve solver: {ours['solver']} ({ours['solver_reason']})")
    if "error" in ours:
        print(f"gradsolve side FAILED: {ours['error'][:2000]}")
    if "error" in amici:
        print(f"AMICI side FAILED:\n{amici['error']}")
    a = amici if "error" not in amici else {}
    print("(1) at the nominal parameters")
    if a and not np.isfinite(a.get("fval", 0.0)):
        print(f"  AMICI objective at nominal (fwd sensi, first call) {a['fval']}: CVODES failed "
              f"(see the AMICI log); adjoint run: {a.get('fval_adj')}")
    print(f"  objective (neg. log-likelihood): gradsolve {ours['fval']:.10g}  "
          f"AMICI {a.get('fval', float('nan')):.10g}  "
          f"diff {ours['fval'] - a.get('fval', float('nan')):.3g}")
    if a:
        if a["missing_ids"]:
            print(f"  NOTE ids not in gradsolve's problem {a['missing_ids']}: AMICI at "
                  "PEtab nominal")
        g_ours = dict(zip(ours["ids"], ours["grad"]))
        go = np.array([g_ours.get(p, np.nan) for p in a["ids"]])
        for lab in ("fwd", "adj"):
            ga = np.array(a[f"grad_{lab}"])
            rel = np.max(np.abs(go - ga)) / max(np.max(np.abs(ga)), 1e-300)
            print(f"  gradient max|diff| / max|grad| vs AMICI {lab}: {rel:.2e}")
    f = ours["first"]

    def ms_(v):
        return f"{1e3 * v:10.2f} ms" if v == v else "       n/a"

    nan = float("nan")
    print(f"  {'':34} {'gradsolve':>13} {'AMICI':>13} {'AMICI/ours':>10}")
    rows = [("objective", ours["obj_s"], a.get("obj_s", nan), a.get("fval_obj", nan)),
            ("objective+gradient (fwd sensi)", ours["obj_grad_s"], a.get("obj_grad_fwd_s", nan),
             a.get("fval_fwd", nan)),
            ("objective+gradient (adjoint)", ours["obj_grad_s"], a.get("obj_grad_adj_s", nan),
             a.get("fval_adj", nan))]
    for lab, o, t, fv in rows:
        bad = "" if np.isfinite(fv) else f"  AMICI objective {fv}: simulation FAILED"
        print(f"  {lab:<34} {ms_(o):>13} {ms_(t):>13} {t / o:>10.2f}{bad}")
    print(f"  {'first call (load+compile+obj+grad)':<34} {f.get('total_s', nan):>11.1f} s "
          f"{a.get('first_s', nan):>11.1f} s {a.get('first_s', nan) / f.get('total_s', nan):>10.2f}")
    print(f"    gradsolve: load {f.get('load_s', nan):.1f} s + compile/first "
          f"{f.get('first_call_s', nan):.1f} s; fresh subprocess wall "
          f"{f['subprocess_wall_s']:.1f} s (Python+JAX import {f.get('import_s', nan):.1f} s)"
          + (f"; ERROR {f['error']}" if "error" in f else ""))
    if a:
        print(f"    AMICI: import+codegen+compile+first call {a['first_s']:.1f} s; "
              f"subprocess wall (all of the AMICI side) {a['subprocess_wall_s']:.1f} s")
    if prof is not None:
        print("(2) profiles (95 %, parameter scale)")
        print(f"  gradsolve: fit 10 starts {prof['fit_s']:.1f} s (best {prof['fit_loss']:.5f}),"
              f" profile {prof['profile_s']:.1f} s")
        ap = a.get("profile")
        if ap and "error" in ap:
            print(f"  pyPESTO profile FAILED: {ap['error']}")
            ap = None
        if ap:
            print(f"  pyPESTO:   Fides from gradsolve's optimum -> {ap['fval']:.5f}; "
                  f"profile {ap['profile_s']:.1f} s; time ratio pyPESTO/gradsolve "
                  f"{ap['profile_s'] / prof['profile_s']:.2f}")
        print(f"  {'parameter':<26} {'gradsolve lo':>12} {'hi':>9} {'pyPESTO lo':>11} "
              f"{'hi':>9} {'dlo/width':>10} {'dhi/width':>10} {'pts':>4}")
        for p, (lo, hi) in prof["intervals"].items():
            plo, phi = (ap["intervals"].get(p, [nan, nan]) if ap else [nan, nan])
            w = hi - lo
            dl = (plo - lo) / w if np.isfinite(w) and np.isfinite(plo - lo) else nan
            du = (phi - hi) / w if np.isfinite(w) and np.isfinite(phi - hi) else nan
            pts = ap["points"].get(p, 0) if ap else 0
            print(f"  {p:<26} {lo:>12.4f} {hi:>9.4f} {plo:>11.4f} {phi:>9.4f} "
                  f"{dl:>10.2e} {du:>10.2e} {pts:>4}")
    if ms is not None:
        am = a.get("multistart")
        if am and "error" in am:
            print(f"  pyPESTO multistart FAILED: {am['error']}")
            am = None
        best = min(ms["losses"] + (am["losses"] if am else []))
        print(f"(3) multistart, {len(ms['losses'])} starts; best objective by either "
              f"{best:.5f}; converged = within 0.1")
        for lab, d in (("gradsolve", ms), ("pyPESTO+Fides", am)):
            if not d:
                print(f"  {lab}: n/a")
                continue
            conv = sum(v <= best + 0.1 for v in d["losses"])
            print(f"  {lab:<14} wall {d['wall_s']:7.1f} s  best {min(d['losses']):.5f}  "
                  f"converged {conv}/{len(d['losses'])}  "
                  f"{conv / (d['wall_s'] / 60):.2f} converged starts/min")
        print(f"  gradsolve inner (hierarchical) parameters: {ms['hierarchical']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", default=["Boehm_JProteomeRes2014"])
    ap.add_argument("--collection", default=COLLECTION)
    ap.add_argument("--profiles", action="store_true",
                    help="(2): profiles (Boehm_JProteomeRes2014 only)")
    ap.add_argument("--multistart", type=int, default=0, metavar="N", help="(3): N starts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amici-python", default=os.environ.get(
        "AMICI_PYTHON", "/work/amici-venv/bin/python"))
    ap.add_argument("--amici-atol", type=float, default=ATOL_AMICI,
                    help="AMICI's absolute tolerance (default 1e-16)")
    ap.add_argument("--out", default=None, help="write all numbers as JSON here")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side == "amici":
        print(json.dumps(amici_side(json.loads(Path(a.problems[0]).read_text()))))
        return
    if a.side == "ours-first":
        print(json.dumps(ours_first_call(a.problems[0])))
        return

    results = {}
    for name in a.problems:
        yaml = resolve_yaml(name, a.collection)
        try:
            ours = ours_nominal(yaml)
        except Exception as e:  # still run the AMICI side (at PEtab's nominal values)
            ours = dict(error=f"{type(e).__name__}: {e}", nominal={}, ids=[], grad=[],
                        fval=float("nan"), obj_s=float("nan"), obj_grad_s=float("nan"),
                        first=dict(subprocess_wall_s=float("nan")), solver="n/a",
                        solver_reason="")
        prof = ms = None
        do_prof = a.profiles and "Boehm" in name
        if do_prof:
            prof = ours_profiles(yaml, 10, a.seed)
        if a.multistart:
            ms = ours_multistart(yaml, a.multistart, a.seed)
        job = dict(yaml=yaml, nominal=ours["nominal"], profiles=do_prof,
                   amici_atol=a.amici_atol,
                   optimum=prof["optimum"] if prof else None, multistart=a.multistart)
        amici = run_amici(a.amici_python, job)
        report(name, ours, amici, prof, ms)
        results[name] = dict(gradsolve=dict(nominal=ours, profiles=prof, multistart=ms),
                             amici=amici)
        sys.stdout.flush()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    sys.exit(main())
