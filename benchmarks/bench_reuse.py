"""Mesh reuse in a user's own Optax loop: `gs.MeshReuse` against `gs.solve` per step.

The loop a user writes: Adam on the parameters of an ensemble of Lotka–Volterra systems
(each trajectory fitted to its own noisy data, from a start 20 % off), ``jax.jit`` around
one step, the loss a sum of squares at 20 save times. Both sides run the same steps in one
process, Tsit5 at rtol 1e-6 / atol 1e-9:

- ``gs.solve``: record + replay at every step;
- ``gs.MeshReuse``: replay the kept mesh, re-record stale trajectories inside ``jit``.

Prints per-step time (steady state, best of ``--repeats`` runs of the loop), compile time,
re-records and the final loss of each side, and the ratio.

Usage::

    python benchmarks/bench_reuse.py                 # n = 100, 300 steps
    python benchmarks/bench_reuse.py --n 1000 --steps 300 --lr 1e-3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import gradsolve as gs  # noqa: E402


def lv(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


def problem(n: int):
    key = jax.random.PRNGKey(0)
    true = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.1 * jax.random.uniform(key, (n, 4)))
    y0 = jnp.ones((n, 2))
    ts = jnp.linspace(0.5, 10.0, 20)
    clean = gs.solve(lv, 0.0, 10.0, y0, true, ts=ts, rtol=1e-10, atol=1e-12).ys
    data = clean + 0.05 * jax.random.normal(jax.random.PRNGKey(1), clean.shape)
    start = true * 1.2
    return y0, ts, data, jnp.log(start)


def run(side: str, n: int, steps: int, repeats: int, lr: float) -> dict:
    y0, ts, data, u0 = problem(n)
    opt = optax.adam(lr)
    reuse = gs.MeshReuse(lv, 0.0, 10.0, ts=ts, rtol=1e-6, atol=1e-9)

    if side == "solve":
        def loss(u, state):
            sol = gs.solve(lv, 0.0, 10.0, y0, jnp.exp(u), ts=ts, rtol=1e-6, atol=1e-9,
                           max_steps=512)
            return jnp.sum((sol.ys - data) ** 2), state
    else:
        def loss(u, state):
            sol, state = reuse.solve(state, y0, jnp.exp(u))
            return jnp.sum((sol.ys - data) ** 2), state

    @jax.jit
    def step(u, opt_state, state):
        (value, state), g = jax.value_and_grad(loss, has_aux=True)(u, state)
        updates, opt_state = opt.update(g, opt_state)
        return optax.apply_updates(u, updates), opt_state, state, value

    def loop():
        u, opt_state = u0, opt.init(u0)
        state = reuse.init(y0, jnp.exp(u0)) if side == "reuse" else None
        for _ in range(steps):
            u, opt_state, state, value = step(u, opt_state, state)
        jax.block_until_ready(u)
        return u, state, value

    t = time.perf_counter()
    u, state, value = loop()
    first = time.perf_counter() - t
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        loop()
        best = min(best, time.perf_counter() - t)
    out = dict(side=side, n=n, steps=steps, lr=lr, first_run_s=first, best_run_s=best,
               ms_per_step=1e3 * best / steps, final_loss=float(value))
    if side == "reuse":
        out.update(n_records=int(state.n_records), n_rows_recorded=int(state.n_rows_recorded))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100, help="trajectories (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=300, help="Adam steps (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate on log-parameters (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed loops per side (default: %(default)s)")
    args = ap.parse_args(argv)
    rows = [run(side, args.n, args.steps, args.repeats, args.lr) for side in ("solve", "reuse")]
    for r in rows:
        extra = (f", {r['n_records']} records ({r['n_rows_recorded']} trajectory records)"
                 if r["side"] == "reuse" else "")
        print(f"{r['side']:6s} n={r['n']} lr={r['lr']:g}: {r['ms_per_step']:.2f} ms/step (first run "
              f"{r['first_run_s']:.1f} s incl. compile), final loss {r['final_loss']:.4f}{extra}")
    ratio = rows[0]["ms_per_step"] / rows[1]["ms_per_step"]
    print(f"MeshReuse / gs.solve speed-up per step: {ratio:.2f}x")
    out = os.path.join(os.path.dirname(__file__), "results", f"bench_reuse_n{args.n}_lr{args.lr:g}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(dict(rows=rows, ratio=ratio, machine=platform.platform(),
                       processor=platform.processor(), cpus=os.cpu_count(),
                       date=time.strftime("%Y-%m-%d")), fh, indent=1)


if __name__ == "__main__":
    main()
