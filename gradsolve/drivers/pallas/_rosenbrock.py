"""Rosenbrock steps (`gradsolve.Rodas5P`, `gradsolve.Rosenbrock23`) over blocks of
trajectories, for the Pallas kernels.

The record, the replay and the adjoint kernels call ``solver.step(field, t, h, y, p, st)``
on blocks (`gradsolve.drivers.pallas._layout`: each state component one ``(rows, 128)``
block). `BlockRosenbrock` is that ``step`` for a linearly implicit method, in the
arithmetic of `gradsolve._solver.rosenbrock` (the XLA drivers' step) operation for
operation, but for the linear algebra, which is unrolled over the ``d`` states, and the
last stage points of a stiffly accurate method (Rodas5P's stages 7 and 8 and ``y1``: the
previous point plus one increment, not a new sum over all of them; 14 % of the forward
step's operations and 11 % of its reverse on Robertson):

- the value ``f(t0, y0)``, the Jacobian ``J = df/dy`` and ``f_t = df/dt`` are the solver's
  own `gradsolve._solver.rosenbrock.jacobians` (``d + 1`` forward-mode passes), translated
  entry by entry like the field (`BlockField.jacobians`);
- ``W = I / gamma - h J`` (Rosenbrock23: ``I - h d J``) is ``d * d`` blocks, factorised
  by LU with partial pivoting as LAPACK's ``getrf`` does (the row of largest magnitude,
  the first on ties; multipliers by the pivot's reciprocal, as ``getf2``). The pivot row
  differs from lane to lane, so the swaps are branchless: at column ``k`` each candidate
  row ``r > k`` carries a mask (is it the pivot row), and rows ``k`` and ``r`` exchange
  their entries by selects where it is set. Pivoting and not a plain elimination because
  ``W`` is not diagonally dominant in general: on Robertson ``W[2, 1] = -h 6e7 y2`` beside
  ``W[2, 2] = 1 / gamma``, and ``-h J`` dominates once ``h`` is large, as it is on a stiff
  problem's slow phase;
- every stage's solve replays the swaps on its right-hand side (the same masks), then the
  two triangular substitutions, dividing by the diagonal through its reciprocal (once per
  step).

A singular ``W`` gives a non-finite step, which the error norm maps to an infinite error
ratio: the record rejects that step and shrinks ``h``, as the XLA record does with
LAPACK's factors.

The adjoint kernel differentiates this step with ``jax.vjp`` (the factorisation included:
for ``d <= 8`` its reverse is a few hundred operations per step, and the derivative is that
of ``W^-1 r``, as ``lax.custom_linear_solve`` gives the XLA drivers), so it is the exact
discrete adjoint of the forward's arithmetic.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..._solver.base import combine
from ..._solver.rosenbrock import AbstractRosenbrock
from ..._solver.rosenbrock23 import Rosenbrock23, _d as _D23, _e32 as _E32
from ..lanes import LaneArray

MAX_STATES = 8
"""The most states a Rosenbrock step runs in the Pallas kernels with: its ``W`` is ``d * d``
blocks, factorised in straight-line code of about ``d**3`` operations (more states: the
batched XLA driver)."""


def rosenbrock_reason(solver, d: int) -> str | None:
    """Why the Pallas kernels cannot run ``solver`` (an `AbstractRosenbrock`) on ``d``
    states, or ``None``."""
    if type(solver).step not in (AbstractRosenbrock.step, Rosenbrock23.step):
        return (f"the Pallas kernels run the Rosenbrock steps of gs.Rodas5P, "
                f"gs.Rosenbrock23 and subclasses that only set coefficients; "
                f"{type(solver).__name__} has a step of its own.")
    if d > MAX_STATES:
        return (f"the Pallas kernels factorise a Rosenbrock step's matrix in unrolled "
                f"code for at most {MAX_STATES} states; this system has {d}.")
    return None


def lu_factor(a: list[list]):
    """LU with partial pivoting of the ``d * d`` blocks ``a`` (rows of entries):
    ``(lu, swaps, inv)``: the factors in one matrix (unit lower ``L`` below the diagonal),
    per column ``k < d - 1`` the masks of rows ``k + 1 ..`` exchanged with row ``k``, and
    the reciprocals of ``U``'s diagonal."""
    d = len(a)
    a = [list(row) for row in a]
    swaps, inv = [], []
    for k in range(d):
        if k < d - 1:
            mags = [jnp.abs(a[r][k]) for r in range(k, d)]
            top = mags[0]
            for x in mags[1:]:
                top = jnp.maximum(top, x)
            found = mags[0] == top  # row k is the pivot row (the first on ties)
            masks = []
            for r in range(k + 1, d):
                sel = (mags[r - k] == top) & ~found
                found = found | sel
                masks.append(sel)
                for j in range(d):
                    ak, ar = a[k][j], a[r][j]
                    a[k][j], a[r][j] = jnp.where(sel, ar, ak), jnp.where(sel, ak, ar)
            swaps.append(masks)
        r_kk = 1.0 / a[k][k]
        inv.append(r_kk)
        for r in range(k + 1, d):
            m = a[r][k] * r_kk
            a[r][k] = m
            for j in range(k + 1, d):
                a[r][j] = a[r][j] - m * a[k][j]
    return a, swaps, inv


def lu_solve(factors, b: LaneArray) -> LaneArray:
    """``W^-1 b`` from `lu_factor`'s ``factors``: the row swaps, then forward substitution
    with ``L`` and back substitution with ``U``."""
    lu, swaps, inv = factors
    x = list(b.rows)
    d = len(x)
    for k, masks in enumerate(swaps):
        for r, sel in zip(range(k + 1, d), masks):
            xk, xr = x[k], x[r]
            x[k], x[r] = jnp.where(sel, xr, xk), jnp.where(sel, xk, xr)
    for i in range(1, d):
        for j in range(i):
            x[i] = x[i] - lu[i][j] * x[j]
    for i in reversed(range(d)):
        for j in range(i + 1, d):
            x[i] = x[i] - lu[i][j] * x[j]
        x[i] = x[i] * inv[i]
    return LaneArray(x)


def _matrix(jac, diagonal, scale):
    """``diagonal * I - scale * J`` entry by entry, as ``eye * diagonal - scale * jac``
    computes it (an off-diagonal entry ``0 - x`` is ``-x``)."""
    d = len(jac)
    return [[diagonal - scale * jac[i][j] if i == j else -(scale * jac[i][j])
             for j in range(d)] for i in range(d)]


class BlockRosenbrock:
    """``solver`` (an `AbstractRosenbrock`) as the kernels call a solver: ``step(field,
    t0, h, y, p, state)`` on blocks, no carried state (module docstring)."""

    fsal = False
    c = (0.0,)  # no carried stage: its time is never read

    def __init__(self, solver):
        self.solver = solver
        self.error_order = solver.error_order

    def init(self, field, t0, y0, p):
        return None

    def step(self, field, t0, h, y: LaneArray, p: LaneArray, state):
        f0, jac, f_t = field.jacobians(t0, y, p)
        if type(self.solver).step is Rosenbrock23.step:
            return _rosenbrock23(field, t0, h, y, p, f0, jac, f_t)
        return _transformed(self.solver, field, t0, h, y, p, f0, jac, f_t)


def _transformed(solver, field, t0, h, y0: LaneArray, p, f0, jac, f_t):
    """`gradsolve._solver.rosenbrock.AbstractRosenbrock.step` on blocks."""
    a, C, m, e, c, dd = solver.a, solver.C, solver.m, solver.m_error, solver.c, solver.d
    dtype = y0.rows[0].dtype
    diagonal = np.asarray(1.0, dtype) / np.asarray(solver.gamma, dtype)
    factors = lu_factor(_matrix(jac, diagonal, h))
    h2 = h * h
    us, points = [], []
    for i in range(len(m)):
        if i == 0 and c[0] == 0.0:
            fi, yi = f0, y0
        else:
            if _extends(a[i], a[i - 1], i):
                yi = points[i - 1] + us[i - 1]
            else:
                shift = combine(a[i], us)
                yi = y0 if shift is None else y0 + shift
            fi = field(t0 + float(c[i]) * h, yi, p)
        points.append(yi)
        rhs = h * fi
        coupling = combine(C[i], us)
        if coupling is not None:
            rhs = rhs + coupling
        if dd[i] != 0.0:
            rhs = rhs + (float(dd[i]) * h2) * f_t
        us.append(lu_solve(factors, rhs))
    s_ = len(m)
    if _extends(m, a[s_ - 1], s_):
        y1 = points[s_ - 1] + us[s_ - 1]
    else:
        incr = combine(m, us)
        y1 = y0 if incr is None else y0 + incr
    err = combine(e, us)
    return y1, (y0 * 0.0 if err is None else err), None


def _extends(row, prev, i: int) -> bool:
    """Whether the combination ``row`` of the first ``i`` increments is ``prev``'s of the
    first ``i - 1`` plus the last one (a stiffly accurate method's last stages and
    solution: Rodas5P's stage points 7 and 8 and ``y1``), so the point is the previous one
    plus that increment: 1 addition per state instead of ``i``. Equal to the XLA step's
    sum to rounding."""
    return i >= 2 and row[i - 1] == 1.0 and np.array_equal(row[:i - 1], prev[:i - 1])


def _rosenbrock23(field, t0, h, y0: LaneArray, p, f0, jac, f_t):
    """`gradsolve.Rosenbrock23.step` (the ``ode23s`` formulas) on blocks."""
    dh = _D23 * h
    factors = lu_factor(_matrix(jac, 1.0, dh))
    hdt = dh * f_t
    k1 = lu_solve(factors, f0 + hdt)
    f1 = field(t0 + 0.5 * h, y0 + (0.5 * h) * k1, p)
    k2 = lu_solve(factors, f1 - k1) + k1
    y1 = y0 + h * k2
    f2 = field(t0 + h, y1, p)
    k3 = lu_solve(factors, f2 - _E32 * (k2 - f1) - 2.0 * (k1 - f0) + hdt)
    y_error = (h / 6.0) * (k1 - 2.0 * k2 + k3)
    return y1, y_error, None
