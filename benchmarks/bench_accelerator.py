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

Sides ``kernel`` (the compiled CPU kernel) and ``batched`` run where JAX's default backend
is: ``JAX_PLATFORMS=cpu`` gives the host's CPU side of a TPU machine. The peak device
allocation of the process so far is reported where the device keeps statistics (run one
size per process to read it per size).

Ratios are Diffrax's gradient time over each gradsolve gradient time. ``--check`` first
compares the Pallas side with the lanes side on the same mesh (values, gradients w.r.t.
``y0``, parameters and save times) and the Pallas record with the XLA record.

``--defaults`` times only ``jax.grad`` through ``gs.solve`` under ``jit`` at its defaults (the
driver and mesh capacity it picks for ``--n``; first, second and best later call) with the
device's peak allocation, and reports an error (memory) instead of raising it.

``--events`` runs the known-time-event workload instead (`events`): an oral dosing
schedule (four boluses into a depot, one infusion into the central compartment, 20
observations over 48 h, float32), recorded once by the XLA record; the replay gradient
w.r.t. the parameters and the dose amounts and times on the lanes and Pallas sides (and
how far apart they are), the dosed record under ``jit`` on both, and the save-time gradient
(``ts=``) of the Lotka–Volterra workload with `gradsolve._savetimes.moved_out_of_order`,
the on-device check of moved save times, timed alone.

``--model robertson`` runs the stiff workload instead (`stiff`): Robertson (3 states,
rates spread +-10 %), `gradsolve.Rodas5P` (``--solver Rosenbrock23``), float32, rtol 1e-4 /
atol 1e-8, 20 log-spaced save times on [1e-2, 100], loss ``sum(log(ys ** 2 + 1e-30))``:
``jax.grad`` through ``gs.solve`` under ``jit`` (capacity ``--max-steps``) on the sides
``auto`` (the default driver; its route printed), ``batched`` (the XLA loops) and
``pallas`` (the fused kernels), and the replay gradient, replay and record on one mesh
recorded by the XLA record. ``--check`` compares the sides' gradients and records first.
``--rows R`` sets the Pallas kernels' sublanes per block (record and replay).

Run: ``python benchmarks/bench_accelerator.py --n 32768 [--model lotka_volterra]
[--sides diffrax,lanes,pallas,kernel,batched] [--max-steps 1024] [--repeats 5] [--check] [--events]``;
the stiff workload: ``python benchmarks/bench_accelerator.py --model robertson
--n 1024,16384 [--sides auto,batched,pallas] [--check]``.
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
STIFF_RTOL, STIFF_ATOL = 1e-4, 1e-8  # --model robertson
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


def peak_bytes():
    """The device's peak allocation so far in this process (bytes), where it reports one."""
    try:
        return int(jax.devices()[0].memory_stats()["peak_bytes_in_use"])
    except Exception:  # noqa: BLE001 - CPU devices keep no statistics
        return None


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
    # one mesh for every gradsolve side; recorded by Lanes unless only Pallas runs (at a
    # million trajectories the XLA record's buffers are what would not fit)
    rec_driver = PALLAS if set(sides) <= {"pallas", "diffrax"} else gs.drivers.Lanes()
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, rtol=RTOL, atol=ATOL,
                     driver=rec_driver, max_steps=max_steps)
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
        driver = {"lanes": gs.drivers.Lanes(), "pallas": PALLAS, "kernel": gs.drivers.Kernel(),
                  "batched": gs.drivers.Batched()}[side]
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
           "peak_bytes": peak_bytes(), "cpu_cores": os.cpu_count(),
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


def at_defaults(model: str, n: int, repeats: int) -> dict:
    """``jax.grad`` through ``gs.solve`` under ``jit`` at its defaults (driver, ``max_steps``):
    the route and mesh capacity it chose, its first call, its second call and the best of
    ``repeats`` more, the memory XLA reserves for the call (arguments, outputs and
    temporaries: the call's peak on the device, which ``peak_bytes`` does not see on a TPU)
    and the device's peak allocation; an error (memory) is reported, not raised. Robertson
    runs the stiff workload (`stiff`: Rodas5P, its tolerances)."""
    if model == "robertson":
        f, t1, y0, p, ts = stiff_workload(n)
        kw = dict(rtol=STIFF_RTOL, atol=STIFF_ATOL, solver=gs.Rodas5P())
    else:
        f, t1, y0, p, ts = workload(model, n)
        kw = dict(rtol=RTOL, atol=ATOL)

    def solve(q):
        return gs.solve(f, 0.0, t1, y0, q, ts=ts, **kw)

    out = {"model": model, "n": n, "backend": jax.default_backend(),
           "device": str(jax.devices()[0].device_kind)}
    try:
        shape = jax.eval_shape(solve, p)
        out["route"], out["capacity"] = shape.route, shape.mesh.times.shape[1] - 1
        g = jax.jit(jax.grad(lambda q: jnp.sum(solve(q).ys ** 2)))
        ma = g.lower(p).compile().memory_analysis()
        if ma is not None:  # what XLA reserves for the call: the peak of the device's memory
            out["xla_bytes"] = int(ma.argument_size_in_bytes + ma.output_size_in_bytes
                                   + ma.temp_size_in_bytes - ma.alias_size_in_bytes)
            out["xla_temp_bytes"] = int(ma.temp_size_in_bytes)
        times = []
        for _ in range(2 + repeats):
            t = time.perf_counter()
            jax.block_until_ready(g(p))
            times.append(1e3 * (time.perf_counter() - t))
        out.update(first_ms=times[0], second_ms=times[1], best_ms=min(times[1:]))
        status = np.asarray(jax.jit(lambda q: solve(q).stats["status"])(p))
        out["failed"] = int(np.sum(status != 0))
    except Exception as e:  # noqa: BLE001 - RESOURCE_EXHAUSTED is the result to report
        out["error"] = f"{type(e).__name__}: {str(e)[:600]}"
    out["peak_bytes"] = peak_bytes()
    return out


def memory_at(model: str, n: int, caps: list[int]) -> list[dict]:
    """What XLA reserves (arguments, outputs, temporaries) for ``jax.grad`` through
    ``gs.solve`` under ``jit`` at each mesh capacity in ``caps``, compiled, not run."""
    f, t1, y0, p, ts = workload(model, n)
    rows = []
    for cap in caps:
        g = jax.jit(jax.grad(lambda q, c=cap: jnp.sum(gs.solve(
            f, 0.0, t1, y0, q, ts=ts, rtol=RTOL, atol=ATOL, max_steps=c).ys ** 2)))
        row = {"model": model, "n": n, "max_steps": cap, "d": int(y0.shape[1])}
        try:
            ma = g.lower(p).compile().memory_analysis()
            row.update(xla_bytes=int(ma.argument_size_in_bytes + ma.output_size_in_bytes
                                     + ma.temp_size_in_bytes - ma.alias_size_in_bytes),
                       xla_temp_bytes=int(ma.temp_size_in_bytes))
        except Exception as e:  # noqa: BLE001 - a capacity the device cannot hold
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def oral(t, y, p):
    """Depot and central compartment, first-order absorption and elimination."""
    return jnp.stack([-p[0] * y[0], p[0] * y[0] - p[1] * y[1]])


def events(n: int, max_steps: int, repeats: int) -> dict:
    """The known-time-event rows (module docstring): dosed replay gradients, dosed records,
    the save-time gradient and its check of moved save times."""
    from gradsolve._savetimes import moved_out_of_order, save_roles

    rng = np.random.default_rng(0)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    p = f32(np.array([1.0, 0.15]) * (1 + 0.4 * (rng.random((n, 2)) - 0.5)))
    y0 = jnp.zeros((n, 2), jnp.float32)
    ts = f32(np.linspace(0.5, 47.5, 20))
    bt = f32(np.array([0.0, 12.0, 24.0, 36.0]) + rng.uniform(0.0, 1.0, (n, 4)))
    ba = f32(rng.uniform(50.0, 150.0, (n, 4)))
    kw = dict(rtol=RTOL, atol=ATOL)

    def doses(bt, ba):
        return [gs.Bolus(time=bt, amount=ba, cmt=0),
                gs.Infusion(time=f32(6.0), amount=f32(100.0), duration=f32(2.0), cmt=1)]

    lanes = gs.drivers.Lanes()
    mesh = gs.record(oral, 0.0, 48.0, y0, p, ts=ts, doses=doses(bt, ba), driver=lanes,
                     max_steps=max_steps, **kw)
    calls, grads, records = {}, {}, {}
    for side, driver in (("lanes", lanes), ("pallas", PALLAS)):
        def loss(q, a, b, d=driver):
            return jnp.sum(gs.replay(oral, mesh, y0, q, doses=doses(b, a), driver=d).ys ** 2)

        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        rec = jax.jit(lambda q, a, b, d=driver: gs.record(
            oral, 0.0, 48.0, y0, q, ts=ts, doses=doses(b, a), driver=d, max_steps=max_steps,
            **kw).n_steps)
        grads[side], records[side] = g, rec
        calls[f"{side} dosed replay grad"] = lambda g=g: g(p, ba, bt)
        calls[f"{side} dosed record"] = lambda r=rec: r(p, ba, bt)
    # the save-time gradient of the Lotka–Volterra workload, and its check alone
    f, t1, y0_lv, p_lv, ts_lv = workload("lotka_volterra", n)
    mesh_lv = gs.record(f, 0.0, t1, y0_lv, p_lv, ts=ts_lv, rtol=RTOL, atol=ATOL, driver=lanes,
                        max_steps=max_steps)
    gts = jax.jit(jax.grad(lambda q, tt: jnp.sum(gs.replay(f, mesh_lv, y0_lv, q, ts=tt,
                                                           driver=PALLAS).ys ** 2),
                           argnums=(0, 1)))
    calls["pallas ts grad (p, ts)"] = lambda: gts(p_lv, ts_lv)
    bm = mesh_lv.batch()
    times = bm.times.astype(jnp.float32)
    subst = save_roles(bm.ts, bm.t0, bm.t1, bm.save_index)[3]
    ts_n = jnp.broadcast_to(ts_lv, bm.ts.shape)
    check = jax.jit(moved_out_of_order)
    calls["moved_out_of_order"] = lambda: check(times, bm.save_index, ts_n, subst)
    failed = {}
    for name, fn in list(calls.items()):  # a side that does not compile: say why, go on
        try:
            jax.block_until_ready(fn())
        except Exception as e:  # noqa: BLE001 - reported in the results
            failed[name] = f"{type(e).__name__}: {str(e)[:2000]}"
            print(f"{name} failed: {failed[name]}", flush=True)
            del calls[name]
    ms = best(calls, repeats)
    out = {"n": n, "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
           "failed": failed, "max_steps": max_steps, "mean_steps_dosed": float(np.mean(mesh.n_steps)),
           "jumps_dosed": int(mesh.jump_index.shape[-1]),
           "mean_steps_lv": float(np.mean(mesh_lv.n_steps)), "ms": ms}
    out["dosed_grad_rel_vs_lanes"], out["dosed_record_same_n_steps"] = [], float("nan")
    if "pallas dosed replay grad" in calls:
        ga, gb = grads["pallas"](p, ba, bt), grads["lanes"](p, ba, bt)
        out["dosed_grad_rel_vs_lanes"] = [rel(a, b) for a, b in zip(ga, gb)]
    if "pallas dosed record" in calls:
        out["dosed_record_same_n_steps"] = float(np.mean(
            np.asarray(records["pallas"](p, ba, bt)) == np.asarray(mesh.n_steps)))
    return out


def stiff_workload(n: int, seed: int = 0):
    """Robertson: ``(f, t1, y0 (n, 3), params (n, 3), ts (20,))`` in float32."""
    f, t1, y0, p, ts, _ = make("robertson", n, seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return f, float(t1), f32(y0), f32(p), f32(ts)


def stiff(n: int, sides: list[str], solver_name: str, max_steps: int, repeats: int,
          checking: bool) -> dict:
    """The stiff rows (module docstring): per side the ``gs.solve`` gradient under ``jit``
    (and its route), the replay gradient, the replay and the record on one mesh."""
    f, t1, y0, p, ts = stiff_workload(n)
    solver = getattr(gs, solver_name)()
    kw = dict(ts=ts, rtol=STIFF_RTOL, atol=STIFF_ATOL, solver=solver, max_steps=max_steps)
    mesh_driver = PALLAS if sides == ["pallas"] else gs.drivers.Batched()
    mesh = gs.record(f, 0.0, t1, y0, p, driver=mesh_driver, **kw)
    drivers = {"auto": None, "batched": gs.drivers.Batched(), "pallas": PALLAS}
    calls, solve_grads, records, routes = {}, {}, {}, {}

    def loss(ys):
        return jnp.sum(jnp.log(ys ** 2 + 1e-30))

    for side in sides:
        driver = drivers[side]
        routes[side] = jax.eval_shape(
            lambda q, d=driver: gs.solve(f, 0.0, t1, y0, q, driver=d, **kw), p).route
        sg = jax.jit(jax.grad(lambda q, d=driver: loss(gs.solve(f, 0.0, t1, y0, q, driver=d,
                                                                 **kw).ys)))
        rg = jax.jit(jax.grad(lambda q, d=driver: loss(gs.replay(f, mesh, y0, q, driver=d).ys)))
        rf = jax.jit(lambda q, d=driver: gs.replay(f, mesh, y0, q, driver=d).ys)
        rc = jax.jit(lambda q, d=driver: gs.record(f, 0.0, t1, y0, q, driver=d, **kw))
        solve_grads[side], records[side] = sg, rc
        calls.update({f"{side} solve grad": (lambda g=sg: g(p)),
                      f"{side} replay grad": (lambda g=rg: g(p)),
                      f"{side} replay fwd": (lambda g=rf: g(p)),
                      f"{side} record": (lambda g=rc: g(p).times)})
    out = {"model": "robertson", "solver": solver_name, "n": n,
           "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
           "cpu_cores": os.cpu_count(), "max_steps": max_steps, "routes": routes,
           "mean_steps": float(np.mean(mesh.n_steps)), "max_steps_taken": int(np.max(mesh.n_steps)),
           "mean_rejected": float(np.mean(mesh.n_rejected)),
           "failed": int(np.sum(np.asarray(mesh.status) != 0))}
    if checking:
        ref = "batched" if "batched" in sides else sides[0]
        g_ref, rec_ref = solve_grads[ref](p), records[ref](p)
        out["check"] = {}
        for side in sides:
            if side == ref:
                continue
            rec = records[side](p)
            out["check"][side] = {
                "solve_grad_rel": rel(solve_grads[side](p), g_ref),
                "record_same_n_steps": float(np.mean(np.asarray(rec.n_steps)
                                                     == np.asarray(rec_ref.n_steps))),
                "record_status_ok": float(np.mean(np.asarray(rec.status) == 0))}
        print("check", json.dumps(out["check"]), flush=True)
    out["ms"] = best(calls, repeats)
    out["peak_bytes"] = peak_bytes()
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
    ap.add_argument("--events", action="store_true",
                    help="the known-time-event workload (doses) instead")
    ap.add_argument("--defaults", action="store_true",
                    help="only gs.solve's gradient at its defaults (run one size per process)")
    ap.add_argument("--solver", default="Rodas5P",
                    help="the stiff workload's solver (--model robertson): Rodas5P, Rosenbrock23")
    ap.add_argument("--rows", type=int, default=None,
                    help="the Pallas kernels' sublanes per block (record and replay)")
    ap.add_argument("--memory-caps", default="",
                    help="only XLA's reserved memory of gs.solve's gradient at these "
                         "capacities (comma-separated), compiled and not run")
    a = ap.parse_args(argv)
    global PALLAS
    if a.interpret:
        PALLAS = gs.drivers.Pallas(interpret=True)
    if a.rows is not None:
        from gradsolve.drivers.pallas import _record, _replay
        _record.ROWS = _replay.ROWS = a.rows
    print("jax", jax.__version__, "diffrax", diffrax.__version__, jax.devices(), flush=True)
    if a.model == "robertson" and not (a.defaults or a.memory_caps):
        sides = [s for s in a.sides.split(",") if s in ("auto", "batched", "pallas")]
        if a.sides == ap.get_default("sides"):
            sides = ["auto", "batched", "pallas"]
        results = []
        for n in (int(x) for x in a.n.split(",")):
            r = stiff(n, sides, a.solver, a.max_steps, a.repeats, a.check)
            results.append(r)
            peak = "" if r["peak_bytes"] is None else f", peak {r['peak_bytes'] / 2**30:.2f} GiB"
            print(f"\nrobertson {r['solver']} n={n} ({r['device']}, {r['cpu_cores']} host "
                  f"cores, mean steps {r['mean_steps']:.1f} (+{r['mean_rejected']:.1f} "
                  f"rejected), max {r['max_steps_taken']}, failed {r['failed']}, capacity "
                  f"{a.max_steps}{peak})")
            print("  routes:", ", ".join(f"{k} -> {v}" for k, v in r["routes"].items()))
            for k, v in r["ms"].items():
                print(f"  {k:<22}{v:>10.3f} ms")
            sys.stdout.flush()
            if a.json:
                with open(a.json, "w") as fh:
                    json.dump(results, fh, indent=1)
        return results
    if a.events:
        results = []
        for n in (int(x) for x in a.n.split(",")):
            r = events(n, a.max_steps, a.repeats)
            results.append(r)
            print(f"\ndosed n={n} ({r['device']}, mean steps {r['mean_steps_dosed']:.1f}, "
                  f"{r['jumps_dosed']} jumps; LV mean steps {r['mean_steps_lv']:.1f})")
            for k, v in r["ms"].items():
                print(f"  {k:<30}{v:>10.3f} ms")
            print("  dosed grad rel diff pallas vs lanes (p, amounts, times):",
                  ", ".join(f"{x:.2e}" for x in r["dosed_grad_rel_vs_lanes"]))
            print(f"  dosed record: same n_steps as the XLA record "
                  f"{r['dosed_record_same_n_steps']:.3f}")
            sys.stdout.flush()
            if a.json:
                with open(a.json, "w") as fh:
                    json.dump(results, fh, indent=1)
        return results
    if a.memory_caps:
        results = [r for x in a.n.split(",") for r in memory_at(
            a.model, int(x), [int(c) for c in a.memory_caps.split(",")])]
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(results, fh, indent=1)
        return results
    if a.defaults:
        results = [at_defaults(a.model, int(x), a.repeats) for x in a.n.split(",")]
        for r in results:
            print(json.dumps(r), flush=True)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(results, fh, indent=1)
        return results
    sides = [s for s in a.sides.split(",") if s]
    results = []
    for n in (int(x) for x in a.n.split(",")):
        if a.check:
            f, t1, y0, p, ts = workload(a.model, n)
            print("check", json.dumps(check(f, t1, y0, p, ts, a.max_steps)), flush=True)
        r = bench(a.model, n, sides, a.max_steps, a.repeats)
        results.append(r)
        peak = "" if r["peak_bytes"] is None else f", peak {r['peak_bytes'] / 2**30:.2f} GiB"
        print(f"\n{a.model} n={n} ({r['device']}, {r['cpu_cores']} host cores, mean steps "
              f"{r['mean_steps']:.1f}, max {r['max_steps_taken']}, capacity {a.max_steps}{peak})")
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
