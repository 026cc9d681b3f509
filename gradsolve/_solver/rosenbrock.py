"""Linearly implicit (Rosenbrock–Wanner) methods for stiff problems.

A Rosenbrock method replaces the Newton iterations of an implicit Runge–Kutta method by one
linear solve per stage with the same matrix, built from the Jacobian ``J = df/dy`` at the
start of the step. For a non-autonomous ``f`` the time derivative ``f_t = df/dt`` enters
every stage; it is computed here exactly (forward-mode AD), so non-autonomous problems keep
the full order.

We use the transformed form of E. Hairer and G. Wanner, *Solving Ordinary Differential
Equations II: Stiff and Differential-Algebraic Problems*, 2nd ed., Springer (1996),
Sec. IV.7, eq. (7.25) (the form of their code RODAS), with the stage equations multiplied
through by ``h``::

    (I / gamma - h J) u_i = h f(t0 + c_i h, y0 + sum_j a_ij u_j)
                            + sum_j C_ij u_j + d_i h^2 f_t,           i = 1..s
    y1      = y0 + sum_i m_i u_i
    y_error =      sum_i e_i u_i

Nothing divides by ``h``: the matrix ``I / gamma - h J`` is ``I / gamma`` at ``h = 0``,
every right-hand side vanishes, all ``u_i`` are exactly zero and the step is an exact
identity whose derivatives (reverse and forward mode) are finite. No ``where`` guard is
needed. One LU factorisation per step serves all stages.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .base import AbstractSolver, combine


def jacobians(f, t0, y0, params):
    """``(f(t0, y0), J, f_t)``: value, Jacobian ``df/dy`` and time derivative ``df/dt``.

    One batched forward-mode pass: ``d + 1`` Jacobian–vector products of ``f`` in the
    directions ``(dt, dy) = e_0, ..., e_d`` share the primal evaluation, which is returned
    as well. Differentiable (reverse and forward mode) like any JAX computation.
    """
    y0 = jnp.asarray(y0)
    t0 = jnp.asarray(t0)
    if not jnp.issubdtype(t0.dtype, jnp.inexact):
        t0 = t0.astype(y0.dtype)
    d = y0.shape[0]
    basis = jnp.eye(d + 1, dtype=y0.dtype)
    tt = basis[:, 0].astype(t0.dtype)  # (d + 1,)
    ty = basis[:, 1:]  # (d + 1, d)

    def directional(dt, dy):
        return jax.jvp(lambda t, y: f(t, y, params), (t0, y0), (dt, dy))

    f0, tangents = jax.vmap(directional, out_axes=(None, 0))(tt, ty)
    f_t = tangents[0]
    jac = tangents[1:].T  # tangents[1 + j] = J[:, j]
    return f0, jac, f_t


def _lu_solver(matrix, lu, perm, inverse):
    """``solve(rhs) = matrix^-1 rhs`` from ``matrix``'s LU factors ``lu`` (unit lower and
    upper triangles in one ``(d, d)``) with row permutation ``perm`` (``matrix[perm] = L
    U``) and its ``inverse``; differentiable through `jax.lax.custom_linear_solve`."""
    tri = jax.lax.linalg.triangular_solve

    def forward(_, b):
        x = b[perm][:, None]
        x = tri(lu, x, left_side=True, lower=True, unit_diagonal=True)
        return tri(lu, x, left_side=True, lower=False)[:, 0]

    def transposed(_, b):
        x = tri(lu, b[:, None], left_side=True, lower=False, transpose_a=True)
        x = tri(lu, x, left_side=True, lower=True, unit_diagonal=True, transpose_a=True)
        return x[:, 0][inverse]

    return lambda rhs: jax.lax.custom_linear_solve(lambda u: matrix @ u, rhs, forward,
                                                   transposed)


class AbstractRosenbrock(AbstractSolver):
    """A Rosenbrock–Wanner method given by its (transformed) coefficients.

    Concrete subclasses set, as class-level arrays for ``s`` stages (Hairer & Wanner's
    transformed coefficients, IV.7.25):

    - ``gamma``: the diagonal coefficient;
    - ``a`` ``(s, s)``, strictly lower triangular: stage points ``y0 + sum_j a_ij u_j``;
    - ``C`` ``(s, s)``, strictly lower triangular: coupling ``sum_j C_ij u_j`` (this is
      ``diag(1/gamma) - Gamma^{-1}``, *without* the usual ``1/h``: see the module notes);
    - ``m`` ``(s,)``: solution weights; ``m_error`` ``(s,)``: error weights
      (``y1 - y1_hat``);
    - ``c`` ``(s,)``: stage times (``alpha_i``, row sums of the untransformed alpha);
    - ``d`` ``(s,)``: coefficients of ``h f_t`` (``gamma_i``, row sums of Gamma).

    ``c[0]`` must be 0 and ``a[0]`` zero, so the first stage reuses ``f(t0, y0)``.
    ``f`` must be differentiable in ``t`` and ``y`` at the step's start.

    Example:
        The built-in methods are subclasses; a new one only sets the arrays above (as
        ``ClassVar`` attributes, with ``order`` and ``embedded_order``):

        >>> isinstance(gs.Rodas5P(), gs.AbstractRosenbrock), gs.Rodas5P().implicit
        (True, True)
        >>> sol = gs.solve(f, t0, t1, y0, params, solver=gs.Rodas5P())
    """

    gamma: ClassVar[float]
    a: ClassVar[np.ndarray]
    C: ClassVar[np.ndarray]
    m: ClassVar[np.ndarray]
    m_error: ClassVar[np.ndarray]
    c: ClassVar[np.ndarray]
    d: ClassVar[np.ndarray]
    implicit: ClassVar[bool] = True

    def step(self, f, t0, h, y0, params, state):
        a, C, m, e, c, d = self.a, self.C, self.m, self.m_error, self.c, self.d
        s = len(m)
        dtype = y0.dtype
        f0, jac, f_t = jacobians(f, t0, y0, params)
        n = y0.shape[0]
        matrix = jnp.eye(n, dtype=dtype) / self.gamma - h * jac
        # Every stage solves with W = matrix. The factors are not differentiated: each
        # solve's derivative is W^-1 (d rhs - dW u) (lax.custom_linear_solve), the same
        # exact derivative for a triangular solve pair per tangent, where differentiating
        # the factorisation costs matrix products per tangent (2x on a stiff replay's
        # forward-mode Jacobian). The row permutation and its inverse are formed once per
        # step, not once per stage solve (jax.scipy's lu_solve converts the pivots each
        # time: a loop per solve, 8 stages x record, replay and adjoint).
        lu, _, perm = jax.lax.linalg.lu(jax.lax.stop_gradient(matrix))
        inverse = jnp.zeros_like(perm).at[perm].set(jnp.arange(n, dtype=perm.dtype))
        solve = _lu_solver(matrix, lu, perm, inverse)

        h2 = h * h
        us = []

        for i in range(s):
            if i == 0 and c[0] == 0.0:
                fi = f0
            else:
                shift = combine(a[i], us)
                yi = y0 if shift is None else y0 + shift
                fi = f(t0 + float(c[i]) * h, yi, params)
            rhs = h * fi
            coupling = combine(C[i], us)
            if coupling is not None:
                rhs = rhs + coupling
            if d[i] != 0.0:
                rhs = rhs + (float(d[i]) * h2) * f_t
            us.append(solve(rhs))

        incr = combine(m, us)
        y1 = y0 if incr is None else y0 + incr
        err = combine(e, us)
        y_error = jnp.zeros_like(y0) if err is None else err
        return y1, y_error, None
