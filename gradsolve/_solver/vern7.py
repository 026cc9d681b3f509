"""Verner's "most efficient" 7(6) pair.

J. H. Verner, "Numerically optimal Runge–Kutta pairs with interpolants", Numerical
Algorithms 53, 383–396 (2010); coefficients from Verner's website ("Jim Verner's Refuge for
Runge–Kutta Pairs", the efficient 7(6) pair), in the exact rational form also used by
OrdinaryDiffEq.jl's ``Vern7Tableau``. Ten stages, not first-same-as-last, so ten
evaluations of ``f`` per step. The extra stages of Verner's interpolant are not included.

The tableau is kept as exact fractions (``vern7.csv`` beside this file, data rather than
code) and rounded once to float64 (``b_error`` is formed exactly before rounding), so every
coefficient is correctly rounded.
"""

from __future__ import annotations

import csv
from fractions import Fraction as F
from pathlib import Path
from typing import ClassVar

import numpy as np

from .base import AbstractExplicitRK, ButcherTableau


def _read_tableau() -> ButcherTableau:
    """The exact rational coefficients from ``vern7.csv`` (rows ``array, i, j, numerator,
    denominator``; ``i``, ``j`` 1-based as in Verner's listing, absent entries zero),
    each rounded once to float64; ``b_error`` is formed exactly before rounding."""
    path = Path(__file__).with_name("vern7.csv")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    exact = {name: {} for name in ("a", "b", "b_hat", "c")}
    for r in rows:
        key = (int(r["i"]), int(r["j"])) if r["j"] else int(r["i"])
        exact[r["array"]][key] = F(int(r["numerator"]), int(r["denominator"]))
    s = len(exact["b"])
    a = np.zeros((s, s))
    for (i, j), v in exact["a"].items():
        a[i - 1, j - 1] = float(v)
    vec = lambda name: [exact[name].get(k, F(0)) for k in range(1, s + 1)]
    b, b_hat, c = vec("b"), vec("b_hat"), vec("c")
    return ButcherTableau(
        a=a, b=np.array([float(v) for v in b]),
        b_error=np.array([float(v - w) for v, w in zip(b, b_hat)]),
        c=np.array([float(v) for v in c]), fsal=False)


_TABLEAU = _read_tableau()


class Vern7(AbstractExplicitRK):
    """Verner's efficient 7(6) explicit Runge–Kutta pair.

    Order 7 with an embedded order-6 error estimate, ten stages (no FSAL). The choice for
    smooth non-stiff problems at tight tolerances (about ``rtol <= 1e-8``, in float64).

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, params, solver=gs.Vern7())
    """

    tableau: ClassVar[ButcherTableau] = _TABLEAU
    order: ClassVar[int] = 7
    embedded_order: ClassVar[int] = 6
