"""Dormand–Prince 5(4) pair.

J. R. Dormand and P. J. Prince, "A family of embedded Runge–Kutta formulae", J. Comp.
Appl. Math. 6, 19–26 (1980); coefficients as in Hairer, Norsett & Wanner, *Solving ODEs I*,
Table II.5.2. Seven stages, first-same-as-last.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .base import AbstractExplicitRK, ButcherTableau

_a = np.zeros((7, 7))
_a[1, :1] = [1 / 5]
_a[2, :2] = [3 / 40, 9 / 40]
_a[3, :3] = [44 / 45, -56 / 15, 32 / 9]
_a[4, :4] = [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729]
_a[5, :5] = [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656]
_b = np.array([35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0])
_a[6, :6] = _b[:6]
_b_hat = np.array([5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40])
_c = np.array([0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0])
_TABLEAU = ButcherTableau(a=_a, b=_b, b_error=_b - _b_hat, c=_c, fsal=True)


class Dopri5(AbstractExplicitRK):
    """Dormand–Prince 5(4) explicit Runge–Kutta pair (``ode45``/``DOPRI5``).

    Order 5 with an embedded order-4 error estimate, seven stages with FSAL.

    Example:
        With Hairer's PI step-size control for this pair:

        >>> pi = gs.PIDController(pcoeff=0.4, icoeff=0.3)
        >>> sol = gs.solve(f, 0.0, 10.0, y0, params, solver=gs.Dopri5(), controller=pi)
    """

    tableau: ClassVar[ButcherTableau] = _TABLEAU
    order: ClassVar[int] = 5
    embedded_order: ClassVar[int] = 4
