"""The compiled CPU replay kernel (`gradsolve.drivers.Kernel`) against the XLA replay.

Every other test file already runs through the kernel where it applies (it is the default
on CPU) and checks it against Diffrax, closed forms and finite differences. Here the two
replay paths are compared directly, over solvers (FSAL and not), vector fields that use many
JAX primitives, pytree and per-trajectory parameters, save-time gradients, forward mode,
second derivatives, ``vmap`` and float32; and the fallbacks are checked.
"""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import kernel_builds, lotka_volterra
from gradsolve import _config
from gradsolve.drivers.kernel import build, driver as kernel_replay_mod



def _cache_settings(monkeypatch, **changes):
    """The kernel cache settings (read from the environment at import) changed for a test."""
    monkeypatch.setattr(_config, "SETTINGS", _config.SETTINGS._replace(**changes))


requires_compiler = pytest.mark.skipif(
    not kernel_builds(), reason="no working C++ compiler: the kernel falls back to XLA (tested below)"
)


def forced(t, y, p):
    """Damped oscillator with time-dependent forcing; dict parameters of mixed shapes."""
    k, w = p["k"], p["w"]
    return jnp.array([y[1], -k * y[0] - w[0] * y[1] + w[1] * jnp.cos(2.0 * t)])


def many_primitives(t, y, p):
    """A smooth non-stiff field exercising the translator: matmul, reductions, indexing,
    concatenation, select, pow, transcendental functions."""
    m = jnp.array([[-0.2, 1.0, 0.0], [-1.0, -0.1, 0.3], [0.0, -0.3, -0.5]])
    lin = m @ y
    a, b, c = y[0], y[1], y[2]
    nl = jnp.stack([
        0.1 * jnp.tanh(a) * jnp.sin(t) + 0.05 * jnp.exp(-(b ** 2)),
        0.05 * jnp.where(a > 0, jnp.sqrt(1.0 + a ** 2), jnp.log1p(a ** 2)) - 0.01 * b ** 3,
        0.02 * jnp.maximum(c, -1.0) * jnp.abs(jnp.cos(b)) + 0.01 * jnp.sum(y) ** 2,
    ])
    shifted = jnp.concatenate([y[1:], y[:1]])
    return lin + p[0] * nl + p[1] * (jnp.abs(shifted) + 1.0) ** 0.5 * 0.01 + jnp.clip(p[2] * c, -1, 1) * 0.01


PROBLEMS = {
    "lotka_volterra": (
        lotka_volterra, 6.0,
        lambda n: jnp.tile(jnp.array([1.0, 1.0]), (n, 1)),
        lambda n: jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.1 * jnp.linspace(-1, 1, n))[:, None],
    ),
    "forced": (
        forced, 8.0,
        lambda n: jnp.tile(jnp.array([1.0, 0.0]), (n, 1)),
        lambda n: {"k": 2.0 + jnp.linspace(0, 1, n), "w": jnp.tile(jnp.array([0.1, 0.5]), (n, 1))},
    ),
    "many_primitives": (
        many_primitives, 5.0,
        lambda n: jnp.tile(jnp.array([0.5, -0.3, 0.2]), (n, 1)) * (1 + 0.1 * jnp.arange(n))[:, None],
        lambda n: jnp.tile(jnp.array([1.0, 0.5, 0.3]), (n, 1)),
    ),
}


def _loss(f, mesh, y0, p, ts):
    sol = gs.replay(f, mesh, y0, p, ts=ts)
    return jnp.sum(jnp.sin(sol.ys)) + jnp.sum(sol.y1 ** 2), sol


# Each (problem, solver) pair is a kernel build and XLA compiles (~10 s cold). In the
# normal suite every problem once, with Tsit5 (whose kernels the record tests below reuse);
# Dopri5 and Vern7 on the kernel against the batched replay, values, error ratios and
# gradients (save times included), are test_drivers.py's test_replay_drivers_agree_with_
# batched[forced-Dopri5-Kernel] (dict parameters) and [coupled-Vern7-Kernel] (nested dict
# parameters). The other pairs run in the slow tier.
KERNEL_VS_XLA_FAST = {("lotka_volterra", "Tsit5"), ("forced", "Tsit5"), ("many_primitives", "Tsit5")}
KERNEL_VS_XLA = [pytest.param(problem, solver, id=f"{problem}-{type(solver).__name__}",
                              marks=[] if (problem, type(solver).__name__) in KERNEL_VS_XLA_FAST
                              else [pytest.mark.slow])
                 for solver in (gs.Tsit5(), gs.Dopri5(), gs.Vern7()) for problem in sorted(PROBLEMS)]


@requires_compiler
@pytest.mark.parametrize("problem, solver", KERNEL_VS_XLA)
def test_kernel_matches_xla_replay(problem, solver):
    f, t1, make_y0, make_p = PROBLEMS[problem]
    n = 11  # not a multiple of the lane count: idle lanes are exercised
    y0, p = make_y0(n), make_p(n)
    ts = jnp.linspace(0.0, t1, 7)
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, solver=solver, rtol=1e-8, atol=1e-10)
    ts_b = jnp.broadcast_to(ts, (n, 7))
    vg = jax.value_and_grad(lambda a, b, c: _loss(f, mesh, a, b, c), argnums=(0, 1, 2), has_aux=True)
    (val, sol), grads = vg(y0, p, ts_b)
    assert sol.route == "gradsolve-kernel"
    with gs.use_compiled_kernel(False):
        (val_x, sol_x), grads_x = vg(y0, p, ts_b)
    assert sol_x.route in ("gradsolve-lanes", "gradsolve-batched")  # an XLA driver
    assert gs.replay(f, mesh, y0, p).route == "gradsolve-kernel"  # the block restored it
    np.testing.assert_allclose(sol.ys, sol_x.ys, rtol=1e-12, atol=1e-13)
    # The error estimate is a difference of two close solutions: rounding shows sooner.
    np.testing.assert_allclose(sol.error_ratio, sol_x.error_ratio, rtol=1e-6)
    for g, gx in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_x)):
        np.testing.assert_allclose(g, gx, rtol=1e-10, atol=1e-12)
    # The interior save times carry a gradient (they are mesh nodes).
    assert np.abs(np.asarray(grads[2])[:, 1:-1]).max() > 0


# The transforms, against the XLA replay's: forward mode and ``vmap`` of ``grad`` in the
# normal suite; second order, forward over reverse (``hessian``) and reverse over reverse,
# in the slow tier (~45 s: four second-order programs, each ~10 s to compile). Second
# derivatives through the kernel (the rule of the adjoint's own ``custom_jvp``,
# `gradsolve.drivers._adjoint`) are checked in the normal suite by test_replay.py's
# test_equal_save_times_each_get_their_own_derivative[True] (``jacfwd`` of ``grad``
# through the kernel, against the closed form).
TRANSFORM_GROUPS = {"fwd_vmap": ("jacfwd", "vmap_grad"), "second_order": ("hessian", "rev_rev")}


@requires_compiler
@pytest.mark.parametrize("group", [pytest.param("fwd_vmap"),
                                   pytest.param("second_order", marks=pytest.mark.slow)])
def test_forward_mode_second_order_and_vmap(group):
    f, t1, make_y0, make_p = PROBLEMS["lotka_volterra"]
    y0, p = make_y0(3), make_p(3)
    mesh = gs.record(f, 0.0, t1, y0, p, ts=jnp.linspace(0, t1, 5))
    loss = lambda q: jnp.sum(gs.replay(f, mesh, y0, q).ys ** 2)
    # plain reverse mode (jacrev of this scalar loss is its grad) is compared with the XLA
    # replay in test_kernel_matches_xla_replay[lotka_volterra-Tsit5]

    def transforms():
        # Jitted (one compile each instead of op-by-op dispatch), and built anew for each
        # setting: `use_compiled_kernel` is read when tracing, and a jitted function
        # reused would not trace again.
        every = {
            "jacfwd": jax.jacfwd(loss), "hessian": jax.hessian(loss),
            "rev_rev": jax.jacrev(jax.jacrev(loss)),
            "vmap_grad": lambda q: jax.vmap(jax.grad(loss))(jnp.stack([q, 1.01 * q])),
        }
        return {k: jax.jit(every[k]) for k in TRANSFORM_GROUPS[group]}

    out = {k: fn(p) for k, fn in transforms().items()}
    with gs.use_compiled_kernel(False):
        ref = {k: fn(p) for k, fn in transforms().items()}
    for k in out:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-9, atol=1e-11, err_msg=k)


@requires_compiler
def test_float32_kernel():
    f = lotka_volterra
    y0 = jnp.ones((5, 2), jnp.float32)
    p = (jnp.array([1.5, 1.0, 3.0, 1.0]) * jnp.linspace(0.9, 1.1, 5)[:, None]).astype(jnp.float32)
    mesh = gs.record(f, 0.0, 5.0, y0, p, ts=jnp.linspace(0, 5, 6, dtype=jnp.float32), rtol=1e-4, atol=1e-6)
    g = jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q).ys ** 2))
    sol = gs.replay(f, mesh, y0, p)
    assert sol.route == "gradsolve-kernel" and sol.ys.dtype == jnp.float32
    gk = g(p)
    with gs.use_compiled_kernel(False):
        gx = g(p)
    assert gk.dtype == jnp.float32
    np.testing.assert_allclose(gk, gx, rtol=2e-4)


@requires_compiler
def test_a_rematerialised_field_runs_on_the_kernel():
    """A field under ``jax.checkpoint`` (``remat2`` in its jaxpr, as the PEtab importer's
    fields) is translated through: the same C++ as the plain field, the same values."""
    f = jax.checkpoint(lotka_volterra)
    y0 = jnp.array([[1.0, 0.5], [0.8, 0.6]])
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0]), (2, 1))
    assert "remat2" in str(jax.make_jaxpr(f)(0.0, y0[0], p[0]))
    assert gs.drivers.Kernel().replay_reason(f, gs.Tsit5(), y0, p) is None
    sol = gs.solve(f, 0.0, 2.0, y0, p, driver=gs.drivers.Kernel())
    ref = gs.solve(lotka_volterra, 0.0, 2.0, y0, p, driver=gs.drivers.Batched())
    assert sol.route == "gradsolve-kernel"
    np.testing.assert_allclose(sol.ys, ref.ys, rtol=1e-12)


def test_untranslatable_vector_field_falls_back():
    def looped(t, y, p):  # a while loop: the translator declines, the XLA replay runs
        return jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] - 0.5 * p * y),
                                  (0, jnp.zeros_like(y)))[1]

    y0 = jnp.ones((4, 2))
    p = jnp.linspace(0.5, 1.0, 4)[:, None]
    with pytest.warns(RuntimeWarning, match="`while`"):
        mesh = gs.record(looped, 0.0, 1.0, y0, p, rtol=1e-10, atol=1e-12)
        sol = gs.replay(looped, mesh, y0, p)
    assert sol.route == "gradsolve-batched"
    np.testing.assert_allclose(sol.ys[:, -1], jnp.exp(-p) * y0, rtol=1e-8)


def test_no_compiler_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(build, "compiler", lambda: None)
    monkeypatch.setattr(build, "_warned", {})
    monkeypatch.setattr(build, "_registered", {})
    monkeypatch.setattr(build, "_failed", {})
    monkeypatch.setattr(kernel_replay_mod, "_sources", {})

    def decay2(t, y, p):
        return -p * y

    y0 = jnp.ones((3, 1))
    p = jnp.array([[1.0], [2.0], [3.0]])
    with pytest.warns(RuntimeWarning, match="compiled kernel") as record:
        mesh = gs.record(decay2, 0.0, 1.0, y0, p, rtol=1e-10, atol=1e-12)
        sol = gs.replay(decay2, mesh, y0, p)
    assert len([w for w in record if "compiled kernel" in str(w.message)]) == 1
    assert sol.route == "gradsolve-lanes"
    np.testing.assert_allclose(sol.ys[:, -1], jnp.exp(-p), rtol=1e-8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gs.replay(decay2, mesh, y0, 2 * p)  # warned once only


@pytest.mark.slow  # ~20 s: a second kernel build on the fallback path
@requires_compiler
def test_scalar_libm_fallback_when_vector_math_does_not_link(monkeypatch, tmp_path):
    """Without glibc's libmvec the kernel is rebuilt with scalar libm: same results, no warning."""
    _cache_settings(monkeypatch, kernel_cache=str(tmp_path))
    monkeypatch.setattr(build, "_VECTOR_MATH_FLAGS", (["-DGRADSOLVE_VECTOR_MATH"], ["-lgradsolve_no_such_lib"]))
    monkeypatch.setattr(build, "_registered", {})
    monkeypatch.setattr(kernel_replay_mod, "_sources", {})

    def pendulum(t, y, p):
        return jnp.stack([y[1], -p[0] * jnp.sin(y[0]) - p[1] * jnp.exp(-t) * y[1]])

    y0 = jnp.tile(jnp.array([0.5, 0.0]), (5, 1))
    p = jnp.tile(jnp.array([9.81, 0.1]), (5, 1)) * (1 + 0.05 * jnp.arange(5))[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mesh = gs.record(pendulum, 0.0, 3.0, y0, p, ts=jnp.linspace(0, 3, 4))
        loss = lambda a: jnp.sum(gs.replay(pendulum, mesh, y0, a).ys ** 2)
        g, sol = jax.grad(loss)(p), gs.replay(pendulum, mesh, y0, p)
    assert sol.route == "gradsolve-kernel"
    with gs.use_compiled_kernel(False):
        g_xla, sol_xla = jax.grad(loss)(p), gs.replay(pendulum, mesh, y0, p)
    np.testing.assert_allclose(sol.ys, sol_xla.ys, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g, g_xla, rtol=1e-11)


@requires_compiler
@pytest.mark.slow  # three cold kernel builds (~70 s on 2 cores): kept out of the CI budget
@pytest.mark.parametrize("cpus", [1, 2, 4])
def test_kernel_parts_build_in_any_grouping(monkeypatch, tmp_path, cpus):
    """The handlers are compiled in groups sized to the CPUs (one library per group) and the
    time-carrying adjoint only once a save-time gradient needs it: every grouping gives the
    XLA replay's values and gradients (parameters and ``ts``)."""
    _cache_settings(monkeypatch, kernel_cache=str(tmp_path))
    monkeypatch.setattr(build, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(build, "_registered", {})
    monkeypatch.setattr(build, "_built", {})
    monkeypatch.setattr(kernel_replay_mod, "_sources", {})

    def decay_forced(t, y, p):  # a field no other test (or grouping) builds
        return jnp.stack([-p[0] * y[0] + jnp.sin(t), -p[1] * y[1] + 0.1 * cpus * y[0]])

    y0 = jnp.tile(jnp.array([1.0, 0.5]), (6, 1))
    p = jnp.array([0.7, 1.3]) * (1 + 0.1 * jnp.arange(6))[:, None]
    ts = jnp.linspace(0.0, 2.0, 5)
    mesh = gs.record(decay_forced, 0.0, 2.0, y0, p, ts=ts)
    loss_p = lambda a: jnp.sum(gs.replay(decay_forced, mesh, y0, a).ys ** 2)
    loss_ts = lambda s: jnp.sum(gs.replay(decay_forced, mesh, y0, p, ts=s).ys ** 2)
    sol = gs.replay(decay_forced, mesh, y0, p)
    g_p = jax.grad(loss_p)(p)
    built = sorted(f.name for f in tmp_path.iterdir())
    assert not any("bwdt" in name for name in built), built
    assert len(built) == min(cpus, 3), built
    g_ts = jax.grad(loss_ts)(ts)
    assert any("bwdt" in f.name for f in tmp_path.iterdir())
    assert sol.route == "gradsolve-kernel"
    with gs.use_compiled_kernel(False):
        sol_x = gs.replay(decay_forced, mesh, y0, p)
        g_p_x, g_ts_x = jax.grad(loss_p)(p), jax.grad(loss_ts)(ts)
    np.testing.assert_allclose(sol.ys, sol_x.ys, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g_p, g_p_x, rtol=1e-11)
    np.testing.assert_allclose(g_ts, g_ts_x, rtol=1e-10, atol=1e-12)


def test_stiff_solvers_use_the_kernel_and_diffrax_solvers_the_xla_replay():
    import diffrax

    y0 = jnp.ones((2, 1))
    p = jnp.array([[1.0], [2.0]])
    f = lambda t, y, p: -p * y
    stiff = "gradsolve-kernel" if kernel_builds() else "gradsolve-batched"
    for solver, route in ((gs.Rodas5P(), stiff),
                          (diffrax.Tsit5(), "gradsolve-batched/diffrax.Tsit5")):
        mesh = gs.record(f, 0.0, 1.0, y0, p, solver=solver)
        assert gs.replay(f, mesh, y0, p).route == route


# Every problem with the default options in the normal suite, and the options (the
# initial step, the PI controller, the step limit: the controller's code, the same for
# every field) on lotka_volterra; the options on the other fields in the slow tier.
RECORD_OPTIONS = {"default": {},
                  "dt0_pi": {"dt0": 0.01, "controller": gs.PIDController(pcoeff=0.4, icoeff=0.3)},
                  "max_steps": {"max_steps": 20}}
RECORD_CASES = [pytest.param(problem, options, id=f"{name}-{problem}",
                             marks=[] if name == "default" or problem == "lotka_volterra"
                             else [pytest.mark.slow])
                for name, options in RECORD_OPTIONS.items() for problem in sorted(PROBLEMS)]


@requires_compiler
@pytest.mark.parametrize("problem, options", RECORD_CASES)
def test_record_kernel_matches_xla_record(problem, options):
    f, t1, make_y0, make_p = PROBLEMS[problem]
    n = 9
    y0, p = make_y0(n), make_p(n)
    ts = jnp.linspace(0.0, t1, 6)
    kw = dict(ts=ts, rtol=1e-7, atol=1e-9, throw=False, **options)
    mk = gs.record(f, 0.0, t1, y0, p, **kw)
    with gs.use_compiled_kernel(False):
        mx = gs.record(f, 0.0, t1, y0, p, **kw)
    np.testing.assert_array_equal(mk.status, mx.status)
    if "max_steps" in options:
        assert np.all(np.asarray(mk.status) == gs.Status.MAX_STEPS)
    if problem == "lotka_volterra" and "controller" not in options:
        # Pure arithmetic and an I-controller: the two implementations take the same steps.
        for field in ("n_steps", "n_rejected", "save_index"):
            np.testing.assert_array_equal(getattr(mk, field), getattr(mx, field), err_msg=field)
        # Step sizes come from error estimates (differences of close numbers): last-bit
        # rounding differences move the nodes slightly.
        np.testing.assert_allclose(mk.times, mx.times, rtol=1e-6, atol=1e-9)
    else:
        # Transcendental functions differ in the last bit between libm and XLA, and an
        # accept/reject decision near err = 1 can flip: the XLA record itself changes by a
        # few steps when rtol moves by 1e-13 here. Compare step counts statistically.
        np.testing.assert_allclose(mk.n_steps, mx.n_steps, rtol=0.1)
    np.testing.assert_allclose(mk.y_last, mx.y_last, rtol=1e-5, atol=1e-6)  # two valid solves
    # The replay reproduces the record's own final state (same code, same arithmetic).
    ok = np.asarray(mk.status) == 0
    np.testing.assert_allclose(gs.replay(f, mk, y0, p).y1[ok], mk.y_last[ok], rtol=1e-13, atol=1e-14)


@requires_compiler
def test_moved_save_times_not_differentiated_keep_their_nodes_in_the_adjoint():
    """Save times traced and moved from the recorded ones but not differentiated: the
    adjoint without save-time cotangents still steps over the moved nodes (it once used
    the recorded ones, a gradient off by ~1e-3 here), as the XLA drivers' AD does."""
    # (Shapes no other test replays with: tests that count adjoint builds must trace anew.)
    y0, p = jnp.ones((4, 2)), jnp.array([[1.5, 1.0, 3.0, 1.0]] * 4)
    ts0 = jnp.linspace(1.0, 9.0, 7)
    mesh = gs.record(lotka_volterra, 0.0, 10.0, y0, p, ts=ts0)

    def grad(driver):
        loss = lambda p, ts: jnp.sum(gs.replay(lotka_volterra, mesh, y0, p, ts=ts,
                                               driver=driver).ys ** 2)
        return jax.jit(jax.grad(loss))(p, ts0 + 1e-3)

    np.testing.assert_allclose(grad(gs.drivers.Kernel()), grad(gs.drivers.Batched()),
                               rtol=1e-10)


# The transforms of test_states_packed_by_step_count: ``jit`` in the normal suite (the
# packing itself); ``vmap`` and second order, one compile each per driver, in the slow tier
# (the kernel under ``vmap``: test_forward_mode_second_order_and_vmap[fwd_vmap]; second
# order: test_replay.py's test_equal_save_times_each_get_their_own_derivative[True]).
PACKED_TRANSFORMS = ["jit", pytest.param("vmap", marks=pytest.mark.slow),
                     pytest.param("second_order", marks=pytest.mark.slow)]


@requires_compiler
@pytest.mark.parametrize("transform", PACKED_TRANSFORMS)
def test_states_packed_by_step_count_under_jit_vmap_and_second_order(transform):
    """The kernel's forward stores each trajectory's states packed by its step count (not at
    the mesh capacity's stride) and tells the adjoint where they are. A ragged ensemble
    (step counts ~10x apart) solved at a capacity far above them: gradients under ``jit``,
    under ``vmap`` (B x n trajectories in one call) and the Hessian-vector products of a
    ``jacrev`` of ``jacrev`` (where ``vmap`` broadcasts one call's states to copies) equal
    the XLA driver's."""
    n = 5
    y0 = jnp.ones((n, 2))
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * jnp.geomspace(0.3, 3.0, n)[:, None]
    ts = jnp.linspace(0.0, 6.0, 4)

    def loss(q, driver):
        sol = gs.solve(lotka_volterra, 0.0, 6.0, y0, q, ts=ts, max_steps=3000, driver=driver)
        return jnp.sum(sol.ys ** 2)

    mesh = gs.record(lotka_volterra, 0.0, 6.0, y0, p, ts=ts)
    assert np.ptp(np.asarray(mesh.n_steps)) > 20
    kernel, xla = gs.drivers.Kernel(), gs.drivers.Batched()
    if transform == "jit":
        g = jax.jit(jax.grad(lambda q: loss(q, kernel)))(p)
        gx = jax.jit(jax.grad(lambda q: loss(q, xla)))(p)
        np.testing.assert_allclose(g, gx, rtol=1e-10)
    if transform == "vmap":
        batch = jnp.stack([p, 1.1 * p, 0.9 * p])
        vg = jax.jit(jax.vmap(jax.grad(lambda q: loss(q, kernel))))(batch)
        vgx = jax.jit(jax.vmap(jax.grad(lambda q: loss(q, xla))))(batch)
        np.testing.assert_allclose(vg, vgx, rtol=1e-10)
    if transform == "second_order":
        rep = lambda q, drv: jnp.sum(gs.replay(lotka_volterra, mesh, y0, q, driver=drv).ys ** 2)
        h = jax.jacrev(jax.jacrev(lambda q: rep(q, kernel)))(p)
        hx = jax.jacrev(jax.jacrev(lambda q: rep(q, xla)))(p)
        np.testing.assert_allclose(h, hx, rtol=1e-9, atol=1e-9 * np.abs(hx).max())


@requires_compiler
# one compile per case and driver: the traced save times (and the size limit) in the
# normal suite, the recorded nodes and the jumps in the slow tier
@pytest.mark.parametrize("case", [pytest.param("recorded", marks=pytest.mark.slow), "moved",
                                  pytest.param("jumps", marks=pytest.mark.slow)])
def test_stored_rows_without_node_times_past_the_size_limit(monkeypatch, case):
    """Past `_WIDE_ROWS_MAX_BYTES` the forward stores states alone (no node time beside
    them) and the reverse sweep finds the node times again: recorded, moved by traced save
    times, or moved by jumps. Gradients equal the XLA driver's either way."""
    # (Shapes no other test replays with, so every call traces with the limit in force.)
    monkeypatch.setattr(kernel_replay_mod, "_WIDE_ROWS_MAX_BYTES", 0)
    n = 6
    y0 = jnp.ones((n, 2))
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.05 * jnp.arange(n))[:, None]
    ts0 = jnp.linspace(0.5, 5.5, 5)
    jumps = (jnp.full((n, 1), 2.25), jnp.tile(jnp.array([[[0.3, 0.0]]]), (n, 1, 1)))
    cases = {"recorded": (None, None), "moved": (ts0 + 1e-3, None), "jumps": (None, jumps)}
    for name, (ts, jmp) in [(case, cases[case])]:
        mesh = gs.record(lotka_volterra, 0.0, 6.0, y0, p, ts=ts0, jumps=jumps if jmp else None)
        s1 = mesh.times.shape[1]

        def loss(q, t, driver):
            sol = gs.replay(lotka_volterra, mesh, y0, q, ts=t, jumps=jmp, driver=driver)
            return jnp.sum(sol.ys ** 2)

        grad = jax.grad(loss, argnums=(0, 1) if ts is not None else 0)
        jaxpr = str(jax.make_jaxpr(grad)(p, ts, gs.drivers.Kernel()))
        assert f"f64[{n},{s1},2]" in jaxpr and f"f64[{n},{s1},3]" not in jaxpr, name
        g = grad(p, ts, gs.drivers.Kernel())
        gx = grad(p, ts, gs.drivers.Batched())
        for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(gx)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)


@requires_compiler
# Tsit5 (FSAL: the carried stage restarts after each jump and tstop node) in the normal
# suite; Vern7 (another kernel build, ~8 s) in the slow tier
@pytest.mark.parametrize("solver", [gs.Tsit5(), pytest.param(gs.Vern7(), marks=pytest.mark.slow)],
                         ids=lambda s: type(s).__name__)
def test_record_kernel_with_events_matches_xla_record(solver):
    """Ragged dose schedules (padding, a jump at t0, two jumps at one time, one at t1) and
    tstops: the C++ record lands the same forced nodes as the XLA loop."""
    def pk(t, y, p):
        rate = jnp.where((t >= p[2]) & (t < p[3]), p[4], 0.0)
        return jnp.stack([-p[0] * y[0], p[0] * y[0] - p[1] * y[1] + rate])

    inf = jnp.inf
    jt = jnp.array([[0.0, 12.0, 24.0], [0.0, 8.0, inf], [6.0, 6.0, 48.0]])
    js = jnp.stack([jnp.array([[100.0, 100.0, 50.0], [80.0, 60.0, 0.0], [40.0, 30.0, 5.0]]),
                    jnp.zeros((3, 3))], axis=-1)
    tstops = jnp.array([[30.0, 32.0], [10.0, 11.0], [inf, inf]])
    p = jnp.array([[1.0, 0.2, 30.0, 32.0, 5.0], [0.7, 0.1, 10.0, 11.0, 2.0],
                   [1.3, 0.3, 99.0, 99.0, 0.0]])
    ts = jnp.array([0.0, 1.0, 6.0, 12.0, 20.0, 31.0, 40.0, 48.0])
    kw = dict(ts=ts, jumps=(jt, js), tstops=tstops, rtol=1e-8, atol=1e-8, solver=solver)
    y0 = jnp.zeros((3, 2))
    mk = gs.record(pk, 0.0, 48.0, y0, p, driver=gs.drivers.Kernel(), **kw)
    mx = gs.record(pk, 0.0, 48.0, y0, p, driver=gs.drivers.Batched(), **kw)
    for field in ("status", "n_steps", "n_rejected", "save_index", "jump_index", "tstop_index"):
        np.testing.assert_array_equal(getattr(mk, field), getattr(mx, field), err_msg=field)
    # Step sizes come from error estimates: last-bit differences (libm against XLA) move
    # the free nodes slightly, more for Vern7, whose error estimate after a short clipped
    # step is mostly rounding (2.5e-5 without events too); forced nodes sit at their
    # times exactly (below).
    rtol = 1e-6 if isinstance(solver, gs.Tsit5) else 1e-4
    np.testing.assert_allclose(mk.times, mx.times, rtol=rtol, atol=1e-9)
    np.testing.assert_allclose(mk.y_last, mx.y_last, rtol=1e-7, atol=1e-9)
    # Every jump its own node at its time, after a node at the same time.
    rows = np.arange(3)[:, None]
    live = np.isfinite(np.asarray(jt))
    idx = np.asarray(mk.jump_index)
    np.testing.assert_array_equal(np.asarray(mk.times)[rows, idx][live], np.asarray(jt)[live])
    np.testing.assert_array_equal(np.asarray(mk.times)[rows, idx - 1][live], np.asarray(jt)[live])
    assert np.all(idx[~live] == 0)
    # The kernel's replay of its own record reproduces the record's final state (the jump
    # at t1 included).
    sol = gs.replay(pk, mk, y0, p, jumps=(jt, js), driver=gs.drivers.Kernel())
    np.testing.assert_allclose(sol.y1, mk.y_last, rtol=1e-13, atol=1e-13)
    assert float(sol.y1[2, 0]) > 5.0 - 1e-9


@requires_compiler
def test_closures_over_changing_values_stop_compiling_new_kernels(monkeypatch):
    """A vector field closing over a value that changes between calls would compile a new
    kernel per value; past the limit (here 1) it runs on the XLA driver, with a warning and
    the same results (checked against the closed form y = exp(-k t))."""
    monkeypatch.setattr(kernel_replay_mod, "_MAX_VARIANTS", 1)
    monkeypatch.setattr(kernel_replay_mod, "_variants", {})

    def solve(k):
        return gs.solve(lambda t, y, p: -k * p * y, 0.0, 2.0, jnp.ones((3, 1)), jnp.ones(3),
                        ts=jnp.array([1.0, 2.0]), rtol=1e-10, atol=1e-12)

    first = solve(0.3)
    assert first.route == "gradsolve-kernel"
    with pytest.warns(RuntimeWarning, match="closes over values that change"):
        second = solve(0.7)
    assert second.route == "gradsolve-lanes"
    for k, sol in ((0.3, first), (0.7, second)):
        np.testing.assert_allclose(sol.ys[:, :, 0], np.exp(-k * np.array([[1.0, 2.0]] * 3)),
                                   rtol=1e-9)


def test_kernel_cache_prunes_least_recently_used(tmp_path, monkeypatch):
    _cache_settings(monkeypatch, kernel_cache=str(tmp_path))
    _cache_settings(monkeypatch, kernel_cache_mb=2.5 / 1024)  # 2.5 KiB
    paths = []
    for i in range(4):
        p = tmp_path / f"gs_{i}_fwd.so"
        p.write_bytes(b"x" * 1024)
        os.utime(p, (1000 + i, 1000 + i))
        paths.append(p)
    build._prune_cache(keep={paths[0]})  # the oldest, but just built: kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gs_0_fwd.so", "gs_3_fwd.so"]


def test_complex_constants_are_refused_not_truncated():
    """A complex constant in the field (here |3 + 4j| = 5) must not lose its imaginary part
    in the translator: the kernel and the lanes replay refuse it, and the batched driver
    gives the closed form."""
    C = jnp.array([3.0 + 4.0j, 1.0 + 0.0j])
    f = lambda t, y, p: -p * y * jnp.abs(C)[0]
    y0, p = jnp.ones((3, 1)), jnp.array([[0.1], [0.2], [0.3]])
    for driver in (gs.drivers.Kernel(), gs.drivers.Lanes()):
        assert "complex" in driver.replay_reason(f, gs.Tsit5(), y0, p)
    with pytest.warns(RuntimeWarning, match="complex128"):  # the fallback says why
        sol = gs.solve(f, 0.0, 1.0, y0, p, rtol=1e-10, atol=1e-12)
    assert sol.route == "gradsolve-batched"
    np.testing.assert_allclose(sol.y1, jnp.exp(-5.0 * p), rtol=1e-8)


@requires_compiler
def test_kernel_calls_are_typed_ffi_in_the_op_itself():
    """Each kernel call states typed FFI in the op's own attributes (``api_version = 4``,
    ``backend_config`` a dictionary), not in the discardable ``mhlo.backend_config`` that
    XLA's passes dropped in large programs (the calls then ran as untyped custom calls no
    handler serves). Checked on the lowered program of a gradient through the kernel."""
    y0 = jnp.tile(jnp.array([1.0, 1.0]), (4, 1))
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0]), (4, 1))
    ts = jnp.linspace(0.0, 3.0, 5)

    def loss(p):
        sol = gs.solve(lotka_volterra, 0.0, 3.0, y0, p, ts=ts, driver=gs.drivers.Kernel())
        return jnp.sum(sol.ys ** 2)

    text = jax.jit(jax.grad(loss)).lower(p).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @gradsolve_" in line]
    assert {c.split("@")[1].split("(")[0].rsplit("_", 1)[1] for c in calls} >= {"rec", "fwd", "bwd"}
    for c in calls:
        assert "api_version = 4" in c and "mhlo.backend_config" not in c, c
        assert "backend_config = {" in c and "threads = 0" in c, c


@requires_compiler
def test_kernel_threads_fixed_by_the_driver():
    """``Kernel(threads=1)`` runs every call on one thread: the same values and gradients
    as the default (up to the order lanes are summed in, here none: per-trajectory
    outputs); a bad count is refused naming the argument."""
    n = 64  # enough lanes for the default to use several threads where CPUs allow
    y0 = jnp.tile(jnp.array([1.0, 1.0]), (n, 1))
    p = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.1 * jnp.linspace(-1, 1, n))[:, None]
    ts = jnp.linspace(0.0, 3.0, 5)

    def run(driver):
        f = lambda p: gs.solve(lotka_volterra, 0.0, 3.0, y0, p, ts=ts, driver=driver).ys
        ys, vjp = jax.vjp(f, p)
        return ys, vjp(jnp.ones_like(ys))[0]

    ys1, g1 = run(gs.drivers.Kernel(threads=1))
    ys0, g0 = run(gs.drivers.Kernel())
    assert jnp.array_equal(ys1, ys0) and jnp.array_equal(g1, g0)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            gs.drivers.Kernel(threads=bad)


@requires_compiler
def test_explicit_kernel_threads_need_sixteen_lane_groups(monkeypatch):
    """An explicit kernel's call starts a thread for every 16 groups of 8 trajectories (its
    steps are cheap next to a thread's start), at most the threads allowed, and runs on one
    below 256 trajectories; the environment variable caps the default."""
    y0, p = jnp.ones((2, 2)), jnp.ones((2, 4))
    prefix = kernel_replay_mod.kernel_target(lotka_volterra, gs.Tsit5(), y0, p).prefix
    assert [build.threads(prefix, n, 8) for n in (1, 8, 64, 255, 256, 384, 5000)] == \
        [1, 1, 1, 1, 2, 3, 8]
    monkeypatch.setenv("GRADSOLVE_KERNEL_THREADS", "3")  # read at every call
    assert build.threads(prefix, 5000) == 3 and build.threads(prefix, 5000, 5) == 5
