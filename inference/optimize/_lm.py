"""A batched, bounded Levenberg–Marquardt for many starts of one residual problem at once.

The objective of each start is a negative log-likelihood written through residuals,

    F(x) = sum_i [ normal: z_i^2 / 2 + s_i ;  laplace: |z_i| + s_i ] + P(x),

with ``z = (t(data) - t(model)) / sigma`` and ``s = log sigma`` (both may depend on ``x``)
and ``P`` an optional separable penalty (a negative log prior). With ``sigma`` fixed and
normal noise this is least squares and the method below is Levenberg–Marquardt exactly
(Moré 1978, "The Levenberg-Marquardt algorithm: implementation and theory"). When ``sigma``
is estimated, ``F`` is not a sum of squares; the step then uses the exact gradient and the
Fisher information of the noise model as the curvature (Fisher scoring, the Hessian
approximation Fides and pyPESTO use for these problems): for a measurement with normal noise
``J_h^T J_h + 2 J_s^T J_s``, with Laplace noise ``J_h^T J_h + J_s^T J_s``, where
``J_h = d t(model) / dx / sigma = -(J_z + z J_s)``; ``P`` adds its curvature's diagonal,
clipped at zero. Steps are accepted on the actual decrease of ``F``, so the curvature model
only shapes the steps.

With hierarchical optimisation (`models.load_petab`'s default) ``z`` and ``s`` are the
residuals at the closed-form optimum of the inner parameters (scalings, offsets, noise),
so ``F`` is the full negative log-likelihood at that optimum and the forward-mode
Jacobian, taken through the closed forms, is that of the reduced residuals (variable
projection). With a noise parameter profiled out, ``sum z^2`` over its measurements is
their number and ``F`` their ``n/2 log RSS``, and ``log sigma`` is no parameter: the
Fisher information of the reduced problem is the Schur complement of the full one, whose
``x``-``sigma`` block vanishes, so it is ``J_h^T J_h`` alone (``J_h`` through the closed
forms of scalings and offsets: variable projection's Gauss-Newton matrix); such rows
(``profiled``) leave their ``2 J_s^T J_s`` out. Kept in, it is no Fisher information of the reduced problem: it adds
``2 n g g^T / RSS^2`` where the Hessian of ``n/2 log RSS`` subtracts it, and shortens
every step along the gradient by up to a factor 3 far from an optimum.

Bounds: a projected method with an active set (Bertsekas 1982, "Projected Newton methods
for optimization problems with simple constraints"): coordinates on a bound whose gradient
points out of the box are held, the damped system is solved in the others, and the trial
point is projected into the box. The damping follows Nielsen's rule (Nielsen 1999, "Damping
parameter in Marquardt's method"), scaled by the curvature's diagonal (Marquardt).

Every start advances in the same compiled step (`LMKernel.step`): one evaluation of
residuals and their forward-mode Jacobian for all starts (one ensemble of solves); each
start accepts or rejects its own trial point and keeps its own damping.

Mesh reuse (``mesh_terms``): each start keeps the mesh its solves were last recorded on and
evaluates its trial points by a replay of that mesh (whose forward-mode derivative is the
exact derivative of the replayed steps), so most iterations cost a replay, not an adaptive
record plus a replay. A start's mesh is re-recorded at its trial point when the point moved
more than the policy's ``drift_tol`` from the recording point (`inference.MeshPolicy`,
the rule every fitter and sampler follows; here measured as the largest coordinate's
change on the parameter scale), or when the replay's embedded error estimate exceeds the
requested tolerances there (then that evaluation is redone on the new mesh: ``redo_factor
= 1``): every objective value meets the tolerances a fresh solve would.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._progress import progress_bar
from ..problem._abstract import ResidualTerms
from ..problem._policy import MeshPolicy
from ._optimizer import AbstractOptimizer, OptimizeResult, checked_bounds, checked_mask

__all__ = ["LevenbergMarquardt", "LMState", "LMKernel", "MeshTerms", "RUNNING", "CONVERGED",
           "FAILED_START", "STALLED", "REASONS", "LM_POLICY"]

LM_POLICY = MeshPolicy(rerecord="auto", drift_tol=0.5, error_ratio_max=1.0,
                       record_tol_factor=0.5, redo_factor=1.0, drift_measure="absolute")
"""The LM multistart's mesh rule: record at half the tolerances; re-record a start whose
point moved by more than 0.5 on the parameter scale (a factor of 3 in a ``log10``
parameter) or whose replay's error ratio exceeds 1 (and redo that evaluation: LM's
acceptance compares objective values, which must meet the tolerances)."""

RUNNING, CONVERGED, FAILED_START, STALLED = 0, 1, 2, 3

REASONS = ("running", "ftol", "gtol", "xtol", "damping", "max_iter", "not_finite")
"""Why each start stopped (`LMState.reason` indexes this): still running; an accepted step
lowered the objective by at most ``ftol (1 + |F|)``; the projected gradient is at most
``gtol``; the step vanished (every free coordinate on its bound, or an accepted step no
longer than ``xtol (1 + |x|)``); the damping passed ``lam_max`` without an accepted step;
the iteration cap; the objective was not finite at the start. Fides' exit flags, by their
names."""
_FTOL, _GTOL, _XTOL, _DAMPING, _MAX_ITER, _NOT_FINITE = range(1, 7)

_LAM_DOWN = 1.0 / 3.0  # the largest decrease of the damping after one accepted step
_CONVERGED_LAM = 1.0  # the largest damping of a step whose small decrease means converged


class MeshTerms(NamedTuple):
    """Residuals on a kept mesh, for `LMKernel`'s mesh reuse.

    Attributes:
        record: ``record(x (D,)) -> mesh``: the solves' mesh at ``x`` (a pytree of arrays,
            no derivative).
        terms: ``terms(x (D,), mesh) -> (z (m,), s (m,), error_ratio (k,))``: the residuals
            of `LMKernel`'s ``terms`` by a replay of ``mesh``, forward-mode differentiable
            in ``x``, and the replay's error estimate per solve in units of the requested
            tolerances (above 1, or not finite: the mesh is too coarse at ``x``).
        cost: ``cost(meshes) -> (n,)`` what evaluating each of ``n`` kept meshes costs
            (e.g. its longest trajectory's step count), or ``None``: `LMKernel.run`
            evaluates starts of similar cost together (a batched replay runs every row
            to its longest).
    """

    record: Callable
    terms: Callable
    cost: Callable | None = None


class LMState(NamedTuple):
    """Per-start state of the batched Levenberg–Marquardt (``n`` starts, ``D`` parameters).

    Attributes:
        x: ``(n, D)`` current points; f: ``(n,)`` objective there; g: ``(n, D)`` gradient;
        h: ``(n, D, D)`` curvature (Gauss–Newton / Fisher information).
        lam: ``(n,)`` damping; nu: ``(n,)`` its growth factor after a rejection.
        code: ``(n,)`` `RUNNING`, `CONVERGED`, `FAILED_START` (not finite at the start) or
            `STALLED` (the damping grew past its bound without an accepted step).
        iters: ``(n,)`` iterations done; accepted: ``(n,)`` accepted steps.
        mesh: with mesh reuse, each start's kept mesh (leading axis ``n``), else ``None``;
        x_rec: ``(n, D)`` where each was recorded (``None`` without reuse).
        records: ``(n,)`` how often each start's solves were recorded (with reuse: its
            mesh records; without: its evaluations).
        reason: ``(n,)`` why each start stopped, an index into `REASONS` (0: running).
    """

    x: jax.Array
    f: jax.Array
    g: jax.Array
    h: jax.Array
    lam: jax.Array
    nu: jax.Array
    code: jax.Array
    iters: jax.Array
    accepted: jax.Array
    mesh: object = None
    x_rec: jax.Array | None = None
    records: jax.Array | None = None
    reason: jax.Array | None = None


class LMKernel:
    """`init` and `step` of a batched bounded LM for ``terms``.

    Args:
        terms: ``terms(x (D,)) -> (z (m,), s (m,))`` for one start: weighted residuals and
            log noise scales (``s`` zeros for plain least squares); forward-mode
            differentiable.
        laplace: ``(m,)`` bool, where the noise is Laplace (``None``: all normal).
        penalty: ``penalty(x) -> scalar`` added to the objective (separable in ``x``), or
            ``None``.
        lower, upper: ``(D,)`` bounds (finite or infinite).
        ftol: converged when an accepted step taken at damping at most 1 (relative to
            the curvature's diagonal) lowers ``F`` by at most ``ftol * (1 + |F|)``; gtol: or
            when the projected gradient's largest entry is at most ``gtol``; xtol: or when
            such an accepted step moves no coordinate more than ``xtol * (1 + max |x|)``
            (0, the default: off, as in Fides).
        lam_max: a start whose damping passes this without an accepted step is `STALLED`.
        mesh_terms: `MeshTerms`: evaluate on kept meshes (module docstring); ``terms`` is
            then unused.
        policy: when a start's mesh is re-recorded (`MeshPolicy`; default `LM_POLICY`:
            a move of 0.5 on the parameter scale, or an error ratio above 1, which also
            redoes that evaluation).
        profiled: ``(m,)`` bool, where ``s`` is a noise parameter optimised in closed
            form at each ``x`` (hierarchical optimisation; ``None``: nowhere): its
            derivative enters the gradient but not the curvature.
        data_columns: the last ``data_columns`` coordinates of ``x`` are data the terms
            read (a profile's held coordinate's index), not parameters: no derivative is
            taken in them (zero gradient and curvature), so the LM never moves them.
    """

    def __init__(self, terms: Callable, laplace=None, penalty: Callable | None = None, *,
                 lower, upper, ftol: float = 1e-10, gtol: float = 1e-6, xtol: float = 0.0,
                 lam_max: float = 1e12, mesh_terms: MeshTerms | None = None,
                 policy: MeshPolicy = LM_POLICY, profiled=None, data_columns: int = 0):
        self.lower = jnp.asarray(lower, float)
        self.upper = jnp.asarray(upper, float)
        if not (isinstance(data_columns, (int, np.integer)) and not isinstance(
                data_columns, bool) and 0 <= data_columns < self.lower.shape[-1]):
            raise ValueError(f"`data_columns` must be an int in [0, {self.lower.shape[-1]}) "
                             f"(the coordinates that are data, not parameters), got "
                             f"{data_columns!r}")
        self.ftol, self.gtol, self.xtol, self.lam_max = ftol, gtol, xtol, lam_max
        self.mesh_terms, self.policy = mesh_terms, policy
        self.n_records = 0  # batched records run (init included)
        self.n_evals = 0  # batched evaluations (residuals and Jacobians)
        lap = None if laplace is None else jnp.asarray(laplace, bool)
        prof = None if profiled is None else jnp.asarray(profiled, bool)

        def local(x, mesh=None):
            """(F, gradient, curvature, the solves' largest error ratio) at one point."""
            def zs(x):
                if mesh_terms is None:
                    z, s = terms(x)
                    err = jnp.zeros(())
                else:
                    z, s, err = mesh_terms.terms(x, mesh)
                    err = jnp.max(jnp.where(jnp.isfinite(err), err, jnp.inf))
                return jnp.concatenate([z, s]), err

            # forward mode over the differentiated columns only, the values from the same
            # pass (``jax.jacfwd`` drops its values: a second, separate solve)
            k = x.shape[0] - data_columns
            basis = jnp.eye(k, x.shape[0], dtype=x.dtype)  # (k, D) unit tangents
            v, jt, err = jax.vmap(lambda t: jax.jvp(zs, (x,), (t,), has_aux=True),
                                  out_axes=(None, 0, None))(basis)
            jac = jnp.zeros((v.shape[0], x.shape[0]), jt.dtype).at[:, :k].set(jt.T)
            m = v.shape[0] // 2
            z, s, jz, js = v[:m], v[m:], jac[:m], jac[m:]
            is_lap = jnp.zeros(m, bool) if lap is None else lap
            f = _sum_of_terms(z, s, is_lap)
            dz = jnp.where(is_lap, jnp.sign(z), z)
            g = jz.T @ dz + jnp.sum(js, axis=0)
            jh = jz + z[:, None] * js
            # a profiled noise's log sigma is no parameter of the reduced problem: its
            # Fisher information is the Schur complement J_h^T J_h (module docstring)
            w = jnp.where(is_lap, 1.0, 2.0) * (1.0 if prof is None else ~prof)
            h = jh.T @ jh + (js * w[:, None]).T @ js
            if penalty is not None:
                p, gp = jax.value_and_grad(penalty)(x)
                hp = jnp.diagonal(jax.hessian(penalty)(x))
                f, g = f + p, g + gp
                h = h + jnp.diag(jnp.maximum(hp, 0.0))
            ok = jnp.isfinite(f) & jnp.all(jnp.isfinite(g)) & jnp.all(jnp.isfinite(h))
            return jnp.where(ok, f, jnp.inf), g, h, err

        # the evaluation (the ensemble of solves and their Jacobians) is compiled once and
        # shared by init and step; the step's algebra is a second, small program
        self._local_jit = jax.jit(jax.vmap(local))
        if mesh_terms is not None:
            self._record_jit = jax.jit(jax.vmap(mesh_terms.record))
        self._bounds = _Bounds(self.lower, self.upper, *(
            jnp.asarray(v, float) for v in (ftol, gtol, xtol, lam_max)))

    def with_record(self, record: Callable, *, ftol: float) -> "LMKernel":
        """This kernel with another ``mesh_terms.record`` (e.g. the same solves at other
        tolerances) and ``ftol``, sharing its compiled evaluation: a second pass of the
        same residuals costs no second trace or compile of them. Counts start at zero."""
        out = copy.copy(self)
        out.mesh_terms = self.mesh_terms._replace(record=record)
        out._record_jit = jax.jit(jax.vmap(record))
        out.ftol = ftol
        out._bounds = self._bounds._replace(ftol=jnp.asarray(ftol, float))
        out.n_records = out.n_evals = 0
        return out

    def init(self, x) -> LMState:
        """The state at the starts ``x (n, D)`` (clipped into the bounds): one evaluation."""
        x = jnp.clip(jnp.asarray(x, float), self.lower, self.upper)
        n = x.shape[0]
        mesh = x_rec = None
        if self.mesh_terms is not None:
            mesh, x_rec = self._record_jit(x), x
            self.n_records += 1
        f, g, h, _ = self._local_jit(x, mesh)
        self.n_evals += 1
        code = jnp.where(jnp.isfinite(f), RUNNING, FAILED_START)
        # (strong float64, as `_update` returns them: one compiled step, not two)
        return LMState(x=x, f=f, g=g, h=h, lam=jnp.full(n, 1e-3, float),
                       nu=jnp.full(n, 2.0, float),
                       code=code, iters=jnp.zeros(n, int), accepted=jnp.zeros(n, int),
                       mesh=mesh, x_rec=x_rec, records=jnp.ones(n, int),
                       reason=jnp.where(jnp.isfinite(f), 0, _NOT_FINITE))

    def _rerecord(self, s: LMState, x, rows):
        """``s`` with the meshes of ``rows`` (host bool ``(n,)``) recorded at ``x``."""
        new = self._record_jit(x)
        self.n_records += 1
        rows_j = jnp.asarray(rows)
        mesh, x_rec = _where_rows(rows_j, (new, x), (s.mesh, s.x_rec))
        return s._replace(mesh=mesh, x_rec=x_rec, records=s.records + rows_j)

    def _evaluate(self, s: LMState, x_new):
        """(state with refreshed meshes, F, gradient, curvature) at the trial points."""
        self.n_evals += 1
        if self.mesh_terms is None:
            return (s._replace(records=s.records + (s.code == RUNNING)),
                    *self._local_jit(x_new)[:3])
        running = np.asarray(s.code) == RUNNING
        moved = self.policy.distance(x_new, s.x_rec)
        due = self.policy.rerecord_after(running, moved, np.zeros(len(running)))
        if due.any():
            # a batched record costs about the same for one row as for all: refresh all
            due = running
            s = self._rerecord(s, x_new, due)
        f, g, h, err = self._local_jit(x_new, s.mesh)
        coarse = (running & ~due
                  & ~(np.asarray(err) <= self.policy.redo_factor * self.policy.error_ratio_max))
        if coarse.any():
            s = self._rerecord(s, x_new, coarse)
            self.n_evals += 1
            f2, g2, h2, _ = self._local_jit(x_new, s.mesh)
            f, g, h = _where_rows(jnp.asarray(coarse), (f2, g2, h2), (f, g, h))
        return s, f, g, h

    def step(self, s: LMState) -> LMState:
        """One iteration of every running start (one evaluation of all trial points)."""
        x_new, d, pred = _trial(self._bounds, s._replace(mesh=None))
        s, f, g, h = self._evaluate(s, x_new)
        # the meshes stay out of the update's program (nothing to copy there)
        out = _update(self._bounds, s._replace(mesh=None), x_new, d, pred, f, g, h)
        return out._replace(mesh=s.mesh)

    def run(self, x, max_iter: int, callback: Callable | None = None, *,
            shrink: bool = True) -> tuple[LMState, list]:
        """Iterate from ``x (n, D)`` until no start is running, ``max_iter`` iterations, or
        ``callback(state)`` (after each iteration) returns ``True``; returns the final state
        (starts still running have reason ``"max_iter"``) and the
        objective ``(n,)`` after each iteration.

        Finished starts leave the ensemble: the step runs on the smallest batch of size
        ``n, n/4, n/16, ...`` (at least 4) that holds the running starts (padded with repeats
        of one of them), so that a few slow starts do not carry the cost of all; each size
        is one more compile. With ``mesh_terms.cost``, the starts are evaluated in groups of
        the smallest of these sizes, sorted by the cost of their kept meshes, wherever one
        batch would cost more than twice the groups (a batched replay runs every row to
        its longest: on Fujita_SciSignal2010's 20 Latin hypercube starts, meshes of 15-835
        steps, one batch cost 2.7x the 20 starts one at a time).

        A smaller batch's rows are gathered from the state and scattered back by one
        compiled program per size (not one per array of the state and number of rows:
        Boehm_JProteomeRes2014's profile compiled 250 of those).

        ``shrink=False`` runs every iteration on the full batch (finished starts held by
        their codes): one compiled evaluation, for callers of many short runs (a
        profile's rounds), where a smaller batch's compile costs more than its rows save
        (Boehm_JProteomeRes2014's profile: 9.4 s CPU to compile the 4-row evaluation,
        against 6.6 s CPU of rows saved over the profile's 185 evaluations)."""
        x = jnp.clip(jnp.asarray(x, float), self.lower, self.upper)
        n = int(x.shape[0])
        sizes, m = [n], n // 4
        while shrink and m >= 4:
            sizes.append(m)
            m //= 4
        sizes.sort()
        grouped = self.mesh_terms is not None and self.mesh_terms.cost is not None
        group = sizes[0] if grouped else n
        s = self._in_groups(self.init, x, np.arange(n), group)
        history = [np.asarray(s.f)]
        for _ in range(int(max_iter)):
            running = np.flatnonzero(np.asarray(s.code) == RUNNING)
            if not len(running):
                break
            size = next(b for b in sizes if b >= len(running))
            if grouped and len(running) > group:
                cost = np.asarray(self.mesh_terms.cost(s.mesh), float)[running]
                order = np.argsort(cost, kind="stable")
                ends = np.minimum(np.arange(group, len(running) + group, group),
                                  len(running)) - 1
                # split where one batch would pad to more than twice the groups' cost
                if size * cost.max() > 2.0 * group * np.sum(cost[order][ends]):
                    size, running = group, running[order]
            s = self._in_groups(self.step, s, running, size, scatter=True)
            history.append(np.asarray(s.f))
            if callback is not None and callback(s) is True:
                break
        s = s._replace(reason=jnp.where(s.code == RUNNING, _MAX_ITER, s.reason))
        return s, history

    def _in_groups(self, fn, s, rows, size: int, scatter: bool = False):
        """``fn`` (`init` or `step`) on ``rows`` of ``s`` in consecutive groups of ``size``
        (the last padded with repeats of its first row). ``scatter``: the results go
        back into ``s``; else ``s`` is the points ``x (n, D)`` and the groups' states are
        joined."""
        out = []
        for i in range(0, len(rows), size):
            part = rows[i:i + size]
            idx = np.concatenate([part, np.full(size - len(part), part[0])])
            whole = len(idx) == len(rows) and np.array_equal(idx, np.arange(len(idx)))
            if not scatter:
                sub = fn(s if whole else s[idx])
                out.append(sub if whole else jax.tree_util.tree_map(
                    lambda a, k=len(part): a[:k], sub))
            elif size == s.x.shape[0]:
                # one batch of all starts: finished ones are held by their codes (cheaper
                # than gathering and scattering the kept meshes)
                s = fn(s)
            else:
                # one compiled gather and scatter per group size, not one per array and
                # number of rows (the padding rows are dropped: written to row ``n``)
                sub = fn(_gather_rows(s, jnp.asarray(idx)))
                back = np.concatenate([part, np.full(size - len(part), s.x.shape[0])])
                s = _scatter_rows(s, jnp.asarray(back), sub)
        if scatter:
            return s
        return out[0] if len(out) == 1 else jax.tree_util.tree_map(
            lambda *a: jnp.concatenate(a), *out)


@jax.jit
def _where_rows(rows, new, old):
    """``new``'s rows where ``rows (n,)`` (bool), else ``old``'s, in every array of two
    pytrees of the same structure (leading axis ``n``): one compiled program, not one per
    array."""
    return jax.tree_util.tree_map(
        lambda a, b: jnp.where(rows.reshape(rows.shape + (1,) * (a.ndim - 1)), a, b),
        new, old)


@jax.jit
def _gather_rows(s, rows):
    """The rows ``rows (k,)`` of every array of the state ``s`` (leading axis ``n``)."""
    return jax.tree_util.tree_map(lambda a: a[rows], s)


@jax.jit
def _scatter_rows(s, rows, sub):
    """``s`` with its rows ``rows (k,)`` replaced by ``sub``'s (leading axis ``k``); an
    index past the end writes nothing."""
    return jax.tree_util.tree_map(lambda a, b: a.at[rows].set(b, mode="drop"), s, sub)


class _Bounds(NamedTuple):
    """What the step's algebra reads of an `LMKernel`, as data (not constants of the
    program): every kernel of the same shapes runs the same two compiled programs."""

    lower: jax.Array
    upper: jax.Array
    ftol: jax.Array
    gtol: jax.Array
    xtol: jax.Array
    lam_max: jax.Array


def _free(b: _Bounds, x, g):
    """``(n, D)``: the coordinates not held on a bound by a gradient pointing out."""
    at_lo = (x <= b.lower) & (g > 0)
    at_hi = (x >= b.upper) & (g < 0)
    return ~(at_lo | at_hi)


@jax.jit
def _trial(b: _Bounds, s: LMState):
    """Each start's projected damped step ``d (n, D)`` and its predicted decrease."""
    free = _free(b, s.x, s.g)
    mask = free[:, :, None] & free[:, None, :]
    diag = jnp.diagonal(s.h, axis1=1, axis2=2)
    scale = jnp.maximum(diag, 1e-12 * (1.0 + jnp.max(diag, axis=1, keepdims=True)))
    a = jnp.where(mask, s.h, 0.0) + jax.vmap(jnp.diag)(
        jnp.where(free, s.lam[:, None] * scale, 1.0))
    step = -jnp.linalg.solve(a, jnp.where(free, s.g, 0.0)[..., None])[..., 0]
    x_new = jnp.clip(s.x + step, b.lower, b.upper)
    d = x_new - s.x
    pred = -(jnp.sum(s.g * d, axis=1) + 0.5 * jnp.einsum("ni,nij,nj->n", d, s.h, d))
    return x_new, d, pred


@jax.jit
def _update(b: _Bounds, s: LMState, x_new, d, pred, f_new, g_new, h_new) -> LMState:
    """Each start's acceptance of its trial point, new damping and convergence."""
    running = s.code == RUNNING
    decrease = s.f - f_new
    rho = decrease / jnp.where(pred > 0, pred, jnp.inf)
    accept = running & jnp.isfinite(f_new) & (decrease > 0) & (rho > 1e-4)
    lam_acc = s.lam * jnp.maximum(_LAM_DOWN, 1.0 - (2.0 * rho - 1.0) ** 3)
    lam = jnp.where(accept, lam_acc, jnp.where(running, s.lam * s.nu, s.lam))
    nu = jnp.where(accept, 2.0, jnp.where(running, s.nu * 2.0, s.nu))
    pick = lambda new, old: jnp.where(  # noqa: E731
        accept.reshape(accept.shape + (1,) * (new.ndim - 1)), new, old)
    x, f, g, h = pick(x_new, s.x), pick(f_new, s.f), pick(g_new, s.g), pick(h_new, s.h)
    pg = jnp.where(_free(b, x, g), g, 0.0)
    # a small decrease (or step) means converged only where the step was not damped far
    # below a Gauss-Newton step (a heavily damped step is short wherever it is)
    gn = accept & (s.lam <= _CONVERGED_LAM)
    small_f = gn & (decrease <= b.ftol * (1.0 + jnp.abs(f)))
    small_g = jnp.max(jnp.abs(pg), axis=1) <= b.gtol
    step = jnp.max(jnp.abs(d), axis=1)
    small_x = gn & (step <= b.xtol * (1.0 + jnp.max(jnp.abs(x), axis=1)))
    no_move = running & ~accept & (step == 0.0)
    why = jnp.where(small_g, _GTOL, jnp.where(small_f, _FTOL, _XTOL))
    stop = running & (small_f | small_g | small_x | no_move)
    code = jnp.where(stop, CONVERGED, s.code)
    reason = jnp.where(stop, why, s.reason)
    stalled = (code == RUNNING) & (lam > b.lam_max)
    code = jnp.where(stalled, STALLED, code)
    reason = jnp.where(stalled, _DAMPING, reason)
    return s._replace(x=x, f=f, g=g, h=h, lam=lam, nu=nu, code=code, reason=reason,
                      iters=s.iters + running, accepted=s.accepted + accept)


class LevenbergMarquardt(AbstractOptimizer):
    """The batched bounded Levenberg–Marquardt (`LMKernel`) as an optimiser of any problem
    whose objective has residuals (`inference.AbstractProblem.residual_terms`): every
    start one row of one ensemble, each evaluation a replay of the start's kept mesh.

    The run has two passes: first with the solves at ``loose_tol_factor`` times the
    problem's tolerances, to a decrease below ``loose_ftol (1 + |F|)`` (far from an optimum
    a path needs descent directions, not eight digits; a stiff solve at 100x looser
    tolerances takes about a third of the steps), then from there at the problem's
    tolerances to ``ftol`` / ``gtol`` (Fides' default stop, pyPESTO's optimiser on these
    problems). ``loose_tol_factor=1`` runs the second pass alone. The values reported are
    fresh solves' at each final point.

    Args:
        max_iter: iterations per start and pass.
        ftol, gtol: the stop (`LMKernel`'s): an accepted step lowering the objective by at
            most ``ftol (1 + |F|)``, or a projected gradient at most ``gtol``.
        loose_tol_factor, loose_ftol: the first pass's tolerance factor and stop.
        policy: when a start's mesh is re-recorded (`LM_POLICY`).

    Example:
        >>> opt = inference.optimize.LevenbergMarquardt(max_iter=200)
        >>> inference.fit(models.load_petab("Boehm_JProteomeRes2014"), optimizer=opt,
        ...               n_starts=20)
    """

    name = "lm"

    def __init__(self, max_iter: int = 1000, *, ftol: float = 1e-8, gtol: float = 1e-6,
                 loose_tol_factor: float = 100.0, loose_ftol: float = 1e-6,
                 policy: MeshPolicy = LM_POLICY):
        for arg, v in (("max_iter", max_iter),):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"`{arg}` must be an int >= 1, got {v!r}")
        for arg, v in (("ftol", ftol), ("gtol", gtol), ("loose_ftol", loose_ftol)):
            if not (isinstance(v, (int, float, np.number)) and v >= 0):
                raise ValueError(f"`{arg}` must be a number >= 0, got {v!r}")
        if not (isinstance(loose_tol_factor, (int, float, np.number)) and loose_tol_factor >= 1):
            raise ValueError(f"`loose_tol_factor` must be a number >= 1, got "
                             f"{loose_tol_factor!r}")
        self.max_iter, self.ftol, self.gtol = int(max_iter), float(ftol), float(gtol)
        self.loose_tol_factor, self.loose_ftol = float(loose_tol_factor), float(loose_ftol)
        self.policy = policy

    def check(self, problem) -> None:
        """``ValueError`` where ``problem`` has no residual form (`residual_terms` is
        ``None``: a non-Gaussian likelihood, a population's integrated likelihood)."""
        if problem.residual_terms() is None:
            raise ValueError(
                f"the Levenberg-Marquardt optimiser needs residuals, and this "
                f"{type(problem).__name__}'s objective has none (its likelihood is not "
                "normal or Laplace noise on the observations); use method='lbfgs' or an "
                "Optax optimizer")

    def _pass(self, rt, lo, hi, x0, mask, bar, tol_factor, ftol, deadline, like=None):
        """One batched LM run from ``x0`` with the solves at ``tol_factor`` times the
        problem's tolerances: (final state, objective history, kernel, stopped early).
        ``like``: an earlier pass's kernel, whose compiled evaluation this one shares (the
        residuals are the same; only the record's tolerances and ``ftol`` differ)."""
        policy = self.policy
        record_factor = tol_factor * policy.record_tol_factor

        def record(x):
            return rt.record(x, record_factor)

        late = [False]

        def after(s):
            bar.update(1)
            if deadline is not None and time.monotonic() > deadline:
                late[0] = True
                return True
            return False

        if like is not None:
            kernel = like.with_record(record, ftol=ftol)
            s, history = kernel.run(x0, self.max_iter, callback=after)
            return s, history, kernel, late[0]
        held = None if mask is None else jnp.asarray(mask)

        def frozen(x):
            # a held coordinate has no derivative: the LM neither steps nor curves in it
            return x if held is None else jnp.where(held, jax.lax.stop_gradient(x), x)

        def terms_on(x, mesh):
            z, s, err = rt.terms(frozen(x), mesh)
            return z, s, policy.error_ratio(err)

        penalty = None
        if rt.penalty is not None:
            def penalty(x):
                return rt.penalty(frozen(x))

        mesh_terms = MeshTerms(record, terms_on, rt.cost)
        kernel = LMKernel(None, rt.laplace, penalty, lower=lo, upper=hi,
                          mesh_terms=mesh_terms, ftol=ftol, gtol=self.gtol, policy=policy,
                          profiled=rt.profiled)
        s, history = kernel.run(x0, self.max_iter, callback=after)
        return s, history, kernel, late[0]

    def minimize(self, problem, x0, *, mask=None, deadline=None, progress=None,
                 prior: bool = True) -> OptimizeResult:
        """`AbstractOptimizer.minimize` by the batched LM (module docstring)."""
        self.check(problem)
        mask = checked_mask(problem, mask)
        lo, hi = checked_bounds(problem)
        rt = problem.residual_terms(prior=prior)
        x = np.asarray(x0, float)
        bar = progress_bar(progress, total=self.max_iter, done=0,
                           desc=f"fit {_label(problem)} (LM)")
        passes = []
        try:
            if self.loose_tol_factor > 1.0:
                passes.append(self._pass(rt, lo, hi, x, mask, bar, self.loose_tol_factor,
                                         self.loose_ftol, deadline))
                x = np.asarray(passes[-1][0].x)
            if not (passes and passes[-1][3]):
                passes.append(self._pass(rt, lo, hi, x, mask, bar, 1.0, self.ftol,
                                         deadline, like=passes[-1][2] if passes else None))
        finally:
            bar.close()
        s, late = passes[-1][0], passes[-1][3]
        failed = (np.asarray(passes[0][0].code) == FAILED_START) | (
            np.asarray(s.code) == FAILED_START)
        # the reported values are fresh solves' (the iterations' came from replays of kept
        # meshes, equal to within the tolerances): each final point recorded at the
        # problem's tolerances and replayed on its own mesh, as `gs.solve` does
        xs = np.asarray(s.x)
        value = np.asarray(_fresh_values(rt)(jnp.asarray(xs)), float)
        value = np.where(failed | ~np.isfinite(value), np.inf, value)
        reasons = np.asarray(REASONS, dtype=object)[np.asarray(s.reason)]
        if late:
            reasons = np.where(np.asarray(s.reason) == _MAX_ITER, "deadline", reasons)
        reasons = np.where(failed, "not_finite", reasons).astype(str)
        history = np.concatenate([np.stack(h) for _, h, _, _ in passes]) + rt.constant
        return OptimizeResult(
            x=xs, value=value, converged=(np.asarray(s.code) == CONVERGED) & ~failed,
            n_iter=sum(np.asarray(p[0].iters) for p in passes), reason=reasons,
            history=history, n_records=sum(p[2].n_records for p in passes),
            n_records_per_start=sum(np.asarray(p[0].records) for p in passes).astype(np.int64),
            n_evals=sum(p[2].n_evals for p in passes),
            max_error_ratio=np.zeros(len(xs)))


def _fresh_values(rt: ResidualTerms):
    """``values(x (n, D)) -> (n,)``: the objective of `ResidualTerms` ``rt`` at each point
    from a record at the problem's tolerances and its replay (a fresh solve), compiled."""
    lap = None if rt.laplace is None else jnp.asarray(rt.laplace, bool)

    def one(x):
        z, s, _ = rt.terms(x, rt.record(x, 1.0))
        f = _sum_of_terms(z, s, lap) + rt.constant
        return f if rt.penalty is None else f + rt.penalty(x)

    return jax.jit(jax.vmap(one))


def _label(problem) -> str:
    """A problem's name for progress lines."""
    names = getattr(problem, "source", None)
    return getattr(names, "name", None) or type(problem).__name__


def _sum_of_terms(z, s, laplace):
    """The objective's sum over residuals (module docstring): ``z**2 / 2 + s``, or
    ``|z| + s`` where ``laplace`` (``(m,)`` bool, or ``None``: all normal)."""
    rho = 0.5 * z**2 if laplace is None else jnp.where(laplace, jnp.abs(z), 0.5 * z**2)
    return jnp.sum(rho + s)
