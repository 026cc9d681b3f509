"""Butcher tableaus of the explicit Runge–Kutta pairs: order conditions and observed order.

The order conditions are checked on every rooted tree up to the claimed order (Butcher
trees: ``b . Phi(t) == 1 / gamma(t)``), for the propagated weights ``b`` and for the
embedded weights ``b_hat = b - b_error``. The fixed-step tests call ``step`` directly and
compare with closed-form solutions, so they check the tableau as the drivers use it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradsolve._solver.dopri5 import Dopri5
from gradsolve._solver.tsit5 import Tsit5
from gradsolve._solver.vern7 import Vern7

SOLVERS = [(Tsit5, 5, 4), (Dopri5, 5, 4), (Vern7, 7, 6)]
EPS = np.finfo(np.float64).eps


# --------------------------------------------------------------------------- rooted trees


@functools.lru_cache(maxsize=None)
def _trees(n: int) -> tuple:
    """All rooted trees with ``n`` nodes; a tree is the sorted tuple of its subtrees."""
    if n == 1:
        return ((),)
    found = set()

    def grow(remaining, smallest, children):
        if remaining == 0:
            found.add(tuple(sorted(children)))
            return
        for k in range(smallest, remaining + 1):
            for sub in _trees(k):
                grow(remaining - k, k, children + [sub])

    grow(n - 1, 1, [])
    return tuple(sorted(found))


def _gamma(tree) -> int:
    g = 1 + sum(_size(t) for t in tree)
    for t in tree:
        g *= _gamma(t)
    return g


def _size(tree) -> int:
    return 1 + sum(_size(t) for t in tree)


def _stage_weights(a, tree):
    """``Phi_i(t)`` per stage: product over subtrees of ``a @ Phi(subtree)``."""
    g = np.ones(a.shape[0])
    for t in tree:
        g = g * (a @ _stage_weights(a, t))
    return g


def _max_residual(a, w, order):
    return max(abs(w @ _stage_weights(a, t) - 1.0 / _gamma(t)) for t in _trees(order))


def test_tree_counts():
    # Number of rooted trees of order 1..8 (OEIS A000081).
    assert [len(_trees(n)) for n in range(1, 9)] == [1, 1, 2, 4, 9, 20, 48, 115]


# --------------------------------------------------------------------------- tableaus


@pytest.mark.parametrize("cls, order, embedded_order", SOLVERS)
def test_tableau_shape(cls, order, embedded_order):
    a, b, e, c = cls.a, cls.b, cls.b_error, cls.c
    s = len(b)
    assert a.shape == (s, s) and b.shape == e.shape == c.shape == (s,)
    assert np.all(np.triu(a) == 0.0), "explicit: a must be strictly lower triangular"
    assert c[0] == 0.0
    assert cls.order == order and cls.embedded_order == embedded_order
    assert cls().error_order == min(order, embedded_order) + 1
    # Row-sum condition, to rounding of the (possibly large) coefficients.
    np.testing.assert_array_less(np.abs(a.sum(1) - c), 8 * EPS * (1 + np.abs(a).sum(1)))
    if cls.fsal:
        np.testing.assert_array_equal(a[-1], b)
        assert c[-1] == 1.0 and b[-1] == 0.0


@pytest.mark.parametrize("cls, order, embedded_order", SOLVERS)
def test_order_conditions(cls, order, embedded_order):
    a, b = cls.a, cls.b
    b_hat = b - cls.b_error
    scale = 1 + np.abs(a).sum()
    for p in range(1, order + 1):
        assert _max_residual(a, b, p) < 16 * EPS * scale, f"b fails order {p}"
    for p in range(1, embedded_order + 1):
        assert _max_residual(a, b_hat, p) < 16 * EPS * scale, f"b_hat fails order {p}"
    # ... and the orders are not higher than claimed (the pair really is p(q)).
    assert _max_residual(a, b, order + 1) > 1e-8
    assert _max_residual(a, b_hat, embedded_order + 1) > 1e-8
    # Quadrature conditions spelled out, as a readable cross-check.
    c = cls.c
    for k in range(order):
        assert abs(b @ c**k - 1 / (k + 1)) < 1e-14
    assert abs(b @ (a @ c) - 1 / 6) < 1e-14
    assert abs(b @ (c * (a @ c)) - 1 / 8) < 1e-14
    assert abs(b @ (a @ (a @ c)) - 1 / 24) < 1e-14


# --------------------------------------------------------------------------- stepping


def _oscillator(t, y, params):
    del t, params
    return jnp.stack([y[1], -y[0]])


def _oscillator_exact(t):
    return jnp.stack([jnp.cos(t), -jnp.sin(t)])


def _forced(t, y, params):  # non-autonomous: exercises c
    del params
    return -y + jnp.sin(t)


def _forced_exact(t):
    return jnp.atleast_1d(1.5 * jnp.exp(-t) + 0.5 * (jnp.sin(t) - jnp.cos(t)))


PROBLEMS = {
    # name: (f, exact, y0, t1, step counts)
    "oscillator": (_oscillator, _oscillator_exact, [1.0, 0.0], 10.0, (40, 80)),
    "forced": (_forced, _forced_exact, [1.0], 1.0, (8, 16)),
}


def _fixed_step_error(solver, f, exact, y0, t1, n):
    y0 = jnp.asarray(y0, jnp.float64)
    h = jnp.asarray(t1 / n, jnp.float64)

    @jax.jit
    def run(y0):
        def body(carry, i):
            y, state = carry
            y, _, state = solver.step(f, i * h, h, y, None, state)
            return (y, state), None

        state = solver.init(f, jnp.asarray(0.0, jnp.float64), y0, None)
        (y, _), _ = jax.lax.scan(body, (y0, state), jnp.arange(n, dtype=jnp.float64))
        return y

    return float(jnp.max(jnp.abs(run(y0) - exact(jnp.asarray(t1, jnp.float64)))))


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("cls, order", [(Tsit5, 5), (Dopri5, 5), (Vern7, 7)])
def test_observed_order(cls, order, problem):
    f, exact, y0, t1, (n1, n2) = PROBLEMS[problem]
    err1 = _fixed_step_error(cls(), f, exact, y0, t1, n1)
    err2 = _fixed_step_error(cls(), f, exact, y0, t1, n2)
    observed = np.log2(err1 / err2) / np.log2(n2 / n1)
    assert abs(observed - order) < 0.4, (err1, err2, observed)


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("cls", [Tsit5, Dopri5, Vern7])
def test_error_estimate_scaling(cls, problem):
    # Local error estimate ~ C h^(min(p, q) + 1).
    solver = cls()
    f, _, y0, _, _ = PROBLEMS[problem]
    y0 = jnp.asarray(y0, jnp.float64)
    t0 = jnp.asarray(0.3, jnp.float64)
    state = solver.init(f, t0, y0, None)

    def est(h):
        _, y_error, _ = solver.step(f, t0, jnp.asarray(h, jnp.float64), y0, None, state)
        return float(jnp.max(jnp.abs(y_error)))

    observed = np.log2(est(0.2) / est(0.1))
    assert abs(observed - solver.error_order) < 0.25, observed


@pytest.mark.parametrize("cls", [Tsit5, Dopri5, Vern7])
def test_zero_step_is_exact_identity(cls):
    solver = cls()
    f = _forced
    y0 = jnp.asarray([1.0, -2.5, 3.25], jnp.float64)
    t0 = jnp.asarray(0.7, jnp.float64)
    state = solver.init(f, t0, y0, None)
    zero = jnp.asarray(0.0, jnp.float64)
    y1, y_error, _ = solver.step(f, t0, zero, y0, None, state)
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(y_error, jnp.zeros_like(y0))
    jac = jax.jacfwd(lambda y: solver.step(f, t0, zero, y, None, solver.init(f, t0, y, None))[0])(y0)
    np.testing.assert_array_equal(jac, jnp.eye(3))
    dh = jax.jacfwd(lambda h: solver.step(f, t0, h, y0, None, state)[0])(zero)
    assert np.all(np.isfinite(dh))
    np.testing.assert_allclose(dh, f(t0, y0, None), rtol=1e-14)
