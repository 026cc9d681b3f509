"""The compiled kernel under faults: a corrupted, planted or shared cache, a failed, slow or
oversized build, a failed on-demand adjoint. Each gives correct results (the kernel rebuilt,
or an XLA driver) and says why; none crashes or loads code it should not.

The cache scenarios run in fresh processes, since a process keeps the kernels it loaded."""

import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from gradsolve import _config
from gradsolve.drivers.kernel import build

# LV closed over nothing: every process generates the same source, hence the same cache key.
SCRIPT = textwrap.dedent("""
    import jax, warnings
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp, numpy as np, gradsolve as gs
    def lv(t, y, p):
        return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])
    y0 = jnp.ones((3, 2)); p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0]), (3, 1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sol = gs.solve(lv, 0.0, 4.0, y0, p, ts=jnp.linspace(0.0, 4.0, 5), rtol=1e-9, atol=1e-11)
    print("ROUTE", sol.route)
    print("Y1", *np.asarray(sol.y1[0]).tolist())
    print("WARN", " | ".join(str(x.message) for x in w))
""")


def _run(cache, **env):
    full = dict(os.environ, GRADSOLVE_KERNEL_CACHE=str(cache), **env)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    return lines["ROUTE"], np.array(lines["Y1"].split(), float), lines.get("WARN", "")


def _reference():
    from scipy.integrate import solve_ivp

    f = lambda t, y: [1.5 * y[0] - y[0] * y[1], -3.0 * y[1] + y[0] * y[1]]
    return solve_ivp(f, (0.0, 4.0), [1.0, 1.0], rtol=1e-12, atol=1e-14).y[:, -1]


def _planted_library(path, marker):
    """A shared object with the kernel's symbols whose constructor creates ``marker``:
    loading it would run someone else's code."""
    src = path.with_suffix(".cc")
    src.write_text(textwrap.dedent(f"""
        #include <cstdio>
        __attribute__((constructor)) static void planted() {{
          if (FILE* f = std::fopen("{marker}", "w")) std::fclose(f);
        }}
        extern "C" void Fwd() {{}}
        extern "C" void Bwd() {{}}
        extern "C" void Rec() {{}}
    """))
    subprocess.run([build.compiler(), "-shared", "-fPIC", str(src), "-o", str(path)], check=True)
    src.unlink()


requires_compiler = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")


@pytest.mark.slow  # four fresh processes, three kernel builds: about a minute
@requires_compiler
def test_cache_is_private_and_faults_in_it_are_rebuilt(tmp_path):
    cache = tmp_path / "kernels"
    ref = _reference()
    route, y1, _ = _run(cache)
    assert route == "gradsolve-kernel"
    np.testing.assert_allclose(y1, ref, rtol=1e-7)
    assert (cache.stat().st_mode & 0o777) == 0o700
    libs = sorted(cache.glob("gs_*.so"))
    assert libs and all((p.stat().st_mode & 0o077) == 0 for p in libs)

    # A truncated library (a full disk, a killed build) is rebuilt once.
    for p in libs:
        p.write_bytes(p.read_bytes()[:100])
    route, y1, _ = _run(cache)
    assert route == "gradsolve-kernel"
    np.testing.assert_allclose(y1, ref, rtol=1e-7)
    assert all(p.stat().st_size > 1000 for p in libs)

    # A library writable by others (or owned by another user) is never loaded.
    marker = tmp_path / "planted-code-ran"
    for p in libs:
        _planted_library(p, marker)
        p.chmod(0o666)
    if os.getuid() == 0:  # root can plant one owned by somebody else, too
        os.chown(libs[0], 65534, 65534)
        libs[0].chmod(0o644)
    route, y1, _ = _run(cache)
    assert not marker.exists(), "a planted library was loaded"
    assert route == "gradsolve-kernel"
    np.testing.assert_allclose(y1, ref, rtol=1e-7)
    assert all(p.stat().st_uid == os.getuid() and not p.stat().st_mode & 0o022 for p in libs)


@requires_compiler
def test_shared_cache_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    route, y1, warned = _run(shared)
    assert route == "gradsolve-lanes"  # an XLA driver, same results
    assert "not private to this user" in warned
    np.testing.assert_allclose(y1, _reference(), rtol=1e-7)
    assert not list(shared.glob("gs_*.so"))


def _fresh_settings(monkeypatch, tmp_path, **changes):
    monkeypatch.setattr(_config, "SETTINGS", _config.SETTINGS._replace(
        kernel_cache=str(tmp_path / "kernels"), **changes))
    monkeypatch.setattr(build, "_warned", {})


def _decay_problem():
    y0 = jnp.ones((3, 1))
    p = jnp.array([[0.5], [1.0], [2.0]])
    return y0, p, jnp.exp(-p * 2.0)


def _slow_to_build(t, y, p):
    return -p * y + 0.0 * jnp.sin(t)


def _big_field(t, y, p):
    return -p * y + 0.0 * jnp.cos(t)


@requires_compiler
@pytest.mark.parametrize("field, limit, message", [
    (_slow_to_build, {"kernel_build_timeout": 1e-3}, r"took longer than 0.001 s"),
    (_big_field, {"kernel_max_source_mb": 1e-4}, r"over the 0.0001 MB limit"),
], ids=["timeout", "source-size"])
@pytest.mark.slow  # ~6 s, bounded builds
def test_bounded_builds_fall_back_with_their_reason(monkeypatch, tmp_path, field, limit,
                                                    message):
    """A compiler past its timeout, or a generated source over the size limit, leaves the
    kernel unbuilt: an XLA driver runs, with a warning saying which limit."""
    _fresh_settings(monkeypatch, tmp_path, **limit)
    y0, p, exact = _decay_problem()
    with pytest.warns(RuntimeWarning, match=message):
        sol = gs.solve(field, 0.0, 2.0, y0, p, rtol=1e-10, atol=1e-12)
    assert sol.route == "gradsolve-lanes"
    np.testing.assert_allclose(sol.y1, exact, rtol=1e-8)
    assert not list((tmp_path / "kernels").glob("gs_*.so"))


@pytest.mark.slow  # ~6 s, a fresh kernel build
@requires_compiler
def test_first_build_says_so(monkeypatch, tmp_path, caplog):
    _fresh_settings(monkeypatch, tmp_path)
    monkeypatch.setattr(build, "_NOTICE_AFTER_S", 0.0)

    def announced(t, y, p):
        return -p * y + 0.0 * jnp.tanh(t)

    y0, p, exact = _decay_problem()
    with caplog.at_level("WARNING", logger="gradsolve"):
        sol = gs.solve(announced, 0.0, 2.0, y0, p, rtol=1e-10, atol=1e-12)
    assert sol.route == "gradsolve-kernel"
    text = caplog.text
    assert "compiling the CPU kernel for 'test_first_build_says_so.<locals>.announced'" in text
    assert str(tmp_path / "kernels") in text and "was built in" in text
    np.testing.assert_allclose(sol.y1, exact, rtol=1e-8)


@pytest.mark.slow  # ~10 s
@requires_compiler
def test_failed_on_demand_adjoint_differentiates_through_the_batched_driver(monkeypatch,
                                                                            tmp_path):
    """The save-time adjoint (``bwdt``) is built when first needed; if that build fails,
    ``jax.grad`` still works (batched adjoint) instead of raising."""
    _fresh_settings(monkeypatch, tmp_path)
    real = build._build_and_register

    def no_bwdt(cxx, source, key, prefix, parts, label="a vector field"):
        if "bwdt" in parts:
            raise RuntimeError("out of memory (simulated)")
        return real(cxx, source, key, prefix, parts, label)

    monkeypatch.setattr(build, "_build_and_register", no_bwdt)

    def lv(t, y, p):
        return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]
                          + 0.0 * jnp.exp(-t)])

    y0 = jnp.ones((3, 2))
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0]), (3, 1)) * jnp.array([[1.0], [1.1], [0.9]])
    ts = jnp.linspace(0.0, 3.0, 4)
    mesh = gs.record(lv, 0.0, 3.0, y0, p, ts=ts)
    loss = lambda q, tt, d: jnp.sum(gs.replay(lv, mesh, y0, q, ts=tt, driver=d).ys ** 2)
    with pytest.warns(RuntimeWarning, match=r"its bwdt part: out of memory"):
        g = jax.grad(loss, argnums=(0, 1))(p, ts, gs.drivers.Kernel())
    ref = jax.grad(loss, argnums=(0, 1))(p, ts, gs.drivers.Batched())
    for a, b in zip(g, ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_each_distinct_failure_warns_once():
    saved = dict(build._warned)
    build._warned.clear()
    try:
        _warn_three_and_clear()
    finally:
        build._warned.update(saved)


def _warn_three_and_clear():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for reason in ("no C++ compiler found", "g++ failed: x", "no C++ compiler found"):
            build._warn_once(reason)
    assert [str(x.message).split("(")[1].split(")")[0] for x in w] == [
        "no C++ compiler found", "g++ failed: x"]
    gs.clear_caches()  # also forgets the warnings: a later failure is reported again
    with pytest.warns(RuntimeWarning, match=r"no C\+\+ compiler found"):
        build._warn_once("no C++ compiler found")


@requires_compiler
def test_cache_key_names_the_compiler_and_its_version():
    cxx = build.compiler()
    assert os.path.isabs(cxx)
    ident = build._compiler_id(cxx)
    assert ident.startswith(cxx) and len(ident) > len(cxx) + 1


THREADS_SCRIPT = r"""
import os, sys, threading, time
if sys.argv[1] == "pin":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import gradsolve as gs
f = lambda t, y, p: jnp.stack([p[0]*y[0] - p[1]*y[0]*y[1], -p[2]*y[1] + p[3]*y[0]*y[1]])
n = 20000
p = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.1 * jax.random.uniform(jax.random.PRNGKey(0), (n, 4)))
y0 = jnp.ones((n, 2))
mesh = gs.record(f, 0.0, 20.0, y0, p, rtol=1e-9, atol=1e-11, driver=gs.drivers.Kernel())
run = jax.jit(lambda q: gs.replay(f, mesh, y0, q, driver=gs.drivers.Kernel()).y1)
jax.block_until_ready(run(p))
count = lambda: int(next(l for l in open("/proc/self/status") if l.startswith("Threads:")).split()[1])
peak, stop = [0], [False]
def poll():
    while not stop[0]:
        peak[0] = max(peak[0], count())
        time.sleep(0.0002)
th = threading.Thread(target=poll)
th.start()
time.sleep(0.01)
base = count()
for _ in range(3):
    jax.block_until_ready(run(p * 1.0001))
stop[0] = True
th.join()
print("EXTRA", peak[0] - base)
"""


@pytest.mark.slow  # two fresh processes with a large kernel replay
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least two usable CPUs")
def test_kernel_threads_follow_the_cpu_affinity():
    """The kernel starts as many threads as the process may use (its affinity mask, as
    taskset or a batch allocation sets it), not as many as the machine has: pinned to one
    CPU it starts none beyond the caller; with two or more it starts some (the control,
    which shows the count is observed). Counted from /proc/self/status during the call."""
    if not gs.drivers.Kernel().replay_reason(
            lambda t, y, p: -p * y, gs.Tsit5(), jnp.ones((2, 1)), jnp.ones((2, 1))) is None:
        pytest.skip("no working C++ compiler")
    extra = {}
    for mode in ("pin", "free"):
        out = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, mode], capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        extra[mode] = int(out.stdout.split("EXTRA")[-1])
    assert extra["pin"] == 0, extra
    assert extra["free"] >= 1, extra
