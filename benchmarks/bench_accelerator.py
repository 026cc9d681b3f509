"""The accelerator benchmark: Diffrax's default adjoint, the lanes replay (XLA) and the fused
Pallas kernels (`gs.drivers.Pallas`) side by side, in one process, on one device.

Workload (the issue's): float32, Tsit5, rtol 1e-5 / atol 1e-7, 20 save times on [0, 10]
(Lotka–Volterra; other models from ``problems.py`` on their own intervals), parameters
spread +-20 %, loss ``sum(ys ** 2)``. Every time is the best of ``--repeats`` calls after a
warm-up call (which compiles), calls interleaved so that load hits all sides alike.

Rows per side (``-`` where a side does not have it):

- ``replay grad``: ``jax.grad`` of the replay of one mesh recorded once by the XLA record
  (the same mesh for both gradsolve sides), w.r.t. the parameters;
- ``replay fwd``: that replay's forward pass;
- ``solve grad``: ``jax.grad`` through ``gs.solve`` (record + replay every call) under
  ``jit``, mesh capacity ``--max-steps``;
- ``record``: ``gs.record`` under ``jit`` (capacity ``--max-steps``);
- Diffrax: ``jax.grad`` through ``jax.vmap(diffrax.diffeqsolve)`` with its default
  ``RecursiveCheckpointAdjoint`` (``max_steps=--max-steps``), and its forward solve.

Ratios are Diffrax's gradient time over each gradsolve gradient time. ``--check`` first
compares the Pallas side with the lanes side on the same mesh (values, gradients w.r.t.
``y0``, parameters and save times) and the Pallas record with the XLA record.

Run: ``python benchmarks/bench_accelerator.py --n 32768 [--model lotka_volterra]
[--sides diffrax,lanes,pallas] [--max-steps 1024] [--repeats 5] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import diffrax

import gradsolve as gs

sys.path.insert(0, os.path.dirname(__file__))
from problems import make  # noqa: E402

RTOL, ATOL = 1e-5, 1e-7
PALLAS = gs.drivers.Pallas()  # --interpret: Pallas(interpret=True), a dry run off the chip


def workload(model: str, n: int, seed: int = 0):
    """``(f, t1, y0 (n, d), params (n, q), ts (20,))`` in float32."""
    f, t1, y0, p, ts, stiff = make(model, n, seed)
    if stiff:
        raise SystemExit(f"{model} is stiff: the explicit-solver benchmark does not apply.")
    if model == "lotka_volterra":  # the spread: +-20 %
        rng = np.random.default_rng(seed)
        p = np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.4 * (rng.random((n, 4)) - 0.5))
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return f, float(t1), f32(y0), f32(p), f32(jnp.linspace(0.0, t1, 20))


def best(calls: dict, repeats: int) -> dict:
    """Best wall time (ms) of each zero-argument callable, interleaved round-robin, after
    one warm-up call each."""
    for fn in calls.values():
        jax.block_until_ready(fn())
    out = {k: float("inf") for k in calls}
    for _ in range(repeats):
        for k, fn in calls.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            out[k] = min(out[k], 1e3 * (time.perf_counter() - t))
    return out


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def check(f, t1, y0, p, ts, max_steps: int) -> dict:
    """The Pallas side against the lanes side on one mesh, and the two records."""
    lanes, pallas = gs.drivers.Lanes(), PALLAS
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, rtol=RTOL, atol=ATOL, driver=lanes)
    out = {}

    def loss(driver):
        def fn(y, q, tt):
            s = gs.replay(f, mesh, y, q, ts=tt, driver=driver)
            return jnp.sum(jnp.sin(s.ys)) + jnp.sum(s.y1 ** 2)
        return jax.jit(jax.grad(fn, argnums=(0, 1, 2)))

    a = gs.replay(f, mesh, y0, p, driver=pallas)
    b = gs.replay(f, mesh, y0, p, driver=lanes)
    out["route"] = a.route
    out["ys_rel"], out["y1_rel"] = rel(a.ys, b.ys), rel(a.y1, b.y1)
    out["err_ratio_rel"] = rel(a.error_ratio, b.error_ratio)
    for name, ga, gb in zip(("grad_y0_rel", "grad_p_rel", "grad_ts_rel"),
                            loss(pallas)(y0, p, ts), loss(lanes)(y0, p, ts)):
        out[name] = rel(ga, gb)
    gp = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q, driver=pallas).ys ** 2)))(p)
    gl = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q, driver=lanes).ys ** 2)))(p)
    out["grad_p_plain_rel"] = rel(gp, gl)
    rec = gs.record(f, 0.0, t1, y0, p, ts=ts, rtol=RTOL, atol=ATOL, driver=pallas,
                    max_steps=max_steps)
    same = np.asarray(rec.n_steps) == np.asarray(mesh.n_steps)
    out["record_same_n_steps"] = float(np.mean(same))
    out["record_same_n_rejected"] = float(np.mean(np.asarray(rec.n_rejected) ==
                                                  np.asarray(mesh.n_rejected)))
    out["record_status_ok"] = float(np.mean(np.asarray(rec.status) == 0))
    out["record_y_last_rel"] = rel(rec.y_last, mesh.y_last)
    # the Pallas record replayed: its mesh holds (the replay reproduces its final states)
    r = gs.replay(f, rec, y0, p, driver=pallas)
    out["pallas_mesh_replay_y1_rel"] = rel(r.y1, rec.y_last)
    out["pallas_mesh_max_error_ratio"] = float(np.max(np.asarray(r.error_ratio)))
    return out


def bench(model: str, n: int, sides: list[str], max_steps: int, repeats: int) -> dict:
    f, t1, y0, p, ts = workload(model, n)
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, rtol=RTOL, atol=ATOL,
                     driver=gs.drivers.Lanes(), max_steps=max_steps)
    calls, grads = {}, {}
    for side in sides:
        if side == "diffrax":
            term = diffrax.ODETerm(lambda t, y, a: f(t, y, a))

            def dfx_ys(q):
                def one(a, b):
                    return diffrax.diffeqsolve(
                        term, diffrax.Tsit5(), 0.0, t1, None, a, args=b,
                        saveat=diffrax.SaveAt(ts=ts),
                        stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
                        max_steps=max_steps).ys
                return jax.vmap(one)(y0, q)

            g = jax.jit(jax.grad(lambda q: jnp.sum(dfx_ys(q) ** 2)))
            fw = jax.jit(dfx_ys)
            calls["diffrax grad"], calls["diffrax fwd"] = (lambda: g(p)), (lambda: fw(p))
            grads["diffrax"] = g
            continue
        driver = {"lanes": gs.drivers.Lanes(), "pallas": PALLAS}[side]
        rg = jax.jit(jax.grad(lambda q, d=driver: jnp.sum(gs.replay(f, mesh, y0, q, driver=d).ys ** 2)))
        rf = jax.jit(lambda q, d=driver: gs.replay(f, mesh, y0, q, driver=d).ys)
        sg = jax.jit(jax.grad(lambda q, d=driver: jnp.sum(gs.solve(
            f, 0.0, t1, y0, q, ts=ts, rtol=RTOL, atol=ATOL, max_steps=max_steps,
            driver=d).ys ** 2)))
        rc = jax.jit(lambda q, d=driver: gs.record(f, 0.0, t1, y0, q, ts=ts, rtol=RTOL,
                                                   atol=ATOL, max_steps=max_steps,
                                                   driver=d).times)
        calls.update({f"{side} replay grad": (lambda g=rg: g(p)),
                      f"{side} replay fwd": (lambda g=rf: g(p)),
                      f"{side} solve grad": (lambda g=sg: g(p)),
                      f"{side} record": (lambda g=rc: g(p))})
        grads[side] = rg
    ms = best(calls, repeats)
    out = {"model": model, "n": n, "backend": jax.default_backend(),
           "device": str(jax.devices()[0].device_kind), "max_steps": max_steps,
           "mean_steps": float(np.mean(mesh.n_steps)), "max_steps_taken": int(np.max(mesh.n_steps)),
           "ms": ms}
    if "diffrax" in sides:
        ref = ms["diffrax grad"]
        out["ratios_vs_diffrax_grad"] = {k: ref / v for k, v in ms.items()
                                         if k.endswith("grad") and not k.startswith("diffrax")}
    g = {k: np.asarray(fn(p)) for k, fn in grads.items()}
    if "lanes" in g:
        out["grad_rel_vs_lanes"] = {k: rel(v, g["lanes"]) for k, v in g.items() if k != "lanes"}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="32768", help="ensemble sizes, comma-separated")
    ap.add_argument("--model", default="lotka_volterra")
    ap.add_argument("--sides", default="diffrax,lanes,pallas")
    ap.add_argument("--max-steps", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="compare Pallas with Lanes first")
    ap.add_argument("--json", default=None)
    ap.add_argument("--interpret", action="store_true",
                    help="Pallas(interpret=True): a dry run of this script off the chip")
    a = ap.parse_args(argv)
    global PALLAS
    if a.interpret:
        PALLAS = gs.drivers.Pallas(interpret=True)
    print("jax", jax.__version__, "diffrax", diffrax.__version__, jax.devices(), flush=True)
    sides = [s for s in a.sides.split(",") if s]
    results = []
    for n in (int(x) for x in a.n.split(",")):
        if a.check:
            f, t1, y0, p, ts = workload(a.model, n)
            print("check", json.dumps(check(f, t1, y0, p, ts, a.max_steps)), flush=True)
        r = bench(a.model, n, sides, a.max_steps, a.repeats)
        results.append(r)
        print(f"\n{a.model} n={n} ({r['device']}, mean steps {r['mean_steps']:.1f}, "
              f"max {r['max_steps_taken']}, capacity {a.max_steps})")
        for k, v in r["ms"].items():
            print(f"  {k:<22}{v:>10.3f} ms")
        for k, v in r.get("ratios_vs_diffrax_grad", {}).items():
            print(f"  diffrax grad / {k:<22}{v:>9.1f}x")
        for k, v in r.get("grad_rel_vs_lanes", {}).items():
            print(f"  grad rel diff {k} vs lanes: {v:.2e}")
        sys.stdout.flush()
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(results, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
