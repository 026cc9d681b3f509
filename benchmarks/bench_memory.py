"""Peak memory and time of a large replay gradient: n trajectories x S steps.

Lotka–Volterra (Tsit5, rtol 1e-6) integrated long enough for ~S steps per trajectory; the
gradient of sum(ys**2) w.r.t. the per-trajectory parameters on the recorded mesh. Reports
XLA's reserved memory for the compiled gradient (temporaries + outputs; the kernel's stored
node states are one of those temporaries) and the process's peak resident memory, for the
compiled kernel and, with ``--xla``, for the XLA replay (chunked ``jax.checkpoint``).

Run: ``python benchmarks/bench_memory.py [--n 10000] [--steps 5000] [--xla]``.
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import gradsolve as gs  # noqa: E402


def lotka_volterra(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(mesh, y0, p, kernel: bool) -> dict:
    with gs.use_compiled_kernel(kernel):
        loss = lambda q: jnp.sum(gs.replay(lotka_volterra, mesh, y0, q).ys ** 2)
        g = jax.jit(jax.grad(loss))
        ma = g.lower(p).compile().memory_analysis()
        t = time.perf_counter()
        jax.block_until_ready(g(p))
        first = time.perf_counter() - t
        t = time.perf_counter()
        jax.block_until_ready(g(p))
        second = time.perf_counter() - t
    return {
        "route": "kernel" if kernel else "xla",
        "xla_reserved_gb": (ma.temp_size_in_bytes + ma.output_size_in_bytes) / 2**30,
        "peak_rss_gb": peak_rss_gb(),
        "first_call_s": first,
        "grad_s": second,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=5_000)
    ap.add_argument("--xla", action="store_true", help="also measure the XLA replay (slow)")
    args = ap.parse_args(argv)
    n = args.n
    t1 = args.steps / 11.5  # ~11.5 accepted Tsit5 steps per time unit at rtol 1e-6
    rng = np.random.default_rng(0)
    p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((n, 4)) - 0.5)))
    y0 = jnp.ones((n, 2))
    ts = jnp.linspace(0.0, t1, 20)
    t = time.perf_counter()
    mesh = gs.record(lotka_volterra, 0.0, t1, y0, p, ts=ts, max_steps=4 * args.steps)
    rec = time.perf_counter() - t
    steps = np.asarray(mesh.n_steps)
    print(f"n = {n}, steps per trajectory {steps.min()}..{steps.max()} (mean {steps.mean():.0f}), "
          f"mesh capacity {mesh.capacity}; record {rec:.2f} s; peak RSS so far {peak_rss_gb():.2f} GB")
    state_gb = n * (mesh.capacity + 1) * 2 * 8 / 2**30
    print(f"stored node states (n x (S+1) x d float64): {state_gb:.2f} GB")
    rows = [measure(mesh, y0, p, True)]
    if args.xla:
        rows.append(measure(mesh, y0, p, False))
    for r in rows:
        print(f"{r['route']:>7}: gradient {r['grad_s']:.2f} s (first call {r['first_call_s']:.2f} s), "
              f"XLA reserved {r['xla_reserved_gb']:.2f} GB, process peak RSS {r['peak_rss_gb']:.2f} GB")
    return rows


if __name__ == "__main__":
    main()
