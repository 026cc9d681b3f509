"""gradsolve replay gradient vs Diffrax's default adjoint, measured side by side.

For each problem and ensemble size: the gradient of sum(ys**2) w.r.t. params through

- ``gs.replay`` on a mesh recorded once (the fitting/sampling use: mesh reused),
- ``gs.solve`` (record + replay every call),
- ``jax.vmap(diffrax.diffeqsolve)`` with ``RecursiveCheckpointAdjoint`` (default, and with
  ``checkpoints`` set to the step count),

plus forward times (gs forward replay, gs record under ``jit`` with ``max_steps`` slots and
as called outside ``jit``, Diffrax forward). On CPU gradsolve runs its
compiled kernel (the default); the table also times the replay gradient on one kernel
thread (``GRADSOLVE_KERNEL_THREADS=1``) and through the XLA replay
(``gs.use_compiled_kernel(False)``), and reports the peak temporary memory XLA reserves for
each gradient. Where the kernel does not apply (GPU, stiff solvers) those two columns are
left out (``-``): the replay gradient already is the XLA driver there. Times are the best of
``--repeats`` calls after compilation, interleaved so machine load hits both sides alike.
The JSON file is rewritten after every row, so a run cut short keeps what it measured.
Run: ``python benchmarks/bench_core.py [--quick] [--json PATH]`` or ``gradsolve bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402

import gradsolve as gs  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from problems import PROBLEM_NAMES, make  # noqa: E402

RTOL, ATOL = 1e-6, 1e-8


def _best(fns: dict, repeats: int) -> dict:
    """Best wall time of each zero-arg callable, calls interleaved round-robin."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def bench_one(name: str, n: int, repeats: int) -> dict:
    f, t1, y0, p, ts, stiff = make(name, n)
    gsolver = gs.Rodas5P() if stiff else gs.Tsit5()
    dsolver = diffrax.Kvaerno5() if stiff else diffrax.Tsit5()
    term = diffrax.ODETerm(lambda t, y, a: f(t, y, a))
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, solver=gsolver, rtol=RTOL, atol=ATOL)
    max_steps = max(int(np.max(mesh.n_steps)) * 4 + 64, 16384 if stiff else 4096)

    def dfx_ys(p_, checkpoints=None):
        def one(a, b):
            return diffrax.diffeqsolve(
                term, dsolver, 0.0, t1, None, a, args=b, saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
                max_steps=max_steps, adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints),
            ).ys
        return jax.vmap(one)(y0, p_)

    gs_loss = lambda p_: jnp.sum(gs.replay(f, mesh, y0, p_).ys ** 2)
    solve_loss = lambda p_: jnp.sum(gs.solve(f, 0.0, t1, y0, p_, ts=ts, solver=gsolver, rtol=RTOL, atol=ATOL, max_steps=max_steps).ys ** 2)
    dfx_loss = lambda p_: jnp.sum(dfx_ys(p_) ** 2)
    ck = int(np.max(mesh.n_steps) + np.max(mesh.n_rejected)) + 1
    dfx_loss_ck = lambda p_: jnp.sum(dfx_ys(p_, ck) ** 2)
    fns = {
        "gs_grad": jax.jit(jax.grad(gs_loss)),
        # the SPEC's signature with the save times given (not differentiated), as a fit passes them
        "gs_grad_ts": jax.jit(jax.grad(lambda p_: jnp.sum(gs.replay(f, mesh, y0, p_, ts=ts).ys ** 2))),
        "gs_solve_grad": jax.jit(jax.grad(solve_loss)),
        "dfx_grad": jax.jit(jax.grad(dfx_loss)),
        "dfx_grad_ckpt": jax.jit(jax.grad(dfx_loss_ck)),
        "gs_forward": jax.jit(lambda p_: gs.replay(f, mesh, y0, p_).ys),
        "gs_record": jax.jit(lambda p_: gs.record(f, 0.0, t1, y0, p_, ts=ts, solver=gsolver, rtol=RTOL, atol=ATOL, max_steps=max_steps).times),
        "dfx_forward": jax.jit(dfx_ys),
    }
    kernel = gs.replay(f, mesh, y0, p).route == "gradsolve-kernel"
    if kernel:
        with gs.use_compiled_kernel(False):  # traced now, so this one runs the XLA replay
            fns["gs_grad_xla"] = jax.jit(jax.grad(lambda p_: jnp.sum(gs.replay(f, mesh, y0, p_).ys ** 2)))
            jax.block_until_ready(fns["gs_grad_xla"](p))
    grads = {k: fns[k](p) for k in ("gs_grad", "dfx_grad", "gs_grad_xla") if k in fns}
    for fn in fns.values():
        jax.block_until_ready(fn(p))
    calls = {k: (lambda fn=fn: fn(p)) for k, fn in fns.items()}

    def one_thread():
        os.environ["GRADSOLVE_KERNEL_THREADS"] = "1"  # read by the kernel at each call
        try:
            return jax.block_until_ready(fns["gs_grad"](p))
        finally:
            del os.environ["GRADSOLVE_KERNEL_THREADS"]

    if kernel:
        calls["gs_grad_1thread"] = one_thread
    # gs.record as users call it: outside jit, where its buffer grows only as needed.
    calls["gs_record_eager"] = lambda: gs.record(f, 0.0, t1, y0, p, ts=ts, solver=gsolver, rtol=RTOL, atol=ATOL, max_steps=max_steps).times
    calls["gs_record_eager"]()
    t = _best(calls, repeats)
    mem = {}
    for k in ("gs_grad", "gs_grad_xla", "dfx_grad"):
        if k not in fns:
            continue
        try:
            ma = fns[k].lower(p).compile().memory_analysis()
            mem[k] = (ma.temp_size_in_bytes + ma.output_size_in_bytes) / 2**20
        except Exception:  # noqa: BLE001 - not every backend reports it
            mem[k] = float("nan")
    g1, g2 = (np.asarray(grads[k]) for k in ("gs_grad", "dfx_grad"))
    agree = float(np.max(np.abs(g1 - g2)) / np.max(np.abs(g2)))
    agree_xla = None
    if kernel:
        g3 = np.asarray(grads["gs_grad_xla"])
        agree_xla = float(np.max(np.abs(g1 - g3)) / np.max(np.abs(g3)))
    ms = {k: 1e3 * v for k, v in t.items()}
    ratio = lambda k: ms["dfx_grad"] / ms[k] if k in ms else None
    return {
        "problem": name, "n": n, "mean_steps": float(np.mean(mesh.n_steps)),
        "backend": jax.default_backend(), "route": "gradsolve-kernel" if kernel else "gradsolve-replay",
        **{f"{k}_ms": v for k, v in ms.items()},
        "ratio_grad": ms["dfx_grad"] / ms["gs_grad"],
        "ratio_grad_1thread": ratio("gs_grad_1thread"),
        "ratio_grad_xla": ratio("gs_grad_xla"),
        "mem_mb": mem,
        "ratio_grad_ts": ms["dfx_grad"] / ms["gs_grad_ts"],
        "ratio_grad_ckpt": ms["dfx_grad_ckpt"] / ms["gs_grad"],
        "ratio_solve_grad": ms["dfx_grad"] / ms["gs_solve_grad"],
        "cheap_gradient": ms["gs_grad"] / ms["gs_forward"],
        "ratio_record": ms["dfx_forward"] / ms["gs_record"],
        "ratio_record_eager": ms["dfx_forward"] / ms["gs_record_eager"],
        "grad_rel_diff": agree,
        "kernel_vs_xla_rel_diff": agree_xla,
    }


COLUMNS = """columns:
  steps       mean accepted steps per trajectory
  gs grad ms  gradsolve replay gradient on a reused mesh (default driver), best of --repeats
  diffrax ms  jax.grad through jax.vmap(diffrax.diffeqsolve), RecursiveCheckpointAdjoint
  ratio       diffrax ms / gs grad ms
  ts          the same ratio for the replay given ts=ts (save times not differentiated)
  1-thr       the same ratio with the kernel on one thread (GRADSOLVE_KERNEL_THREADS=1)
  xla         the same ratio with the compiled kernel off (an XLA driver)
  ckpt        the ratio against Diffrax with checkpoints= set to the step count
  solve       the ratio for gs.solve (record + replay every call) under jit
  grad/fwd    gradsolve gradient time / its forward replay time
  record      Diffrax forward / gradsolve record under jit
  eager       Diffrax forward / gradsolve record called outside jit
  mem MB      peak temporary memory XLA reserves for each gradient, gradsolve/Diffrax
  grad diff   max relative difference of the two gradients (each on its own mesh)"""


def main(argv=None, json_default: str | None = None) -> list[dict]:
    json_default = json_default or os.path.join(os.path.dirname(__file__), "results", "core.json")
    ap = argparse.ArgumentParser(prog="gradsolve bench", description=__doc__.splitlines()[0],
                                 epilog=COLUMNS, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="LV and Lorenz at n = 1, 100 only")
    ap.add_argument("--problems", default="lotka_volterra,lorenz,van_der_pol,robertson",
                    help="comma-separated problems (default: %(default)s)")
    ap.add_argument("--sizes", default="1,100,1000,10000",
                    help="comma-separated ensemble sizes (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed repeats per measurement; the best is reported (default: %(default)s)")
    ap.add_argument("--json", default=json_default,
                    help="where to write the JSON results (default: %(default)s)")
    args = ap.parse_args(argv)
    problems = [s.strip() for s in args.problems.split(",") if s.strip()]
    unknown = sorted(set(problems) - set(PROBLEM_NAMES))
    if unknown or not problems:
        ap.error(f"--problems: unknown {', '.join(unknown) or '(none given)'}; choose from "
                 f"{','.join(PROBLEM_NAMES)}")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: comma-separated positive integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        ap.error(f"--sizes: comma-separated positive integers, got {args.sizes!r}")
    if args.repeats < 1:
        ap.error(f"--repeats: a positive integer, got {args.repeats}")
    if args.quick:
        problems, sizes, args.repeats = ["lotka_volterra", "lorenz"], [1, 100], 5
    rows = []
    head = (f"{'problem':<15}{'n':>7}{'steps':>6}{'gs grad ms':>11}{'diffrax ms':>11}{'ratio':>7}{'ts':>6}"
            f"{'1-thr':>7}{'xla':>6}{'ckpt':>6}{'solve':>7}{'grad/fwd':>9}{'record':>8}{'eager':>7}"
            f"{'mem MB gs/dfx':>15}{'grad diff':>10}")
    print(head)
    meta = {"machine": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "jax": jax.__version__, "diffrax": diffrax.__version__, "devices": [str(d) for d in jax.devices()],
            "rtol": RTOL, "atol": ATOL}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    opt = lambda v, w: f"{v:>{w}.1f}" if v is not None else f"{'-':>{w}}"
    for name in problems:
        for n in sizes:
            if name == "robertson" and n > 1000:
                continue  # Kvaerno5 vmapped at 10,000 takes minutes on 2 cores
            r = bench_one(name, n, args.repeats)
            rows.append(r)
            m = r["mem_mb"]
            print(f"{name:<15}{n:>7}{r['mean_steps']:>6.0f}{r['gs_grad_ms']:>11.2f}{r['dfx_grad_ms']:>11.2f}"
                  f"{r['ratio_grad']:>7.1f}{r['ratio_grad_ts']:>6.1f}{opt(r['ratio_grad_1thread'], 7)}{opt(r['ratio_grad_xla'], 6)}"
                  f"{r['ratio_grad_ckpt']:>6.1f}{r['ratio_solve_grad']:>7.1f}{r['cheap_gradient']:>9.2f}"
                  f"{r['ratio_record']:>8.2f}{r['ratio_record_eager']:>7.2f}"
                  f"{m['gs_grad']:>8.1f}/{m['dfx_grad']:<6.1f}"
                  f"{r['grad_rel_diff']:>10.1e}", flush=True)
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print(COLUMNS)
    print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
