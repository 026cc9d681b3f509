"""Rosenbrock solvers (Rodas5P, Rosenbrock23) on the compiled CPU kernel against the XLA
replay: the replay gradient on one recorded mesh, and a per-step profile.

For each problem and ensemble size a mesh is recorded once (XLA record), then, on that
same mesh, under ``jax.jit`` and after a warm-up call:

- ``grad``: the gradient of ``sum(w * ys)`` (fixed random weights, each state scaled by
  its largest value) w.r.t. ``(y0, params)`` through
  ``gs.replay`` with ``driver=gs.drivers.Batched()`` (XLA: vmapped steps, JAX's AD) and
  with ``driver=gs.drivers.Kernel()`` (C++ forward and adjoint);
- ``forward``: the values only, both ways;
- ``record``: ``gs.record`` both ways (the kernel's record runs the same controller);

best of ``--repeats`` calls, interleaved so machine load hits both sides alike. The
per-step profile divides each time by the accepted steps summed over trajectories
(microseconds per trajectory-step); ``reverse`` is ``grad - forward``. The kernel's values
and gradients are checked against XLA's (1e-9 relative) before anything is timed.

Problems: Robertson (3 states, ``k1, k2, k3`` spread ±10 %, log-spaced save times to
``t = 1e5``, rtol 1e-6, atol 1e-10) at N = 64 and 1,024, and, where the ``[petab]`` extra
and the collection load, PEtab problems' vector fields (``--petab``, default Boehm
JProteomeRes 2014, 8 states; e.g. ``Bachmann_MSB2011``, 25 states) at their nominal
parameters, their conditions tiled to N (their tolerances, Boehm's rtol 1e-8, atol 1e-12). Rosenbrock23, an order-2 method, runs at rtol 1e-4 / atol 1e-8 at least.

``--reuse-probe``: instead, the kernel's reverse sweep per step as built and without its
factorisation of ``W`` (what reusing the forward's factors could save at most), on one
kernel thread, best process CPU time of ``--repeats`` interleaved calls.

Usage: ``python benchmarks/bench_kernel_rosenbrock.py [--sizes 64,1024] [--repeats 5]
[--solvers Rodas5P,Rosenbrock23] [--petab Boehm_JProteomeRes2014,Bachmann_MSB2011]
[--no-boehm] [--reuse-probe]``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gradsolve as gs  # noqa: E402

import bench_core  # noqa: E402  (this folder is on sys.path when a script here runs)


def robertson(t, y, k):
    r1 = k[0] * y[0]
    r2 = k[1] * y[1] ** 2
    r3 = k[2] * y[1] * y[2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


def robertson_problem(n: int):
    y0 = jnp.tile(jnp.array([1.0, 0.0, 0.0]), (n, 1))
    spread = 1 + 0.1 * jnp.sin(jnp.arange(n) * 1.7)[:, None] * jnp.array([1.0, -1.0, 0.5])
    p = jnp.array([0.04, 3e7, 1e4]) * spread
    ts = jnp.logspace(-4, 5, 19)
    return "robertson", robertson, 0.0, 1e5, y0, p, ts, 1e-6, 1e-10


COLLECTION = Path("/work/shared/petab-benchmark-collection")


def petab_problem(name: str, n: int, collection: Path = COLLECTION):
    """The PEtab problem ``name``'s field at its nominal parameters, its conditions tiled
    to ``n`` and their parameters spread by 1 % (``None`` where it does not load or has
    switches). Looked for in the tests' data, then in ``collection``."""
    try:
        import models

        here = Path(__file__).resolve().parents[1] / "tests" / "data" / "petab" / name
        folder = here if here.is_dir() else collection / name
        yaml = sorted(folder.glob(f"{name}.yaml")) or sorted(folder.glob("*.yaml"))
        problem = models.load_petab(yaml[0] if yaml else folder, hierarchical=False)
    except Exception as e:  # noqa: BLE001 - optional
        print(f"{name}: not loaded ({type(e).__name__}: {e})")
        return None
    y0, p, _, jumps = problem._inputs(jnp.asarray(problem.nominal))
    if jumps is not None:
        print(f"{name}: has switches (jumps); not benchmarked here")
        return None
    reps = -(-n // y0.shape[0])
    y0 = jnp.tile(y0, (reps, 1))[:n]
    p = jnp.tile(p, (reps, 1))[:n] * (1 + 0.01 * jnp.sin(jnp.arange(n))[:, None])
    ts = jnp.asarray(problem.ts)
    label = f"{name.split('_')[0].lower()}({y0.shape[1]})"
    return (label, problem.vector_field, 0.0, float(problem._t1), y0, p, ts,
            problem.rtol, problem.atol)


def bench(case, solver, repeats: int) -> dict:
    name, f, t0, t1, y0, p, ts, rtol, atol = case
    if isinstance(solver, gs.Rosenbrock23):  # an order-2 method: loose tolerances
        rtol, atol = max(rtol, 1e-4), max(atol, 1e-8)
    n = y0.shape[0]
    xla, kernel = gs.drivers.Batched(), gs.drivers.Kernel()
    kw = dict(ts=ts, solver=solver, rtol=rtol, atol=atol, max_steps=4096)
    mesh = gs.record(f, t0, t1, y0, p, driver=xla, **kw)
    steps = float(jnp.sum(mesh.n_steps))

    # fixed weights over the saved values, each state scaled by its size: a well-conditioned
    # loss (a log of the values would divide by states that pass near zero, where two
    # correct solvers differ in relative terms)
    ys0 = gs.replay(f, mesh, y0, p, driver=xla).ys
    w = jax.random.normal(jax.random.PRNGKey(0), ys0.shape) / (
        jnp.max(jnp.abs(ys0), axis=(0, 1), keepdims=True) + 1e-300)

    def loss(drv):
        def fn(y, q):
            ys = gs.replay(f, mesh, y, q, driver=drv).ys
            return jnp.sum(w * ys)
        return fn

    grads = {k: jax.jit(jax.grad(loss(d), argnums=(0, 1))) for k, d in
             (("xla", xla), ("kernel", kernel))}
    fwds = {k: jax.jit(lambda y, q, d=d: gs.replay(f, mesh, y, q, driver=d).ys) for k, d in
            (("xla", xla), ("kernel", kernel))}
    recs = {k: jax.jit(lambda y, q, d=d: gs.record(f, t0, t1, y, q, driver=d, **kw).n_steps)
            for k, d in (("xla", xla), ("kernel", kernel))}
    # The kernel against XLA on this mesh before timing.
    ys_k, ys_x = fwds["kernel"](y0, p), fwds["xla"](y0, p)
    np.testing.assert_allclose(ys_k, ys_x, rtol=1e-9, atol=1e-12 * float(jnp.max(jnp.abs(ys_x))))
    # the gradients' largest difference, relative to their largest entry: ~1e-12 on
    # Robertson, Boehm and Bachmann; ~1e-4 for Laske's y0 (34 states, W's relative pivots
    # down to 1e-10), where the kernel's dense LU (partial pivoting, as XLA's) differs
    # from XLA's by as much as its sparse one (1.0e-4 and 7.3e-5, 3 conditions): the
    # arithmetic's conditioning, not an error of either
    gaps = [float(jnp.max(jnp.abs(gk - gx)) / jnp.max(jnp.abs(gx)))
            for gk, gx in zip(grads["kernel"](y0, p), grads["xla"](y0, p))]
    print(f"{name:>9} kernel - XLA gradients, largest difference / largest entry: "
          f"y0 {gaps[0]:.1e}, params {gaps[1]:.1e}")
    assert max(gaps) < 1e-3, gaps
    fns = {f"grad_{k}": (lambda g=g: g(y0, p)) for k, g in grads.items()}
    fns.update({f"fwd_{k}": (lambda g=g: g(y0, p)) for k, g in fwds.items()})
    fns.update({f"rec_{k}": (lambda g=g: g(y0, p)) for k, g in recs.items()})
    for fn in fns.values():  # compile and warm up before timing
        jax.block_until_ready(fn())
    t = bench_core._best(fns, repeats)
    us = lambda s: 1e6 * s / steps
    row = dict(problem=name, solver=type(solver).__name__, n=n, steps=steps, **t)
    print(f"{name:>9} {type(solver).__name__:>12} N={n:>5} rtol={rtol:g} steps={steps:>8.0f} "
          f"| grad xla "
          f"{1e3 * t['grad_xla']:8.1f} ms kernel {1e3 * t['grad_kernel']:7.1f} ms "
          f"x{t['grad_xla'] / t['grad_kernel']:5.1f} | fwd x{t['fwd_xla'] / t['fwd_kernel']:5.1f}"
          f" | record x{t['rec_xla'] / t['rec_kernel']:5.1f}")
    print(f"{'':>9} per trajectory-step (us): forward xla {us(t['fwd_xla']):7.2f} kernel "
          f"{us(t['fwd_kernel']):6.3f} | reverse xla {us(t['grad_xla'] - t['fwd_xla']):7.2f} "
          f"kernel {us(t['grad_kernel'] - t['fwd_kernel']):6.3f} | record xla "
          f"{us(t['rec_xla']):7.2f} kernel {us(t['rec_kernel']):6.3f}", flush=True)
    return row


def reuse_probe(case, solver, repeats: int) -> dict:
    """The kernel's replay gradient on one mesh as built, and with a probe build whose
    reverse step skips its factorisation of ``W`` (``GS_ROSENBROCK_REUSE_PROBE``; its
    derivatives are wrong, its time is what carrying the forward's factors could save at
    most, before the cost of storing and reading them)."""
    from gradsolve.drivers.kernel import driver as kernel_driver

    name, f, t0, t1, y0, p, ts, rtol, atol = case
    if isinstance(solver, gs.Rosenbrock23):
        rtol, atol = max(rtol, 1e-4), max(atol, 1e-8)
    mesh = gs.record(f, t0, t1, y0, p, ts=ts, solver=solver, rtol=rtol, atol=atol,
                     max_steps=4096, driver=gs.drivers.Batched())
    steps = float(jnp.sum(mesh.n_steps))
    kernel = gs.drivers.Kernel()
    probe_f = lambda t, y, q: f(t, y, q)  # noqa: E731 - another field: a kernel of its own
    generate = kernel_driver.generate
    kernel_driver.generate = lambda *a: "#define GS_ROSENBROCK_REUSE_PROBE\n" + generate(*a)
    try:
        kernel_driver.kernel_target(probe_f, solver, y0, p)
    finally:
        kernel_driver.generate = generate

    def grad(field):
        loss = lambda y, q: jnp.sum(gs.replay(field, mesh, y, q, driver=kernel).ys ** 2)
        return jax.jit(jax.grad(loss, argnums=(0, 1)))

    fns = {"grad": grad(f), "probe": grad(probe_f)}
    fwd = jax.jit(lambda y, q: gs.replay(f, mesh, y, q, driver=kernel).ys)
    calls = {k: (lambda g=g: g(y0, p)) for k, g in fns.items()}
    calls["fwd"] = lambda: fwd(y0, p)
    # One kernel thread and the process's CPU time, not wall time: on a shared machine
    # the load moves wall times by more than the difference measured here.
    os.environ["GRADSOLVE_KERNEL_THREADS"] = "1"
    for fn in calls.values():
        jax.block_until_ready(fn())
    t = {k: float("inf") for k in calls}
    for _ in range(repeats):
        for k, fn in calls.items():
            c = time.process_time()
            jax.block_until_ready(fn())
            t[k] = min(t[k], time.process_time() - c)
    us = lambda s: 1e6 * s / steps
    rev, rev_probe = t["grad"] - t["fwd"], t["probe"] - t["fwd"]
    print(f"{name:>9} {type(solver).__name__:>12} N={y0.shape[0]:>5} d={y0.shape[1]} | reverse "
          f"{us(rev):6.3f} us/step, without its factorisation {us(rev_probe):6.3f} us/step: "
          f"carrying the factors saves at most {100 * (rev - rev_probe) / rev:4.1f} % of the "
          f"reverse sweep", flush=True)
    return dict(problem=name, reverse_us=us(rev), probe_us=us(rev_probe))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,1024")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--solvers", default="Rodas5P,Rosenbrock23")
    ap.add_argument("--petab", default="Boehm_JProteomeRes2014",
                    help="PEtab problems beside Robertson, comma-separated ('' for none)")
    ap.add_argument("--no-boehm", action="store_true", help="the same as --petab ''")
    ap.add_argument("--reuse-probe", action="store_true",
                    help="time the reverse sweep with and without its factorisation")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    solvers = [getattr(gs, s)() for s in args.solvers.split(",")]
    for n in sizes:
        cases = [robertson_problem(n)]
        names = [] if args.no_boehm else [s for s in args.petab.split(",") if s]
        cases += [c for c in (petab_problem(name, n) for name in names) if c is not None]
        for case in cases:
            for solver in solvers:
                (reuse_probe if args.reuse_probe else bench)(case, solver, args.repeats)


if __name__ == "__main__":
    main()
