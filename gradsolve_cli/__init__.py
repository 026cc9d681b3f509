"""The ``gradsolve`` console command: ``gradsolve demo``, ``gradsolve bench`` and
``gradsolve build-cache``.

This is the one place that imports everything (``gradsolve``, ``models``, ``inference``);
the core never imports the layers above it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
import sys
import time


def _x64():
    import gradsolve as gs

    gs.enable_x64()


_REPEATS = 5  # timed runs per function in the demo; the best one is reported


def _cpus() -> int:
    from gradsolve._cpus import usable_cpus  # here: `gradsolve --help` imports no JAX

    return usable_cpus()


def _load_ratio() -> float | None:
    """The 1-minute load average per usable core (``None`` where the OS has none): above
    0.5, other work competes with the timed runs for the cores."""
    try:
        return os.getloadavg()[0] / _cpus()
    except (AttributeError, OSError):
        return None


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
    grads = {k: jax.block_until_ready(fn(p)) for k, fn in fns.items()}  # compiles each
    best = {k: float("inf") for k in fns}
    load_before = _load_ratio()
    for _ in range(_REPEATS):
        for k, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(p))
            best[k] = min(best[k], time.perf_counter() - t)
    load_after = _load_ratio()
    print(f"      timings: each function jit-compiled and run once first, then the best of "
          f"{_REPEATS} runs (wall clock, compilation excluded)")
    ref = "Diffrax gradient (RecursiveCheckpointAdjoint)"
    for k in fns:
        diff = float(np.max(np.abs(grads[k] - grads[ref])) / np.max(np.abs(grads[ref])))
        print(f"      {k:<48} {1e3 * best[k]:9.2f} ms  {best[ref] / best[k]:5.1f}x Diffrax's "
              f"speed  gradient max rel. diff vs Diffrax {diff:.1e}")
    print("      (each solves on its own adaptive mesh, so gradients agree to the tolerance; "
          "on one shared mesh they agree to ~1e-15: tutorial 07)")
    loaded = [r for r in (load_before, load_after) if r is not None and r > 0.5]
    if loaded:
        print(f"      warning: this machine was busy while timing (load average "
              f"{max(loaded) * _cpus():.1f} on {_cpus()} cores); the timings are noisy and "
              "the speed ratios may be understated")


def _demo_inference(out: str, quick: bool) -> None:
    """Fit and sample the lynx–hare data; write a summary, plots and the InferenceData."""
    import numpy as np

    import inference
    import models

    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    print("[2/2] Lynx–hare (Hudson's Bay Company pelts 1900–1920), Carpenter's Stan model")
    t = time.perf_counter()
    # 1,000 Adam steps reach the MAP (loss 126.69) from 16 starts; 300 do not (131.5)
    n_starts, steps = (16 if quick else 64), 1000
    fit = inference.fit(model, data, n_starts=n_starts, steps=steps, seed=0)
    print(f"      MAP fit: {n_starts} starts drawn from the priors x {steps} Adam steps, "
          f"{time.perf_counter() - t:.1f} s (wall clock, compilation included), "
          f"{fit.n_records} mesh records for "
          f"{fit.n_grad_evals} gradient evaluations; best start:")
    for k in model.priors:  # the order of the posterior summary below
        print(f"        {k:<8} {np.array2string(np.asarray(fit.params[k]), precision=4)}")
    import arviz as az

    t = time.perf_counter()
    nw, ns = (200, 200) if quick else (500, 1000)
    idata = inference.sample(model, data, num_warmup=nw, num_samples=ns, num_chains=2, seed=0)
    wall = time.perf_counter() - t
    idata.posterior = _named_components(idata.posterior, model)
    summary = az.summary(idata, var_names=list(model.priors))
    divergences = int(np.sum(np.asarray(idata.sample_stats["diverging"])))
    print(f"      NUTS: 2 chains x ({nw} warmup + {ns} samples) in {wall:.1f} s (wall clock, "
          f"compilation included), "
          f"{divergences} divergent transition{'s' if divergences != 1 else ''} after warmup")
    attrs = idata.sample_stats.attrs
    print(f"      divergence response: {attrs['divergence_response']}; sampling mesh: {attrs['sampling_mesh']} "
          f"(largest error ratio at a draw {attrs['max_error_ratio']:.2f} of the tolerance)")
    print(summary.to_string())
    os.makedirs(out, exist_ok=True)
    written = [os.path.join(out, name) for name in ("summary.csv", "lynx_hare.nc")]
    summary.to_csv(written[0])
    idata.to_netcdf(written[1])
    written += _plots(idata, model, data, out)
    print("      wrote:")
    for path in written:
        print(f"        {os.path.abspath(path)}")


# The lynx–hare model's theta = (alpha, beta, gamma, delta) (`models.lynx_hare`).
_THETA_NAMES = ("alpha", "beta", "gamma", "delta")


def _named_components(posterior, model):
    """``posterior`` with each vector parameter's components named, so that the summary
    and the trace plot say ``theta[alpha]``, ``z_init[hare]``, ``sigma[lynx]`` instead of
    indices: ``theta`` by the model's rates, ``z_init`` by its states, ``sigma`` by its
    observed quantities."""
    names = {"theta": _THETA_NAMES, "z_init": tuple(model.state_names),
             "sigma": tuple(model.observed_names)}
    for var, labels in names.items():
        if var not in posterior:
            continue
        dims = posterior[var].dims[2:]  # after (chain, draw)
        if len(dims) == 1 and posterior.sizes[dims[0]] == len(labels):
            posterior = posterior.assign_coords({dims[0]: list(labels)})
    return posterior


def _plots(idata, model, data, out: str) -> list[str]:
    """``trace.png`` (one panel per parameter component) and ``posterior_predictive.png``
    (the data with the 90 % posterior predictive band, noise included, per species)."""
    import matplotlib

    matplotlib.use("Agg")
    import arviz as az
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    import inference

    trace = os.path.join(out, "trace.png")
    axes = az.plot_trace(idata, var_names=list(model.priors), compact=False,
                         figsize=(10, 2.0 * sum(int(np.prod(np.shape(v))) for v in
                                                model.defaults.values())))
    for row in np.atleast_2d(axes):
        row[1].set_xlabel("draw")
        row[0].set_ylabel("density")
    plt.tight_layout(rect=(0, 0, 1, 0.98))
    plt.gcf().suptitle("NUTS trace: one row per parameter component (two chains)")
    plt.savefig(trace, dpi=80)
    plt.close("all")

    post = idata.posterior
    total = post.sizes["chain"] * post.sizes["draw"]
    picks = np.linspace(0, total - 1, 200).astype(int)
    flat = {k: np.asarray(post[k].values).reshape((total,) + post[k].shape[2:])[picks]
            for k in model.priors}
    ts = np.linspace(0.0, float(np.max(data.ts)), 101)
    # every picked draw's solve and observation noise, as one vectorised call
    sims = inference.predictive(model, ts, flat, seed=0)["obs"]  # (draws, len(ts), observed)
    lo, mid, hi = np.percentile(sims, [5, 50, 95], axis=0)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    names = data.names or tuple(f"state {j}" for j in range(data.ys.shape[1]))
    for j, name in enumerate(names):
        color, marker = f"C{j}", "os"[j % 2]
        ax.fill_between(1900 + ts, lo[:, j], hi[:, j], color=color, alpha=0.2,
                        label=f"{name}: 90 % posterior predictive")
        ax.plot(1900 + ts, mid[:, j], color=color, lw=1.2, label=f"{name}: predictive median")
        ax.plot(1900 + np.asarray(data.ts), np.asarray(data.ys)[:, j], marker, color=color,
                mec="k", label=f"{name}: observed")
    years = 1900 + np.asarray(data.ts)
    ax.set_xlim(years[0] - 0.5, years[-1] + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("year")
    ax.set_ylabel("pelts (thousands)")
    ax.set_title(f"Lynx–hare: data and posterior predictive ({len(picks)} draws, noise included)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    predictive = os.path.join(out, "posterior_predictive.png")
    fig.savefig(predictive, dpi=90)
    plt.close(fig)
    return [trace, predictive]


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, got {text!r}")
    return v


_COMMANDS = ("demo", "bench", "build-cache")


def _parse(ap: argparse.ArgumentParser, argv):
    """``ap.parse_args(argv)``, an unrecognised option answered with the closest ones."""
    args, unknown = ap.parse_known_args(argv)
    if unknown:
        options = [o for a in ap._actions for o in a.option_strings]
        bad = unknown[0]
        near = difflib.get_close_matches(bad.split("=")[0], options, n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(near)}?" if near else f"; its options: {', '.join(options)}"
        ap.error(f"unrecognized argument {bad!r}{hint}")
    return args


def demo(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gradsolve demo", description="Solve, differentiate, fit and sample: a tour on this machine.")
    ap.add_argument("--out", default="gradsolve-demo", help="output folder for plots and results (default: ./gradsolve-demo)")
    ap.add_argument("--n", type=_positive_int, default=1000,
                    help="trajectories in the Lotka–Volterra ensemble (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="smaller fit and shorter chains")
    args = _parse(ap, argv)
    _x64()
    _demo_core(args.n)
    _demo_inference(args.out, args.quick)
    return 0


def bench(argv=None) -> int:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if not os.path.isfile(os.path.join(here, "bench_core.py")):
        print("gradsolve bench: the benchmark scripts (benchmarks/ in the repository) are not "
              "installed with this package; run it from a source checkout installed with "
              "`pip install -e .`", file=sys.stderr)
        return 2
    _x64()
    sys.path.insert(0, here)
    import bench_core  # noqa: PLC0415 - the benchmark scripts live in benchmarks/

    # JSON into the working directory, not the checkout
    bench_core.main(list(argv or []), json_default="gradsolve-bench.json")
    return 0


class _SpecNotFound(ValueError):
    """A ``MODULE:ATTR`` whose module, file or attribute does not exist."""


def _load_spec(spec: str):
    """The object ``attr`` of ``module:attr`` (a module name, importable from the working
    directory, or a path to a ``.py`` file)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not MODULE:ATTR")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise _SpecNotFound(f"{spec!r}: no file {path}")
        name = "_gradsolve_build_cache_" + os.path.splitext(os.path.basename(path))[0]
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            # only the module named in the spec (or a package above it): an import that
            # fails inside the user's module is their code's error, with its traceback
            if e.name is None or not (module_name == e.name
                                      or module_name.startswith(e.name + ".")):
                raise
            raise _SpecNotFound(
                f"{spec!r}: no module named {module_name!r} (importable from "
                f"{os.getcwd()}; or give the path of a .py file)") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise _SpecNotFound(f"{spec!r}: module {module_name!r} has no {attr!r}") from None


def _problems(obj, spec: str) -> list[tuple]:
    """``(f, y0, params, solver)`` tuples from what ``spec`` names: a callable returning
    ``(f, y0, params)``, ``(f, y0, params, solver)`` or a list of those, or such a value."""
    value = obj() if callable(obj) else obj
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, tuple) or len(item) not in (3, 4):
            raise ValueError(f"{spec!r} must give (f, y0, params), (f, y0, params, solver) or a "
                             f"list of them, got {type(item).__name__}")
        out.append(tuple(item) + (None,) * (4 - len(item)))
    return out


def build_cache(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="gradsolve build-cache",
        description="Compile the CPU kernels of your vector fields into the kernel cache now "
                    "(gs.drivers.Kernel().prebuild), e.g. as a cluster job's first step, so "
                    "that later processes load them in milliseconds instead of compiling "
                    "on first use. Run it on the kind of machine the jobs run on (the "
                    "kernels are built for its CPU) and with the dtype they use.")
    ap.add_argument("specs", nargs="+", metavar="MODULE:ATTR",
                    help="a module (importable from here) or path/to/file.py, and a callable "
                         "in it returning (f, y0, params), (f, y0, params, solver) or a list "
                         "of those")
    ap.add_argument("--cache", metavar="DIR",
                    help="the cache folder (default: $GRADSOLVE_KERNEL_CACHE, else "
                         "~/.cache/gradsolve/kernels); jobs must use the same one")
    ap.add_argument("--x64", action="store_true",
                    help="64-bit floats (gs.enable_x64()) before importing the module, as a "
                         "job that calls gs.enable_x64() has: the kernels differ by dtype")
    args = _parse(ap, argv)
    import gradsolve as gs

    if args.cache:
        from gradsolve import _config

        folder = os.path.abspath(args.cache)
        os.environ["GRADSOLVE_KERNEL_CACHE"] = folder  # for the module imported below
        _config.SETTINGS = _config.SETTINGS._replace(kernel_cache=folder)  # read at import
    if args.x64:
        gs.enable_x64()
    try:
        problems = [(spec, p) for spec in args.specs for p in _problems(_load_spec(spec), spec)]
    except _SpecNotFound as e:  # a well-formed spec naming nothing: one line, no usage
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        ap.error(str(e))
    failed = 0
    for spec, (f, y0, params, solver) in problems:
        import jax.numpy as jnp

        name = getattr(f, "__qualname__", type(f).__name__)
        what = (f"{name} from {spec} ({jnp.result_type(y0)}, "
                f"{type(solver or gs.Tsit5()).__name__})")
        try:
            info = gs.drivers.Kernel().prebuild(f, y0, params, solver=solver)
        except ValueError as e:
            failed += 1
            print(f"not built: {what}: {e}", file=sys.stderr)
            continue
        how = (f"compiled in {info.compile_s:.1f} s" if info.compile_s > 0
               else "already in the cache")
        print(f"{what}: {info.source_mb:.2f} MB of C++, {how} ({info.seconds:.1f} s in all); "
              f"{len(info.files)} files in {info.folder}")
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="gradsolve", description="gradsolve: record, replay, differentiate ODE ensembles.")
    ap.add_argument("command", choices=_COMMANDS,
                    help="demo: solve/fit/sample tour; bench: benchmark table vs Diffrax; "
                         "build-cache: compile the CPU kernels of your vector fields ahead "
                         "of time (see gradsolve build-cache --help)")
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0
    if argv[0] in ("--version", "-V"):
        import gradsolve

        print(f"gradsolve {gradsolve.__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        return demo(rest)
    if cmd == "bench":
        return bench(rest)
    if cmd == "build-cache":
        return build_cache(rest)
    if cmd.startswith("-"):
        ap.error(f"unrecognized option {cmd!r}; options other than --help and --version "
                 "follow the command, e.g. gradsolve demo --quick (see gradsolve demo --help)")
    near = difflib.get_close_matches(cmd, _COMMANDS, n=1, cutoff=0.5)
    hint = f"; did you mean {near[0]!r}?" if near else "."
    ap.error(f"unknown command {cmd!r}{hint} The commands: {', '.join(_COMMANDS)}.")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
