"""Rosenbrock23: the 2(3) modified Rosenbrock pair of MATLAB's ``ode23s``.

L. F. Shampine and M. W. Reichelt, "The MATLAB ODE Suite", SIAM Journal on Scientific
Computing 18(1), 1–22 (1997), Sec. 3 (the formulas with ``d = 1/(2 + sqrt(2))`` and
``e32 = 6 + sqrt(2)``). Order 2 for the propagated solution, L-stable; the error estimate
comes from an order-3 companion formula that costs one more evaluation of ``f`` and one
more linear solve with the same factorised matrix ``W = I - h d J``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .rosenbrock import AbstractRosenbrock, jacobians

_d = 1.0 / (2.0 + math.sqrt(2.0))
_e32 = 6.0 + math.sqrt(2.0)


class Rosenbrock23(AbstractRosenbrock):
    """Shampine & Reichelt's ``ode23s`` pair: order 2, order-3 error estimate.

    Cheap per step (one Jacobian, one LU factorisation, three evaluations of ``f``) and
    robust for stiff problems at loose tolerances (``rtol`` around ``1e-3``); prefer
    `Rodas5P` for tighter ones.

    Example:
        >>> sol = gs.solve(f, t0, t1, y0, params, solver=gs.Rosenbrock23(), rtol=1e-3)
    """

    order: ClassVar[int] = 2
    embedded_order: ClassVar[int] = 3

    def step(self, f, t0, h, y0, params, state):
        # The ode23s formulas (Shampine & Reichelt 1997, Sec. 3), with W = I - h d J:
        #   k1 = W^-1 (F0 + h d T)
        #   F1 = f(t0 + h/2, y0 + h/2 k1),       k2 = W^-1 (F1 - k1) + k1
        #   y1 = y0 + h k2,  F2 = f(t0 + h, y1)
        #   k3 = W^-1 (F2 - e32 (k2 - F1) - 2 (k1 - F0) + h d T)
        #   error = h/6 (k1 - 2 k2 + k3)
        # Nothing divides by h; at h = 0, W = I and y1 = y0 + 0 * k2 = y0 exactly.
        n = y0.shape[0]
        f0, jac, f_t = jacobians(f, t0, y0, params)
        w = jnp.eye(n, dtype=y0.dtype) - (_d * h) * jac
        lu_piv = jsl.lu_factor(w)
        hdt = (_d * h) * f_t
        k1 = jsl.lu_solve(lu_piv, f0 + hdt)
        f1 = f(t0 + 0.5 * h, y0 + (0.5 * h) * k1, params)
        k2 = jsl.lu_solve(lu_piv, f1 - k1) + k1
        y1 = y0 + h * k2
        f2 = f(t0 + h, y1, params)
        k3 = jsl.lu_solve(lu_piv, f2 - _e32 * (k2 - f1) - 2.0 * (k1 - f0) + hdt)
        y_error = (h / 6.0) * (k1 - 2.0 * k2 + k3)
        return y1, y_error, None
