"""Many-start fits on the accelerator against its own host: ``inference.fit`` of lynx–hare.

``inference.fit(models.lynx_hare(), models.load_dataset("lynx_hare"), n_starts=N,
seed=SEED)`` (Adam 1e-2, 1,000 steps unless ``--steps``) on the default device (the chip
where there is one) and on the host CPU (``jax.default_device(jax.devices("cpu")[0])``)
in the same process, each called twice: the first call compiles (or loads the persistent
compilation cache), the second runs the same starts on compiled programs. For each size
and side it prints the seconds of both calls, the best loss, the starts ending within 0.1
of it (the waterfall's plateau), the failed starts, the records and gradient evaluations,
the device's peak memory where it reports one, then the host/device ratio of the second
calls. Usage::

    python benchmarks/bench_fit_starts.py --n 1024,100000 --float32 --json out.json
    python benchmarks/bench_fit_starts.py --n 64 --steps 20      # a check that it runs
    python benchmarks/bench_fit_starts.py --n 100000 --sides device --profile  # where time goes

``--host-max-n`` skips the host above a size (its time grows with N: 1,024 starts took
20 s on 13 host cores, so 100,000 take about half an hour). Writes ``--json`` where given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1024,100000", help="comma-separated numbers of starts")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=None,
                    help="steps per compiled call (default: Optax's)")
    ap.add_argument("--sides", default="device,cpu", help="device, cpu or both")
    ap.add_argument("--host-max-n", type=int, default=None,
                    help="run the host side only up to this many starts")
    ap.add_argument("--float32", action="store_true", help="single precision (the chip's)")
    ap.add_argument("--profile", action="store_true",
                    help="also time the fit's parts: compiled chunks, re-records, merges")
    ap.add_argument("--calls", type=int, default=2,
                    help="calls per size and side (1: the first call, compiles included)")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


_PARTS = {}
_LOOPS = {}


def _profiled() -> None:
    """Wrap `FitKernel`'s parts to add up their calls and seconds in `_PARTS` (the compiled
    loop waited for, so its seconds are the device's)."""
    from inference.optimize._optax import FitKernel

    def timed(name):
        inner = getattr(FitKernel, name)

        def wrapper(self, *args, **kwargs):
            t = time.perf_counter()
            out = inner(self, *args, **kwargs)
            if name == "_run":
                jax.block_until_ready(out["history"])
            dt = time.perf_counter() - t
            calls, seconds = _PARTS.get(name, (0, 0.0))
            _PARTS[name] = (calls + 1, seconds + dt)
            if name == "_run":  # the compiled loop's work, by mesh capacity
                key = f"loop at capacity {args[0].mesh.capacity}"
                c, sec, ev, rec = _LOOPS.get(key, (0, 0.0, 0, 0))
                _LOOPS[key] = (c + 1, sec + dt, ev + int(out.get("evals", 1)),
                               rec + int(out.get("n_rec", 0)))
            return out
        setattr(FitKernel, name, wrapper)

    for name in ("advance", "_run", "rerecord", "record", "merge", "init", "final"):
        timed(name)


def run(m, data, n: int, steps: int, seed: int, chunk: int | None, device, calls: int = 2
        ) -> list[dict]:
    """``calls`` timed calls of the fit of ``n`` starts on ``device``; one row each."""
    import numpy as np
    import optax

    import inference

    rows = []
    for call in range(1, calls + 1):
        kw = dict(steps=steps)
        if chunk is not None:
            kw = dict(optimizer=inference.optimize.Optax(optax.adam(1e-2), max_iter=steps,
                                                         chunk=chunk, seed=seed))
        _PARTS.clear()
        _LOOPS.clear()
        with jax.default_device(device):
            t = time.perf_counter()
            res = inference.fit(m, data, n_starts=n, seed=seed, progress=False, **kw)
            seconds = time.perf_counter() - t
        stats = device.memory_stats() or {}  # None on the host CPU
        losses = np.asarray(res.losses)
        best = float(np.min(losses))
        rows.append(dict(
            side=device.platform, device=str(device), n=n, call=call, seconds=seconds,
            best_loss=best, at_best=int(np.sum(losses <= best + 0.1)),
            failed=int(np.sum(np.asarray(res.status) != 0)), n_records=int(res.n_records),
            n_grad_evals=int(res.n_grad_evals), n_steps=int(res.n_steps),
            peak_bytes=stats.get("peak_bytes_in_use")))
        r = rows[-1]
        peak = "" if r["peak_bytes"] is None else f"  peak {r['peak_bytes'] / 2**30:.2f} GiB"
        print(f"{r['side']:>4} n={n:>7} call {call}: {seconds:9.2f} s  best {best:.6g}  "
              f"within 0.1 of best {r['at_best']}  failed {r['failed']}  records "
              f"{r['n_records']}  evals {r['n_grad_evals']}{peak}", flush=True)
        if _PARTS:
            r["parts"] = {k: dict(calls=c, seconds=t) for k, (c, t) in _PARTS.items()}
            print("      " + ", ".join(f"{k} {c}x {t:.2f} s" for k, (c, t) in _PARTS.items()),
                  flush=True)
            r["loops"] = {k: dict(calls=c, seconds=t, evaluations=e, records_in_loop=q)
                          for k, (c, t, e, q) in _LOOPS.items()}
            for k, (c, t, e, q) in sorted(_LOOPS.items()):
                print(f"      {k}: {c} calls, {e} evaluations, {q} records in the loop, "
                      f"{t:.2f} s ({1e3 * t / max(e, 1):.2f} ms an evaluation)", flush=True)
            _PARTS.clear()
            _LOOPS.clear()
    return rows


def main(argv=None) -> dict:
    a = _args(argv)
    if not a.float32:
        jax.config.update("jax_enable_x64", True)
    import models

    m, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    if a.profile:
        _profiled()
    sides = [s.strip() for s in a.sides.split(",") if s.strip()]
    devices = {"device": jax.devices()[0], "cpu": jax.devices("cpu")[0]}
    print(f"jax {jax.__version__}, default device {devices['device']}, "
          f"{'float32' if a.float32 else 'float64'}, {a.steps} steps, seed {a.seed}",
          flush=True)
    out = dict(argv=sys.argv[1:], jax=jax.__version__, host=platform.node(),
               device=str(devices["device"]), float32=a.float32, steps=a.steps,
               seed=a.seed, runs=[], ratios={})
    for n in [int(x) for x in a.n.split(",")]:
        second = {}
        for side in sides:
            if side == "cpu" and a.host_max_n is not None and n > a.host_max_n:
                print(f" cpu n={n:>7}: skipped (--host-max-n {a.host_max_n})", flush=True)
                continue
            rows = run(m, data, n, a.steps, a.seed, a.chunk, devices[side], a.calls)
            out["runs"] += rows
            second[side] = rows[-1]["seconds"]
        if len(second) == 2 and a.calls >= 2:
            ratio = second["cpu"] / second["device"]
            out["ratios"][str(n)] = ratio
            print(f"n={n}: host {second['cpu']:.2f} s / device {second['device']:.2f} s "
                  f"= {ratio:.2f}x (second calls)", flush=True)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
