"""SPEC §2.6: bad input gets a ValueError naming the argument; failed trajectories raise a
RuntimeError naming them outside jit and give status codes plus NaN inside it."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import lotka_volterra, robertson

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
g = jax.grad(lambda q: jnp.sum(gs.solve(f, 0.0, 5.0, jnp.ones(2, jnp.float32), q, rtol=1e-5, atol=1e-7).ys))(p)
assert sol.ys.dtype == jnp.float32 and g.dtype == jnp.float32
print(repr(np.asarray(sol.ys[0]).tolist())); print(repr(np.asarray(g).tolist()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ys32, g32 = (np.array(eval(line)) for line in out.stdout.strip().splitlines())
    ref = gs.solve(lotka_volterra, 0.0, 5.0, Y0, P, ts=jnp.linspace(0, 5, 6), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ys32, ref.ys, rtol=1e-3)
    gref = jax.grad(lambda q: jnp.sum(gs.solve(lotka_volterra, 0.0, 5.0, Y0, q, rtol=1e-10, atol=1e-12).ys))(P)
    np.testing.assert_allclose(g32, gref, rtol=1e-3)
