"""First call of a PEtab problem: where its time goes, from empty caches, phase by phase.

What a systems biologist meets on a fresh machine: ``models.load_petab(yaml,
hierarchical=False)`` at its defaults, then the first call of
``jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))`` at the nominal
parameters (the protocol of ``bench_vs_amici.py``'s "first call"). Each problem runs in a
fresh Python process with its own empty folders for the compiled kernels
(``GRADSOLVE_KERNEL_CACHE``) and for XLA's persistent cache (``GRADSOLVE_XLA_CACHE``; JAX's
``JAX_COMPILATION_CACHE_DIR`` removed), so nothing compiled before is reused.

Columns (seconds of wall time; ``cpu`` columns: the process's CPU time, all threads, which
reads the same on a busy shared machine where the wall time does not):

- ``import``: ``import jax, models``;
- ``read``: the YAML and tables, the `petab` linter, the SBML model to SymPy;
- ``build``: the `PetabProblem` (the field and the tables as arrays);
- ``probe``: ``solver="auto"``'s stiffness probe (part of ``load_petab``);
- ``trace``, ``lower``, ``compile``: ``jit(...).trace``, ``.lower()``, ``.compile()`` of
  the objective and gradient (XLA's compile of the record and of the replay and its
  adjoint, in one program);
- ``run``: its first run; ``first``: ``read`` to ``run``, what the user waits for;
- ``warm ms``: the objective and gradient afterwards, best of 5;
- ``Ginstr``: with ``--perf``, the process's user-space instructions (``perf stat -e
  instructions:u``, import and warm calls included), in billions: what to compare between
  two checkouts on a machine too busy for its clocks to mean much.

``--xla`` (the default) runs the XLA drivers (``GRADSOLVE_KERNEL=0``): the path of the
first calls, while a compiled kernel builds in the background. ``--default`` leaves the
driver choice to `gradsolve.drivers.Auto` (a kernel whose build is estimated short is built
before the first result). ``--root`` runs another checkout's ``gradsolve``/``models`` (a
``git archive`` of an older commit) for a before/after table.

Usage::

    .venv/bin/python benchmarks/bench_first_call.py                    # the six, ~10 min
    .venv/bin/python benchmarks/bench_first_call.py Boehm_JProteomeRes2014 --json /tmp/fc.json
    .venv/bin/python benchmarks/bench_first_call.py --root /tmp/base   # an older checkout
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBLEMS = ("Boehm_JProteomeRes2014", "Zheng_PNAS2012", "Laske_PLOSComputBiol2019",
            "Fujita_SciSignal2010", "Bachmann_MSB2011", "Isensee_JCB2018")
COLLECTION = "/work/shared/petab-benchmark-collection"


def _clock():
    return time.perf_counter(), time.process_time()


def _since(start):
    return time.perf_counter() - start[0], time.process_time() - start[1]


def _child(yaml: str) -> dict:
    out = {}
    start = _clock()
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import models
    from models._petab import _load
    from models._petab import _problem as petab_problem

    out["import"] = _since(start)
    out["source"] = str(Path(models.__file__).parent.parent)
    start = _clock()
    pp, odes = _load.read_problem(yaml)
    out["read"] = _since(start)
    probe = {}
    choose = petab_problem.PetabProblem._choose_solver

    def timed_choose(self):
        t = _clock()
        choose(self)
        probe["probe"] = _since(t)

    petab_problem.PetabProblem._choose_solver = timed_choose
    start = _clock()
    problem = petab_problem.PetabProblem(pp, odes, hierarchical=False, solver="auto")
    build = _since(start)
    out["probe"] = probe.get("probe", (0.0, 0.0))
    out["build"] = tuple(b - p for b, p in zip(build, out["probe"]))
    vg = jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))
    x = jnp.asarray(problem.nominal)
    start = _clock()
    traced = vg.trace(x)
    out["trace"] = _since(start)
    start = _clock()
    lowered = traced.lower()
    out["lower"] = _since(start)
    start = _clock()
    compiled = lowered.compile()
    out["compile"] = _since(start)
    start = _clock()
    v, g = compiled(x)
    jax.block_until_ready(g)
    out["run"] = _since(start)
    out["first"] = tuple(sum(out[k][i] for k in ("read", "build", "probe", "trace", "lower",
                                                 "compile", "run")) for i in range(2))
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(vg(x))
        warm.append(time.perf_counter() - t)
    out["warm_ms"] = 1e3 * min(warm)
    out.update(value=float(v), grad_norm=float(jnp.linalg.norm(g)), solver=str(problem.solver),
               states=len(problem.state_ids), conditions=len(problem.condition_ids))
    return out


def _run_child(yaml: str, root: str | None, xla: bool, perf: bool = False) -> dict:
    cold = tempfile.mkdtemp(prefix="gs-first-call-")
    env = dict(os.environ, GRADSOLVE_KERNEL_CACHE=f"{cold}/kernels",
               GRADSOLVE_XLA_CACHE=f"{cold}/xla", PYTHONUNBUFFERED="1")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("GRADSOLVE_KERNEL", None)
    if xla:
        env["GRADSOLVE_KERNEL"] = "0"
    src = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", yaml]
    counts = f"{cold}/perf.txt"
    if perf:
        cmd = ["perf", "stat", "-e", "instructions:u", "-x", ",", "-o", counts] + cmd
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{yaml} failed:\n{proc.stderr[-3000:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        if perf:
            with open(counts) as fh:
                row["instructions"] = next(float(line.split(",")[0]) for line in fh
                                           if "instructions" in line)
    finally:
        shutil.rmtree(cold, ignore_errors=True)
    return row


_PHASES = ("import", "read", "build", "probe", "trace", "lower", "compile", "run", "first")


def _fmt(name: str, row: dict) -> str:
    cells = " | ".join(f"{row[k][0]:.1f}" for k in _PHASES)
    return (f"| {name[:24]:<24} | {row['states']}/{row['conditions']} | {cells} | "
            f"{row['first'][1]:.1f} | {row['compile'][1]:.1f} | {row['warm_ms']:.1f} | "
            f"{row.get('instructions', float('nan')) / 1e9:.0f} | {row['solver']} | "
            f"{row['value']:.10g} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", default=list(PROBLEMS))
    ap.add_argument("--collection", default=COLLECTION)
    ap.add_argument("--root", default=None, help="the checkout whose gradsolve and models run")
    ap.add_argument("--default", action="store_true",
                    help="the default drivers (compiled kernels where Auto takes them)")
    ap.add_argument("--perf", action="store_true",
                    help="count each process's instructions with `perf stat`")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    print(f"# first call, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
          f"average {os.getloadavg()[0]:.1f} at start; "
          f"{'default drivers' if args.default else 'XLA drivers (GRADSOLVE_KERNEL=0)'}"
          f"{'; ' + args.root if args.root else ''}")
    print("| problem | states/conds | " + " | ".join(_PHASES) +
          " | first cpu | compile cpu | warm ms | Ginstr | solver | -log L |")
    print("| --- " * (len(_PHASES) + 8) + "|")
    rows = {}
    for name in args.problems:
        yaml = name if name.endswith((".yaml", ".yml")) else \
            str(Path(args.collection) / name / f"{name}.yaml")
        row = _run_child(yaml, args.root, xla=not args.default, perf=args.perf)
        rows[name] = row
        print(_fmt(name, row), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
