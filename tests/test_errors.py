"""SPEC §2.6: bad input gets a ValueError naming the argument; failed trajectories raise a
RuntimeError naming them outside jit and give status codes plus NaN inside it."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import decay, kernel_builds, lotka_volterra, robertson

P = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(y0=jnp.ones((2, 3, 2))), "`y0`"),
        (dict(params=jnp.ones((5, 4)), y0=jnp.ones((3, 2))), "`params"),
        (dict(ts=jnp.array([0.0, 2.0, 1.0])), "`ts` must be sorted"),
        (dict(ts=jnp.array([0.0, 11.0])), "`ts` must lie inside"),
        (dict(ts=jnp.array([-1.0, 1.0])), "`ts` must lie inside"),
        (dict(t1=0.0), "`t1` must be greater than `t0`"),
        (dict(t1=-1.0), "`t1` must be greater than `t0`"),
        (dict(rtol=0.0), "`rtol` must be positive"),
        (dict(atol=-1e-9), "`atol` must be positive"),
        (dict(max_steps=0), "`max_steps`"),
        (dict(solver="tsit5"), "`solver`"),
        (dict(f=lambda t, y, p: jnp.zeros(3)), "`f` must return"),
        (dict(dt0=-0.1), "`dt0`"),
        (dict(dt0=0.0), "`dt0`"),
        (dict(dt0=float("inf")), "`dt0`"),
        (dict(y0=jnp.ones((0, 2)), params=jnp.ones((0, 4))), "`y0`"),
        (dict(y0=jnp.ones(2, jnp.complex128)), "`y0`"),
        (dict(controller="pid"), "`controller`"),
        (dict(atol=float("inf")), "`atol` must be positive and finite"),
        (dict(rtol=float("inf")), "`rtol` must be positive and finite"),
        (dict(t0="0"), "`t0` must be a real number, got str '0'"),
        (dict(t1=1j), "`t1` must be a real number"),
        (dict(rtol="1e-6"), "`rtol` must be a real number"),
        (dict(dt0="0.1"), "`dt0` must be a real number"),
        (dict(throw="no"), "`throw` must be None, True or False"),
    ],
)
@pytest.mark.parametrize("fn", ["record", "solve"])
def test_bad_input_names_the_argument(fn, kwargs, needle):
    args = dict(f=lotka_volterra, t0=0.0, t1=10.0, y0=Y0, params=P)
    args.update(kwargs)
    f, t0, t1, y0, params = (args.pop(k) for k in ("f", "t0", "t1", "y0", "params"))
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        getattr(gs, fn)(f, t0, t1, y0, params, **args)


def test_replay_rejects_mismatched_inputs():
    mesh = gs.record(lotka_volterra, 0.0, 5.0, jnp.ones((3, 2)), jnp.tile(P, (3, 1)))
    with pytest.raises(ValueError, match="trajectories"):
        gs.replay(lotka_volterra, mesh, jnp.ones((4, 2)), jnp.tile(P, (4, 1)))
    with pytest.raises(ValueError, match="ensemble"):
        gs.replay(lotka_volterra, mesh, Y0, P)
    with pytest.raises(ValueError, match="`mesh`"):
        gs.replay(lotka_volterra, "mesh", Y0, P)
    with pytest.raises(ValueError, match="`ts`"):
        gs.replay(lotka_volterra, mesh, jnp.ones((3, 2)), jnp.tile(P, (3, 1)), ts=jnp.ones(4))
    for layout, needle in ((dict(group_size=0), "gs.replay: `group_size`"),
                           (dict(group_size=True), "gs.replay: `group_size`"),
                           (dict(chunk_size=2.0), "gs.replay: `chunk_size`")):
        with pytest.raises(ValueError, match=needle):
            gs.replay(lotka_volterra, mesh, jnp.ones((3, 2)), jnp.tile(P, (3, 1)), **layout)


def test_solve_refuses_a_bad_layout_before_it_records(monkeypatch):
    import gradsolve._solve as solve_module

    def no_record(*args, **kwargs):
        raise AssertionError("recorded before the layout was checked")

    monkeypatch.setattr(solve_module, "record_prepared", no_record)
    for layout, needle in ((dict(group_size=0), "gs.solve: `group_size`"),
                           (dict(chunk_size=2.0), "gs.solve: `chunk_size`")):
        with pytest.raises(ValueError, match=needle):
            gs.solve(lotka_volterra, 0.0, 1.0, Y0, P, **layout)


def _blowup(t, y, p):
    return p["a"] * y**2  # y(t) = y0 / (1 - a y0 t): finite-time blow-up at t = 1/(a y0)


def test_max_steps_error_names_trajectories_and_fix():
    n = 4
    p = jnp.tile(P, (n, 1)).at[2].multiply(20.0)  # trajectory 2 needs many more steps
    with pytest.raises(RuntimeError) as info:
        gs.record(lotka_volterra, 0.0, 10.0, jnp.ones((n, 2)), p, max_steps=60)
    msg = str(info.value)
    assert "max_steps=" in msg and "2" in msg and "gs.Rodas5P()" in msg
    assert "looks stiff" not in msg  # Lotka–Volterra is not stiff: do not cry wolf


def test_blowup_is_reported_as_underflow_or_nonfinite():
    with pytest.raises(RuntimeError, match="non-finite|underflow|max_steps"):
        gs.solve(_blowup, 0.0, 2.0, jnp.array([1.0]), {"a": jnp.array(1.0)})


def test_explicit_solver_on_stiff_problem_suggests_rodas5p():
    k = jnp.array([0.04, 3e7, 1e4])
    with pytest.raises(RuntimeError) as info:
        gs.record(robertson, 0.0, 1e5, jnp.array([1.0, 0.0, 0.0]), k, max_steps=2000)
    msg = str(info.value)
    assert "looks stiff" in msg and "gs.Rodas5P()" in msg


def test_inside_jit_failures_are_status_and_nan():
    n = 3
    a = jnp.array([0.1, 1.0, 0.2])  # trajectory 1 blows up before t1 = 2
    y0 = jnp.ones((n, 1))

    @jax.jit
    def run(a_):
        return gs.solve(_blowup, 0.0, 2.0, y0, {"a": a_})

    sol = run(a)
    status = np.asarray(sol.mesh.status)
    assert status[1] != 0 and status[0] == 0 and status[2] == 0
    assert np.all(np.isnan(np.asarray(sol.ys[1])))
    np.testing.assert_allclose(sol.ys[0, -1, 0], 1.0 / (1.0 - 0.1 * 2.0), rtol=1e-6)
    # Gradients of the surviving trajectories stay finite (no NaN leaks across the ensemble).
    g = jax.grad(lambda a_: jnp.sum(jnp.nan_to_num(run(a_).ys)))(a)
    assert np.all(np.isfinite(np.asarray(g)))



# Trajectory 1 runs out of max_steps=40 (rtol 1e-5 on [0, 5]); 0 and 2 need about 16 and 24
# steps (the Diffrax driver counts its own: 16 and 23).
_FAIL_Y0 = jnp.array([[3.1, 1.6], [30.0, 30.0], [2.0, 1.0]])
_FAIL_TS = jnp.linspace(0.0, 5.0, 6)


def _failing_solve(y0, p, driver, **kw):
    return gs.solve(lotka_volterra, 0.0, 5.0, y0, p, ts=_FAIL_TS, rtol=1e-5, max_steps=40,
                    driver=driver, **kw)


_FAIL_DRIVERS = ([pytest.param(gs.drivers.Kernel(), id="kernel")] if kernel_builds() else []) + [
    pytest.param(gs.drivers.Batched(), id="batched"), pytest.param(gs.drivers.Lanes(), id="lanes"),
    pytest.param(gs.drivers.Diffrax(), id="diffrax", marks=pytest.mark.slow)]  # ~25 s


@pytest.mark.parametrize("driver", _FAIL_DRIVERS)
def test_failed_trajectory_has_a_nan_gradient(driver):
    """A loss on a failed trajectory is NaN and so is its gradient (not a zero that an
    optimiser would take for a stationary point); the other trajectories' gradients are
    those of a solve of them alone."""
    p = jnp.tile(P, (3, 1))

    def loss(y0, p):
        sol = _failing_solve(y0, p, driver)
        return jnp.sum(sol.ys ** 2), sol.stats["status"]

    (value, status), (g_y0, g_p) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(
        _FAIL_Y0, p)
    np.testing.assert_array_equal(status, [0, gs.Status.MAX_STEPS, 0])
    assert np.isnan(value)
    assert np.all(np.isnan(g_y0[1])) and np.all(np.isnan(g_p[1]))
    ok = jnp.array([0, 2])
    (want_y0, want_p), _ = jax.jit(jax.grad(loss, (0, 1), has_aux=True))(_FAIL_Y0[ok], p[ok])
    np.testing.assert_allclose(g_y0[ok], want_y0, rtol=1e-10)
    np.testing.assert_allclose(g_p[ok], want_p, rtol=1e-10)
    if isinstance(driver, gs.drivers.Diffrax):
        return  # (the rest is the same code on every driver; Diffrax compiles slowly)
    # Parameters shared by every trajectory mix the failed one in: NaN, as JAX would.
    shared = jax.jit(jax.grad(lambda q: loss(_FAIL_Y0, jnp.tile(q, (3, 1)))[0]))(P)
    assert np.all(np.isnan(shared))
    # A loss that leaves the failed trajectory out has a finite gradient (zero there).
    masked = jax.jit(jax.grad(lambda p: jnp.sum(jnp.nan_to_num(_failing_solve(
        _FAIL_Y0, p, driver).ys))))(p)
    np.testing.assert_array_equal(masked[1], 0.0)
    assert np.all(np.isfinite(masked))


def test_failed_trajectory_has_nan_derivatives_in_replay_and_forward_mode():
    """The same for `gs.replay` of a mesh whose record failed, in reverse and forward
    mode: NaN in the failed row, the others' derivatives untouched."""
    p = jnp.tile(P, (3, 1))
    mesh = gs.record(lotka_volterra, 0.0, 5.0, _FAIL_Y0, p, ts=_FAIL_TS, rtol=1e-5,
                     max_steps=40, throw=False)
    np.testing.assert_array_equal(mesh.status, [0, gs.Status.MAX_STEPS, 0])
    y_end = lambda p: gs.replay(lotka_volterra, mesh, _FAIL_Y0, p).ys[:, -1, 0]
    g = jax.jit(jax.grad(lambda p: jnp.sum(y_end(p))))(p)
    jf = jax.jit(jax.jacfwd(y_end))(p)  # (3 outputs, 3 trajectories, 4 parameters)
    assert np.all(np.isnan(g[1])) and np.all(np.isnan(jf[1, 1]))
    ok = np.array([0, 2])
    want = jax.jacfwd(lambda q: _failing_solve(_FAIL_Y0[ok], q, None).ys[:, -1, 0])(p[ok])
    np.testing.assert_allclose(g[ok], want[np.arange(2), np.arange(2)], rtol=1e-10)
    np.testing.assert_allclose(jf[ok][:, ok], want, rtol=1e-10)
    np.testing.assert_array_equal(jf[1][ok], 0.0)  # no leak across rows
    np.testing.assert_array_equal(jf[ok][:, 1], 0.0)

def test_throw_true_raises_inside_jit():
    @jax.jit
    def run(a_):
        return gs.solve(_blowup, 0.0, 2.0, jnp.ones(1), {"a": a_}, throw=True).ys

    with pytest.raises(Exception, match="gs.Rodas5P"):
        jax.block_until_ready(run(jnp.array(1.0)))


def test_throw_false_returns_status_outside_jit():
    mesh = gs.record(_blowup, 0.0, 2.0, jnp.ones(1), {"a": jnp.array(1.0)}, throw=False)
    assert int(mesh.status) in (gs.Status.NONFINITE, gs.Status.STEP_UNDERFLOW, gs.Status.MAX_STEPS)


def test_import_does_not_touch_global_config():
    code = "import jax; import gradsolve; print(jax.config.jax_enable_x64)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_float32_solve_and_gradient():
    code = r"""
import jax, jax.numpy as jnp, numpy as np
import gradsolve as gs
f = lambda t, y, p: jnp.stack([p[0]*y[0] - p[1]*y[0]*y[1], -p[2]*y[1] + p[3]*y[0]*y[1]])
p = jnp.array([1.5, 1.0, 3.0, 1.0], jnp.float32)
sol = gs.solve(f, 0.0, 5.0, jnp.ones((4, 2), jnp.float32), jnp.tile(p, (4, 1)), ts=jnp.linspace(0, 5, 6), rtol=1e-5, atol=1e-7)
g = jax.jit(jax.grad(lambda q: jnp.sum(gs.solve(f, 0.0, 5.0, jnp.ones(2, jnp.float32), q, rtol=1e-5, atol=1e-7).ys)))(p)
assert sol.ys.dtype == jnp.float32 and g.dtype == jnp.float32
print(repr(np.asarray(sol.ys[0]).tolist())); print(repr(np.asarray(g).tolist()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ys32, g32 = (np.array(eval(line)) for line in out.stdout.strip().splitlines())
    ref = gs.solve(lotka_volterra, 0.0, 5.0, Y0, P, ts=jnp.linspace(0, 5, 6), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ys32, ref.ys, rtol=1e-3)
    gref = jax.jit(jax.grad(lambda q: jnp.sum(gs.solve(lotka_volterra, 0.0, 5.0, Y0, q, rtol=1e-10, atol=1e-12).ys)))(P)
    np.testing.assert_allclose(g32, gref, rtol=1e-3)


@pytest.mark.parametrize("kernel", [True, False])
def test_invalid_traced_inputs_give_invalid_status_and_nan(kernel):
    """Under jit, ts/tolerances/interval are traced: no ValueError is possible, so invalid
    ones are flagged per trajectory (Status.INVALID_INPUT, NaN), on both replay routes."""
    ts = jnp.array([[0.2, 0.5], [0.5, 0.2], [0.3, 1.5], [0.3, 1.0]])  # rows 1, 2 invalid
    k = jnp.array([1.0, 2.0, 3.0, 4.0])
    y0 = jnp.ones((4, 1))
    with gs.use_compiled_kernel(kernel):
        run = jax.jit(lambda ts, rtol: gs.solve(decay, 0.0, 1.0, y0, {"k": k}, ts=ts, rtol=rtol))
        sol = run(ts, 1e-8)
        np.testing.assert_array_equal(sol.stats["status"], [0, 4, 4, 0])
        assert gs.Status.INVALID_INPUT == 4
        assert np.all(np.isnan(np.asarray(sol.ys[1:3])))
        for i in (0, 3):
            np.testing.assert_allclose(sol.ys[i, :, 0], np.exp(-float(k[i]) * np.asarray(ts[i])),
                                       rtol=1e-6)
        # Gradients of the valid trajectories are untouched (none leaks from the invalid).
        g = jax.grad(lambda k_, ts_: jnp.sum(jnp.nan_to_num(
            gs.solve(decay, 0.0, 1.0, y0, {"k": k_}, ts=ts_, rtol=1e-8).ys)))
        gk = np.asarray(jax.jit(g)(k, ts))
        ref = [-np.sum(np.asarray(ts[i]) * np.exp(-float(k[i]) * np.asarray(ts[i]))) for i in (0, 3)]
        np.testing.assert_allclose(gk[np.array([0, 3])], ref, rtol=1e-5)
        np.testing.assert_array_equal(gk[1:3], 0.0)
        # A traced non-positive tolerance invalidates every trajectory.
        assert np.all(np.asarray(run(ts[jnp.array([0, 3, 0, 3])], -1.0).stats["status"]) == 4)
        mesh = jax.jit(lambda t1: gs.record(decay, 0.0, t1, y0, {"k": k}))(-1.0)
        assert np.all(np.asarray(mesh.status) == gs.Status.INVALID_INPUT)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(ts=jnp.array([0.5, 0.2])), "`ts` must be sorted"),
        (dict(ts=jnp.array([0.5, 1.5])), "`ts` must lie inside"),
        (dict(rtol=jnp.array(-1.0)), "`rtol` must be positive"),
        (dict(dt0=jnp.array(-0.1)), "`dt0` must be positive"),
    ],
)
def test_invalid_traced_input_with_throw_names_it(kwargs, needle):
    run = jax.jit(lambda kw: gs.solve(decay, 0.0, 1.0, jnp.ones(1), {"k": 1.0}, throw=True, **kw).ys)
    with pytest.raises(Exception, match=needle) as info:
        jax.block_until_ready(run(kwargs))
    assert "a trajectory failed" not in str(info.value)


def test_vmap_over_a_value_the_vector_field_closes_over():
    """jax.vmap(lambda k: gs.solve(lambda t, y, p: -k * y, ...)) run eagerly: the mesh is
    traced although the arguments are not; it must behave as under jit."""
    ks = jnp.array([1.0, 2.0, 3.0])
    y0 = jnp.array([1.0, 2.0])
    sol = jax.vmap(lambda k: gs.solve(lambda t, y, p: -k * y, 0.0, 1.0, y0, None, rtol=1e-8))(ks)
    np.testing.assert_allclose(sol.y1, np.exp(-np.asarray(ks))[:, None] * np.asarray(y0), rtol=1e-6)
    # A failure there is a status code plus NaN, as under jit.
    a = jnp.array([0.1, 1.0])
    sol = jax.vmap(lambda a_: gs.solve(lambda t, y, p: a_ * y**2, 0.0, 2.0, jnp.ones(1), None))(a)
    assert int(sol.mesh.status[0]) == 0 and int(sol.mesh.status[1]) != 0
    assert np.isnan(float(sol.y1[1, 0]))


# the kernel route (a kernel build of its own, ~12 s) in the slow tier; float32 on the
# kernel is checked in the normal suite by test_kernel.py::test_float32_kernel
@pytest.mark.parametrize("route", [pytest.param("kernel", marks=pytest.mark.slow), "xla",
                                   "rodas5p"])
def test_mixed_and_half_precision_dtypes_are_promoted(route):
    """float32 y0 with float64 params (x64 on) runs in float64 on every route; float16 and
    bfloat16 y0 run in float32."""
    kw = dict(solver=gs.Rodas5P()) if route == "rodas5p" else {}
    with gs.use_compiled_kernel(route == "kernel"):
        sol = gs.solve(decay, 0.0, 1.0, jnp.ones(2, jnp.float32), {"k": jnp.array(1.5, jnp.float64)},
                       rtol=1e-8, atol=1e-10, **kw)
        assert sol.ys.dtype == jnp.float64
        np.testing.assert_allclose(sol.y1, np.exp(-1.5), rtol=1e-6)
        for half in (jnp.float16, jnp.bfloat16):
            sol = gs.solve(decay, 0.0, 1.0, jnp.ones(2, half), {"k": jnp.array(1.5, half)},
                           rtol=1e-4, atol=1e-6, **kw)
            assert sol.ys.dtype == jnp.float32
            np.testing.assert_allclose(sol.y1, np.exp(-1.5), rtol=1e-3)


@pytest.mark.parametrize("driver", [None, gs.drivers.Batched()], ids=["auto", "batched"])
def test_field_returning_a_wider_dtype_names_it(driver):
    """A float32 state whose field returns float64 (a constant matrix built while x64 is on)
    is a ValueError naming f's output dtype, on every route, in record, solve and replay;
    before, an internal loop-carry TypeError (or a jvp dtype mismatch on the kernel route)."""
    A = jnp.array([[-1.0, 0.5], [0.0, -2.0]])  # float64
    f = lambda t, y, p: A @ y * p[0]
    y0, p = jnp.ones((3, 2), jnp.float32), jnp.ones((3, 1), jnp.float32)
    for fn in (gs.solve, gs.record):
        with pytest.raises(ValueError, match="`f` returned dtype float64 for a state y of dtype float32"):
            fn(f, 0.0, 1.0, y0, p, driver=driver)
    mesh = gs.record(lambda t, y, p: (A.astype(y.dtype) @ y) * p[0], 0.0, 1.0, y0, p, driver=driver)
    with pytest.raises(ValueError, match="`f` returned dtype float64"):
        gs.replay(f, mesh, y0, p, driver=driver)
    # The fix the message gives works: the state stays float32.
    fixed = lambda t, y, p: (A @ y * p[0]).astype(y.dtype)
    sol = gs.solve(fixed, 0.0, 1.0, y0, p, driver=driver)
    assert sol.ys.dtype == jnp.float32
    np.testing.assert_allclose(sol.y1[:, 1], np.exp(-2.0), rtol=1e-4)


def test_more_save_times_than_max_steps_is_a_value_error():
    ts = jnp.linspace(0.0, 1.0, 50)
    for fn in (gs.solve, gs.record):
        with pytest.raises(ValueError, match="`max_steps`") as info:
            fn(decay, 0.0, 1.0, jnp.ones(1), {"k": 1.0}, ts=ts, max_steps=20)
        msg = str(info.value)
        assert "len(ts)" in msg and "max_steps=" in msg and "Rodas5P" not in msg
    with pytest.raises(ValueError, match="len\\(ts\\) = 50"):  # traced ts: by their number
        jax.jit(lambda ts: gs.solve(decay, 0.0, 1.0, jnp.ones(1), {"k": 1.0}, ts=ts,
                                    max_steps=20))(ts)
    # Repeated save times are one mesh point each: these fit.
    sol = gs.solve(decay, 0.0, 1.0, jnp.ones(1), {"k": 1.0}, ts=jnp.repeat(ts[:5], 10),
                   max_steps=20, rtol=1e-3)
    np.testing.assert_allclose(sol.ys[:, 0], np.exp(-np.repeat(ts[:5], 10)), rtol=1e-3)


def test_params_with_non_array_leaves():
    """Diffrax accepts ``args`` with non-array leaves; so do solve and record (split off
    and handed back to f), without rebuilding anything per call."""
    import diffrax
    import equinox as eqx

    from gradsolve.drivers.kernel.driver import _sources

    def f(t, y, p):
        assert p["name"] == "decay"
        return -p["k"] * y

    y0 = jnp.array([1.0, 0.5])
    for k in (1.0, 2.0, 3.0):
        if k == 2.0:
            n_sources = len(_sources)
        sol = gs.solve(f, 0.0, 1.0, y0, {"k": jnp.array(k), "name": "decay"}, rtol=1e-8)
        np.testing.assert_allclose(sol.y1, np.exp(-k) * np.asarray(y0), rtol=1e-6)
    assert len(_sources) == n_sources  # the wrapper is reused: no new kernel per call

    mlp = eqx.nn.MLP(2, 2, 8, 2, activation=jax.nn.tanh, key=jax.random.PRNGKey(0))  # smooth
    g = lambda t, y, m: m(y)
    ref = diffrax.diffeqsolve(diffrax.ODETerm(g), diffrax.Tsit5(), 0.0, 1.0, None, y0, args=mlp,
                              stepsize_controller=diffrax.PIDController(rtol=1e-11, atol=1e-13))
    sol = gs.solve(g, 0.0, 1.0, y0, mlp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.y1, ref.ys[-1], rtol=1e-8)
    # the gradients jitted (un-jitted, each compiles hundreds of small programs)
    grad = eqx.filter_jit(eqx.filter_grad(
        lambda m: jnp.sum(gs.solve(g, 0.0, 1.0, y0, m, rtol=1e-10, atol=1e-12).y1)))(mlp)
    grad_ref = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(diffrax.diffeqsolve(
        diffrax.ODETerm(g), diffrax.Tsit5(), 0.0, 1.0, None, y0, args=m,
        stepsize_controller=diffrax.PIDController(rtol=1e-11, atol=1e-13)).ys[-1])))(mlp)
    for a, b in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(grad_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    mesh = gs.record(g, 0.0, 1.0, y0, mlp, rtol=1e-10, atol=1e-12)
    grad_replay = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(gs.replay(g, mesh, y0, m).y1)))(mlp)
    for a, b in zip(jax.tree_util.tree_leaves(grad_replay), jax.tree_util.tree_leaves(grad)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_replay_checks_the_vector_field():
    f = lambda t, y, p: -p * y
    mesh = gs.record(f, 0.0, 1.0, jnp.ones(2), 1.0)
    with pytest.raises(ValueError, match="`f`"):
        gs.replay(lambda t, y, p: jnp.ones(3), mesh, jnp.ones(2), 1.0)
    with pytest.raises(ValueError, match="`f` must be callable"):
        gs.replay(None, mesh, jnp.ones(2), 1.0)


@pytest.mark.parametrize("solver, kernel", [(gs.Tsit5(), True), (gs.Tsit5(), False),
                                            (gs.Rodas5P(), False)], ids=["tsit5-kernel", "tsit5-xla", "rodas5p"])
def test_long_horizon_is_not_a_step_underflow(solver, kernel):
    """Step-size underflow is judged against the current time, not t1: y' = -y / (t + c)
    needs steps ~1e-5 near t = 0 and reaches t1 = 1e11 (the classic ROBER horizon) in a few
    hundred steps. Closed form y = y0 c / (t + c)."""
    c = 1e-3
    f = lambda t, y, p: -y / (t + p)
    ts = jnp.array([1e-3, 1.0, 1e5, 1e11])
    with gs.use_compiled_kernel(kernel):
        sol = gs.solve(f, 0.0, 1e11, jnp.array([2.0]), c, ts=ts, solver=solver, rtol=1e-8,
                       atol=1e-14)
    assert int(sol.mesh.status) == gs.Status.OK
    np.testing.assert_allclose(sol.ys[:, 0], 2.0 * c / (np.asarray(ts) + c), rtol=1e-6, atol=1e-15)


def test_diffrax_controller_is_refused_with_its_translation():
    """A Diffrax controller is refused, not half-used (its rtol/atol would be ignored); the
    message says how to write the same thing in gradsolve."""
    import diffrax

    ctrl = diffrax.PIDController(rtol=1e-3, atol=1e-5, pcoeff=0.3, icoeff=0.4)
    with pytest.raises(ValueError, match="`controller`") as info:
        gs.solve(lotka_volterra, 0.0, 1.0, Y0, P, controller=ctrl)
    msg = str(info.value)
    assert "rtol=0.001, atol=1e-05" in msg and "gs.PIDController(pcoeff=0.3, icoeff=0.4)" in msg
    with pytest.raises(ValueError, match="adaptive"):
        gs.record(lotka_volterra, 0.0, 1.0, Y0, P, controller=diffrax.ConstantStepSize())
    # the translation it proposes runs and gives the closed-form decay
    sol = gs.solve(decay, 0.0, 1.0, jnp.ones(1), {"k": jnp.asarray(1.0)}, rtol=1e-3, atol=1e-5,
                   controller=gs.PIDController(pcoeff=0.3, icoeff=0.4))
    np.testing.assert_allclose(sol.y1, np.exp(-1.0), rtol=1e-3)


def test_saveat_as_ts_gets_a_clear_error():
    import diffrax

    with pytest.raises(ValueError, match="`ts` must be an array.*saveat.subs.ts"):
        gs.solve(lotka_volterra, 0.0, 1.0, Y0, P, ts=diffrax.SaveAt(ts=jnp.linspace(0, 1, 3)))


@pytest.mark.parametrize(
    "f, y0, p, shown",
    [
        (lotka_volterra, jnp.ones((4, 2)), jnp.ones(4), "params {params: ()}"),  # no (n, q) axis
        (lambda y, t, p: -p * y, Y0, jnp.asarray(1.0), "scalar t"),          # odeint's order
        (lotka_volterra, Y0, jnp.ones((3, 4)), "params {params: (3, 4)}"),   # ensemble params
    ],
)
def test_vector_field_errors_show_what_f_received(f, y0, p, shown):
    with pytest.raises(ValueError, match="`f") as info:
        gs.solve(f, 0.0, 1.0, y0, p)
    assert shown in str(info.value) and "f(t, y, params)" in str(info.value)


def test_non_finite_inputs_are_named_as_such():
    y0 = jnp.array([[1.0, 1.0], [jnp.nan, 1.0], [1.0, 1.0]])
    with pytest.raises(RuntimeError) as info:
        gs.record(lotka_volterra, 0.0, 1.0, y0, jnp.tile(P, (3, 1)))
    msg = str(info.value)
    assert "1 of 3 trajectories failed" in msg and "1 trajectory had non-finite `y0`" in msg
    assert "indices: 1" in msg and "Rodas5P" not in msg  # not a stiffness problem


def test_float32_tolerance_below_its_precision_is_refused():
    """A float32 solve asked for rtol under 4 epsilons (4.8e-7) is refused with the reason
    and the way out; the default 1e-6 and 1e-5 run."""
    y0 = jnp.ones((2, 2), jnp.float32)
    p = jnp.tile(jnp.array([1.5, 1.0, 3.0, 1.0], jnp.float32), (2, 1))
    with pytest.raises(ValueError, match=r"gs.solve: `rtol`=1e-08 is below what float32"):
        gs.solve(lotka_volterra, 0.0, 1.0, y0, p, rtol=1e-8)
    with pytest.raises(ValueError, match=r"gs.record: `rtol`.*float64 states"):
        gs.record(lotka_volterra, 0.0, 1.0, y0, p, rtol=1e-7)
    for rtol in (1e-6, 1e-5):
        sol = gs.solve(lotka_volterra, 0.0, 1.0, y0, p, rtol=rtol)
        assert sol.ys.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(sol.ys)))
    # float64 states take the tight tolerance
    gs.solve(lotka_volterra, 0.0, 1.0, Y0, P, rtol=1e-12)
