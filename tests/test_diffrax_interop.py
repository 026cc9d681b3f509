"""SPEC §2.5: diffrax solvers go through record/replay by their own `step`; solvers without
an error estimate fall back to `diffrax.diffeqsolve`, and the route is reported."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import gradsolve as gs
from conftest import lotka_volterra

P = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])
TS = jnp.linspace(0.0, 5.0, 6)


def _scipy(p):
    sol = solve_ivp(lambda t, y: np.asarray(lotka_volterra(t, y, p)), (0.0, 5.0), np.asarray(Y0),
                    t_eval=np.asarray(TS), rtol=1e-12, atol=1e-14, method="DOP853")
    return sol.y.T


def test_diffrax_explicit_solver_records_and_replays_through_its_step():
    mesh = gs.record(lotka_volterra, 0.0, 5.0, Y0, P, ts=TS, solver=diffrax.Tsit5(), rtol=1e-9, atol=1e-11)
    sol = gs.replay(lotka_volterra, mesh, Y0, P)
    assert sol.route == "gradsolve-batched/diffrax.Tsit5"
    np.testing.assert_allclose(sol.ys, _scipy(P), rtol=1e-7)
    # Same tableau as gs.Tsit5: identical mesh and values up to rounding.
    ref = gs.record(lotka_volterra, 0.0, 5.0, Y0, P, ts=TS, solver=gs.Tsit5(), rtol=1e-9, atol=1e-11)
    assert int(ref.n_steps) == int(mesh.n_steps)
    g = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(lotka_volterra, mesh, Y0, q).ys)))(P)
    g_ref = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(lotka_volterra, ref, Y0, q).ys)))(P)
    np.testing.assert_allclose(g, g_ref, rtol=1e-10)


def test_diffrax_implicit_solver_on_mildly_stiff_problem():
    def f(t, y, p):
        return jnp.stack([-p[0] * (y[0] - jnp.cos(t)), -y[1] + y[0]])

    p = jnp.array([50.0])
    sol = gs.solve(f, 0.0, 2.0, jnp.array([0.0, 0.0]), p, ts=jnp.array([1.0, 2.0]),
                   solver=diffrax.Kvaerno5(), rtol=1e-8, atol=1e-10)
    ref = solve_ivp(lambda t, y: np.asarray(f(t, y, p)), (0.0, 2.0), [0.0, 0.0], method="Radau",
                    t_eval=[1.0, 2.0], rtol=1e-12, atol=1e-14).y.T
    np.testing.assert_allclose(sol.ys, ref, rtol=1e-6, atol=1e-9)


def test_solver_without_error_estimate_falls_back_to_diffeqsolve():
    sol = gs.solve(lotka_volterra, 0.0, 5.0, Y0, P, ts=TS, solver=diffrax.Euler(), dt0=1e-3)
    assert sol.route == "diffrax-diffeqsolve"
    np.testing.assert_allclose(sol.ys, _scipy(P), rtol=5e-2)
    g = jax.jit(jax.grad(lambda q: jnp.sum(gs.solve(lotka_volterra, 0.0, 5.0, Y0, q, ts=TS,
                                                    solver=diffrax.Euler(), dt0=1e-3).ys)))(P)
    assert np.all(np.isfinite(g))


def test_solver_needing_a_multiterm_is_refused_by_name():
    """IMEX (KenCarp4) and other MultiTerm solvers cannot step the single ODETerm of `f`:
    a clear ValueError naming the solver, not a false "no error estimate" message."""
    for fn in (gs.solve, gs.record):
        for kw in ({}, {"dt0": 0.01}):
            with pytest.raises(ValueError, match="`solver` KenCarp4 is not supported.*MultiTerm"):
                fn(lotka_volterra, 0.0, 1.0, Y0, P, solver=diffrax.KenCarp4(), **kw)


def test_fallback_route_failures_follow_the_status_policy():
    """diffrax.diffeqsolve fallback (no error estimate): inside jit a failure is a status code
    plus NaN (not Diffrax's runtime error); outside jit a RuntimeError; throw=False never
    raises; throw=True raises inside jit."""
    f = lambda t, y, p: -p * y
    y0 = jnp.ones((2, 1))
    p = jnp.array([1.0, 2.0])

    def run(dt, throw=None, ts=jnp.array([0.5, 1.0])):
        return gs.solve(f, 0.0, 1.0, y0, p, ts=ts, solver=diffrax.Euler(), dt0=dt,
                        max_steps=50, throw=throw)

    ok = jax.jit(run)(0.1)
    assert ok.route == "diffrax-diffeqsolve"
    np.testing.assert_array_equal(ok.stats["status"], [0, 0])
    np.testing.assert_allclose(ok.ys[:, :, 0], (1 - 0.1 * p[:, None]) ** jnp.array([5, 10]), rtol=1e-12)
    bad = jax.jit(run)(1e-3)  # 1000 constant steps > max_steps under jit (dt0 traced)
    np.testing.assert_array_equal(bad.stats["status"], [gs.Status.MAX_STEPS] * 2)
    assert np.all(np.isnan(np.asarray(bad.ys)))
    assert np.all(np.isnan(np.asarray(jax.jit(lambda dt: run(dt, throw=False))(1e-3).y1)))
    with pytest.raises(Exception, match="max_steps"):
        jax.block_until_ready(jax.jit(lambda dt: run(dt, throw=True))(1e-3).ys)
    inv = jax.jit(lambda ts: run(0.1, ts=ts))(jnp.array([0.7, 0.2]))  # traced, unsorted
    np.testing.assert_array_equal(inv.stats["status"], [gs.Status.INVALID_INPUT] * 2)
    assert np.all(np.isnan(np.asarray(inv.ys)))
    # Outside jit: a non-finite state raises naming the trajectory; throw=False returns it.
    blow = lambda t, y, p: p * y**2
    with pytest.raises(RuntimeError, match="indices: 1"):
        gs.solve(blow, 0.0, 2.0, y0, jnp.array([0.1, 1e3]), solver=diffrax.Euler(), dt0=0.01)
    sol = gs.solve(blow, 0.0, 2.0, y0, jnp.array([0.1, 1e3]), solver=diffrax.Euler(), dt0=0.01,
                   throw=False)
    np.testing.assert_array_equal(sol.stats["status"], [0, gs.Status.NONFINITE])
    assert np.isfinite(float(sol.y1[0, 0])) and np.isnan(float(sol.y1[1, 0]))
