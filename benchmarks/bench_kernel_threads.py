"""A PEtab objective and gradient on the compiled kernel: one kernel thread against all.

For each problem: ``models.load_petab(yaml, hierarchical=False)`` at its defaults, then
``jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))`` at the nominal
parameters. The script first prints how that program reaches the kernel: its kernel calls
(``rec``: the record, ``fwd``: the replay, ``bwd``: its adjoint; pre-equilibration is a
solve of its own), the trajectories each call carries (every condition is a lane of one
call, not one call per condition) and the threads each call runs on (the kernel's rule,
`gradsolve.drivers.kernel.build.threads`). Then it times the compiled program
with the kernel on one thread (``GRADSOLVE_KERNEL_THREADS=1``, read at every call) and on
``--threads`` (default: the CPUs this process may use), calls interleaved so machine load
hits both alike: the best wall time and the best process CPU time (all threads) of
``--repeats`` calls each. Values and gradients of the two are compared (they are equal:
trajectories are independent lanes, whichever thread runs them).

On a busy shared machine only the ratios mean anything; run it on a quiet one::

    nice -n 19 .venv/bin/python benchmarks/bench_kernel_threads.py
    nice -n 19 .venv/bin/python benchmarks/bench_kernel_threads.py Bachmann_MSB2011 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import re
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PROBLEMS = ("Fujita_SciSignal2010", "Bachmann_MSB2011", "Isensee_JCB2018")
COLLECTION = "/work/shared/petab-benchmark-collection"


def kernel_calls(lowered_text: str) -> list[tuple[str, str, int]]:
    """``(kernel, part, trajectories)`` of each kernel call in a lowered program: the
    kernel's target prefix, the part (``rec``/``fwd``/``bwd``/``bwdt``) and the leading
    axis of its first result."""
    calls = []
    for line in lowered_text.splitlines():
        m = re.search(r"stablehlo\.custom_call @(gradsolve_\w+?)_(rec|fwd|bwdt|bwd)\(", line)
        if m:
            res = re.search(r"->\s*\(?tensor<(\d+)", line)
            calls.append((m.group(1), m.group(2), int(res.group(1)) if res else -1))
    return calls


def timed(fn, x, threads: int | None):
    """``(wall s, process CPU s, (value, gradient))`` of one call of ``fn(x)`` with the
    kernel on ``threads`` (``None``: its default)."""
    if threads is None:
        os.environ.pop("GRADSOLVE_KERNEL_THREADS", None)
    else:
        os.environ["GRADSOLVE_KERNEL_THREADS"] = str(threads)
    w, c = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(x))
    return time.perf_counter() - w, time.process_time() - c, out


def run(name: str, threads: int, repeats: int) -> None:
    import models
    from gradsolve.drivers.kernel import build

    problem = models.load_petab(f"{COLLECTION}/{name}/{name}.yaml", hierarchical=False)
    vg = jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))
    x = jnp.asarray(problem.nominal)
    t = time.perf_counter()
    calls = kernel_calls(vg.lower(x).as_text())
    print(f"\n{name}: {len(problem.state_ids)} states, {len(problem.condition_ids)} "
          f"conditions, solver {type(problem.solver).__name__}")
    for prefix, part, n in calls:
        print(f"  kernel call {part:4s} {n:4d} trajectories: {build.threads(prefix, n, 1)} "
              f"thread at threads=1, {build.threads(prefix, n, threads)} at {threads}")
    if not calls:
        print("  no kernel call (the XLA drivers run it)")
        return
    jax.block_until_ready(vg(x))  # compile (and the kernel's build, if not cached)
    print(f"  first call {time.perf_counter() - t:.1f} s")
    rows = {1: [], threads: []}
    outs = {}
    for _ in range(repeats):
        for k in rows:
            w, c, outs[k] = timed(vg, x, k)
            rows[k].append((w, c))
    os.environ.pop("GRADSOLVE_KERNEL_THREADS", None)
    (v1, g1), (vn, gn) = outs[1], outs[threads]
    same = float(jnp.max(jnp.abs(g1 - gn))), float(abs(v1 - vn))
    w1, c1 = (min(r[i] for r in rows[1]) for i in (0, 1))
    wn, cn = (min(r[i] for r in rows[threads]) for i in (0, 1))
    print(f"  1 thread : wall {1e3 * w1:9.1f} ms  cpu {1e3 * c1:9.1f} ms")
    print(f"  {threads} threads: wall {1e3 * wn:9.1f} ms  cpu {1e3 * cn:9.1f} ms  "
          f"(wall x{w1 / wn:.2f}, cpu x{cn / c1:.2f})")
    print(f"  |value diff| {same[1]:.1e}, max |gradient diff| {same[0]:.1e}")


def main(argv=None) -> int:
    from gradsolve._cpus import usable_cpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", default=PROBLEMS)
    ap.add_argument("--threads", type=int, default=usable_cpus(),
                    help="the kernel threads to compare with one (default: usable CPUs)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"kernel threads: 1 against {args.threads}; best of {args.repeats} interleaved "
          f"calls; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for name in args.problems:
        run(name, args.threads, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
