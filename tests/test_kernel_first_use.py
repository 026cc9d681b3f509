"""First use of the compiled kernel: `gs.drivers.Auto` builds an expensive kernel in the
background and runs the XLA drivers meanwhile (routes named truthfully, the same results);
an explicit `gs.drivers.Kernel()` waits for it; `Kernel.prebuild` (and ``gradsolve
build-cache``) fills the cache so that a fresh process loads the kernel without compiling.

The threshold (``$GRADSOLVE_KERNEL_BACKGROUND_S``) is lowered here so that small fields
count as expensive; the background compiler is held until the test releases it, so what
runs before and after the build is deterministic."""

import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from gradsolve import _config
from gradsolve.drivers.kernel import build
from gradsolve.drivers.kernel import driver as kernel_driver

requires_compiler = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")


@pytest.fixture
def fresh_kernels(monkeypatch, tmp_path):
    """An empty kernel cache, nothing loaded, every build counted as expensive, and the
    background compiler held until ``release`` is set."""
    monkeypatch.setattr(_config, "SETTINGS", _config.SETTINGS._replace(
        kernel_cache=str(tmp_path / "kernels"), kernel_background_s=1e-3))
    for name in ("_registered", "_built", "_background", "_warned", "_failed"):
        monkeypatch.setattr(build, name, {})
    monkeypatch.setattr(kernel_driver, "_sources", {})
    monkeypatch.setattr(kernel_driver, "_building_sources", {})
    release = threading.Event()
    real = build._compile_all

    def held(*args, background=False, **kw):
        if background:
            assert release.wait(120), "the test never released the background build"
        return real(*args, background=background, **kw)

    monkeypatch.setattr(build, "_compile_all", held)
    yield release
    release.set()
    build.wait(300)


def _problem(n, w):
    """A field no other test builds (``w``: one per test, since XLA keeps a registered
    kernel for the process)."""
    def damped(t, y, p):
        return jnp.stack([y[1], -p[0] * y[0] - p[1] * y[1] + 0.1 * jnp.cos(w * t)])

    y0 = jnp.tile(jnp.array([1.0, 0.0]), (n, 1))
    p = jnp.array([4.0, 0.3]) * (1 + 0.1 * jnp.arange(n))[:, None]
    return damped, y0, p, jnp.linspace(0.0, 3.0, 7)


@pytest.mark.slow  # ~6 s, a background build
@requires_compiler
def test_expensive_kernel_builds_in_the_background(fresh_kernels, caplog):
    release = fresh_kernels
    f, y0, p, ts = _problem(5, 1.3)
    routes = []

    def loss(q):
        sol = gs.solve(f, 0.0, 3.0, y0, q, ts=ts, rtol=1e-8, atol=1e-10)
        routes.append(sol.route)
        return jnp.sum(jnp.sin(sol.ys))

    early = jax.jit(jax.grad(loss))
    with caplog.at_level("WARNING", logger="gradsolve"):
        g_early = early(p)
        sol_early = gs.solve(f, 0.0, 3.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10)
    assert routes == ["gradsolve-lanes"] and sol_early.route == "gradsolve-lanes"
    assert build.building() == ["'_problem.<locals>.damped'"]
    assert caplog.text.count("in the background") == 1  # one line, however many traces
    assert "keep them" in caplog.text and "wait_for_kernels" in caplog.text

    release.set()
    assert gs.drivers.Auto.wait_for_kernels(timeout=300)
    assert build.building() == []
    sol = gs.solve(f, 0.0, 3.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10)
    assert sol.route == "gradsolve-kernel"
    early(p)
    assert routes == ["gradsolve-lanes"]  # traced before the kernel was ready: kept
    late = jax.jit(jax.grad(loss))
    g_late = late(p)
    assert routes[-1] == "gradsolve-kernel"  # traced afterwards: the kernel
    with gs.use_compiled_kernel(False):
        sol_x = gs.solve(f, 0.0, 3.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10,
                         driver=gs.drivers.Batched())
        g_x = jax.grad(lambda q: jnp.sum(jnp.sin(gs.solve(
            f, 0.0, 3.0, y0, q, ts=ts, rtol=1e-8, atol=1e-10,
            driver=gs.drivers.Batched()).ys)))(p)
    for ys in (sol_early.ys, sol.ys):
        np.testing.assert_allclose(ys, sol_x.ys, rtol=1e-12, atol=1e-14)
    for g in (g_early, g_late):
        np.testing.assert_allclose(g, g_x, rtol=1e-11, atol=1e-13)


@pytest.mark.slow  # ~6 s, a background build
@requires_compiler
def test_explicit_kernel_waits_for_the_background_build(fresh_kernels):
    release = fresh_kernels
    f, y0, p, ts = _problem(3, 1.4)
    first = gs.solve(f, 0.0, 3.0, y0, p, ts=ts)
    assert first.route == "gradsolve-lanes" and build.building()
    threading.Timer(0.2, release.set).start()
    sol = gs.solve(f, 0.0, 3.0, y0, p, ts=ts, driver=gs.drivers.Kernel())
    assert sol.route == "gradsolve-kernel" and not build.building()
    assert gs.solve(f, 0.0, 3.0, y0, p, ts=ts).route == "gradsolve-kernel"
    np.testing.assert_allclose(sol.ys, first.ys, rtol=1e-12, atol=1e-14)


@requires_compiler
def test_a_cached_kernel_loads_at_once_however_expensive(fresh_kernels):
    """Only a kernel missing from the cache goes to the background: one already there
    loads on the caller's thread (the held background compiler is never asked)."""
    f, y0, p, ts = _problem(2, 1.5)
    gs.drivers.Kernel().prebuild(f, y0, p)  # not Auto: built before it returns
    for name in ("_registered", "_built"):
        getattr(build, name).clear()
    kernel_driver._sources.clear()
    assert gs.solve(f, 0.0, 3.0, y0, p, ts=ts).route == "gradsolve-kernel"
    assert not build.building()


def test_default_threshold_keeps_small_fields_synchronous():
    """Lotka–Volterra and Lorenz-96 with 16 states are estimated below the default
    threshold (built before the first call returns); a source of 2 MB (the size limit)
    above it."""
    from gradsolve._flat import flat_field, flatten_spec
    from gradsolve.drivers.kernel.source import generate

    def lv(t, y, p):
        return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])

    def l96(t, y, p):
        return (jnp.roll(y, -1) - jnp.roll(y, 2)) * jnp.roll(y, 1) - y + p[0]

    default = _config.read_settings().kernel_background_s
    for f, d, q in ((lv, 2, 4), (l96, 16, 1)):
        _, treedef, shapes, dtypes = flatten_spec(jnp.ones((1, q)))
        source = generate(flat_field(f, treedef, shapes, dtypes)[0], d, q, jnp.float64,
                          gs.Tsit5())
        assert build.estimated_build_s(source) < default / 2, (f.__name__, len(source))
    assert build.estimated_build_s("x" * 2_000_000) > default


SPEC = textwrap.dedent("""
    import jax.numpy as jnp
    def pendulum(t, y, p):
        return jnp.stack([y[1], -p[0] * jnp.sin(y[0]) - p[1] * y[1] + 0.0 * jnp.exp(-t)])
    def problem():
        return pendulum, jnp.array([0.5, 0.0]), jnp.array([9.81, 0.1])
""")

CHECK = textwrap.dedent("""
    import os, sys, warnings
    if hasattr(os, "sched_setaffinity"):  # one CPU: another grouping than the build's
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import gradsolve as gs
    from gradsolve.drivers.kernel import build
    def no_compiler(*args, **kw):
        raise AssertionError("compiled")
    build._compile = no_compiler
    sys.path.insert(0, sys.argv[1])
    from spec import problem
    f, y0, p = problem()
    y0 = jnp.tile(y0, (4, 1)); p = jnp.tile(p, (4, 1))
    ts = jnp.linspace(0.0, 2.0, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = gs.solve(f, 0.0, 2.0, y0, p, ts=ts)
        mesh = gs.record(f, 0.0, 2.0, y0, p, ts=ts)
        g = jax.grad(lambda s: jnp.sum(gs.replay(f, mesh, y0, p, ts=s).ys ** 2))(ts)
    print("ROUTE", sol.route, bool(jnp.all(jnp.isfinite(g))))
""")


@pytest.mark.slow  # ~20 s, two processes: a cached kernel loading at once is tested below
@requires_compiler
def test_prebuilt_cache_loads_in_a_fresh_process_without_compiling(tmp_path):
    """``gradsolve build-cache`` builds the four parts; a fresh process whose compiler would
    fail, pinned to one CPU (so it would group the parts into other libraries), then runs
    the kernel (record, replay and the save-time adjoint) from the cache, leaving its files
    as they were and logging no build."""
    (tmp_path / "spec.py").write_text(SPEC)
    cache = tmp_path / "kernels"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.pop("GRADSOLVE_KERNEL", None)
    out = subprocess.run([sys.executable, "-m", "gradsolve_cli", "build-cache", "spec:problem",
                          "--cache", str(cache), "--x64"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pendulum from spec:problem (float64, Tsit5)" in out.stdout
    files = {p.name: p.stat().st_ino for p in cache.glob("gs_*.so")}
    assert any("bwdt" in name for name in files) and len(files) >= 2
    assert {part for name in files for part in name[:-3].split("_")[-1].split("-")} == {
        "fwd", "bwd", "rec", "bwdt"}
    run = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)],
                         env=dict(env, GRADSOLVE_KERNEL_CACHE=str(cache)),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ROUTE gradsolve-kernel True" in run.stdout
    assert "compiling" not in run.stderr and "built" not in run.stderr
    assert {p.name: p.stat().st_ino for p in cache.glob("gs_*.so")} == files
    again = subprocess.run([sys.executable, "-m", "gradsolve_cli", "build-cache",
                            "spec:problem", "--cache", str(cache), "--x64"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already in the cache" in again.stdout


EXITS_EARLY = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import gradsolve as gs
    from gradsolve import _config
    from gradsolve.drivers.kernel import build
    _config.SETTINGS = _config.SETTINGS._replace(kernel_cache=sys.argv[1],
                                                 kernel_background_s=1e-3)
    f = lambda t, y, p: jnp.stack([y[1], -p[0] * y[0] + 0.01 * jnp.sin(3.7 * t)])
    chosen = gs.drivers.Auto().choose("replay", f, gs.Tsit5(), jnp.ones((2, 2)), jnp.ones((2, 1)))
    for _ in range(1000):  # until the compilers run
        if len(build._children) == len(build._groups(("fwd", "bwd", "rec"))):
            break
        time.sleep(0.01)
    print("ROUTE", chosen.name, len(build.building()), len(build._children))
    print("SCRATCH", *build._scratch)
""")


@requires_compiler
def test_a_process_that_exits_stops_its_background_compilers(tmp_path):
    """Exiting while a background build runs kills its compilers (with their children) and
    removes their temporary folders; nothing reaches the cache."""
    cache = tmp_path / "kernels"
    out = subprocess.run([sys.executable, "-c", EXITS_EARLY, str(cache)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    route, n_building, n_compilers = lines["ROUTE"].split()
    assert route == "gradsolve-lanes" and n_building == "1" and int(n_compilers) >= 1
    scratch = lines["SCRATCH"].split()
    assert scratch and not any(os.path.exists(d) for d in scratch)
    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not any(d in running for d in scratch)
    assert not list(cache.glob("*.so"))
    assert "stopped the background build" in out.stderr
