"""`load_petab`'s stiffness probe (`models._petab._solver_choice`): its host-side Tsit5 solve
against `gradsolve.record`'s Tsit5 record on the XLA driver (an independent implementation of
the same steps), and its decision on a stiff and a non-stiff field."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import lotka_volterra, robertson

import gradsolve as gs
from models._petab._solver_choice import _host_field, _jacobian, probe_explicit, tsit5_steps

N = 4
Y0 = jnp.array([[1.0, 1.0], [2.0, 0.5], [0.5, 2.0], [1.0, 3.0]])
P = jnp.array([1.5, 1.0, 3.0, 1.0]) * jnp.linspace(0.8, 1.2, N)[:, None]
TS = jnp.array([0.5, 1.0, 2.5, 7.0, 10.0])
# additive jumps (a dose) at t = 0 (onto y0), 3 and 6, a padded one (+inf) in the last row
JUMP_T = jnp.array([[0.0, 3.0, 6.0]] * (N - 1) + [[0.0, 3.0, jnp.inf]])
JUMP_S = jnp.broadcast_to(jnp.array([[0.2, 0.0], [0.5, 0.0], [0.0, 0.3]]), (N, 3, 2))


def _record(f, t1, y0, p, budget, **kw):
    return gs.record(f, 0.0, t1, y0, p, solver=gs.Tsit5(), max_steps=budget, throw=False,
                     driver=gs.drivers.Batched(), **kw)


@pytest.mark.parametrize("events", [{}, {"ts": TS}, {"ts": TS, "jumps": (JUMP_T, JUMP_S)}],
                         ids=["plain", "save-times", "save-times-and-jumps"])
@pytest.mark.parametrize("rtol, atol", [(1e-6, 1e-9), (1e-8, 1e-12)])
def test_host_tsit5_takes_the_steps_of_the_record(events, rtol, atol):
    mesh = _record(lotka_volterra, 10.0, Y0, P, 2000, rtol=rtol, atol=atol, **events)
    steps, ok = tsit5_steps(lotka_volterra, 0.0, 10.0, Y0, P, rtol=rtol, atol=atol,
                            max_steps=2000, **events)
    assert np.all(np.asarray(mesh.status) == 0) and ok.all()
    # the same rules; rounding (another order of the stage sums) may move a step
    np.testing.assert_allclose(steps, np.asarray(mesh.n_steps), rtol=0.02, atol=1)


def test_host_tsit5_fails_where_the_record_runs_out_of_steps():
    budget = 60
    mesh = _record(lotka_volterra, 10.0, Y0, P, budget, rtol=1e-8, atol=1e-12)
    steps, ok = tsit5_steps(lotka_volterra, 0.0, 10.0, Y0, P, rtol=1e-8, atol=1e-12,
                            max_steps=budget)
    assert not np.any(np.asarray(mesh.status) == 0) and not ok.any()
    assert np.all(steps <= budget)


def test_probe_calls_a_stiff_field_stiff():
    # Robertson: its Jacobian at y0 = (1, 0, 0) has spectral radius 0.04, so the bound passes
    # it on to the solve, which then runs out of explicit steps (as the record does).
    y0 = jnp.array([[1.0, 0.0, 0.0]] * 2)
    k = jnp.array([[0.04, 3e7, 1e4], [0.05, 3e7, 1e4]])
    mesh = _record(robertson, 1e3, y0, k, 2000, rtol=1e-6, atol=1e-10)
    assert np.all(np.asarray(mesh.status) != 0)
    solver, why = probe_explicit(robertson, y0, k, jnp.array([1.0, 1e3]), 1e3, None,
                                 rtol=1e-6, atol=1e-10, budget=2000)
    assert solver is None
    assert why.startswith("gs.Rodas5P(): stiff (gs.Tsit5() needed more than 2000 steps")


def test_probe_calls_a_non_stiff_field_explicit_with_the_records_step_count():
    jumps = (JUMP_T, JUMP_S)
    solver, why = probe_explicit(lotka_volterra, Y0, P, TS, 10.0, jumps, rtol=1e-8,
                                 atol=1e-12, budget=2000)
    assert isinstance(solver, gs.Tsit5)
    mesh = _record(lotka_volterra, 10.0, Y0, P, 2000, rtol=1e-8, atol=1e-12, ts=TS,
                   jumps=jumps)
    said = int(why.split("at most ")[1].split()[0])
    assert said == pytest.approx(int(np.max(np.asarray(mesh.n_steps))), rel=0.02, abs=1)


def test_host_tsit5_names_a_bad_argument():
    with pytest.raises(ValueError, match="max_steps"):
        tsit5_steps(lotka_volterra, 0.0, 1.0, Y0, P, rtol=1e-6, atol=1e-9, max_steps=0)
    with pytest.raises(ValueError, match="y0"):
        tsit5_steps(lotka_volterra, 0.0, 1.0, Y0[0], P[0], rtol=1e-6, atol=1e-9,
                    max_steps=10)


def test_the_forward_difference_jacobian_places_the_spectral_radius_as_autodiff_does():
    y0 = jnp.array([[1.0, 1e-3, 0.0], [0.5, 2e-5, 0.3]])
    k = jnp.array([[0.04, 3e7, 1e4], [0.05, 3e7, 1e4]])
    exact = np.asarray(jax.vmap(jax.jacfwd(robertson, argnums=1), in_axes=(None, 0, 0))(
        0.0, y0, k))
    approx = _jacobian(_host_field(robertson, k), np.asarray(y0))
    rho = lambda j: np.max(np.abs(np.linalg.eigvals(j)))
    # forward differences: truncation error ~ sqrt(eps) * f'' (7e-6 relative here)
    assert rho(approx) == pytest.approx(rho(exact), rel=1e-4)
    np.testing.assert_allclose(approx, exact, rtol=1e-4, atol=1e-5 * np.abs(exact).max())
