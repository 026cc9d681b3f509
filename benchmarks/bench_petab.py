"""The PEtab benchmark collection through `models.load_petab`: one row per problem.

For each problem: does it load (or the reason it does not); the log-likelihood at the nominal
parameters against AMICI's reference value where one exists (within 1e-3 relative or 0.01
absolute); our simulation against the one the collection ships (``simulatedData_*.tsv``,
made with the authors' tool) and the log-likelihood of theirs (PEtab's `calculate_llh`,
a second reference); the gradient against fourth-order central differences (a second load at rtol
1e-11, on at most ``--fd-coords`` coordinates chosen with a fixed seed, each at the step
where the differences have converged; max |g - fd| / max |fd| <= 1e-4); the first call (compile) and one warm objective+gradient call at the
default tolerances (Rodas5P, rtol 1e-8, atol 1e-12).

Each problem runs in its own process with a time limit, smallest problems first; rows are
appended to a JSON-lines file as they finish, and ``--table`` prints the Markdown table.

    python benchmarks/bench_petab.py --out benchmarks/petab_rows.jsonl
    python benchmarks/bench_petab.py --table benchmarks/petab_rows.jsonl
    python benchmarks/bench_petab.py --no-gradient ...   # without the gradient's stages

``--fit N`` instead runs `inference.fit` with ``N`` starts (seed 0, Latin hypercube inside
the bounds) on each problem: the best objective against the objective at the nominal
parameters, how many starts ended within 0.1 of the best ("converged", pyPESTO's
convention), the wall time (compilation included) and converged starts per minute;
``--fit-table`` prints those rows.

    python benchmarks/bench_petab.py --fit 20 --out /tmp/petab_fit.jsonl \
        --only Boehm_JProteomeRes2014 Fujita_SciSignal2010 Bachmann_MSB2011
    python benchmarks/bench_petab.py --fit-table /tmp/petab_fit.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

COLLECTION = Path(__file__).resolve().parents[2] / "shared" / "petab-benchmark-collection"

# AMICI's reference log-likelihoods at the nominal parameters
# (AMICI-dev/AMICI, tests/benchmark_models/benchmark_models.yaml), kept with the tests' data
REFERENCE = json.loads((Path(__file__).resolve().parents[1] / "tests" / "data" / "petab"
                        / "amici_reference.json").read_text())["llh"]


FD_STEPS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


def _converged_difference(f, x0, i):
    """The fourth-order central difference of ``f`` in coordinate ``i`` at the step where
    it has converged: of the steps `FD_STEPS`, the smaller one of the neighbouring pair
    whose estimates agree best (chosen without looking at the gradient under test). One
    step for every problem is not enough: an oscillating model's likelihood
    (Borghans_BiophysChem1997) changes its number of spikes within 1e-4 on the parameter
    scale, where a step of 1e-3 gives a difference 200x the derivative. NaN where no two
    neighbouring steps give finite differences (Crauste_CellSystems2017's solution blows
    up at t = 10 for a change of 1e-4 in most of its parameters)."""
    import numpy as np

    est = []
    for h in FD_STEPS:
        e = np.zeros_like(x0)
        e[i] = h
        v = [f(x0 + k * e) for k in (2, 1, -1, -2)]
        est.append((-v[0] + 8 * v[1] - 8 * v[2] + v[3]) / (12 * h))
    gaps = [abs(a - b) for a, b in zip(est, est[1:])]
    if not np.any(np.isfinite(gaps)):
        return float("nan")  # the objective is not finite within 2 steps of x0 at any step
    return est[int(np.nanargmin(gaps)) + 1]


SIM_KEYS = ("observableId", "preequilibrationConditionId", "simulationConditionId", "time",
            "observableParameters", "noiseParameters", "datasetId")


def collection_simulation(problem, name: str) -> dict:
    """Our simulation at the nominal parameters against the one the collection ships
    (``simulatedData_*.tsv``, made by the problem's authors with their own tool): rows
    matched on the measurement table's keys (the two tables need not share an order); per
    row ``|ours - theirs| / max(|theirs|, 1e-3 * the observable's largest |theirs|)`` (a
    floor, so rows at ~0 do not dominate), its maximum and median; and the log-likelihood
    of THEIR simulation by PEtab's own `calculate_llh` (a second reference value, where
    AMICI has none or disagrees)."""
    import numpy as np
    import pandas as pd
    import petab.v1 as petab

    files = sorted((COLLECTION / name).glob("simulatedData_*.tsv"))
    if not files:
        return {}
    theirs = pd.concat([pd.read_csv(f, sep="\t") for f in files], ignore_index=True)
    ours = problem.simulate()
    keys = [k for k in SIM_KEYS if k in theirs.columns and k in ours.columns]

    def keyed(df):
        df = df.copy()
        for k in keys:
            # times to 8 digits: some tables write more digits than the measurements'
            df[k] = (df[k].astype(float).map(lambda v: float(f"{v:.8g}")) if k == "time" else
                     df[k].astype(object).where(df[k].notna(), "").astype(str))
        return df

    # some tables name an observable with its overrides appended ("obs__par__cond")
    known = set(ours["observableId"])
    theirs["observableId"] = [o if o in known or o.split("__")[0] not in known
                              else o.split("__")[0] for o in theirs["observableId"]]
    theirs = keyed(theirs)
    ours_k = keyed(ours)
    core = [k for k in keys if k not in ("observableParameters", "noiseParameters",
                                         "datasetId")]
    best = None
    # their table may write parameters where the measurement table names them (numbers
    # for `noiseParameters`): fall back to fewer keys where the simulation is still
    # unique per key
    for ks in (keys, [k for k in keys if k != "noiseParameters"], core):
        t = theirs.drop_duplicates(ks + ["simulation"])
        if t.duplicated(ks).any():
            continue
        both = ours_k.merge(t[ks + ["simulation"]], on=ks, suffixes=("", "_theirs"),
                            how="left")
        n = int(np.isfinite(both["simulation_theirs"].to_numpy(float)).sum())
        if best is None or n > best[0]:
            best = (n, both)
    if best is None:
        return {"sim_rows": 0, "sim_rows_total": len(ours)}
    both = best[1]
    a, b = both["simulation"].to_numpy(float), both["simulation_theirs"].to_numpy(float)
    matched = np.isfinite(b)
    scale = both.assign(m=np.abs(b)).groupby("observableId")["m"].transform("max").to_numpy()
    rel = np.abs(a - b) / np.maximum(np.abs(b), 1e-3 * scale)
    rel = rel[matched & np.isfinite(rel)]
    row = {"sim_rows": int(matched.sum()), "sim_rows_total": len(both)}
    if len(rel):
        row.update(sim_max_rel=float(np.max(rel)), sim_median_rel=float(np.median(rel)))
    try:
        pp = problem.petab_problem
        if matched.all():  # their values in the measurement table's rows and order
            sim = ours.assign(simulation=b)
            row["sim_llh"] = float(petab.calculate_llh(pp.measurement_df, sim,
                                                       pp.observable_df, pp.parameter_df))
    except Exception as e:  # noqa: BLE001 - PEtab's own function, on their table
        row["sim_llh_error"] = f"{type(e).__name__}: {e}"[:120]
    return row


def one(name: str, fd_coords: int, report=lambda row: None, gradient: bool = True) -> dict:
    """Every measurement of one problem (run in a child process); ``report(row)`` after
    each stage, so a problem stopped by the time limit keeps what it measured."""
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import models

    row: dict = {"problem": name}
    t = time.perf_counter()
    try:
        # every parameter outer: the reference log-likelihoods are at the nominal values
        problem = models.load_petab(COLLECTION / name, hierarchical=False)
    except Exception as e:  # noqa: BLE001 - the reason is the row
        row["loads"] = f"{type(e).__name__}: {e}"[:160]
        return row
    row["load_s"] = time.perf_counter() - t
    row["loads"] = "yes"
    row["states"] = len(problem.state_ids)
    row["params"] = len(problem.parameter_ids)
    row["conditions"] = len(problem.condition_ids)
    row["measurements"] = len(problem.petab_problem.measurement_df)
    row["solver"] = problem.solver_reason
    report(row)
    x0 = np.asarray(problem.nominal)
    # the value alone first: a large model's reverse-mode compile can take many minutes
    t = time.perf_counter()
    row["llh"] = float(jax.jit(problem.log_likelihood)(x0))
    row["llh_first_call_s"] = time.perf_counter() - t
    if name in REFERENCE:
        ref = REFERENCE[name]
        row["ref"] = ref
        row["matches"] = bool(abs(row["llh"] - ref) <= max(1e-3 * abs(ref), 0.01))
    row["grad_error"] = "simulation not finished"
    report(row)
    row.update(collection_simulation(problem, name))
    if not gradient:
        row["grad_error"] = "not run"
        return row
    row["grad_error"] = "objective+gradient not finished"
    report(row)
    vg = jax.jit(jax.value_and_grad(problem.log_likelihood))
    t = time.perf_counter()
    v, g = vg(x0)
    g = np.asarray(jax.block_until_ready(g))
    row["first_call_s"] = time.perf_counter() - t
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(vg(x0))
        ts.append(time.perf_counter() - t)
    row["obj_grad_ms"] = 1e3 * min(ts)
    row["grad_error"] = "central differences not finished"
    report(row)
    # Gradient against central differences, both at tight tolerances.
    tight = models.load_petab(COLLECTION / name, rtol=1e-11, atol=1e-14, hierarchical=False)
    vgt = jax.jit(jax.value_and_grad(tight.log_likelihood))
    gt = np.asarray(vgt(x0)[1])
    lt = jax.jit(tight.log_likelihood)
    rng = np.random.default_rng(0)
    coords = np.sort(rng.permutation(len(x0))[:fd_coords])
    fd = np.asarray([_converged_difference(lambda z: float(lt(z)), x0, i) for i in coords])
    del row["grad_error"]
    defined = np.isfinite(fd)
    row["fd_coords"] = int(len(coords))
    row["fd_coords_defined"] = int(defined.sum())
    err = (float(np.max(np.abs(gt[coords][defined] - fd[defined]))
                 / max(np.max(np.abs(fd[defined])), 1e-300)) if defined.any() else float("nan"))
    row["grad_rel_err"] = err
    row["grad_matches"] = bool(err <= 1e-4)
    row["grad_default_vs_tight"] = float(np.max(np.abs(g - gt)) / max(np.max(np.abs(gt)),
                                                                        1e-300))
    return row


def fit_row(name: str, n_starts: int) -> dict:
    """One multistart fit of one problem (run in a child process)."""
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import inference
    import models

    problem = models.load_petab(COLLECTION / name)  # hierarchical where it applies
    row: dict = {"problem": name, "n_starts": n_starts, "params": len(problem.parameter_ids),
                 "conditions": len(problem.condition_ids)}
    nominal = -float(problem.full.log_likelihood())
    if bool(np.any(problem.full.priors.given)):
        nominal -= float(problem.full.log_prior(jacobian=False, given_only=True))
    row["nominal_objective"] = nominal
    t = time.perf_counter()
    res = inference.fit(problem, n_starts=n_starts, seed=0)
    wall = time.perf_counter() - t
    losses = np.asarray(res.losses)
    best = float(losses[0])
    n_conv = int(np.sum(losses - best <= 0.1))
    row.update(best_objective=best, method=res.method, objective=res.objective,
               converged_within_0_1=n_conv, optimiser_converged=int(np.sum(res.converged)),
               failed=int(np.sum(res.status != 0)), iterations=int(res.n_steps),
               fit_wall_s=wall, converged_per_min=60.0 * n_conv / wall,
               ensemble_records=int(res.n_records), ensemble_evaluations=int(res.n_grad_evals),
               records_per_start=[int(v) for v in np.asarray(res.n_records_per_start)],
               exit_reasons=[str(v) for v in res.exit_reasons],
               losses=[float(v) for v in losses])
    return row


def fit_table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["problem"])
    out = ["| problem | params / conditions | starts | objective at nominal | best objective "
           "| best - nominal | within 0.1 of best | failed | iterations | wall s (compile "
           "incl.) | converged starts / min |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "best_objective" not in r:
            out.append(f"| {r['problem']} | | {r.get('n_starts', '')} | | "
                       f"{r.get('loads', r.get('error', '?'))} | | | | | | |")
            continue
        out.append(
            f"| {r['problem']} | {r['params']} / {r['conditions']} | {r['n_starts']} | "
            f"{r['nominal_objective']:.4f} | {r['best_objective']:.4f} | "
            f"{r['best_objective'] - r['nominal_objective']:+.1e} | "
            f"{r['converged_within_0_1']} | {r['failed']} | {r['iterations']} | "
            f"{r['fit_wall_s']:.0f} | {r['converged_per_min']:.2f} |")
    return "\n".join(out)


def _size(name: str) -> int:
    d = COLLECTION / name
    return sum(f.stat().st_size for f in d.glob("*") if f.is_file())


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["problem"])
    out = ["| problem | loads | states / params / conditions / meas. | llh at nominal | "
           "reference (AMICI) | matches | llh of the collection's simulation | ours vs "
           "its simulation (max rel. diff, rows) | grad vs FD (rel. err, coords) | "
           "first call s | obj+grad ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("loads") != "yes":
            out.append(f"| {r['problem']} | no: {r.get('loads', '?')} | | | | | | | | | |")
            continue
        if "llh" not in r:
            out.append(f"| {r['problem']} | yes | {r['states']} / {r['params']} / "
                       f"{r['conditions']} / {r['measurements']} | "
                       f"{r.get('error', r.get('grad_error', ''))} | | | | | | | |")
            continue
        sim_llh = f"{r['sim_llh']:.6f}" if "sim_llh" in r else ""
        if "sim_max_rel" in r:
            sim = f"{r['sim_max_rel']:.1e} ({r['sim_rows']} of {r['sim_rows_total']})"
        elif "sim_rows" in r:
            sim = "no row matches the measurement table's"
        else:
            sim = ""
        ref = f"{r['ref']:.6f}" if "ref" in r else "none"
        match = ("yes" if r["matches"] else "**no**") if "ref" in r else ""
        coords = (f"{r['fd_coords_defined']} of {r['fd_coords']} defined"
                  if r.get("fd_coords_defined", r.get("fd_coords")) != r.get("fd_coords")
                  else f"{r.get('fd_coords')}")
        grad = (f"{r['grad_rel_err']:.1e} ({coords}) "
                f"{'ok' if r['grad_matches'] else '**no**'}") if "grad_rel_err" in r else \
            r.get("grad_error", "not run")
        first = f"{r['first_call_s']:.1f}" if "first_call_s" in r else ""
        ms = f"{r['obj_grad_ms']:.1f}" if "obj_grad_ms" in r else ""
        out.append(f"| {r['problem']} | yes | {r['states']} / {r['params']} / "
                   f"{r['conditions']} / {r['measurements']} | {r['llh']:.6f} | {ref} | "
                   f"{match} | {sim_llh} | {sim} | {grad} | {first} | {ms} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/petab_rows.jsonl"))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per problem")
    ap.add_argument("--fd-coords", type=int, default=6)
    ap.add_argument("--only", nargs="*", help="problem names (default: all)")
    ap.add_argument("--table", type=Path, help="print the Markdown table of a rows file")
    ap.add_argument("--fit", type=int, default=0, help="multistart fits with this many starts")
    ap.add_argument("--fit-table", type=Path, help="print the Markdown table of fit rows")
    ap.add_argument("--no-gradient", action="store_true",
                    help="load, log-likelihood and the collection's simulation only")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.table:
        print(table(a.table))
        return
    if a.fit_table:
        print(fit_table(a.fit_table))
        return
    if a.child:
        def report(row):
            print("ROW " + json.dumps(row), flush=True)

        report(fit_row(a.child, a.fit) if a.fit else one(a.child, a.fd_coords, report,
                                                         gradient=not a.no_gradient))
        return
    names = a.only or sorted((p.name for p in COLLECTION.iterdir() if p.is_dir()), key=_size)
    done = set()
    if a.out.exists():
        done = {json.loads(line)["problem"] for line in a.out.read_text().splitlines()
                if line.strip()}
    for name in names:
        if name in done:
            continue
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, __file__, "--child", name, "--fd-coords",
                                str(a.fd_coords), "--fit", str(a.fit)]
                               + (["--no-gradient"] if a.no_gradient else []),
                               capture_output=True, text=True,
                               timeout=a.timeout)
            rows = [line[4:] for line in p.stdout.splitlines() if line.startswith("ROW ")]
            row = json.loads(rows[-1]) if rows else {
                "problem": name, "loads": "crashed: " + p.stderr.strip().splitlines()[-1][:150]
                if p.stderr.strip() else "crashed"}
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rows = [line[4:] for line in out.splitlines() if line.startswith("ROW ")]
            row = {"problem": name, "loads": f"not finished within {a.timeout:.0f} s"}
            if rows:   # what it measured before the limit
                row = json.loads(rows[-1])
                row["grad_error"] = (row.get("grad_error", "not finished") +
                                     f" within {a.timeout:.0f} s")
        row["wall_s"] = time.perf_counter() - t
        print(json.dumps(row), flush=True)
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
