"""First use: how long until the first gradient, from a cold and from a warm kernel cache.

What a user meets on a fresh machine (or in a fresh cluster job): ``import gradsolve``,
``jax.jit(jax.grad(loss))`` of a ``gs.solve`` with save times, first call. Each cell runs
in a fresh Python process (nothing compiled in memory, JAX's persistent cache off) with
``GRADSOLVE_KERNEL_CACHE`` pointing at a temporary folder:

- ``cold``: the folder is empty, so the compiled kernel is built on first use;
- ``warm``: the same folder after the cold run of the kernel route filled it;
- ``-``: the XLA route, which does not use the kernel cache.

Routes: ``kernel`` (``driver=gs.drivers.Kernel()``: builds the kernel before the first
result), ``xla`` (``driver=gs.drivers.Batched()``: no kernel), ``diffrax`` (the same loss
through ``jax.vmap(diffrax.diffeqsolve)``, Tsit5, ``PIDController``, its default adjoint:
what the first gradient costs a Diffrax user) and ``auto`` (the default
driver: the kernel, built in the background where its estimated build time exceeds
``$GRADSOLVE_KERNEL_BACKGROUND_S``, the XLA drivers meanwhile). For ``auto`` from a cold
cache the script then waits for a background build (``gs.drivers.Auto.wait_for_kernels``)
and times a fresh ``jax.jit`` trace, which shows the switch to the kernel.

Problems (float64, Tsit5, rtol 1e-6, atol 1e-8):

- ``lv``: Lotka–Volterra, n = 100, 20 save times on [0, 10];
- ``l96``: Lorenz-96 with d = 16, n = 100, 20 save times on [0, 1];
- ``mlp``: a neural ODE, ``eqx.nn.MLP(4, 4, 16, 2, activation=tanh)`` (4-16-16-4), one
  network shared by n = 32 trajectories, 10 save times on [0, 1]. (A 4-32-32-4 network
  generates 5.5 MB of C++, over the 5 MB limit ``$GRADSOLVE_KERNEL_MAX_SOURCE_MB``: it
  always runs on the XLA route.)

Columns: ``import`` (``import gradsolve`` and JAX), ``first`` (the first call: trace, XLA
compile, kernel build where there is one, run), ``then`` (the same jitted function
afterwards: best of 5 calls), ``route`` (``Solution.route`` in the traced call). Absolute times on a shared
machine are noisy; the cold/warm and route-to-route ratios are what to read.

Usage::

    python benchmarks/bench_first_use.py                    # all problems, ~4 minutes
    python benchmarks/bench_first_use.py --problems lv,l96 --routes kernel,xla
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

PROBLEMS = ("lv", "l96", "mlp")
ROUTES = ("kernel", "xla", "auto", "diffrax")


def _child(problem: str, route: str, wait: bool) -> dict:
    t = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np

    import gradsolve as gs

    t_import = time.perf_counter() - t
    rng = np.random.default_rng(0)
    if problem == "lv":
        n = 100

        def f(t, y, p):
            return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])

        y0 = jnp.ones((n, 2))
        p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((n, 4)) - 0.5)))
        t1, ts = 10.0, jnp.linspace(0.0, 10.0, 20)
        to_params = lambda q: q
    elif problem == "l96":
        n, d = 100, 16

        def f(t, y, p):
            return (jnp.roll(y, -1) - jnp.roll(y, 2)) * jnp.roll(y, 1) - y + p[0]

        y0 = jnp.asarray(8.0 + rng.normal(size=(n, d)))
        p = jnp.asarray(8.0 * (1 + 0.2 * (rng.random((n, 1)) - 0.5)))
        t1, ts = 1.0, jnp.linspace(0.0, 1.0, 20)
        to_params = lambda q: q
    elif problem == "mlp":
        n = 32
        mlp = eqx.nn.MLP(4, 4, 16, 2, activation=jnp.tanh, key=jax.random.PRNGKey(0))
        arrays, static = eqx.partition(mlp, eqx.is_array_like)

        def f(t, y, q):
            return eqx.combine(q, static)(y)

        y0 = jnp.asarray(rng.normal(size=(n, 4)))
        p = arrays
        t1, ts = 1.0, jnp.linspace(0.0, 1.0, 10)
        # one network for every trajectory: each params leaf gets the ensemble axis
        to_params = lambda q: jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), q)
    else:
        raise ValueError(problem)
    routes: list[str] = []
    if route == "diffrax":
        import diffrax

        term = diffrax.ODETerm(f)

        def one(y0_i, p_i):
            return diffrax.diffeqsolve(
                term, diffrax.Tsit5(), 0.0, t1, None, y0_i, args=p_i,
                saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
                max_steps=4096).ys

        def loss(q):
            routes.append("vmap(diffeqsolve)")
            return jnp.sum(jax.vmap(one)(y0, to_params(q)) ** 2)
    else:
        driver = {"kernel": gs.drivers.Kernel(), "xla": gs.drivers.Batched(),
                  "auto": None}[route]

        def loss(q):
            sol = gs.solve(f, 0.0, t1, y0, to_params(q), ts=ts, rtol=1e-6, atol=1e-8,
                           driver=driver)
            routes.append(sol.route)  # at trace time: the driver this trace runs
            return jnp.sum(sol.ys ** 2)

    def timed(fn):
        t = time.perf_counter()
        jax.block_until_ready(fn(p))
        return time.perf_counter() - t

    grad = jax.jit(jax.grad(loss))
    first = timed(grad)
    out = dict(import_s=t_import, first_s=first, then_s=min(timed(grad) for _ in range(5)),
               route=routes[-1])
    if wait:
        t = time.perf_counter()
        gs.drivers.Auto.wait_for_kernels()
        out["wait_s"] = time.perf_counter() - t
        retraced = jax.jit(jax.grad(loss))
        out["retraced_first_s"] = timed(retraced)
        out["retraced_route"] = routes[-1]
    return out


def _run_child(problem: str, route: str, cache: str, wait: bool = False) -> dict:
    env = dict(os.environ, GRADSOLVE_KERNEL_CACHE=cache, PYTHONUNBUFFERED="1")
    for var in ("JAX_COMPILATION_CACHE_DIR", "GRADSOLVE_KERNEL"):
        env.pop(var, None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", problem, route]
    if wait:
        cmd.append("--wait")
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{problem}/{route} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t
    out["built_log"] = "was built in" in proc.stderr or "background" in proc.stderr
    return out


def _fmt(row: dict) -> str:
    extra = ""
    if "retraced_route" in row:
        extra = (f"  (after {row['wait_s']:.1f} s wait: re-traced {row['retraced_first_s']:.2f} s "
                 f"on {row['retraced_route']})")
    return (f"| {row['problem']:<4} | {row['route_arg']:<6} | {row['cache']:<4} | "
            f"{row['import_s']:6.1f} | {row['first_s']:7.2f} | {1e3 * row['then_s']:8.1f} | "
            f"{row['route']:<17} |{extra}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--routes", default=",".join(ROUTES))
    ap.add_argument("--repeats", type=int, default=1,
                    help="fresh processes per cell, the fastest first call reported "
                         "(default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--child", nargs=2, metavar=("PROBLEM", "ROUTE"), help=argparse.SUPPRESS)
    ap.add_argument("--wait", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child, args.wait)))
        return 0
    problems = [p for p in args.problems.split(",") if p]
    routes = [r for r in args.routes.split(",") if r]
    for name, allowed in (("--problems", PROBLEMS), ("--routes", ROUTES)):
        bad = [x for x in (problems if name == "--problems" else routes) if x not in allowed]
        if bad:
            ap.error(f"{name}: unknown {bad}; choose from {','.join(allowed)}")
    print(f"# first use: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print("| problem | route | cache | import s | first s | then ms | route traced |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for problem in problems:
        filled = tempfile.mkdtemp(prefix="gs-first-use-")  # filled by the cold kernel run
        try:
            # the XLA route does not use the kernel cache: one row
            plan = [(r, s) for r in routes
                    for s in (("-",) if r in ("xla", "diffrax") else ("cold", "warm"))]
            for route, state in plan:
                best = None
                for _ in range(args.repeats):
                    if state == "warm":
                        if not any(p.suffix == ".so" for p in Path(filled).iterdir()):
                            _run_child(problem, "kernel", filled)  # nothing filled it yet
                        cache = filled
                    elif route == "kernel":  # an empty cache each run, filled by it
                        shutil.rmtree(filled, ignore_errors=True)
                        os.makedirs(filled, mode=0o700)
                        cache = filled
                    else:
                        cache = tempfile.mkdtemp(prefix="gs-cold-")
                    row = _run_child(problem, route, cache,
                                     wait=(route == "auto" and state == "cold"))
                    if cache != filled:
                        shutil.rmtree(cache, ignore_errors=True)
                    if best is None or row["first_s"] < best["first_s"]:
                        best = row
                best.update(problem=problem, route_arg=route, cache=state)
                rows.append(best)
                print(_fmt(best), flush=True)
        finally:
            shutil.rmtree(filled, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
