"""Fit time: inference.fit (gradsolve mesh reuse) vs the same Optax loop on Diffrax.

Both sides minimise the same MAP objective of the Lotka–Volterra zoo model on the same
synthetic data, from the same N prior draws, with the same optimizer (Adam 3e-2) on the same
unconstrained vector for the same number of steps, in one process:

- gradsolve: ``inference.fit(n_starts=N)`` (one ensemble record, replay gradients,
  re-records on drift);
- Diffrax: a jitted step of ``jax.value_and_grad`` through ``vmap(diffeqsolve)`` (Tsit5,
  PIDController at the same rtol/atol, default ``RecursiveCheckpointAdjoint``) + Optax.

Reported: wall time of the whole fit (compile included) and of the steady-state steps,
the best final loss of each, and the ratios. Usage::

    python benchmarks/bench_fit.py            # N = 1000 starts, 300 steps
    python benchmarks/bench_fit.py --quick    # N = 100, 100 steps

Writes ``benchmarks/results/bench_fit[_quick].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import inference  # noqa: E402
import models  # noqa: E402
from inference import ParamSpace  # noqa: E402

RTOL, ATOL = 1e-6, 1e-8


def problem():
    m = models.lotka_volterra()
    true = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    true["sigma"] = jnp.asarray(0.05)
    data = m.simulate(jax.random.PRNGKey(1), true, np.linspace(0.5, 10.0, 20))
    return m, data


def starts(m, n, seed):
    """The same starting points inference.fit(init=None, seed=seed) draws."""
    key = jax.random.PRNGKey(seed)
    _, k0 = jax.random.split(key)
    return m.sample_prior(k0, n)


def run_gradsolve(m, data, n, steps, seed):
    marks = {}

    def cb(step, info):
        if step == 10:
            marks["t10"] = time.perf_counter()

    t0 = time.perf_counter()
    res = inference.fit(m, data, n_starts=n, steps=steps, optimizer=optax.adam(3e-2),
                        seed=seed, rtol=RTOL, atol=ATOL, progress=False, callback=cb)
    t1 = time.perf_counter()
    steady = (t1 - marks["t10"]) / (steps - 10) if "t10" in marks else float("nan")
    return dict(total_s=t1 - t0, per_step_ms=1e3 * steady, best_loss=float(res.loss),
                n_records=res.n_records, n_grad_evals=res.n_grad_evals,
                n_failed=int(np.sum(res.status != 0)))


def run_diffrax(m, data, n, steps, seed):
    space = ParamSpace(m.priors)
    ts = jnp.asarray(data.ts, dtype=float)
    t_end = float(np.asarray(data.ts)[-1])
    ys = jnp.asarray(data.ys)
    term = diffrax.ODETerm(lambda t, y, args: m.vector_field(t, y, args))
    ctrl = diffrax.PIDController(rtol=RTOL, atol=ATOL)

    def one(p):
        sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), m.t0, t_end, None,
                                  m.y0, args=p, saveat=diffrax.SaveAt(ts=ts),
                                  stepsize_controller=ctrl, max_steps=4096, throw=False,
                                  adjoint=diffrax.RecursiveCheckpointAdjoint())
        yp = sol.ys[:, np.asarray(m.observed)]
        ok = jnp.all(jnp.isfinite(yp))
        ll = jnp.sum(m.noise(p, jnp.where(ok, yp, 1.0)).log_prob(ys))
        return jnp.where(ok, ll, -jnp.inf)

    opt = optax.adam(3e-2)

    def losses(u):
        x = space.from_unconstrained(u)
        loss = -(jax.vmap(one)(x) + m.log_prior(x))
        return jnp.where(jnp.isfinite(loss), loss, jnp.inf)

    @jax.jit
    def step(u, st):
        def tot(u):
            ls = losses(u)
            return jnp.sum(jnp.where(jnp.isfinite(ls), ls, 0.0)), ls

        (_, ls), g = jax.value_and_grad(tot, has_aux=True)(u)
        g = jnp.where(jnp.isfinite(ls)[:, None] & jnp.isfinite(g), g, 0.0)
        upd, st = opt.update(g, st, u)
        return optax.apply_updates(u, upd), st, ls

    u = space.to_unconstrained(starts(m, n, seed))
    t0 = time.perf_counter()
    st = opt.init(u)
    t10 = None
    for i in range(steps):
        u, st, ls = step(u, st)
        if i == 9:
            jax.block_until_ready(u)
            t10 = time.perf_counter()
    jax.block_until_ready(u)
    t1 = time.perf_counter()
    final = np.asarray(jax.jit(losses)(u))
    return dict(total_s=t1 - t0, per_step_ms=1e3 * (t1 - t10) / (steps - 10),
                best_loss=float(np.min(final[np.isfinite(final)])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=100 starts, 100 steps")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = args.n or (100 if args.quick else 1000)
    steps = args.steps or (100 if args.quick else 300)
    m, data = problem()
    print(f"Lotka–Volterra MAP fit: {n} starts x {steps} Adam steps, rtol={RTOL}, atol={ATOL}")
    gs_res = run_gradsolve(m, data, n, steps, args.seed)
    dfx_res = run_diffrax(m, data, n, steps, args.seed)
    ratio_total = dfx_res["total_s"] / gs_res["total_s"]
    ratio_step = dfx_res["per_step_ms"] / gs_res["per_step_ms"]
    rows = [
        ("", "gradsolve", "diffrax", "ratio (diffrax/gradsolve)"),
        ("total wall (s, compile incl.)", f"{gs_res['total_s']:.2f}", f"{dfx_res['total_s']:.2f}",
         f"{ratio_total:.2f}x"),
        ("steady step (ms)", f"{gs_res['per_step_ms']:.2f}", f"{dfx_res['per_step_ms']:.2f}",
         f"{ratio_step:.2f}x"),
        ("best final loss", f"{gs_res['best_loss']:.5f}", f"{dfx_res['best_loss']:.5f}", ""),
        ("records / grad evals", f"{gs_res['n_records']} / {gs_res['n_grad_evals']}",
         f"{steps} solves / {steps}", ""),
    ]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    out = dict(benchmark="fit", model="lotka_volterra", n_starts=n, steps=steps, rtol=RTOL,
               atol=ATOL, gradsolve=gs_res, diffrax=dfx_res, ratio_total=ratio_total,
               ratio_step=ratio_step, quick=args.quick, jax=jax.__version__,
               machine=platform.platform(), cpus=os.cpu_count(),
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "bench_fit_quick.json" if args.quick else "bench_fit.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
