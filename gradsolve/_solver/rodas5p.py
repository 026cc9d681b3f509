"""Rodas5P: Steinebach's 5(4) stiffly accurate Rosenbrock–Wanner method.

G. Steinebach, "Construction of Rosenbrock–Wanner method Rodas5P and numerical benchmarks
within the Julia Differential Equations package", BIT Numerical Mathematics 63, 27 (2023).
Eight stages, order 5 with an embedded order-4 solution, stiffly accurate (the last two
stages are evaluated at ``t0 + h``; ``y1`` is the last stage point plus the last increment
and the error estimate is that increment), L-stable; order conditions for index-1 DAEs
and good behaviour for a Jacobian of reduced accuracy.

The transformed coefficients (``gamma``, ``a``, ``C``, stage times ``c`` and ``f_t``
coefficients ``d``) are those of the paper as published in OrdinaryDiffEq.jl's
``Rodas5PTableau``. Note for whoever copies them: there the struct takes ``d`` before
``c``; here the roles were checked independently: ``d`` are the row sums of
``Gamma = (diag(1/gamma) - C)^{-1}`` (first entry ``gamma``), ``c`` those of
``a Gamma`` (second entry ``3 gamma``), and the observed order on a non-autonomous problem
is 5 (``tests/test_stiff.py``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .rosenbrock import AbstractRosenbrock

_gamma = 0.21193756319429014

_a = np.zeros((8, 8))
_a[1, :1] = [3.0]
_a[2, :2] = [2.849394379747939, 0.45842242204463923]
_a[3, :3] = [-6.954028509809101, 2.489845061869568, -10.358996098473584]
_a[4, :4] = [2.8029986275628964, 0.5072464736228206, -0.3988312541770524,
             -0.04721187230404641]
_a[5, :5] = [-7.502846399306121, 2.561846144803919, -11.627539656261098,
             -0.18268767659942256, 0.030198172008377946]
# Stiffly accurate: stages 7 and 8 sit at the previous stage point plus its increment.
_a[6, :6] = [*_a[5, :5], 1.0]
_a[7, :7] = [*_a[5, :5], 1.0, 1.0]
_m = np.array([*_a[5, :5], 1.0, 1.0, 1.0])
_m_error = np.zeros(8)
_m_error[7] = 1.0

_C = np.zeros((8, 8))
_C[1, :1] = [-14.155112264123755]
_C[2, :2] = [-17.97296035885952, -2.859693295451294]
_C[3, :3] = [147.12150275711716, -1.41221402718213, 71.68940251302358]
_C[4, :4] = [165.43517024871676, -0.4592823456491126, 42.90938336958603,
             -5.961986721573306]
_C[5, :5] = [24.854864614690072, -3.0009227002832186, 47.4931110020768,
             5.5814197821558125, -0.6610691825249471]
_C[6, :6] = [30.91273214028599, -3.1208243349937974, 77.79954646070892,
             34.28646028294783, -19.097331116725623, -28.087943162872662]
_C[7, :7] = [37.80277123390563, -3.2571969029072276, 112.26918849496327,
             66.9347231244047, -40.06618937091002, -54.66780262877968,
             -9.48861652309627]

# Stage times (alpha_i) and f_t coefficients (gamma_i).
_c = np.array([0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716,
               0.4288403609558664, 1.0, 1.0, 1.0])
_d = np.array([0.21193756319429014, -0.42387512638858027, -0.3384627126235924,
               1.8046452872882734, 2.325825639765069, 0.0, 0.0, 0.0])


class Rodas5P(AbstractRosenbrock):
    """Rodas5P, Steinebach's stiffly accurate 5(4) Rosenbrock–Wanner method.

    The recommended solver for stiff problems at moderate to tight tolerances. Each step
    costs one Jacobian (``jax.jacfwd`` of ``f``, time derivative included), one LU
    factorisation and seven further evaluations of ``f``.

    Example:
        >>> sol = gs.solve(f, t0, t1, y0, params, solver=gs.Rodas5P())
    """

    gamma: ClassVar[float] = _gamma
    a: ClassVar[np.ndarray] = _a
    C: ClassVar[np.ndarray] = _C
    m: ClassVar[np.ndarray] = _m
    m_error: ClassVar[np.ndarray] = _m_error
    c: ClassVar[np.ndarray] = _c
    d: ClassVar[np.ndarray] = _d
    order: ClassVar[int] = 5
    embedded_order: ClassVar[int] = 4
