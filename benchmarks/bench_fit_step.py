"""One step of a many-start fit, in parts: what `inference.fit`'s compiled loop runs per
step on lynx–hare, timed alone at N starts on the default device.

Prior draws of lynx–hare's parameters (``N`` of them, float32) are recorded once on the
host (the fit's first mesh, trimmed to a power of two, or padded to ``--capacity``); then,
each jitted and timed over ``--repeats`` calls after a first:

- ``record_in_place``: `Problem.record_in_place`, every start recorded again at the mesh's
  capacity (the loop's re-record);
- ``value_and_grad``: the MAP objective and its gradient on the mesh (the loop's step);
- ``record + where + value_and_grad``: both, with the fresh rows swapped in.

Usage::

    python benchmarks/bench_fit_step.py --n 16384
    python benchmarks/bench_fit_step.py --n 16384 --capacity 4096   # a grown mesh
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time(name: str, fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    ms = (time.perf_counter() - t) / repeats * 1e3
    print(f"{name}: {ms:.2f} ms", flush=True)
    return ms


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--capacity", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)

    import models
    from inference.problem._problem import Problem

    prob = Problem(models.lynx_hare(), models.load_dataset("lynx_hare"))
    u = jnp.asarray(prob.sample_starts(jax.random.PRNGKey(0), a.n), jnp.float32)
    mesh = prob.record(u, 0.5).trim()
    print(f"{a.n} starts on {jax.devices()[0]}: the longest takes "
          f"{int(np.max(mesh.n_steps))} steps, capacity {mesh.capacity}", flush=True)
    if a.capacity is not None and a.capacity > mesh.capacity:
        mesh = mesh.with_capacity(a.capacity)
        print(f"padded to capacity {mesh.capacity}", flush=True)
    mesh = mesh.to_device()
    print(f"replay driver {prob.replay_driver}", flush=True)

    def loss(u, mesh):
        lp, sol = prob.log_density(u, mesh, prior=True, jacobian=False)
        return jnp.sum(-lp), sol.error_ratio

    vg = jax.value_and_grad(loss, has_aux=True)

    def both(u, mesh):
        fresh = prob.record_in_place(u, mesh, 0.5)
        return vg(u, mesh.where(fresh.status == 0, fresh))

    out = dict(n=a.n, capacity=mesh.capacity)
    out["record_in_place"] = _time("record_in_place", jax.jit(
        lambda u, m: prob.record_in_place(u, m, 0.5)), u, mesh, repeats=a.repeats)
    out["value_and_grad"] = _time("value_and_grad", jax.jit(vg), u, mesh, repeats=a.repeats)
    out["both"] = _time("record + where + value_and_grad", jax.jit(both), u, mesh,
                        repeats=a.repeats)
    return out


if __name__ == "__main__":
    main()
