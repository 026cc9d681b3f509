"""The ``gradsolve`` console command: ``gradsolve demo`` and ``gradsolve bench``.

This is the one place that imports everything (``gradsolve``, ``models``, ``inference``);
the core never imports the layers above it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _x64():
    import gradsolve as gs

    gs.enable_x64()


def _demo_core(n: int) -> None:
    """An ensemble of Lotka–Volterra solves and gradients, next to Diffrax."""
    import diffrax
    import jax
    import jax.numpy as jnp
    import numpy as np

    import gradsolve as gs

    def lv(t, y, p):
        return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])

    rng = np.random.default_rng(0)
    p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((n, 4)) - 0.5)))
    y0 = jnp.ones((n, 2))
    ts = jnp.linspace(0.0, 10.0, 20)
    rtol, atol = 1e-6, 1e-8
    print(f"[1/2] Lotka–Volterra ensemble: n = {n} trajectories, 20 save times on [0, 10], "
          f"Tsit5, rtol={rtol}, atol={atol}")
    mesh = gs.record(lv, 0.0, 10.0, y0, p, ts=ts, rtol=rtol, atol=atol)
    print(f"      recorded mesh: {float(np.mean(mesh.n_steps)):.0f} accepted steps per "
          f"trajectory on average ({int(np.sum(mesh.n_rejected))} rejections in all)")
    term = diffrax.ODETerm(lambda t, y, a: lv(t, y, a))

    def dfx_loss(q):
        def one(a, b):
            return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 10.0, None, a, args=b,
                                       saveat=diffrax.SaveAt(ts=ts), max_steps=4096,
                                       stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol)).ys
        return jnp.sum(jax.vmap(one)(y0, q) ** 2)

    fns = {
        "gradsolve replay gradient (mesh reused)": jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(lv, mesh, y0, q).ys ** 2))),
        "gradsolve solve gradient (record + replay)": jax.jit(jax.grad(lambda q: jnp.sum(gs.solve(lv, 0.0, 10.0, y0, q, ts=ts, rtol=rtol, atol=atol).ys ** 2))),
        "Diffrax gradient (RecursiveCheckpointAdjoint)": jax.jit(jax.grad(dfx_loss)),
    }
    grads = {k: jax.block_until_ready(fn(p)) for k, fn in fns.items()}
    best = {k: float("inf") for k in fns}
    for _ in range(5):
        for k, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(p))
            best[k] = min(best[k], time.perf_counter() - t)
    ref = "Diffrax gradient (RecursiveCheckpointAdjoint)"
    for k in fns:
        diff = float(np.max(np.abs(grads[k] - grads[ref])) / np.max(np.abs(grads[ref])))
        print(f"      {k:<48} {1e3 * best[k]:9.2f} ms  {best[ref] / best[k]:5.1f}x Diffrax's "
              f"speed  gradient max rel. diff vs Diffrax {diff:.1e}")
    print("      (each solves on its own adaptive mesh, so gradients agree to the tolerance; "
          "on one shared mesh they agree to ~1e-15: tutorial 07)")


def _demo_inference(out: str, quick: bool) -> None:
    """Fit and sample the lynx–hare data; write a summary, plots and the InferenceData."""
    import numpy as np

    import inference
    import models

    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    print("[2/2] Lynx–hare (Hudson's Bay Company pelts 1900–1920), Carpenter's Stan model")
    t = time.perf_counter()
    # 1,000 Adam steps reach the MAP (loss 126.69) from 16 starts; 300 do not (131.5)
    fit = inference.fit(model, data, n_starts=16 if quick else 64, steps=1000, seed=0)
    print(f"      MAP fit: {time.perf_counter() - t:.1f} s, {fit.n_records} mesh records for "
          f"{fit.n_grad_evals} gradient evaluations")
    for k, v in fit.params.items():
        print(f"        {k:<8} {np.array2string(np.asarray(v), precision=4)}")
    if not hasattr(inference, "sample"):
        return
    import arviz as az

    t = time.perf_counter()
    nw, ns = (200, 200) if quick else (500, 1000)
    idata = inference.sample(model, data, num_warmup=nw, num_samples=ns, num_chains=2, seed=0)
    wall = time.perf_counter() - t
    summary = az.summary(idata, var_names=list(model.priors))
    print(f"      NUTS: 2 chains x ({nw} warmup + {ns} samples) in {wall:.1f} s")
    print(summary.to_string())
    os.makedirs(out, exist_ok=True)
    summary.to_csv(os.path.join(out, "summary.csv"))
    idata.to_netcdf(os.path.join(out, "lynx_hare.nc"))
    _plots(idata, model, data, out)
    print(f"      wrote summary.csv, lynx_hare.nc and plots to {os.path.abspath(out)}")


def _plots(idata, model, data, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import arviz as az
    import jax
    import matplotlib.pyplot as plt
    import numpy as np

    az.plot_trace(idata, var_names=list(model.priors))
    plt.tight_layout()
    plt.savefig(os.path.join(out, "trace.png"), dpi=90)
    plt.close("all")
    post = idata.posterior
    draws = [{k: np.asarray(post[k].values).reshape((-1,) + post[k].shape[2:])[i] for k in model.priors}
             for i in np.linspace(0, post.sizes["chain"] * post.sizes["draw"] - 1, 40).astype(int)]
    ts = np.linspace(0.0, float(np.max(data.ts)), 200)
    fig, ax = plt.subplots(figsize=(8, 4))
    for d in draws:
        pred = np.asarray(model.predict(jax.tree_util.tree_map(np.asarray, d), ts))
        ax.plot(1900 + ts, pred[:, 0], color="C0", alpha=0.15)
        ax.plot(1900 + ts, pred[:, 1], color="C1", alpha=0.15)
    ax.plot(1900 + np.asarray(data.ts), np.asarray(data.ys)[:, 0], "o", color="C0", label="hare")
    ax.plot(1900 + np.asarray(data.ts), np.asarray(data.ys)[:, 1], "s", color="C1", label="lynx")
    ax.set_xlabel("year")
    ax.set_ylabel("pelts (thousands)")
    ax.set_title("Lynx–hare: data and 40 posterior draws")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "posterior_predictive.png"), dpi=90)
    plt.close(fig)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, got {text!r}")
    return v


def demo(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gradsolve demo", description="Solve, differentiate, fit and sample: a tour on this machine.")
    ap.add_argument("--out", default="gradsolve-demo", help="output folder for plots and results (default: ./gradsolve-demo)")
    ap.add_argument("--n", type=_positive_int, default=1000,
                    help="trajectories in the Lotka–Volterra ensemble (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="smaller fit and shorter chains")
    args = ap.parse_args(argv)
    _x64()
    _demo_core(args.n)
    try:
        import inference

        has_fit = hasattr(inference, "fit")
    except ImportError:
        has_fit = False
    if has_fit:
        _demo_inference(args.out, args.quick)
    else:
        print("[2/2] inference layer not available in this build; skipped fitting and sampling")
    return 0


def bench(argv=None) -> int:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if not os.path.isfile(os.path.join(here, "bench_core.py")):
        print("gradsolve bench: the benchmark scripts (benchmarks/ in the repository) are not "
              "installed with this package; run it from a source checkout installed with "
              "`pip install -e .`", file=sys.stderr)
        return 2
    argv = list(argv or [])
    if not any(a == "--json" or a.startswith("--json=") for a in argv):
        argv += ["--json", "gradsolve-bench.json"]  # the working directory, not the checkout
    _x64()
    sys.path.insert(0, here)
    import bench_core  # noqa: PLC0415 - the benchmark scripts live in benchmarks/

    bench_core.main(argv)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="gradsolve", description="gradsolve: record, replay, differentiate ODE ensembles.")
    ap.add_argument("command", choices=["demo", "bench"], help="demo: solve/fit/sample tour; bench: benchmark table vs Diffrax")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        return demo(rest)
    if cmd == "bench":
        return bench(rest)
    ap.error(f"unknown command {cmd!r}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
