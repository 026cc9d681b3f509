"""The shared translator (`gradsolve._jaxpr.Scalarizer`) on common idioms of vector fields.

Each field below is written with one idiom that the compiled kernel and the lanes replay
used to refuse (so `gs.drivers.Auto` fell back, silently, to the batched XLA replay):
``.at[].set``/``.add``, constant-index gathers, ``softmax``/``logsumexp`` (``stop_gradient``),
``cumsum`` and friends, ``jnp.piecewise``, ``lax.cond``/``switch``, ``jnp.interp`` (a scan
and gathers at traced indices), ``fori_loop``, ``erfinv``, ``lgamma`` (``digamma`` in its
derivative), ``argmax`` indexing. For each: ``Auto`` now takes the kernel (with a compiler)
and the lanes replay with the kernel off, and on ONE recorded mesh both give the values and
the gradients (w.r.t. ``y0`` and the parameters) of `gs.drivers.Batched` (``jax.vmap`` of
the user's own ``f``, the independent reference) to rounding, and no fallback warning is
raised. What is still untranslated (``while``) warns once per field, naming it, and runs
correctly on the batched replay. The C++ special functions are compiled alone and checked
against scipy.
"""

import subprocess
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import gradsolve as gs
from gradsolve.drivers import lanes as _lanes
from gradsolve.drivers.kernel import build
from gradsolve.drivers.kernel.source import SPECIAL_FUNCTIONS
from test_kernel import requires_compiler

RTOL = 1e-12  # same steps on the same mesh: agreement to rounding (float64)
N = 5


def lv_at(t, y, p):
    """Lotka–Volterra built with ``.at[].set`` and ``.at[].add`` (scatters)."""
    dy = jnp.zeros(2).at[0].set(p[0] * y[0] - p[1] * y[0] * y[1])
    return dy.at[1].add(-p[2] * y[1] + p[3] * y[0] * y[1])


def lv_gather(t, y, p):
    """Lotka–Volterra through a constant-index gather (``y[jnp.array([1, 0])]``)."""
    other = y[jnp.array([1, 0])]
    return jnp.array([p[0], -p[2]]) * y + jnp.array([-p[1], p[3]]) * y * other


def softmax(t, y, p):
    return p[0] * jax.nn.softmax(p[1] * y) - p[2] * y


def logsumexp(t, y, p):
    return p[0] * (jax.nn.logsumexp(y) - y) - p[1] * y ** 3


def cumulative(t, y, p):
    return (-p[0] * jnp.cumsum(y) + p[1] * jnp.cumprod(jnp.cos(y))
            + p[2] * (jax.lax.cummax(y, reverse=True) - jax.lax.cummin(y)))


def piecewise(t, y, p):
    return -p[0] * jnp.piecewise(y, [y < 0.3, y > 1.2],
                                 [lambda v: v + v ** 3, lambda v: 1.5 * v, jnp.sin])


def cond(t, y, p):
    return jax.lax.cond(y[0] > 0.5, lambda v: -p[0] * v, lambda v: -p[1] * v ** 3, y)


def switch(t, y, p):
    branch = jnp.clip(jnp.floor(2 * y[0]), 0, 2).astype(jnp.int32)
    return jax.lax.switch(branch, [lambda v: -p[0] * v, lambda v: -p[1] * v ** 3,
                                   lambda v: -jnp.sin(p[2] * v)], y)


FORCING_T = jnp.array([0.0, 0.5, 1.0, 2.0, 3.0])
FORCING = jnp.array([0.0, 1.0, 0.2, -0.5, 0.3])


def interp(t, y, p):
    """A tabulated forcing in time and a tabulated saturation of the state."""
    sat = jnp.interp(y, jnp.array([-1.0, 0.0, 0.5, 2.0]), jnp.array([-0.5, 0.0, 0.4, 0.6]))
    return -p[0] * sat + p[1] * jnp.interp(t, FORCING_T, FORCING) - 0.1 * y


def fori(t, y, p):
    return jax.lax.fori_loop(0, 3, lambda i, v: v - 0.1 * p[0] * (i + 1) * v ** 3, -p[1] * y)


def erfinv(t, y, p):
    return -p[0] * y + p[1] * jax.scipy.special.erfinv(0.9 * jnp.tanh(y))


def lgamma(t, y, p):
    return -p[0] * y + p[1] * jax.lax.lgamma(1.5 + y ** 2)


def argmax(t, y, p):
    """Indexing at a computed index (``dynamic_slice``) and ``argmin``."""
    return -p[0] * y * y[jnp.argmax(y)] + p[1] * jnp.argmin(y) - p[2] * y


FIELDS = {  # f, y0 (d,), p (P,), t1
    "at_set": (lv_at, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], 4.0),
    "gather": (lv_gather, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], 4.0),
    "softmax": (softmax, [0.2, -0.4, 0.9], [1.0, 2.0, 0.5], 3.0),
    "logsumexp": (logsumexp, [0.2, -0.4, 0.9], [1.0, 0.3], 3.0),
    "cumsum": (cumulative, [0.2, -0.4, 0.9], [0.5, 0.3, 0.2], 3.0),
    "piecewise": (piecewise, [0.1, 0.8, 1.6], [0.7], 3.0),
    "cond": (cond, [1.2, 0.3], [0.9, 0.6], 3.0),
    "switch": (switch, [1.2, 0.3], [0.9, 0.6, 1.3], 3.0),
    "interp": (interp, [0.4, -0.6, 1.5], [0.8, 0.5], 3.0),
    "fori": (fori, [0.5, -0.8], [0.6, 0.4], 3.0),
    "erfinv": (erfinv, [0.5, -0.8], [0.6, 0.4], 3.0),
    "lgamma": (lgamma, [0.5, -0.8], [0.6, 0.4], 3.0),
    "argmax": (argmax, [0.5, -0.8, 0.1], [0.6, 0.4, 0.3], 3.0),
}


def _problem(name):
    f, y0, p, t1 = FIELDS[name]
    spread = (1 + 0.15 * jnp.linspace(-1, 1, N))[:, None]
    y0 = jnp.asarray(y0) * spread
    p = jnp.asarray(p) * spread[::-1]
    ts = jnp.linspace(0.0, t1, 7)
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, rtol=1e-8, atol=1e-10, driver=gs.drivers.Batched())
    return f, mesh, y0, p, ts


def _run(f, mesh, y0, p, ts, driver=None):
    """``(route, ys, d loss / d (y0, p))`` of the replay on ``mesh`` through ``driver``."""
    w = jnp.linspace(0.5, 1.5, ts.size)[:, None]

    def loss(y0, p):
        sol = gs.replay(f, mesh, y0, p, ts=ts, driver=driver)
        return jnp.sum(w * sol.ys ** 2), sol

    # the values from the gradient's own forward pass: no separate replay to compile
    (_, sol), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(y0, p)
    return sol.route, sol.ys, grads


def _close(got, ref):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(np.max(np.abs(b))))


# One kernel build (a C++ compile) per idiom is the slow part: in the normal suite every
# idiom runs on the kernel in one of three stacked fields (test_all_idioms_in_one_field_
# run_on_the_kernel, three builds: the translation, no warning, values and gradients against
# the batched replay); each idiom alone on the kernel, through `Auto`, in the slow tier
# (`Auto` taking a translated field, with the kernel off: test_lanes_idioms_in_one_field_
# match_batched; with it on: test_kernel.py's test_kernel_matches_xla_replay).
KERNEL_ALONE = [pytest.param(name, marks=[pytest.mark.slow]) for name in FIELDS]


@requires_compiler
@pytest.mark.parametrize("name", KERNEL_ALONE)
def test_idiom_runs_on_the_kernel_and_matches_batched(name):
    f, mesh, y0, p, ts = _problem(name)
    _, ys_ref, g_ref = _run(f, mesh, y0, p, ts, gs.drivers.Batched())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback warning either
        route, ys, g = _run(f, mesh, y0, p, ts)
    assert route == "gradsolve-kernel"
    _close(ys, ys_ref)
    _close(g, g_ref)


# three groups: one field of all 13 idioms is 1.6 MB of C++ (a slower build than three)
GROUPS = {"a": list(FIELDS)[:4], "b": list(FIELDS)[4:8], "c": list(FIELDS)[8:]}
# the idioms the lanes replay runs stacked in the normal suite (see LANES_ALONE below)
STACKS = {**GROUPS, "lanes": ["at_set", "gather", "switch"]}


def _blocks(group):
    """``(name, state slice, parameter slice)`` of each idiom of ``group`` in its field."""
    out, i, j = [], 0, 0
    for name in STACKS[group]:
        _, y0, p, _ = FIELDS[name]
        out.append((name, slice(i, i + len(y0)), slice(j, j + len(p))))
        i, j = i + len(y0), j + len(p)
    return out


def _stacked(group):
    """The idioms of ``group`` side by side: uncoupled blocks of the state, each driven by
    its own field on its own parameters."""
    def idioms(t, y, p):
        return jnp.concatenate([FIELDS[name][0](t, y[ys], p[ps])
                                for name, ys, ps in _blocks(group)])
    idioms.__name__ = idioms.__qualname__ = f"idioms_{group}"
    return idioms


def _stacked_problem(group):
    """``(f, mesh, y0, p, ts)`` of `_stacked` ``(group)``, its mesh recorded by the batched
    driver."""
    spread = (1 + 0.15 * jnp.linspace(-1, 1, N))[:, None]
    every_idiom = _stacked(group)
    y0 = jnp.concatenate([jnp.asarray(FIELDS[n][1]) for n in STACKS[group]]) * spread
    p = jnp.concatenate([jnp.asarray(FIELDS[n][2]) for n in STACKS[group]]) * spread[::-1]
    t1 = 3.0
    ts = jnp.linspace(0.0, t1, 7)
    mesh = gs.record(every_idiom, 0.0, t1, y0, p, ts=ts, rtol=1e-8, atol=1e-10,
                     driver=gs.drivers.Batched())
    return every_idiom, mesh, y0, p, ts


def _close_blocks(group, got, ref):
    """Each idiom's block of the values and of the gradients ``(ys, (d y0, d p))``."""
    (ys, (gy, gp)), (ys_ref, (gy_ref, gp_ref)) = got, ref
    for name, ys_, ps_ in _blocks(group):
        _close(ys[..., ys_], ys_ref[..., ys_])
        _close((gy[:, ys_], gp[:, ps_]), (gy_ref[:, ys_], gp_ref[:, ps_]))


@requires_compiler
@pytest.mark.parametrize("group", GROUPS)
def test_all_idioms_in_one_field_run_on_the_kernel(group):
    """What test_idiom_runs_on_the_kernel_and_matches_batched checks for each idiom, for all
    of a group of them in one field (one kernel build): the kernel translates it without a warning,
    and each idiom's block of the values and of the gradients equals the batched replay's."""
    every_idiom, mesh, y0, p, ts = _stacked_problem(group)
    _, ys_ref, g_ref = _run(every_idiom, mesh, y0, p, ts, gs.drivers.Batched())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback warning either
        # the kernel translates the field (what makes ``Auto`` take it; a field this size
        # it builds in the background, so the explicit driver waits for the build)
        assert gs.drivers.Kernel().replay_reason(every_idiom, gs.Tsit5(), y0, p) is None
        route, ys, g = _run(every_idiom, mesh, y0, p, ts, gs.drivers.Kernel())
    assert route == "gradsolve-kernel"
    _close_blocks(group, (ys, g), (ys_ref, g_ref))


# On the lanes replay, indexing and control flow (the lanes' own lowering: gathers and
# selects over lanes) in the normal suite, stacked in one field (STACKS["lanes"]: one
# record and two XLA compiles instead of three of each; `cond` is left out, as
# ``lax.cond`` and ``lax.switch`` are one primitive, ``cond`` with an index operand, which
# `switch` runs with three branches on a computed index); each idiom alone, and the other
# idioms, whose scalar rules the kernel tests above exercise, in the slow tier (an XLA
# compile each, ~3-10 s).
LANES_ALONE = [pytest.param(name, marks=[pytest.mark.slow]) for name in FIELDS]


def test_lanes_idioms_in_one_field_match_batched(monkeypatch):
    """What test_idiom_runs_on_the_lanes_replay_and_matches_batched checks for each idiom,
    for the indexing and control-flow idioms in one field: the lanes replay gives each
    idiom's block of the batched replay's values and gradients, and ``Auto`` takes it with
    the kernel off, without a warning."""
    every_idiom, mesh, y0, p, ts = _stacked_problem("lanes")
    _, ys_ref, g_ref = _run(every_idiom, mesh, y0, p, ts, gs.drivers.Batched())
    # the translation is what is tested here, not `lanes_pays`'s size rule
    monkeypatch.setattr(_lanes, "lanes_pays", lambda d, ops: True)
    route, ys, g = _run(every_idiom, mesh, y0, p, ts, gs.drivers.Lanes())
    assert route == "gradsolve-lanes"
    _close_blocks("lanes", (ys, g), (ys_ref, g_ref))
    with gs.use_compiled_kernel(False), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert _run(every_idiom, mesh, y0, p, ts)[0] == "gradsolve-lanes"


@pytest.mark.parametrize("name", LANES_ALONE)
def test_idiom_runs_on_the_lanes_replay_and_matches_batched(name, monkeypatch):
    f, mesh, y0, p, ts = _problem(name)
    _, ys_ref, g_ref = _run(f, mesh, y0, p, ts, gs.drivers.Batched())
    # the translation is what is tested here, not `lanes_pays`'s size rule
    monkeypatch.setattr(_lanes, "lanes_pays", lambda d, ops: True)
    route, ys, g = _run(f, mesh, y0, p, ts, gs.drivers.Lanes())
    assert route == "gradsolve-lanes"
    _close(ys, ys_ref)
    _close(g, g_ref)
    with gs.use_compiled_kernel(False), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert _run(f, mesh, y0, p, ts)[0] == "gradsolve-lanes"


def test_small_idioms_pass_the_lanes_size_rule():
    """Where the lanes replay pays (`lanes_pays`), ``Auto`` takes it for these idioms
    without forcing: the translation adds no operations to Lotka–Volterra."""
    for name in ("at_set", "gather"):
        f, y0, p, _ = FIELDS[name]
        found = _lanes.lane_field(f, gs.Tsit5(), jnp.ones((2, len(y0))), jnp.ones((2, len(p))))
        assert found.reason is None, found.reason


def looped(t, y, p):
    """A ``while_loop`` (not translated): halves ``p[0]`` once."""
    _, s = jax.lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, 0.5 * c[1]), (0, p[0]))
    return jnp.stack([2 * s * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


@pytest.mark.slow  # ~13 s: fallback of one untranslated field
def test_untranslated_field_warns_once_and_stays_correct():
    gs.clear_caches()
    y0 = jnp.ones((N, 2)) * (1 + 0.1 * jnp.linspace(-1, 1, N))[:, None]
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0]), (N, 1))
    ts = jnp.linspace(0.0, 4.0, 5)
    with pytest.warns(RuntimeWarning, match="`while`") as record:
        sol = gs.solve(looped, 0.0, 4.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10)
        gs.replay(looped, sol.mesh, y0, 2 * p, ts=ts)
    ours = [w for w in record if "`while`" in str(w.message)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "'looped'" in message and "batched XLA driver" in message
    assert ours[0].filename == __file__  # points at the user's call
    assert sol.route == "gradsolve-batched"
    ref = gs.solve(lv_at, 0.0, 4.0, y0, p, ts=ts, rtol=1e-8, atol=1e-10)  # the same field
    np.testing.assert_allclose(sol.ys, ref.ys, rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        gs.replay(looped, sol.mesh, y0, p, ts=ts)  # warned once only
        gs.replay(looped, sol.mesh, y0, p, ts=ts, driver=gs.drivers.Batched())  # explicit
    gs.clear_caches()  # forgets the warnings too
    with pytest.warns(RuntimeWarning, match="`while`"):
        gs.replay(looped, sol.mesh, y0, p, ts=ts)


def test_stiff_solvers_warn_only_where_the_kernel_would_run_them():
    """Stiff solvers run on the compiled kernel by default, so a field it does not
    translate is passed over with the explicit solvers' warning; without a compiler the
    batched replay is the only choice: no warning."""
    from conftest import kernel_builds

    gs.clear_caches()
    y0 = jnp.ones((2, 2))
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0]), (2, 1))
    if kernel_builds():
        with pytest.warns(RuntimeWarning, match="`while`.*compiled kernel"):
            sol = gs.solve(looped, 0.0, 1.0, y0, p, solver=gs.Rodas5P())
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            sol = gs.solve(looped, 0.0, 1.0, y0, p, solver=gs.Rodas5P())
    assert sol.route == "gradsolve-batched"


def test_gather_and_scatter_modes_follow_jax():
    """Out-of-bounds indices (clipped, filled, dropped), duplicate indices, windows and
    ``scatter-mul``/``min``/``max``, through the lanes backend against JAX itself."""
    def f(y):
        a = y.at[jnp.array([0, 0, 4])].add(jnp.array([1.0, 2.0, 3.0]), mode="drop")
        b = y.at[jnp.array([2, 9])].set(y[:2] * 3, mode="clip")
        c = y.at[1].multiply(y[0]).at[3].min(y[2]).at[0].max(-y[1])
        d = y.at[jnp.array([5, 1])].get(mode="fill", fill_value=-7.0)
        e = y.reshape(2, 2)[jnp.array([[1], [0]]), jnp.array([0, 1])]
        g = jax.lax.dynamic_slice(y, (jnp.int32(3),), (2,))  # start clamped to 2
        return jnp.concatenate([a, b, c, d, e.reshape(-1), g])

    y = jnp.array([0.3, -0.7, 1.4, 2.2])
    closed = jax.make_jaxpr(f)(y)
    rows = np.empty(4, dtype=object)
    for i in range(4):
        rows[i] = y[i:i + 1]
    (out,) = _lanes._LaneScalarizer(1).run(closed, [rows])
    got = jnp.concatenate([jnp.reshape(jnp.asarray(o), (-1,)) for o in out])
    np.testing.assert_array_equal(got, f(y))


@requires_compiler
def test_cpp_special_functions_match_scipy(tmp_path):
    """``gs_digamma`` and ``gs_erfinv``, compiled alone in double, to ~1e-15 of scipy."""
    prog = ("#include <cmath>\n#include <cstdint>\n#include <cstdio>\n#include <cstring>\n"
            "#include <limits>\ntypedef double real;\n" + SPECIAL_FUNCTIONS + r"""
int main() { char f; double x;
  while (std::scanf(" %c %lf", &f, &x) == 2)
    std::printf("%.17g\n", f == 'd' ? gs_digamma(x) : gs_erfinv(x)); }
""")
    (tmp_path / "t.cpp").write_text(prog)
    exe = tmp_path / "t"
    subprocess.run([build.compiler(), "-O2", "-std=c++17", "-fno-math-errno",
                    str(tmp_path / "t.cpp"), "-o", str(exe)], check=True)
    xd = np.concatenate([np.linspace(0.01, 60, 2001), np.geomspace(1e-8, 1e8, 200)])
    xn = np.linspace(-10.3, -0.01, 1001)
    xn = xn[np.abs(xn - np.round(xn)) > 1e-6]
    xe = np.concatenate([np.linspace(-0.999, 0.999, 2001), 1 - np.geomspace(2 ** -52, 1e-3, 200),
                         -1 + np.geomspace(2 ** -52, 1e-3, 200), np.geomspace(1e-300, 1e-2, 100)])
    specials = [("d", 0.0), ("d", -3.0), ("d", np.inf), ("e", 1.0), ("e", -1.0), ("e", 1.5)]
    lines = [("d", x) for x in np.concatenate([xd, xn])] + [("e", x) for x in xe] + specials
    text = "".join(f"{c} {float(x)!r}\n" for c, x in lines)
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
    vals = np.array([float(v) for v in out.stdout.split()])
    d, dn = vals[:xd.size], vals[xd.size:xd.size + xn.size]
    e, sp = vals[xd.size + xn.size:-len(specials)], vals[-len(specials):]
    ref = scipy.special.digamma(xd)
    np.testing.assert_allclose(d, ref, rtol=1e-15, atol=1e-15)  # absolute near its root
    # near the poles scipy's own reflection loses digits: psi(x) = psi(1 - x) - pi / tan(pi x)
    # in long double (1 - x is exact here) is the reference
    ld = np.longdouble
    pi = ld("3.14159265358979323846264338327950288")
    refn = scipy.special.digamma(1 - xn).astype(ld) - pi / np.tan(pi * (xn.astype(ld) - np.round(xn)))
    np.testing.assert_allclose(dn, refn.astype(float), rtol=2e-15, atol=2e-15)
    np.testing.assert_allclose(e, scipy.special.erfinv(xe), rtol=1e-15, atol=0)
    assert np.isnan(sp[0]) and np.isnan(sp[1]) and sp[2] == np.inf
    assert sp[3] == np.inf and sp[4] == -np.inf and np.isnan(sp[5])
