"""`steady_state`: the state at the start of a dosing interval repeated forever (a dose
"at steady state", NONMEM's ``SS = 1``), with its exact gradient.

The periodic steady state is the fixed point ``y* = G(y*)`` of one interval's map ``G``:
dose (the interval's dose records, times relative to its start) and evolve for ``II``.
Newton's method finds it, each trajectory its own root (``jax.vmap``, so the map's solves
form one ensemble), with ``G``'s ``d x d`` Jacobian by forward-mode differentiation of the
solve; for a linear model (most pharmacokinetic ones) ``G`` is affine and Newton lands in
one step, the closed form of superposition. The derivative is the implicit function
theorem's, ``dy*/dtheta = (I - dG/dy)^-1 dG/dtheta``, a JVP rule written in differentiable
operations at the converged state: exact to the solve's own discrete adjoint, independent
of the iterations, and itself differentiable, so Hessians and higher derivatives through a
steady state are exact too.

`SteadyState`, the dose record that starts a trajectory there, lives here beside it, so the
dose records (`_doses`) need no solve: the layers run `_doses` -> `_solve` -> here.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import is_concrete
from ._doses import AbstractDose, DoseChange, _Given, _rows, as_schedule
from ._solve import solve

__all__ = ["steady_state", "SteadyState"]


def _solve_small(A, b):
    """``A^-1 b`` for a small ``(d, d)`` system and ``b`` ``(d,)`` or ``(d, m)``, by
    Gaussian elimination with partial pivoting, unrolled in ``d`` (plain arithmetic, no
    LAPACK call: it runs wherever the solve it sits beside runs, inside loops the compiled
    kernel is traced into)."""
    d = A.shape[0]
    vector = b.ndim == 1
    M = jnp.concatenate([A, b[:, None] if vector else b], axis=1)
    for k in range(d):
        piv = k + jnp.argmax(jnp.abs(M[k:, k]))
        rows = jnp.arange(d)
        swap = jnp.where(rows == k, piv, jnp.where(rows == piv, k, rows))
        M = M[swap]
        M = M.at[k].set(M[k] / M[k, k])
        factor = jnp.where(rows == k, 0.0, M[:, k])
        M = M - factor[:, None] * M[k][None, :]
    return M[:, d] if vector else M[:, d:]


def steady_state(f, interval, y0, params, *, doses, solver=None, rtol: float = 1e-6,
                 atol: float = 1e-9, driver=None, max_iterations: int = 50):
    """The pre-dose state of the periodic steady state of ``doses`` given every
    ``interval``.

    Args:
        f: the vector field ``f(t, y, params)`` of one trajectory (``y (d,)``).
        interval: the dosing interval ``II`` (> 0): a scalar, or ``(n,)`` one per
            trajectory.
        y0: ``(d,)`` or ``(n, d)``: Newton's starting guess (zeros serve; a linear model
            needs one step from anywhere).
        params: as `gradsolve.solve` (leading axis ``n`` on every leaf for an ensemble).
        doses: the dose records of ONE interval (`gradsolve.DoseSchedule` or a list of
            `gradsolve.Bolus`, `gradsolve.Infusion`, ...), times relative to its start, in
            ``[0, interval)``; every input ends inside the interval.
        solver, rtol, atol, driver: the interval's solve, as `gradsolve.solve`. Newton
            stops when successive states agree to the same ``rtol``/``atol``.
        max_iterations: Newton's limit: a trajectory that does not converge gets NaN
            (a ``RuntimeError`` outside ``jit``).

    Returns:
        ``(n, d)`` (``(d,)`` for one trajectory): the state just before the interval's
        first dose, once every earlier interval has been dosed the same way. Start the
        solve there, with the interval's doses (and those after it) in ``doses=``.
        Differentiable w.r.t. ``params``, ``interval`` and every dose field.

    Example:
        >>> ss = gs.steady_state(pk, 12.0, jnp.zeros(2), q, doses=[gs.Bolus(0.0, 100.0)])
        >>> sol = gs.solve(pk, 0.0, 12.0, ss, q, ts=ts, doses=[gs.Bolus(0.0, 100.0)])
    """
    where = "gs.steady_state"
    sched = as_schedule(doses, where)
    y0 = jnp.asarray(y0)
    single = y0.ndim == 1
    Y = y0[None] if single else y0
    n, d = Y.shape
    interval = jnp.asarray(interval, Y.dtype)
    if interval.shape not in ((), (n,)):
        raise ValueError(f"{where}: `interval` must be a scalar or ({n},), got shape "
                         f"{interval.shape}.")
    if is_concrete(interval) and not np.all(np.asarray(interval) > 0):
        raise ValueError(f"{where}: `interval` must be positive, got {interval}.")
    interval = jnp.broadcast_to(interval, (n,))
    g, Z0, jumps = sched.apply(f, Y, jumps=None)
    if jumps is None:
        raise ValueError(f"{where}: `doses` gives no dose; a steady state needs one.")
    T, S = jumps
    if is_concrete(T, interval):
        Tn, ii = np.asarray(T), np.asarray(interval)[:, None]
        finite = np.isfinite(Tn)
        if np.any(finite & ((Tn < 0) | (Tn > ii))):
            row = int(np.flatnonzero(np.any(finite & ((Tn < 0) | (Tn > ii)), axis=1))[0])
            raise ValueError(f"{where}: every dose of the interval, and the end of every "
                             f"input, must lie in [0, interval] = [0, {float(ii[row, 0])}] "
                             f"(times are relative to the interval's start; trajectory "
                             f"{row}).")
    D = Z0.shape[1]
    p_batched = jax.tree.map(lambda x: jnp.asarray(x)[None], params) if single else params

    def one(y_guess, p, times, sizes, interval):
        def interval_map(y, q, tt, ss, t_end):
            z = jnp.concatenate([y, jnp.zeros(D - d, y.dtype)])
            sol = solve(g, 0.0, t_end, z, q, solver=solver, rtol=rtol, atol=atol,
                        driver=driver, jumps=(tt, ss))
            return sol.y1[:d]

        # (nothing traced is closed over by the custom rule: `eye` is built inside each
        # function, not once here, where under jit it would be a tracer)
        @eqx.filter_custom_jvp
        def fixed_point(y_guess, inputs):
            # Newton on y - G(y) = 0; no derivative is taken through its iterations
            eye = jnp.eye(d, dtype=y_guess.dtype)

            def newton(carry):
                y, _, it = carry
                J = jax.jacfwd(interval_map)(y, *inputs)
                y_new = y - _solve_small(eye - J, y - interval_map(y, *inputs))
                change = jnp.max(jnp.abs(y_new - y) / (atol + rtol * jnp.abs(y_new)))
                return y_new, change, it + 1

            def going(carry):
                _, change, it = carry
                return (change > 1.0) & (it < max_iterations)

            y, change, _ = jax.lax.while_loop(going, newton, (y_guess, jnp.inf, 0))
            return jnp.where(change <= 1.0, y, jnp.nan)

        @fixed_point.def_jvp
        def fixed_point_jvp(primals, tangents):
            # The implicit function theorem, dy* = (I - dG/dy)^-1 dG/dtheta, written in
            # differentiable operations at y*(theta): differentiating this rule again gives
            # the exact higher derivatives (the terms in d(dG/dy)/dtheta included), which a
            # Hessian through a steady state (FOCE-I, Laplace) needs.
            y_guess, inputs = primals
            _, d_inputs = tangents
            eye = jnp.eye(d, dtype=y_guess.dtype)
            y = fixed_point(y_guess, inputs)
            J = jax.jacfwd(interval_map)(y, *inputs)
            _, dG = eqx.filter_jvp(lambda i: interval_map(y, *i), (inputs,), (d_inputs,))
            # (the inverse first, then a product: the tangent is linear in dG, as reverse
            # mode's transpose needs)
            return y, _solve_small(eye - J, eye) @ dG

        return fixed_point(y_guess, (p, times, sizes, jnp.asarray(interval, y_guess.dtype)))

    out = jax.vmap(one)(Y, p_batched, T, S, interval)
    if is_concrete(out) and not bool(jnp.all(jnp.isfinite(out))):
        bad = np.flatnonzero(~np.all(np.isfinite(np.asarray(out)), axis=-1)).tolist()
        raise RuntimeError(f"{where}: Newton's method found no periodic steady state within "
                           f"{max_iterations} iterations for trajectories {bad}; pass a closer "
                           "`y0`, a larger `max_iterations`, or check that the doses reach a "
                           "steady state (elimination faster than zero).")
    return out[0] if single else out


class SteadyState(AbstractDose):
    """A dose given at steady state (NONMEM's ``SS`` with ``II``): ``dose`` as if it had
    been given every ``interval`` forever before.

    At each of ``dose``'s times the state is the pre-dose state of that periodic steady
    state (`gradsolve.steady_state`: the fixed point of one dosed interval's flow, by
    Newton's method, its gradient by the implicit function theorem), and then ``dose``
    is given. ``add=False`` (``SS = 1``) resets the trajectory to that state, as `Reset`
    does; ``add=True`` (``SS = 2``) adds it to the current state (superposition: right
    for linear models only).

    Attributes:
        dose: a `Bolus` or `Infusion` (any record with a ``time`` field, e.g. with a lag
            time or a bioavailability); an infusion ends before the next dose.
        interval: ``II`` (> 0), broadcast to ``dose.time``'s shape.
        add: ``SS = 2`` instead of ``SS = 1``.

    Example:
        >>> gs.SteadyState(gs.Infusion(0.0, 500.0, duration=2.0, cmt=1), interval=12.0)
    """

    dose: AbstractDose
    interval: jax.Array
    add: bool = eqx.field(static=True, default=False)

    def changes(self, n: int) -> list[DoseChange]:
        given = self.dose.changes(n)
        t = _rows(self.dose.time, n, "time", "gs.SteadyState")
        ii = jnp.broadcast_to(_rows(self.interval, n, "interval", "gs.SteadyState"), t.shape)
        here = jnp.isfinite(t)

        def values(f, params, options):
            out = []
            for k in range(t.shape[1]):
                tk = t[:, k:k + 1]
                rel = [c._replace(
                    times=jnp.where(here[:, k:k + 1] & jnp.isfinite(c.times[:, k:k + 1]),
                                    c.times[:, k:k + 1] - jnp.where(here[:, k:k + 1], tk, 0.0),
                                    jnp.inf),
                    values=c.values[:, k:k + 1], origin=None) for c in given]
                y = steady_state(f, jnp.where(here[:, k], ii[:, k], 1.0),
                                 jnp.zeros((n, options["d"])), params, doses=[_Given(tuple(rel))],
                                 **{o: options[o] for o in ("solver", "rtol", "atol", "driver")})
                out.append(y)
            return jnp.stack(out, axis=1)

        return given + [DoseChange("state" if self.add else "restart", 0, t, values)]
