"""FOCE-I population fits: `inference.fit_population` on theophylline and on the simulated
200-subject two-compartment study, everything counted (a new process: compiles included),
and whether the estimates recover the simulated values (within 2 standard errors).

    python benchmarks/bench_foce.py                 # theophylline, then 200 subjects
    python benchmarks/bench_foce.py --subjects 50   # a smaller study
    python benchmarks/bench_foce.py --subjects 5 --skip-theophylline --driver diffrax --solver tsit5
                                                    # the same fit, every solve through
                                                    # diffrax.diffeqsolve (vmapped)
    python benchmarks/bench_foce.py --seeds 0 1 2 3 # recovery across simulated studies
    python benchmarks/bench_foce.py --profile --seeds 0 7
                                                    # Wald and likelihood-profile 95%
                                                    # intervals beside the truth
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

import inference  # noqa: E402
import models  # noqa: E402


def report(name, fit, truth=None):
    print(f"\n{name}: {fit.wall_time:.1f} s everything counted, OFV {fit.ofv:.3f} (NONMEM's "
          f"convention {fit.ofv_nonmem:.3f}), converged {fit.converged} in "
          f"{fit.n_iterations} iterations, condition number {fit.condition_number:.1f}")
    for k, v in fit.params.items():
        v, se = np.atleast_1d(v), np.atleast_1d(fit.se[k])
        line = f"  {k:<11} " + "  ".join(f"{a:9.4f} ({b:.4f})" for a, b in zip(v, se))
        if truth is not None and k in truth:
            t = np.atleast_1d(np.asarray(truth[k]))
            z = np.abs(v - t) / se
            line += "   truth " + "  ".join(f"{a:.4f}" for a in t) + \
                f"   |z| max {z.max():.2f}"
        print(line)
    print(f"  eta shrinkage {np.round(fit.shrinkage, 3)}; CWRES mean {np.nanmean(fit.cwres):.3f},"
          f" sd {np.nanstd(fit.cwres):.3f}")


def recovery(seeds, subjects, driver) -> None:
    """Fit the simulated study for each seed and print, per seed, the wall time, whether the
    optimiser converged, its largest gradient component, the OFV and every population
    parameter's ``|z| = |estimate - truth| / SE``; then the share of (seed, parameter) pairs
    within 2 SE (about 95% where the standard errors are right and the estimates near normal)
    and the per-seed largest ``|z|``."""
    truth = models.TWO_COMPARTMENT_TRUTH
    names = [f"{k}[{i}]" if np.ndim(truth[k]) else k
             for k in truth for i in range(np.size(truth[k]))]
    print(f"recovery, {subjects} subjects, seeds {list(seeds)}: |z| = |estimate - truth| / SE")
    print(f"{'seed':>4} {'wall s':>7} {'conv':>5} {'max|g|':>8} {'OFV':>10} "
          + " ".join(f"{n:>9}" for n in names) + f" {'max|z|':>7}")
    zs = []
    for seed in seeds:
        data, _ = models.simulated_study(n_subjects=subjects, seed=seed)
        fit = inference.fit_population(models.two_compartment_oral(), data, driver=driver)
        z = np.concatenate([np.abs(np.atleast_1d(fit.params[k]) - np.atleast_1d(truth[k]))
                            / np.atleast_1d(fit.se[k]) for k in truth])
        zs.append(z)
        print(f"{seed:>4} {fit.wall_time:7.1f} {str(bool(fit.converged)):>5} "
              f"{fit.max_gradient:8.1e} {fit.ofv:10.3f} " + " ".join(f"{a:9.2f}" for a in z)
              + f" {z.max():7.2f}", flush=True)
        if not fit.converged:
            print(f"     ({fit.message})", flush=True)
    zs = np.array(zs)
    print(f"within 2 SE: {int((zs <= 2).sum())} of {zs.size} ({100 * (zs <= 2).mean():.0f}%); "
          f"per-seed max |z| {np.round(zs.max(axis=1), 2).tolist()}")


def rise_at(model, data, fit, site, value, driver):
    """``OFV - fit.ofv`` of `inference.fit_population` with the scalar ``site`` held at
    ``value`` (conditioned in the model's program, given to its individual parameters):
    the profile's rise there by a whole separate fit, the likelihood-ratio statistic."""
    from numpyro import handlers
    fixed = model.replace(
        latent=handlers.condition(model.latent_fn, data={site: value}),
        individual=lambda theta, d: model.individual_fn(dict(theta, **{site: value}), d))
    init = {k: v for k, v in fit.params.items() if k != site}
    return inference.fit_population(fixed, data, init=init, driver=driver).ofv - fit.ofv


def profile(seeds, subjects, driver, at_truth=False) -> None:
    """Fit the simulated study for each seed, then `inference.profile_intervals` of every
    population parameter; print the Wald (estimate +- 1.96 SE) and the profile 95%
    intervals beside the truth, whether each covers it, and the wall times; with
    ``at_truth``, for each scalar parameter the profile leaves out, its rise at the truth
    (`rise_at`)."""
    truth = models.TWO_COMPARTMENT_TRUTH
    model = models.two_compartment_oral()
    for seed in seeds:
        data, _ = models.simulated_study(n_subjects=subjects, seed=seed)
        fit = inference.fit_population(model, data, driver=driver)
        ci = inference.profile_intervals(fit, model, data, driver=driver)
        print(f"\nseed {seed}, {subjects} subjects: fit {fit.wall_time:.1f} s (OFV "
              f"{fit.ofv:.3f}, converged {fit.converged}), profiles {ci.wall_time:.1f} s "
              f"({ci.n_evaluations} objective evaluations)")
        print(f"  {'param':<12}{'truth':>8}{'estimate':>10}  {'Wald 95%':<20}{'in':>4}  "
              f"{'profile 95%':<20}{'in':>4}  {'prof/Wald width':>15}")
        n_wald = n_prof = n = 0
        for k in truth:
            t, est = np.atleast_1d(truth[k]), np.atleast_1d(fit.params[k])
            se = np.atleast_1d(fit.se[k])
            lo, hi = np.atleast_1d(ci.lower[k]), np.atleast_1d(ci.upper[k])
            for i in range(t.size):
                label = f"{k}[{i}]" if t.size > 1 else k
                wl, wh = est[i] - 1.96 * se[i], est[i] + 1.96 * se[i]
                in_w = wl <= t[i] <= wh
                # a bound not found: the profile stays inside up to a boundary or step limit
                pl = lo[i] if np.isfinite(lo[i]) else -np.inf
                ph = hi[i] if np.isfinite(hi[i]) else np.inf
                in_p = pl <= t[i] <= ph
                n, n_wald, n_prof = n + 1, n_wald + in_w, n_prof + in_p
                ratio = (ph - pl) / (wh - wl)
                print(f"  {label:<12}{t[i]:8.4f}{est[i]:10.4f}  [{wl:7.4f}, {wh:7.4f}]  "
                      f"{'yes' if in_w else 'NO':>4}  [{pl:7.4f}, {ph:7.4f}]  "
                      f"{'yes' if in_p else 'NO':>4}  {ratio:15.2f}", flush=True)
        print(f"  covered: Wald {n_wald} of {n}, profile {n_prof} of {n}")
        for k in truth if at_truth else ():
            lo, hi = np.nan_to_num(ci.lower[k], nan=-np.inf), np.nan_to_num(ci.upper[k], nan=np.inf)
            if np.ndim(truth[k]) == 0 and not lo <= truth[k] <= hi:
                t1 = time.perf_counter()
                r = rise_at(model, data, fit, k, truth[k], driver)
                print(f"  {k} held at the truth {truth[k]:.4f}: OFV rise {r:.3f} (chi2 95% "
                      f"3.841; a separate fit, {time.perf_counter() - t1:.1f} s)", flush=True)
        for note in ci.notes:
            print(f"  note: {note}")


DRIVERS = {"auto": None, "diffrax": "Diffrax", "lanes": "Lanes", "kernel": "Kernel"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subjects", type=int, default=200)
    ap.add_argument("--skip-theophylline", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="fit the simulated study for each seed and report recovery (|z|)")
    ap.add_argument("--profile", action="store_true",
                    help="Wald and likelihood-profile intervals beside the truth, for each "
                         "of --seeds (default 0)")
    ap.add_argument("--rise-at-truth", action="store_true",
                    help="with --profile: each scalar parameter the profile interval leaves "
                         "out fitted again held at the truth (its OFV rise)")
    ap.add_argument("--driver", choices=sorted(DRIVERS), default="auto",
                    help="how every solve of the fit runs (gs.drivers.*; default Auto)")
    ap.add_argument("--solver", choices=("default", "tsit5"), default="default",
                    help="the fit's solver (default: the route's; Diffrax has no Vern7 twin)")
    args = ap.parse_args()
    import gradsolve as gs
    name = DRIVERS[args.driver]
    driver = None if name is None else getattr(gs.drivers, name)()
    if args.profile:
        profile(args.seeds or [0], args.subjects, driver, args.rise_at_truth)
        return
    if args.seeds:
        recovery(args.seeds, args.subjects, driver)
        return
    if not args.skip_theophylline:
        fit = inference.fit_population(models.theophylline(), models.load_dataset("theophylline"))
        report("theophylline (12 subjects)", fit)
    data, _ = models.simulated_study(n_subjects=args.subjects, seed=0)
    t0 = time.perf_counter()
    solver = gs.Tsit5() if args.solver == "tsit5" else None
    fit = inference.fit_population(models.two_compartment_oral(), data, driver=driver,
                                   solver=solver)
    report(f"simulated study ({args.subjects} subjects, two compartments, six doses each, "
           f"driver {args.driver}; "
           f"{time.perf_counter() - t0:.1f} s)", fit, models.TWO_COMPARTMENT_TRUTH)


if __name__ == "__main__":
    main()
