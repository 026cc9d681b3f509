"""`load_petab`'s ``solver="auto"``: an explicit solver where the problem is not stiff.

An explicit step costs a fraction of a Rosenbrock step and runs on the compiled kernel, but a
stiff problem needs tens of thousands of them (its fastest decay rate, not its accuracy,
bounds the explicit step), a non-stiff one tens to hundreds. `probe_explicit` decides at one
point (the nominal parameters): first by the Jacobian's spectral radius, then by a bounded
Tsit5 solve (`tsit5_steps`).

Both run on the host, in NumPy, around one compiled call of the vector field on the whole
ensemble: the Jacobian by forward differences, the solve with the same steps as
``gradsolve.record(..., solver=gs.Tsit5())`` (the same tableau, error norm, I-controller,
initial step, forced nodes at save and jump times, step budget). Loading then compiles no
program it would throw away: a Tsit5 record of a 34-state model took ~15 s of its ~17 s
load, and its ``jax.jacfwd`` program ~1.5 s; the field compiles in under a second, and the
solve's few thousand calls of it take about as long.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

import gradsolve as gs
from gradsolve._solver.tsit5 import Tsit5

__all__ = ["probe_explicit", "tsit5_steps"]

# the I-controller of `gradsolve.PIDController`'s defaults (the probe's record used them),
# its factor rule applied in NumPy below
_CONTROLLER = gs.PIDController()
assert _CONTROLLER.pcoeff == 0 and _CONTROLLER.icoeff == 1, "the probe steps as an I-controller"
_SAFETY, _FACTOR_MIN, _FACTOR_MAX = (_CONTROLLER.safety, _CONTROLLER.factormin,
                                     _CONTROLLER.factormax)
_ERROR_ORDER = Tsit5().error_order  # 5: the step size follows err^(-1/5)


def probe_explicit(vector_field: Callable, y0, p, ts, t1: float, jumps, *, rtol: float,
                   atol: float, budget: int) -> tuple[gs.AbstractSolver | None, str]:
    """``(gradsolve.Tsit5() or None, why)``: `gradsolve.Tsit5` where it solves every
    trajectory (``y0 (n, d')``, ``p (n, n_p)``, saved at ``ts``, to ``t1``, with
    ``jumps``) within ``budget`` steps, else ``None`` (keep `gradsolve.Rodas5P`); ``why``
    is the sentence `PetabProblem.solver_reason` gives."""
    # First the cheap bound: an explicit step stays stable only while h * rho(J) is
    # below ~3.5 (Tsit5's stability interval on the negative real axis), so a
    # Jacobian spectral radius rho at the start already needing more than the budget
    # over the horizon is stiff without a probe solve.
    f = _host_field(vector_field, p)
    jac = _jacobian(f, np.asarray(y0, np.float64))
    if not np.all(np.isfinite(jac)):
        # e.g. an estimated parameter without a nominal value: no point to probe at
        return None, ("gs.Rodas5P(): the stiffness probe needs a finite Jacobian at the "
                      "nominal parameters, and it is not finite there")
    rho = float(np.max(np.abs(np.linalg.eigvals(jac))))
    if not np.isfinite(rho) or rho * t1 / 3.5 > budget:
        return None, (f"gs.Rodas5P(): stiff (the Jacobian's spectral radius {rho:.3g} at "
                      f"t = 0 needs more than {budget} explicit steps over [0, {t1:g}])")
    steps, ok = _tsit5_steps(f, 0.0, t1, y0, ts=ts, jumps=jumps, rtol=rtol, atol=atol,
                             max_steps=budget)
    if bool(np.all(ok)):
        return gs.Tsit5(), (f"gs.Tsit5(): not stiff at the nominal parameters (at most "
                            f"{int(np.max(steps))} explicit steps per condition)")
    return None, (f"gs.Rodas5P(): stiff (gs.Tsit5() needed more than {budget} steps at the "
                  "nominal parameters)")


def tsit5_steps(vector_field: Callable, t0: float, t1: float, y0, p, *, ts=None, jumps=None,
                rtol: float, atol: float, max_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(steps (n,), ok (n,))``: the mesh nodes (accepted steps and jump nodes) an adaptive
    Tsit5 solve of each trajectory takes from ``t0`` to ``t1``, and whether it got there
    within ``max_steps`` of them (no step-size underflow, finite values throughout).

    The steps of ``gradsolve.record(vector_field, t0, t1, y0, p, ts=ts, jumps=jumps,
    solver=gs.Tsit5(), rtol=rtol, atol=atol, max_steps=max_steps)`` (the same rules; its
    counts agree up to rounding, which may move a step here or there): ``y0 (n, d)``,
    ``p (n, n_p)`` (any pytree with leading axis ``n``), ``ts (k,)`` or ``(n, k)`` sorted
    save times (forced nodes), ``jumps=(times (n, J) or (J,), sizes (n, J, d) or (J, d))``
    additive jumps (``+inf`` times pad a row). The field runs as one compiled call on all
    ``n`` trajectories per stage; the rest is NumPy on the host.
    """
    if max_steps < 1:
        raise ValueError(f"tsit5_steps: `max_steps` must be positive, got {max_steps}.")
    if np.ndim(y0) != 2:
        raise ValueError(f"tsit5_steps: `y0` must have shape (n, d), got {np.shape(y0)}.")
    return _tsit5_steps(_host_field(vector_field, p), t0, t1, y0, ts=ts, jumps=jumps,
                        rtol=rtol, atol=atol, max_steps=max_steps)


def _host_field(vector_field: Callable, p) -> Callable:
    """``f(t (n,), y (n, d)) -> (n, d)`` NumPy: ``vector_field`` on every trajectory at its
    parameters ``p`` (leading axis ``n``), one compiled program (compiled at the first
    call, one shape: every call is on the whole ensemble)."""
    field = jax.jit(jax.vmap(vector_field))
    p = jax.tree_util.tree_map(jax.numpy.asarray, p)

    def f(t, y):
        return np.asarray(field(t, y, p), dtype=np.float64)

    return f


def _jacobian(f: Callable, y: np.ndarray) -> np.ndarray:
    """``(n, d, d)`` forward-difference Jacobians of the host field ``f`` at ``t = 0``,
    ``y (n, d)``: ``d + 1`` calls of the field's one compiled program (a ``jax.jacfwd``
    program of its own took longer to compile than the whole probe then runs). Steps
    ``sqrt(eps) max(|y_j|, 1)`` upward (a state at 0 stays non-negative); the result only
    has to place the spectral radius against a bound that stiff and non-stiff problems
    miss by orders of magnitude."""
    n, d = y.shape
    t = np.zeros(n)
    with np.errstate(all="ignore"):
        f0 = f(t, y)
        jac = np.empty((n, d, d))
        h = np.sqrt(np.finfo(np.float64).eps) * np.maximum(np.abs(y), 1.0)
        for j in range(d):
            yj = y.copy()
            yj[:, j] += h[:, j]
            jac[:, :, j] = (f(t, yj) - f0) / (yj[:, j] - y[:, j])[:, None]
    return jac


def _tsit5_steps(f: Callable, t0: float, t1: float, y0, *, ts, jumps, rtol: float,
                 atol: float, max_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """`tsit5_steps` on the host field ``f`` (`_host_field`)."""
    y = np.array(y0, dtype=np.float64)
    n, d = y.shape
    ts = np.zeros((n, 0)) if ts is None else np.broadcast_to(
        np.asarray(ts, np.float64), (n, np.shape(ts)[-1]))
    k = ts.shape[1]
    if jumps is None:
        jt, js = np.full((n, 0), np.inf), np.zeros((n, 0, d))
    else:
        jt = np.broadcast_to(np.asarray(jumps[0], np.float64), (n, np.shape(jumps[0])[-1]))
        js = np.broadcast_to(np.asarray(jumps[1], np.float64), (n, jt.shape[1], d))
        order = np.argsort(jt, axis=1, kind="stable")
        jt = np.take_along_axis(jt, order, axis=1)
        js = np.where(np.isfinite(jt)[..., None],
                      np.take_along_axis(js, order[..., None], axis=1), 0.0)
    J = jt.shape[1]
    rows = np.arange(n)
    a, b_err, c = Tsit5.tableau.a, Tsit5.tableau.b_error, Tsit5.tableau.c

    def next_of(x, ptr):
        """``x[row, ptr]``, ``+inf`` past the end of the row."""
        if x.shape[1] == 0:
            return np.full(n, np.inf)
        return np.where(ptr < x.shape[1], x[rows, np.minimum(ptr, x.shape[1] - 1)], np.inf)

    def rms(x):
        return np.sqrt(np.mean(x * x, axis=-1))

    t = np.full(n, float(t0))
    # Hairer's initial step (Solving ODEs I, II.4), from the state after jumps at t0
    y_start = y + np.sum(np.where((jt <= t0)[..., None], js, 0.0), axis=1) if J else y
    with np.errstate(all="ignore"):
        scale = atol + np.abs(y_start) * rtol
        f0 = f(t, y_start)
        d0, d1 = rms(y_start / scale), rms(f0 / scale)
        small = (d0 < 1e-5) | (d1 < 1e-5)
        h0 = np.where(small, 1e-6, 0.01 * d0 / np.where(small, 1.0, d1))
        f1 = f(t + h0, y_start + h0[:, None] * f0)
        d2 = rms((f1 - f0) / scale) / h0
        dmax = np.maximum(d1, d2)
        h1 = np.where(dmax <= 1e-15, np.maximum(1e-6, h0 * 1e-3),
                      (0.01 / np.where(dmax <= 1e-15, 1.0, dmax)) ** (1.0 / _ERROR_ORDER))
        h = np.minimum(100 * h0, h1)
        h = np.minimum(np.where(np.isfinite(h), h, 1e-6), t1 - t0)
    fsal = f(t, y)
    n_acc = np.zeros(n, np.int64)
    n_rej = np.zeros(n, np.int64)
    save_ptr = np.sum(ts <= t0, axis=1)
    jump_ptr = np.zeros(n, np.int64)
    done = np.zeros(n, bool)
    failed = np.zeros(n, bool)
    attempts_cap = 4 * max_steps + 64
    tiny_eps = 10 * np.finfo(np.float64).eps
    for _ in range(attempts_cap):
        if done.all():
            break
        target = np.where(save_ptr < k, ts[rows, np.minimum(save_ptr, max(k - 1, 0))]
                          if k else np.inf, t1)
        if J:
            jump_next = next_of(jt, jump_ptr)
            is_jump = ~done & (jump_next <= t)
            target = np.minimum(target, jump_next)
            idle = done | is_jump
        else:
            is_jump = np.zeros(n, bool)
            idle = done
        t_try = t + h
        clipped = t_try >= target
        t_new = np.where(idle, t, np.where(clipped, target, t_try))
        h_eff = t_new - t
        with np.errstate(all="ignore"):
            ks = [fsal]
            for i in range(1, 7):
                yi = y + h_eff[:, None] * sum(a[i, j] * ks[j] for j in range(i) if a[i, j])
                ks.append(f(t + c[i] * h_eff, yi))
            y1 = yi  # first same as last: the last stage is taken at the new solution
            y_err = h_eff[:, None] * sum(b_err[j] * ks[j] for j in range(7) if b_err[j])
            sc = atol + rtol * np.maximum(np.abs(y), np.abs(y1))
            err = rms(y_err / sc)
            err = np.where(np.all(np.isfinite(y1), axis=1) & np.isfinite(err), err, np.inf)
            err = np.where(idle, 0.0, err)
            accept = (err <= 1.0) & ~idle
            fac = _SAFETY * (1.0 / np.maximum(err, 1e-10)) ** (1.0 / _ERROR_ORDER)
            fac = np.where(np.isfinite(err), fac, _FACTOR_MIN)
            fac = np.clip(fac, _FACTOR_MIN, np.where(accept, _FACTOR_MAX, _SAFETY))
        h_next = h_eff * fac
        h_next = np.where(accept & clipped, np.maximum(h_next, h), h_next)
        node = accept | is_jump
        n_acc = n_acc + node
        n_rej = n_rej + (~accept & ~idle)
        save_ptr = np.where(accept, np.sum(ts <= t_new[:, None], axis=1), save_ptr)
        y_new = np.where(accept[:, None], y1, y)
        st_new = np.where(accept[:, None], ks[-1], fsal)
        if J:
            y_new = np.where(is_jump[:, None], y + js[rows, np.minimum(jump_ptr, J - 1)],
                             y_new)
            jump_ptr = jump_ptr + is_jump
            if is_jump.any():  # the carried stage at the state after the jump
                st_new = np.where(is_jump[:, None], f(t_new, y_new), st_new)
            h_next = np.where(is_jump, h, h_next)
            finished = node & (t_new >= t1) & ~(next_of(jt, jump_ptr) <= t_new)
        else:
            finished = accept & (t_new >= t1)
        active = ~done & ~finished
        tiny = tiny_eps * np.maximum(np.abs(t_new), np.abs(t))
        underflow = active & (h_next <= tiny)
        over = active & ((n_acc >= max_steps) | (n_acc + n_rej >= attempts_cap))
        failed |= underflow | over
        t = np.where(accept, t_new, t)
        y, fsal = y_new, st_new
        h = np.where(done, h, h_next)
        done = done | finished | underflow | over
    failed |= ~done
    return n_acc, ~failed
