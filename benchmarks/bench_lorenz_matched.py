"""Lorenz at matched accuracy: gradsolve against Diffrax at equal error, not equal ``rtol``.

The protocol of the published fused-ensemble benchmark that gradsolve's GPU figures are to
be compared with: Lorenz with ``sigma = 10``, ``beta = 8/3`` and ``rho`` spread evenly over
``[0, 21]`` across the ensemble, ``y0 = (1, 0, 0)``, ``t in [0, 1]``, Tsit5 on both sides.
Two solvers at the same ``rtol`` need not be equally accurate (their controllers and error
norms differ), so each side is run over a ladder of tolerances and its error measured
against SciPy's DOP853 at ``rtol = 1e-11`` (``atol = 1e-13``) on an evenly spaced subset of
the ensemble (the error is the largest over the checked trajectories and save times of
``|y - y_ref|``, relative to that trajectory's largest ``|y_ref|``). Each gradsolve rung is
compared with Diffrax's time at the same error, read off Diffrax's work-precision line
(log time against log error, interpolated between the rungs that bracket it). Diffrax's gradient is timed at the faster of its two checkpoint settings
(``RecursiveCheckpointAdjoint()`` and ``checkpoints=`` the step count).

Timed (best of ``--repeats``, calls interleaved), the gradient of ``sum(ys**2)`` w.r.t. the
parameters ``(n, 3)``:

- ``solve``: ``gs.solve`` (record + replay every call) under ``jit``, what a user pays;
- ``replay``: ``gs.replay`` on a mesh recorded once (the fitting and sampling use);
- ``diffrax``: ``jax.grad`` through ``jax.vmap(diffrax.diffeqsolve)``;

and the forward solves (``gs.solve`` values, Diffrax values) likewise matched.

Usage::

    python benchmarks/bench_lorenz_matched.py                   # n = 1,000 (CPU)
    python benchmarks/bench_lorenz_matched.py --n 32768          # the published ensemble size

Writes ``benchmarks/results/bench_lorenz_matched_<n>.json`` (or ``--json PATH``).
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
from scipy.integrate import solve_ivp  # noqa: E402

import gradsolve as gs  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import bench_core  # noqa: E402


def lorenz(t, y, p):
    return jnp.stack([p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]])


def problem(n: int, n_save: int):
    """``y0 (n, 3)``, ``p (n, 3)`` with ``rho`` evenly over [0, 21], save times ``(n_save,)``."""
    rho = np.linspace(0.0, 21.0, n)
    p = np.stack([np.full(n, 10.0), rho, np.full(n, 8.0 / 3.0)], -1)
    y0 = np.tile([1.0, 0.0, 0.0], (n, 1))
    ts = np.linspace(0.0, 1.0, n_save + 1)[1:]
    return jnp.asarray(y0), jnp.asarray(p), jnp.asarray(ts)


def reference(y0, p, ts, idx):
    """DOP853 at rtol 1e-11, atol 1e-13 for trajectories ``idx``: ``(len(idx), k, 3)``."""
    out = []
    for i in idx:
        pi = np.asarray(p[i])
        rhs = lambda t, y: [pi[0] * (y[1] - y[0]), y[0] * (pi[1] - y[2]) - y[1],
                            y[0] * y[1] - pi[2] * y[2]]
        sol = solve_ivp(rhs, (0.0, float(ts[-1])), np.asarray(y0[i]), method="DOP853",
                        t_eval=np.asarray(ts), rtol=1e-11, atol=1e-13)
        out.append(sol.y.T)
    return np.stack(out)


def error(ys, ref, idx):
    d = np.abs(np.asarray(ys)[idx] - ref).max(axis=(1, 2))
    return float(np.max(d / np.abs(ref).max(axis=(1, 2))))


def _best(fns: dict, repeats: int) -> dict:
    """`bench_core._best` in milliseconds."""
    return {k: 1e3 * v for k, v in bench_core._best(fns, repeats).items()}


def rung(y0, p, ts, rtol, atol, repeats):
    """Errors' inputs and best times of one tolerance rung on both sides."""
    mesh = gs.record(lorenz, 0.0, 1.0, y0, p, ts=ts, rtol=rtol, atol=atol)
    steps = int(np.max(mesh.n_steps))
    max_steps = max(4 * steps + 64, 4096)
    term = diffrax.ODETerm(lambda t, y, a: lorenz(t, y, a))

    def dfx(p_, checkpoints=None):
        def one(a, b):
            return diffrax.diffeqsolve(
                term, diffrax.Tsit5(), 0.0, 1.0, None, a, args=b, saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
                max_steps=max_steps, adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints),
            ).ys
        return jax.vmap(one)(y0, p_)

    solve = lambda p_: gs.solve(lorenz, 0.0, 1.0, y0, p_, ts=ts, rtol=rtol, atol=atol,
                                max_steps=max_steps).ys
    ck = int(np.max(mesh.n_steps) + np.max(mesh.n_rejected)) + 1
    sq = lambda g: (lambda p_: jnp.sum(g(p_) ** 2))
    fns = {
        "gs_solve_grad": jax.jit(jax.grad(sq(solve))),
        "gs_replay_grad": jax.jit(jax.grad(sq(lambda p_: gs.replay(lorenz, mesh, y0, p_, ts=ts).ys))),
        "dfx_grad": jax.jit(jax.grad(sq(dfx))),
        "dfx_grad_ckpt": jax.jit(jax.grad(sq(lambda p_: dfx(p_, ck)))),
        "gs_solve": jax.jit(solve),
        "dfx_forward": jax.jit(dfx),
    }
    for fn in fns.values():
        jax.block_until_ready(fn(p))
    ms = _best({k: (lambda fn=fn: fn(p)) for k, fn in fns.items()}, repeats)
    ms["dfx_grad_best"] = min(ms["dfx_grad"], ms["dfx_grad_ckpt"])
    g_gs, g_dfx = np.asarray(fns["gs_solve_grad"](p)), np.asarray(fns["dfx_grad"](p))
    return dict(rtol=rtol, atol=atol, mean_steps=float(np.mean(mesh.n_steps)),
                gs_ys=np.asarray(fns["gs_solve"](p)), dfx_ys=np.asarray(fns["dfx_forward"](p)),
                grad_rel_diff=float(np.max(np.abs(g_gs - g_dfx)) / np.max(np.abs(g_dfx))),
                route=gs.replay(lorenz, mesh, y0, p, ts=ts).route, **{f"{k}_ms": v for k, v in ms.items()})


def at_error(rows, key, err):
    """Diffrax's time ``key`` at error ``err``: log-log interpolation between the two rungs
    that bracket it (a work-precision diagram read at gradsolve's error), and how it was
    read: ``"interpolated"``, ``"extrapolated"`` (more accurate than every Diffrax rung:
    the line through its two most accurate ones) or ``"coarsest"`` (less accurate than every
    rung: its cheapest rung's time, which favours Diffrax)."""
    pts = sorted((r["dfx_error"], r[key]) for r in rows)
    le, lt = np.log([e for e, _ in pts]), np.log([t for _, t in pts])
    x = np.log(err)
    if x >= le[-1]:
        return float(min(t for _, t in pts)), "coarsest"
    if x < le[0]:
        if len(pts) < 2 or le[1] == le[0]:
            return float(pts[0][1]), "extrapolated"
        slope = (lt[1] - lt[0]) / (le[1] - le[0])
        return float(np.exp(lt[0] + slope * (x - le[0]))), "extrapolated"
    return float(np.exp(np.interp(x, le, lt))), "interpolated"


def matched(rows):
    """Each gradsolve rung against Diffrax's cost at the same error."""
    out = []
    for r in rows:
        g, how = at_error(rows, "dfx_grad_best_ms", r["gs_error"])
        fw, _ = at_error(rows, "dfx_forward_ms", r["gs_error"])
        out.append(dict(rtol=r["rtol"], gs_error=r["gs_error"], diffrax=how,
                        dfx_grad_ms=g, dfx_forward_ms=fw,
                        solve_grad_x=g / r["gs_solve_grad_ms"],
                        replay_grad_x=g / r["gs_replay_grad_ms"],
                        forward_x=fw / r["gs_solve_ms"]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="trajectories (default %(default)s)")
    ap.add_argument("--rtols", default="1e-4,3e-5,1e-5,3e-6,1e-6,3e-7,1e-7,3e-8,1e-8",
                    help="tolerance ladder, atol = rtol (default %(default)s)")
    ap.add_argument("--saves", type=int, default=10, help="save times on (0, 1]")
    ap.add_argument("--check", type=int, default=200,
                    help="trajectories checked against SciPy (evenly spaced)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    y0, p, ts = problem(a.n, a.saves)
    idx = np.unique(np.linspace(0, a.n - 1, min(a.check, a.n)).astype(int))
    t = time.perf_counter()
    ref = reference(y0, p, ts, idx)
    print(f"Lorenz, rho over [0, 21], n = {a.n}, {jax.default_backend()}, jax "
          f"{jax.__version__}, diffrax {diffrax.__version__}; SciPy reference on {len(idx)} "
          f"trajectories ({time.perf_counter() - t:.1f} s)", flush=True)
    rows = []
    for rtol in (float(x) for x in a.rtols.split(",")):
        r = rung(y0, p, ts, rtol, rtol, a.repeats)
        r["gs_error"], r["dfx_error"] = error(r.pop("gs_ys"), ref, idx), error(r.pop("dfx_ys"), ref, idx)
        rows.append(r)
        print(f"  rtol {rtol:.0e}: steps {r['mean_steps']:6.1f}  error gs {r['gs_error']:.2e} "
              f"diffrax {r['dfx_error']:.2e}  grad ms: solve {r['gs_solve_grad_ms']:8.2f} replay "
              f"{r['gs_replay_grad_ms']:8.2f} diffrax {r['dfx_grad_ms']:8.2f} (ckpt "
              f"{r['dfx_grad_ckpt_ms']:.2f})  fwd ms: gs.solve {r['gs_solve_ms']:.2f} diffrax "
              f"{r['dfx_forward_ms']:.2f}  grads agree {r['grad_rel_diff']:.1e}", flush=True)
    m = matched(rows)
    print("at matched error (Diffrax's times read off its work-precision line at gradsolve's error):")
    print("  gs rtol  gs error   diffrax grad ms  gs.solve grad  replay grad  forward  diffrax read")
    for x in m:
        print(f"  {x['rtol']:7.0e}  {x['gs_error']:.2e}  {x['dfx_grad_ms']:15.2f}  "
              f"{x['solve_grad_x']:12.1f}x  {x['replay_grad_x']:10.1f}x  {x['forward_x']:6.1f}x  "
              f"{x['diffrax']}")
    res = dict(config=dict(n=a.n, rtols=a.rtols, saves=a.saves, checked=len(idx),
                           repeats=a.repeats, date=time.strftime("%Y-%m-%d"),
                           machine=platform.platform(), cpus=os.cpu_count(),
                           backend=jax.default_backend(), devices=str(jax.devices())),
               rows=rows, matched=m)
    out = a.json or os.path.join(os.path.dirname(__file__), "results",
                                 f"bench_lorenz_matched_{a.n}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
