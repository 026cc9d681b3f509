"""FOCE-I population fits: `inference.fit_population` on theophylline and on the simulated
200-subject two-compartment study, everything counted (a new process: compiles included),
and whether the estimates recover the simulated values (within 2 standard errors).

    python benchmarks/bench_foce.py                 # theophylline, then 200 subjects
    python benchmarks/bench_foce.py --subjects 50   # a smaller study
    python benchmarks/bench_foce.py --subjects 5 --skip-theophylline --driver diffrax
                                                    # the same fit, every solve through
                                                    # diffrax.diffeqsolve (vmapped)
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


DRIVERS = {"auto": None, "diffrax": "Diffrax", "lanes": "Lanes", "kernel": "Kernel"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subjects", type=int, default=200)
    ap.add_argument("--skip-theophylline", action="store_true")
    ap.add_argument("--driver", choices=sorted(DRIVERS), default="auto",
                    help="how every solve of the fit runs (gs.drivers.*; default Auto)")
    args = ap.parse_args()
    import gradsolve as gs
    name = DRIVERS[args.driver]
    driver = None if name is None else getattr(gs.drivers, name)()
    if not args.skip_theophylline:
        fit = inference.fit_population(models.theophylline(), models.load_dataset("theophylline"))
        report("theophylline (12 subjects)", fit)
    data, _ = models.simulated_study(n_subjects=args.subjects, seed=0)
    t0 = time.perf_counter()
    fit = inference.fit_population(models.two_compartment_oral(), data, driver=driver)
    report(f"simulated study ({args.subjects} subjects, two compartments, six doses each, "
           f"driver {args.driver}; "
           f"{time.perf_counter() - t0:.1f} s)", fit, models.TWO_COMPARTMENT_TRUTH)


if __name__ == "__main__":
    main()
