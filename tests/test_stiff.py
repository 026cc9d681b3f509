"""Stiff solvers: Rosenbrock23 (ode23s) and Rodas5P.

Phase 1 drives ``solver.step`` directly on fixed meshes (order, the ``h == 0`` identity,
gradients against finite differences); phase 2 goes through the public API (``gs.solve``,
``gs.record``/``gs.replay``) on the classic stiff test problems, checked against SciPy's
Radau at tight tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from gradsolve._solver import Rodas5P, Rosenbrock23

SOLVERS = [Rodas5P(), Rosenbrock23()]
IDS = ["Rodas5P", "Rosenbrock23"]


# ----------------------------------------------------------------------------- problems


def bernoulli(t, y, p):
    """y' = -p0 y + sin(3 t) y^2: non-autonomous, nonlinear, with a closed form."""
    return -p[0] * y + jnp.sin(3.0 * t) * y**2


def bernoulli_exact(t, y0=1.0):
    # z = 1/y solves the linear z' = 2 z - sin(3 t) (for p0 = 2).
    z0 = 1.0 / y0
    z = np.exp(2 * t) * (z0 - 3 / 13) + (2 * np.sin(3 * t) + 3 * np.cos(3 * t)) / 13
    return 1.0 / z


def stiff2(t, y, p):
    """Stiff, nonlinear, non-autonomous two-state problem (p = [300, 1.2]).

    y0 relaxes fast (rate p0 = 300) towards the moving target cos(t), perturbed by the
    bilinear coupling y0*y1; y1 follows y0^2 slowly (rate p1). The Jacobian has eigenvalues
    near -300 and -p1: with h = 0.1 an explicit method would blow up.
    """
    return jnp.stack([-p[0] * (y[0] - jnp.cos(t)) + y[0] * y[1], p[1] * (y[0] ** 2 - y[1])])


def robertson(t, y, k):
    """Robertson's chemical kinetics (Hairer & Wanner II, IV.10), k = (0.04, 3e7, 1e4)."""
    r1 = k[0] * y[0]
    r2 = k[1] * y[1] ** 2
    r3 = k[2] * y[1] * y[2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


def robertson_dict(t, y, p):
    return robertson(t, y, jnp.stack([p["k1"], p["k2"], p["k3"]]))


def hires(t, y, p):
    """HIRES (Schaefer 1975; Hairer & Wanner II, IV.10), 8 states, t in [0, 321.8122]."""
    y1, y2, y3, y4, y5, y6, y7, y8 = (y[i] for i in range(8))
    k = p[0]  # 280
    return jnp.stack([
        -1.71 * y1 + 0.43 * y2 + 8.32 * y3 + 0.0007,
        1.71 * y1 - 8.75 * y2,
        -10.03 * y3 + 0.43 * y4 + 0.035 * y5,
        8.32 * y2 + 1.71 * y3 - 1.12 * y4,
        -1.745 * y5 + 0.43 * y6 + 0.43 * y7,
        -k * y6 * y8 + 0.69 * y4 + 1.71 * y5 - 0.43 * y6 + 0.69 * y7,
        k * y6 * y8 - 1.81 * y7,
        -k * y6 * y8 + 1.81 * y7,
    ])


HIRES_Y0 = np.array([1.0, 0, 0, 0, 0, 0, 0, 0.0057])


def vdp(t, y, mu):
    """Van der Pol, y1'' - mu (1 - y1^2) y1' + y1 = 0; stiff for mu = 1000."""
    return jnp.stack([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


def scipy_radau(f, t1, y0, params):
    from scipy.integrate import solve_ivp

    fun = jax.jit(lambda t, y: f(t, y, params))
    jac = jax.jit(jax.jacfwd(lambda t, y: f(t, y, params), argnums=1))
    sol = solve_ivp(
        lambda t, y: np.asarray(fun(t, y)), (0.0, t1), np.asarray(y0, float), method="Radau",
        rtol=1e-12, atol=1e-20, jac=lambda t, y: np.asarray(jac(t, y)),
    )
    assert sol.success
    return sol.y[:, -1]


# ------------------------------------------------------------------- fixed-step helper


def fixed_solve(solver, f, ts, y0, params):
    """States after each step of the fixed mesh ``ts`` (``(len(ts) - 1, d)``)."""
    ts = jnp.asarray(ts)

    def body(carry, th):
        y, state = carry
        t, h = th
        y1, _, state1 = solver.step(f, t, h, y, params, state)
        return (y1, state1), y1

    state0 = solver.init(f, ts[0], y0, params)
    _, ys = jax.lax.scan(body, (y0, state0), (ts[:-1], jnp.diff(ts)))
    return ys


def central_fd(fun, x, rel=1e-6, abs_=1e-8):
    """Central differences of scalar ``fun`` at the flat float64 vector ``x``."""
    x = np.asarray(x, float)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = max(rel * abs(x[i]), abs_)
        xp, xm = x.copy(), x.copy()
        xp[i] += e
        xm[i] -= e
        g[i] = (float(fun(jnp.asarray(xp))) - float(fun(jnp.asarray(xm)))) / (2 * e)
    return g


def assert_grad_close(ad, fd, rtol=2e-5):
    """Componentwise relative agreement; components negligible next to the largest one
    (below ``rtol`` times it) are compared absolutely at that level."""
    ad, fd = np.asarray(ad, float), np.asarray(fd, float)
    scale = np.max(np.abs(fd))
    np.testing.assert_allclose(ad, fd, rtol=rtol, atol=rtol * 1e-3 * scale)


# ============================================================================ phase 1


_STEPS = {}


def bernoulli_step(solver):
    """One jitted step of ``bernoulli`` (p0 = 2), compiled once per solver class."""
    key = type(solver)
    if key not in _STEPS:
        p = jnp.array([2.0])
        _STEPS[key] = jax.jit(lambda t, h, y: solver.step(bernoulli, t, h, y, p, None)[:2])
    return _STEPS[key]


def _observed_order(solver, ns, t1=2.0):
    step = bernoulli_step(solver)
    errs = []
    for n in ns:
        y, h = jnp.array([1.0]), jnp.asarray(t1 / n)
        for i in range(n):
            y = step(jnp.asarray(i * t1 / n), h, y)[0]
        errs.append(abs(float(y[0]) - bernoulli_exact(t1)))
    slope = -np.polyfit(np.log(ns), np.log(errs), 1)[0]
    return slope, errs


def test_rodas5p_order_non_autonomous():
    slope, errs = _observed_order(Rodas5P(), [20, 40, 80, 160])
    assert errs[-1] < 1e-9, errs
    assert 4.5 < slope < 5.7, (slope, errs)


def test_rosenbrock23_order_non_autonomous():
    slope, errs = _observed_order(Rosenbrock23(), [20, 40, 80, 160])
    assert 1.8 < slope < 2.3, (slope, errs)


@pytest.mark.slow
def test_rodas5p_swapped_c_d_would_be_caught():
    """The order test discriminates: with the stage times ``c`` and the ``f_t``
    coefficients ``d`` swapped, the non-autonomous order collapses to about 1."""

    class Swapped(Rodas5P):
        c = np.array([0.0, *Rodas5P.d[:4], 1.0, 1.0, 1.0])
        d = np.array([*Rodas5P.c[1:5], 0.0, 0.0, 0.0, 0.0])

    slope, _ = _observed_order(Swapped(), [10, 20, 40, 80])
    assert slope < 3.0


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_error_estimate_scales_with_local_order(solver):
    step = bernoulli_step(solver)
    hs = np.array([0.02, 0.01, 0.005])
    est = [float(jnp.abs(step(jnp.asarray(0.3), jnp.asarray(h), jnp.array([0.8]))[1][0]))
           for h in hs]
    slope = np.polyfit(np.log(hs), np.log(est), 1)[0]
    # Local error of the lower-order member: h^(p+1) = h^5 (Rodas5P), h^3 (Rosenbrock23).
    expected = min(solver.order, solver.embedded_order) + 1
    assert abs(slope - expected) < 0.35, (slope, est)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_prothero_robinson_very_stiff(solver):
    """y' = lam (y - sin t) + cos t, lam = -1e6, h = 0.1 (h lam = -1e5), starting off the
    smooth solution: the transient is damped at once (L-stability, R(z) ~ C/z) and the
    final state is accurate."""
    f = lambda t, y, lam: lam * (y - jnp.sin(t)) + jnp.cos(t)
    ts = jnp.linspace(0.0, 2.0, 21)
    ys = fixed_solve(solver, f, ts, jnp.array([1.0]), -1e6)
    err = abs(float(ys[-1, 0]) - np.sin(2.0))
    assert err < (1e-9 if isinstance(solver, Rodas5P) else 1e-2), err
    assert abs(float(ys[0, 0]) - np.sin(0.1)) < 1e-3  # the unit transient after one step
    # Stability function at z = h lam -> -inf tends to 0 (L-stable).
    lin = lambda t, y, lam: lam * y
    stability = jax.jit(lambda z: solver.step(lin, 0.0, 1.0, jnp.array([1.0]), z, None)[0][0])
    r = [abs(float(stability(jnp.asarray(z)))) for z in (-1e4, -1e8)]
    assert r[0] < 2e-3 and r[1] < 2e-7, r


def pathological(t, y, p):
    """Ten states in independent blocks, each a way for an h = 0 step to go wrong:
    [0] Bernoulli (nonlinear, non-autonomous); [1:3] nilpotent Jacobian (singular, J != 0);
    [3:5] zero field (J = 0); [5:7] huge Jacobian and time derivative (1e12 and 1e15);
    [7:10] Robertson at its initial state (J singular and badly scaled)."""
    return jnp.concatenate([
        bernoulli(t, y[0:1], p[0:1]),
        p[1] * jnp.stack([y[2], 0.0 * y[1]]),
        0.0 * p[2] * y[3:5],
        -1e12 * (y[5:7] - jnp.cos(p[3] * 1e3 * t)),
        robertson(t, y[7:10], p[4:7]),
    ])


PATHOLOGICAL_Y0 = jnp.array([0.7, 1.0, 2.0, 1.0, -2.0, 0.5, 2.0, 1.0, 0.0, 0.0])
PATHOLOGICAL_P = jnp.array([2.0, 3.0, 1.0, 1.0, 0.04, 3e7, 1e4])


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_zero_step_is_exact_identity_with_finite_derivatives(solver):
    f, y0, p = pathological, PATHOLOGICAL_Y0, PATHOLOGICAL_P
    t0 = jnp.asarray(0.4)
    h = jnp.asarray(0.0)

    def out(t0, h, y0, p):
        y1, err, _ = solver.step(f, t0, h, y0, p, None)
        return jnp.concatenate([y1, err])

    d = y0.shape[0]
    # Two cotangents: one on y1, one on the error estimate (the controller never
    # differentiates the latter, but a NaN there would poison a vmapped reverse pass).
    v = jnp.arange(1.0, d + 1.0)
    cots = jnp.stack([jnp.concatenate([v, jnp.zeros(d)]), jnp.concatenate([jnp.zeros(d), v])])

    @jax.jit
    def everything(t0, h, y0, p):
        value, pullback = jax.vjp(out, t0, h, y0, p)  # reverse mode
        tangents = (jnp.ones_like(t0), jnp.ones_like(h), jnp.ones_like(y0), jnp.ones_like(p))
        _, jv = jax.jvp(out, (t0, h, y0, p), tangents)  # forward mode
        return value, jax.vmap(pullback)(cots), jv

    value, ct, jv = everything(t0, h, y0, p)
    y1, err = value[:d], value[d:]
    assert np.array_equal(np.asarray(y1), np.asarray(y0))
    assert np.all(np.asarray(err) == 0.0)
    for leaf in jax.tree_util.tree_leaves((ct, jv)):
        assert np.all(np.isfinite(np.asarray(leaf)))
    ct_t0, ct_h, ct_y0, ct_p = (np.asarray(c) for c in ct)  # rows: y1, error
    f0 = np.asarray(f(t0, y0, p))
    # y1 = y0 + h * (...): identity in y0, no dependence on p or t0, d y1 / dh = f(t0, y0)
    # (consistency), block by block at scales from 1 to 1e12. The error estimate is
    # O(h) and independent of everything else at h = 0.
    np.testing.assert_array_equal(ct_y0, np.stack([v, np.zeros(d)]))
    np.testing.assert_array_equal(ct_p, 0.0)
    np.testing.assert_array_equal(ct_t0, 0.0)
    np.testing.assert_allclose(ct_h[0], float(np.asarray(v) @ f0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jv[:d]), 1.0 + f0, rtol=1e-12, atol=0)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_padding_steps_in_a_batch_keep_gradients_finite(solver):
    """A vmapped batch mixing real and zero-length (padding) steps: all gradients finite,
    and the padded trajectory's gradient is the identity."""
    k = jnp.array([[0.04, 3e7, 1e4], [0.04, 3e7, 1e4]])
    y0 = jnp.array([[1.0, 0.0, 0.0], [0.9, 1e-5, 0.1]])
    hs = jnp.array([1e-3, 0.0])
    ts = jnp.array([0.0, 5.0])
    vstep = jax.vmap(lambda t, h, y, p: solver.step(robertson, t, h, y, p, None)[0])
    loss = lambda y0, k: jnp.sum(vstep(ts, hs, y0, k) * jnp.array([1.0, 1e4, 1.0]))
    gy, gk = jax.jit(jax.grad(loss, argnums=(0, 1)))(y0, k)
    assert np.all(np.isfinite(np.asarray(gy))) and np.all(np.isfinite(np.asarray(gk)))
    np.testing.assert_array_equal(np.asarray(gy[1]), [1.0, 1e4, 1.0])
    np.testing.assert_array_equal(np.asarray(gk[1]), 0.0)


def _fixed_grad_check(solver, f, ts, y0, p, weights, forward=False):
    d = y0.shape[0]
    weights = jnp.asarray(weights)

    def loss(x):
        ys = fixed_solve(solver, f, ts, x[:d], x[d:])
        return jnp.sum(ys * weights)

    # One compiled program gives the AD gradient and the values for the differences.
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    x = jnp.concatenate([y0, p])
    ad = np.asarray(value_and_grad(x)[1])
    fd = central_fd(lambda x: value_and_grad(x)[0], x)
    assert np.all(np.isfinite(ad))
    assert_grad_close(ad, fd, rtol=2e-5)
    if forward:  # forward mode through the same steps agrees with reverse mode
        fwd = np.asarray(jax.jit(jax.jacfwd(loss))(x))
        np.testing.assert_allclose(fwd, ad, rtol=1e-10, atol=1e-13 * np.max(np.abs(ad)))
    return ad, fd


def test_lu_solver_against_numpy_with_pivoting():
    from gradsolve._solver.rosenbrock import _lu_solver

    rng = np.random.default_rng(3)
    a = rng.normal(size=(6, 6))
    a[0, 0] = 1e-12  # forces a row exchange
    b = rng.normal(size=6)
    lu, _, perm = jax.lax.linalg.lu(jnp.asarray(a))
    inverse = jnp.zeros_like(perm).at[perm].set(jnp.arange(6, dtype=perm.dtype))
    solve = _lu_solver(jnp.asarray(a), lu, perm, inverse)
    np.testing.assert_allclose(solve(jnp.asarray(b)), np.linalg.solve(a, b), rtol=1e-10)
    # reverse mode runs the transposed solve: d(c . x)/d b = A^-T c
    c = rng.normal(size=6)
    g = jax.grad(lambda b: jnp.dot(jnp.asarray(c), solve(b)))(jnp.asarray(b))
    np.testing.assert_allclose(g, np.linalg.solve(a.T, c), rtol=1e-10)


def test_one_pivot_conversion_per_rosenbrock_step():
    # the permutation is formed once per step, not in each of Rodas5P's 8 stage solves
    y0, p = jnp.array([1.0, 0.0, 0.0]), jnp.array([0.04, 3e7, 1e4])

    def step(y):
        return Rodas5P().step(robertson, 0.0, 1e-3, y, p, None)[0]

    def count(jaxpr):
        n = 0
        for e in jaxpr.eqns:
            n += e.primitive.name in ("lu_pivots_to_permutation", "lu")
            for v in e.params.values():
                for sub in v if isinstance(v, (list, tuple)) else [v]:
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        n += count(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        n += count(sub)
        return n

    assert count(jax.make_jaxpr(step)(y0).jaxpr) == 1


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_fixed_step_gradients_stiff2_match_fd(solver):
    ts = jnp.linspace(0.0, 2.0, 21)  # h = 0.1, h * p0 = 30: stiff
    _fixed_grad_check(
        solver, stiff2, ts, jnp.array([0.5, -0.3]), jnp.array([300.0, 1.2]),
        weights=jnp.array([1.0, 2.0]), forward=isinstance(solver, Rodas5P),
    )


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_fixed_step_gradients_robertson_match_fd(solver):
    # A few geometric steps through the initial transient and beyond (h up to 9).
    ts = jnp.array([0.0, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0])
    _fixed_grad_check(
        solver, robertson, ts, jnp.array([1.0, 0.0, 0.0]), jnp.array([0.04, 3e7, 1e4]),
        weights=jnp.array([1.0, 1e4, 1.0]),
    )


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_linear_invariant_preserved(solver):
    """Rosenbrock methods keep linear invariants: Robertson's mass stays 1 to round-off."""
    ts = jnp.array([0.0, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0])
    ys = fixed_solve(solver, robertson, ts, jnp.array([1.0, 0.0, 0.0]), jnp.array([0.04, 3e7, 1e4]))
    np.testing.assert_allclose(np.asarray(ys.sum(-1)), 1.0, rtol=0, atol=1e-14)


# ============================================================================ phase 2

ROBER_K = jnp.array([0.04, 3e7, 1e4])
ROBER_Y0 = jnp.array([1.0, 0.0, 0.0])

# Final states from SciPy 1.17 `solve_ivp(method="Radau", rtol=1e-12, atol=1e-20)` with the
# exact (jacfwd) Jacobian, i.e. `scipy_radau` above; stored because computing them takes
# ~35 s. `test_stored_references_match_scipy_radau` (slow) recomputes them all.
REFERENCE = {
    "robertson_100": [0.6172348823960874, 6.153591274639132e-06, 0.38275896401263676],
    "robertson_1e5": [0.01786592114210016, 7.274751468436625e-08, 0.9821340061103829],
    "hires": [0.0007371312573325712, 0.00014424857263161932, 5.888729740967664e-05,
              0.001175651343283157, 0.0023863561988314874, 0.006238968252743343,
              0.002849998395185852, 0.002850001604814148],
    "vdp_3000": [-1.5106069367441057, 0.0011783800007309226],
    "ensemble_0": [0.539972708700098, 3.7688632584644772e-06, 0.4600235224366435],
    "ensemble_255": [0.45051606481906875, 1.019173430042053e-05, 0.5494737434466319],
}


def ensemble_params(n=256):
    """Robertson rate constants spread over a decade (each its own way)."""
    spread = jnp.logspace(0.0, 1.0, n)
    return {"k1": 0.04 * spread, "k2": 3e7 * spread[::-1], "k3": 1e4 * jnp.sqrt(spread)}


def _check_against_reference(y, ref, rtol, atol):
    """Within 100x the requested tolerance, componentwise."""
    y, ref = np.asarray(y), np.asarray(ref)
    ok = np.abs(y - ref) <= 100 * (rtol * np.abs(ref) + atol)
    assert np.all(ok), (y, ref, np.abs(y - ref) / np.abs(ref))


@pytest.mark.slow
def test_stored_references_match_scipy_radau():
    hires_published = [7.371312573325668e-4, 1.442485726316185e-4, 5.888729740967575e-5,
                       1.175651343283149e-3, 2.386356198831331e-3, 6.238968252742796e-3,
                       2.849998395185769e-3, 2.850001604814231e-3]  # IVP test set
    np.testing.assert_allclose(REFERENCE["hires"], hires_published, rtol=1e-9)
    cases = {
        "robertson_100": (robertson, 100.0, ROBER_Y0, ROBER_K),
        "robertson_1e5": (robertson, 1e5, ROBER_Y0, ROBER_K),
        "hires": (hires, 321.8122, HIRES_Y0, jnp.array([280.0])),
        "vdp_3000": (vdp, 3000.0, jnp.array([2.0, 0.0]), jnp.asarray(1000.0)),
    }
    p = ensemble_params()
    for j in (0, 255):
        cases[f"ensemble_{j}"] = (robertson_dict, 40.0, ROBER_Y0, {k: v[j] for k, v in p.items()})
    for name, args in cases.items():
        np.testing.assert_allclose(scipy_radau(*args), REFERENCE[name], rtol=1e-9, err_msg=name)


def test_robertson_rodas5p_to_100_and_1e5():
    rtol, atol = 1e-7, 1e-14
    sol = gs.solve(robertson, 0.0, 1e5, ROBER_Y0, ROBER_K, ts=jnp.array([100.0, 1e5]),
                   solver=Rodas5P(), rtol=rtol, atol=atol)
    assert int(sol.stats["status"]) == 0
    _check_against_reference(sol.ys[0], REFERENCE["robertson_100"], rtol, atol)
    _check_against_reference(sol.ys[1], REFERENCE["robertson_1e5"], rtol, atol)
    _check_against_reference(sol.y1, REFERENCE["robertson_1e5"], rtol, atol)
    assert int(sol.mesh.n_steps) < 500


@pytest.mark.slow
def test_hires_rodas5p():
    rtol, atol = 1e-7, 1e-12
    sol = gs.solve(hires, 0.0, 321.8122, jnp.asarray(HIRES_Y0), jnp.array([280.0]),
                   solver=Rodas5P(), rtol=rtol, atol=atol)
    assert int(sol.stats["status"]) == 0
    _check_against_reference(sol.y1, REFERENCE["hires"], rtol, atol)
    assert int(sol.mesh.n_steps) < 2000


@pytest.mark.slow
def test_van_der_pol_mu1000_rodas5p():
    # Two relaxation cycles (period ~ (3 - 2 ln 2) mu ~ 1614): ~1,550 accepted steps.
    rtol, atol = 1e-7, 1e-10
    sol = gs.solve(vdp, 0.0, 3000.0, jnp.array([2.0, 0.0]), jnp.asarray(1000.0),
                   solver=Rodas5P(), rtol=rtol, atol=atol, max_steps=4000)
    assert int(sol.stats["status"]) == 0
    _check_against_reference(sol.y1, REFERENCE["vdp_3000"], rtol, atol)
    assert int(sol.mesh.n_steps) < 2000


def test_robertson_ensemble_256_jit_and_grad():
    n = 256
    params = ensemble_params(n)
    y0 = jnp.tile(ROBER_Y0, (n, 1))
    ts = jnp.array([1e-3, 1.0, 40.0])

    def loss_fn(params, y0, weights):
        sol = gs.solve(robertson_dict, 0.0, 40.0, y0, params, ts=ts, solver=Rodas5P(),
                       rtol=1e-6, atol=1e-12)
        return jnp.sum(sol.ys * weights), sol

    loss = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True))

    w = jnp.broadcast_to(jnp.array([1.0, 1e4, 1.0]), (3, 3))
    (val, sol), (gp, gy) = loss(params, y0, w)
    assert sol.ys.shape == (n, 3, 3)
    assert np.all(np.asarray(sol.stats["status"]) == 0)
    assert np.isfinite(float(val))
    for leaf in jax.tree_util.tree_leaves((gp, gy)):
        assert leaf.shape[0] == n and np.all(np.isfinite(np.asarray(leaf)))
    for j in (0, n - 1):
        _check_against_reference(sol.ys[j, -1], REFERENCE[f"ensemble_{j}"], 1e-6, 1e-12)
    # The methods conserve mass exactly, so d(sum y(40)) / d(anything) is known exactly:
    # 1 for each y0 component, 0 for every rate constant, across the whole ensemble.
    w_mass = jnp.zeros((3, 3)).at[-1].set(1.0)
    (mass, _), (gpm, gym) = loss(params, y0, w_mass)
    np.testing.assert_allclose(float(mass), n, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(gym), 1.0, atol=1e-10)
    for name, leaf in gpm.items():
        np.testing.assert_allclose(np.asarray(leaf) * np.asarray(params[name]), 0.0, atol=1e-10)


# Slow tier (~10 s each with cold caches: a kernel build and XLA compiles): the frozen-mesh
# gradient on Robertson against central differences of the same replay is, in the normal
# suite, test_kernel_rosenbrock.py's test_robertson_gradient_against_central_differences
# (the kernel's adjoint, the route `Auto` takes here on CPU; that route equals the batched
# replay's: test_kernel_matches_xla_replay_values_and_gradients), and the steps' own AD
# against central differences is test_fixed_step_gradients_robertson_match_fd above; the
# solution at t = 100 against the SciPy reference is test_robertson_rodas5p_to_100_and_1e5.
@pytest.mark.slow
@pytest.mark.parametrize(
    "solver, rtol, ref_tol",
    [(Rodas5P(), 1e-7, 1e-7), (Rosenbrock23(), 1e-4, 1e-4)],
    ids=["Rodas5P", "Rosenbrock23"],
)
def test_robertson_frozen_mesh_gradients_match_fd(solver, rtol, ref_tol):
    """Record once; the gradient of a loss of the replay on that frozen mesh, w.r.t. the
    rate constants and y0, matches central differences of the same frozen-mesh replay."""
    atol = 1e-12
    ts = jnp.array([1e-3, 1.0, 100.0])
    w = jnp.array([1.0, 1e4, 1.0])
    mesh = gs.record(robertson, 0.0, 100.0, ROBER_Y0, ROBER_K, ts=ts, solver=solver,
                     rtol=rtol, atol=atol)
    assert int(mesh.n_steps) < 2000

    def loss(x):
        ys = gs.replay(robertson, mesh, x[:3], x[3:]).ys
        return jnp.sum(ys * w), ys

    # One compiled program gives the AD gradient and the values for the differences.
    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    x = jnp.concatenate([ROBER_Y0, ROBER_K])
    (_, ys), ad = value_and_grad(x)
    _check_against_reference(ys[-1], REFERENCE["robertson_100"], ref_tol, atol)
    fd = central_fd(lambda x: value_and_grad(x)[0][0], x)
    assert_grad_close(ad, fd, rtol=2e-5)
