"""SPEC §2.5: diffrax solvers go through record/replay by their own `step`; solvers without
an error estimate fall back to `diffrax.diffeqsolve`, and the route is reported."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
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
    assert sol.route == "gradsolve-replay"
    np.testing.assert_allclose(sol.ys, _scipy(P), rtol=1e-7)
    # Same tableau as gs.Tsit5: identical mesh and values up to rounding.
    ref = gs.record(lotka_volterra, 0.0, 5.0, Y0, P, ts=TS, solver=gs.Tsit5(), rtol=1e-9, atol=1e-11)
    assert int(ref.n_steps) == int(mesh.n_steps)
    g = jax.grad(lambda q: jnp.sum(gs.replay(lotka_volterra, mesh, Y0, q).ys))(P)
    g_ref = jax.grad(lambda q: jnp.sum(gs.replay(lotka_volterra, ref, Y0, q).ys))(P)
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
    g = jax.grad(lambda q: jnp.sum(gs.solve(lotka_volterra, 0.0, 5.0, Y0, q, ts=TS, solver=diffrax.Euler(), dt0=1e-3).ys))(P)
    assert np.all(np.isfinite(g))
