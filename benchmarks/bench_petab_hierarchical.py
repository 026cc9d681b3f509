"""Hierarchical optimisation of PEtab problems (issue 55): the multistart with the
observable scalings, offsets and noise parameters in closed form against without.

For each problem: ``inference.fit(problem, n_starts=..., seed=...)`` of the problem loaded
with ``hierarchical=True`` (the default) and ``hierarchical=False``, the same seed, in this
process (compilation included, unless ``--warm``: each configuration is fitted once first,
the second run timed). Prints per configuration the estimated parameters (outer + inner),
the wall time, the best objective, the starts that converged (final objective within 0.1
of the best either configuration found) and those per minute of wall time.

    python benchmarks/bench_petab_hierarchical.py --starts 20 --seed 0
    python benchmarks/bench_petab_hierarchical.py Boehm_JProteomeRes2014 --starts 4 \\
        --out /tmp/hier.jsonl

Problems (default: Boehm_JProteomeRes2014, and Zheng_PNAS2012 where the collection is
here) are looked up in ``../shared/petab-benchmark-collection``, then ``tests/data/petab``,
then among those that ship with `models`. Boehm's inner parameters are its three noise
parameters ``sd_*`` (it has no scalings or offsets); Zheng's its one shared ``sigma``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = (ROOT.parent / "shared" / "petab-benchmark-collection",
          ROOT / "tests" / "data" / "petab")
DEFAULT = ("Boehm_JProteomeRes2014", "Zheng_PNAS2012")
CONVERGED_TOL = 0.1


def load(name: str, hierarchical: bool):
    import models

    for place in PLACES:
        if (place / name).is_dir():
            return models.load_petab(place / name, hierarchical=hierarchical)
    return models.load_petab(name, hierarchical=hierarchical)


def available(name: str) -> bool:
    shipped = ROOT / "models" / "data" / "petab" / name
    return any((p / name).is_dir() for p in PLACES) or shipped.is_dir()


def fit(problem, args) -> dict:
    """One multistart: its wall time (s), final objectives, parameters counts."""
    import inference

    t0 = time.perf_counter()
    res = inference.fit(problem, n_starts=args.starts, seed=args.seed, steps=args.steps,
                        progress=args.progress)
    return dict(wall=time.perf_counter() - t0, losses=[float(v) for v in res.losses],
                exit_reasons=[str(r) for r in res.exit_reasons],
                n_outer=len(problem.parameter_ids),
                n_inner=len(problem.inner_parameter_ids))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", default=None)
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1000, help="LM iterations per start")
    ap.add_argument("--warm", action="store_true",
                    help="fit each configuration once first; time the second fit")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="append one JSON line per row")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    names = args.problems or [n for n in DEFAULT if available(n)]
    print(f"{'problem':<26} {'hier':>5} {'params':>8} {'wall s':>8} {'best':>12} "
          f"{'conv':>6} {'conv/min':>9}", flush=True)
    for name in names:
        runs = {}
        for hierarchical in (True, False):
            problem = load(name, hierarchical)
            if args.warm:
                fit(problem, args)
            runs[hierarchical] = fit(problem, args)
        best = min(min(r["losses"]) for r in runs.values())
        for hierarchical, r in runs.items():
            losses = np.asarray(r["losses"])
            conv = int(np.sum(losses <= best + CONVERGED_TOL))
            row = dict(problem=name, hierarchical=hierarchical, n_starts=args.starts,
                       seed=args.seed, warm=args.warm, n_outer=r["n_outer"],
                       n_inner=r["n_inner"], wall_s=r["wall"], best=float(losses.min()),
                       best_either=best, converged=conv,
                       converged_per_min=conv / (r["wall"] / 60.0),
                       exit_reasons=r["exit_reasons"], losses=r["losses"])
            params = f"{r['n_outer']}+{r['n_inner']}"
            print(f"{name:<26} {str(hierarchical):>5} {params:>8} {r['wall']:8.1f} "
                  f"{row['best']:12.5f} {conv:>3}/{args.starts:<2} "
                  f"{row['converged_per_min']:9.2f}", flush=True)
            if args.out is not None:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
