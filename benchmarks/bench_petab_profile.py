"""Profile likelihoods of a PEtab problem (`inference.profile`), against pyPESTO's.

gradsolve: ``inference.fit(problem, n_starts=20)`` (timed apart), then
``inference.profile(problem, fit)``: every parameter's profile, both directions, one
ensemble. Prints each parameter's estimate, 95 % interval (parameter scale), why each side
stopped, the points per profile, rounds, LM evaluations and records, and the wall time
(compilation included); where the fit was not the optimum, the profile's restarts from
the better point it found, both objective values, and whether the result is reliable; and
flags any zero-width interval (there must be none). With ``--check-restart``, where the
profile restarted, the problem is refitted from the point it restarted to (one start) and
profiled again; with ``--from-local``, the profile is also run from the best start that
ended more than 1 above the best (a local optimum, as a fit with too few starts returns),
which must restart to the optimum: either way both profiles' interval ends are compared, as
a fraction of the width.

pyPESTO (only where ``import pypesto, amici`` works in this interpreter, or in the one
``--pypesto-python`` names): the same problem through AMICI, one Fides run from gradsolve's
optimum (so that both profile the same optimum), then ``pypesto.profile.parameter_profile``
at its defaults (Fides inside, ``adaptive_step_regression``) and
``calculate_approximate_ci``; per parameter the difference of the interval ends as a
fraction of gradsolve's interval width, and the time ratio. (This side has not been run
here: AMICI builds from source and did not build within the time given to it.)

Usage::

    python benchmarks/bench_petab_profile.py                       # Boehm, 20 starts
    python benchmarks/bench_petab_profile.py --out /tmp/profile.json
    python benchmarks/bench_petab_profile.py --from-local     # also from a local optimum
    python benchmarks/bench_petab_profile.py --pypesto-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def gradsolve_side(name: str, n_starts: int, seed: int, confidence: float,
                   check_restart: bool = False, from_local: bool = False) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    import inference
    import models

    problem = models.load_petab(name)
    print(f"{name}: {problem!r}", flush=True)
    t = time.perf_counter()
    fit = inference.fit(problem, n_starts=n_starts, seed=seed)
    t_fit = time.perf_counter() - t
    near = int(np.sum(fit.losses <= fit.loss + 0.1))
    print(f"fit: {n_starts} starts, {t_fit:.1f} s, best objective {fit.loss:.5f} "
          f"({near} within 0.1)", flush=True)
    t = time.perf_counter()
    prof = inference.profile(problem, fit, confidence=confidence)
    wall = time.perf_counter() - t
    print(f"profile: {wall:.1f} s, {prof.n_rounds} rounds, {prof.n_evals} LM evaluations, "
          f"{prof.n_records} records (ensembles of {2 * len(prof.parameter_ids)} walks)")
    print(f"  fit objective {prof.fit_objective:.5f}, profiled from {prof.objective_opt:.5f} "
          f"after {prof.n_restarts} restart(s); reliable: {prof.reliable}")
    zero = [p for p in prof.parameter_ids if prof.intervals[p][0] == prof.intervals[p][1]]
    print(f"  zero-width intervals: {zero or 'none'}")
    for note in prof.notes:
        print(f"  note: {note}")
    print(f"  {'parameter':<28} {'scale':>5} {'estimate':>10} {'lower':>10} {'upper':>10}  "
          f"{'stop (lower / upper)':<22} points")
    for p in prof.parameter_ids:
        lo, hi = prof.intervals[p]
        print(f"  {p:<28} {prof.scales[p]:>5} {prof.estimate[p]:>10.4f} {lo:>10.4f} "
              f"{hi:>10.4f}  {' / '.join(prof.stop_reasons[p]):<22} "
              f"{len(prof.paths[p].values)}")
    check = other = None
    if check_restart and prof.n_restarts:
        other = inference.fit(problem, init=prof.optimum, n_starts=1)
        what = f"refitted from the restart's point ({other.loss:.5f})"
    local = np.flatnonzero(fit.losses > fit.loss + 1.0)
    if from_local and len(local):
        i = int(local[0])
        other = dataclasses.replace(fit, best_index=i,
                                    params={k: v[i] for k, v in fit.all_params.items()})
        what = f"from the local optimum of start {i} ({other.loss:.5f})"
    if other is not None:
        t = time.perf_counter()
        again = inference.profile(problem, other, confidence=confidence)
        check = {p: _end_shift(again.intervals[p], prof.intervals[p], again.estimate[p])
                 for p in prof.parameter_ids}
        print(f"check: profiled {what}: {time.perf_counter() - t:.1f} s, "
              f"{again.n_restarts} restart(s) to {again.objective_opt:.5f}, reliable: "
              f"{again.reliable}; its interval ends, and the first profile's minus them "
              "/ width (/ half-width where open):")
        for p, (dl, du) in check.items():
            lo, hi = again.intervals[p]
            print(f"  {p:<28} {lo:>10.4f} {hi:>10.4f}  {dl:>10.2e} {du:>10.2e}")
    return dict(problem=name, fit_s=t_fit, fit_loss=fit.loss, profile_s=wall,
                rounds=prof.n_rounds, evals=prof.n_evals, records=prof.n_records,
                objective_opt=prof.objective_opt, n_restarts=prof.n_restarts,
                reliable=prof.reliable, zero_width=zero,
                estimate={p: prof.estimate[p] for p in prof.parameter_ids},
                intervals={p: list(prof.intervals[p]) for p in prof.parameter_ids},
                stop_reasons={p: list(prof.stop_reasons[p]) for p in prof.parameter_ids},
                points={p: len(prof.paths[p].values) for p in prof.parameter_ids},
                restart_check=check,
                yaml=str(_yaml(problem)))


def _end_shift(a, b, estimate: float) -> list:
    """Each end's difference of the intervals ``a`` and ``b`` as a fraction of ``a``'s
    width (of the distance from ``estimate`` to its finite end where one side is open;
    0 where both ends are the same infinity)."""
    width = a[1] - a[0]
    if not np.isfinite(width):
        width = max(abs(e - estimate) for e in a if np.isfinite(e)) if \
            np.isfinite(a).any() else np.nan
    return [0.0 if x == y else float((y - x) / width) for x, y in zip(a, b)]


def _yaml(problem) -> Path:
    import models

    root = Path(models.__file__).parent / "data" / "petab" / problem.odes.model_id
    return next(root.glob("*.yaml"))


def pypesto_side(yaml: str, x_opt: dict, confidence: float) -> dict:
    """pyPESTO + AMICI + Fides profiles from ``x_opt`` (by parameter id, parameter
    scale): ``{"profile_s", "intervals": {id: [lower, upper]}, "points": {id: n}}``."""
    import pypesto.optimize as optimize
    import pypesto.petab
    import pypesto.profile as profile

    pproblem = pypesto.petab.PetabImporter.from_yaml(yaml).create_problem()
    names = [pproblem.x_names[i] for i in pproblem.x_free_indices]
    guess = np.array([x_opt[p] for p in names])
    optimizer = optimize.FidesOptimizer()
    res = optimize.minimize(pproblem, optimizer=optimizer, n_starts=1, x_guesses=[guess],
                            progress_bar=False)
    t = time.perf_counter()
    res = profile.parameter_profile(pproblem, res, optimizer=optimizer, progress_bar=False,
                                    filename=None)
    wall = time.perf_counter() - t
    level = profile.chi2_quantile_to_ratio(confidence)
    intervals, points = {}, {}
    for i in pproblem.x_free_indices:
        path = res.profile_result.list[-1][i]
        xs, ratios = path.x_path[i], path.ratio_path
        order = np.argsort(xs)
        xs, ratios = xs[order], ratios[order]
        lo, hi = profile.calculate_approximate_ci(xs, ratios, level)
        # pyPESTO reports the path's end where the profile does not cross: an open side
        if ratios[0] >= level:
            lo = -np.inf
        if ratios[-1] >= level:
            hi = np.inf
        intervals[pproblem.x_names[i]] = [float(lo), float(hi)]
        points[pproblem.x_names[i]] = int(len(xs))
    return dict(profile_s=wall, fval=float(res.optimize_result[0].fval),
                intervals=intervals, points=points)


def compare(ours: dict, theirs: dict) -> None:
    print(f"\npyPESTO: profile {theirs['profile_s']:.1f} s, optimum {theirs['fval']:.5f}; "
          f"time ratio pyPESTO / gradsolve {theirs['profile_s'] / ours['profile_s']:.2f}")
    print(f"  {'parameter':<28} {'pyPESTO lower':>13} {'upper':>10}  "
          f"{'d lower / width':>15} {'d upper / width':>15}  points")
    for p, (lo, hi) in ours["intervals"].items():
        plo, phi = theirs["intervals"][p]
        width = hi - lo
        dl = (plo - lo) / width if np.isfinite(width) and np.isfinite(lo - plo) else np.nan
        du = (phi - hi) / width if np.isfinite(width) and np.isfinite(hi - phi) else np.nan
        print(f"  {p:<28} {plo:>13.4f} {phi:>10.4f}  {dl:>15.2e} {du:>15.2e}  "
              f"{theirs['points'][p]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="Boehm_JProteomeRes2014")
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--check-restart", action="store_true",
                    help="where the profile restarted, refit from its point and profile again")
    ap.add_argument("--from-local", action="store_true",
                    help="also profile from the best start > 1 above the best and compare")
    ap.add_argument("--pypesto-python", default=None,
                    help="an interpreter with pypesto and amici (default: this one, if any)")
    ap.add_argument("--pypesto-only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    a = ap.parse_args()
    if a.pypesto_only:  # the pyPESTO side in another interpreter: JSON in, JSON out
        job = json.loads(Path(a.pypesto_only).read_text())
        print(json.dumps(pypesto_side(job["yaml"], job["x_opt"], job["confidence"])))
        return

    ours = gradsolve_side(a.problem, a.starts, a.seed, a.confidence, a.check_restart,
                          a.from_local)
    theirs = None
    if a.pypesto_python is None:
        missing = [m for m in ("pypesto", "amici") if importlib.util.find_spec(m) is None]
        if missing:
            print(f"\npyPESTO side skipped: {missing} not installed (pass --pypesto-python)")
        else:
            theirs = pypesto_side(ours["yaml"], ours["estimate"], a.confidence)
    else:
        job = Path("/tmp") / f"bench_petab_profile_{time.time_ns()}.json"
        job.write_text(json.dumps(dict(yaml=ours["yaml"], x_opt=ours["estimate"],
                                       confidence=a.confidence)))
        out = subprocess.run([a.pypesto_python, __file__, "--pypesto-only", str(job)],
                             capture_output=True, text=True, check=True)
        theirs = json.loads(out.stdout.strip().splitlines()[-1])
    if theirs is not None:
        compare(ours, theirs)
    if a.out:
        Path(a.out).write_text(json.dumps(dict(gradsolve=ours, pypesto=theirs), indent=1))


if __name__ == "__main__":
    sys.exit(main())
