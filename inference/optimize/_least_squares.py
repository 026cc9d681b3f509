"""`fit_least_squares`: least squares by the package's one Levenberg–Marquardt, the
batched LM every residual fit runs (`inference.optimize._lm.LMKernel`).

Every start advances in the same compiled step: one ensemble evaluation of the residuals
and their forward-mode Jacobians (replays of each start's kept mesh), each start accepting
or rejecting its own trial point with its own damping. The parameters are the model's
unconstrained coordinates that move the predictions (no bounds: ``-inf``/``+inf``).

Meshes (`LeastSquaresResiduals.policy`, a `MeshPolicy`): each start's mesh is recorded at
``record_tol_factor`` times the tolerances and re-recorded at its trial point when that
point moved more than ``drift_tol`` from where it was recorded, measured as the largest
change of an unconstrained coordinate (``drift_measure="absolute"``: for a positive
parameter, whose coordinate is its logarithm, 0.1 is a relative change of about 10 %, the
same rule as the relative drift of `inference.fit`; a relative change of a logarithm, or
of a coordinate near zero, would mean nothing), or when the replay's error ratio exceeds
``error_ratio_max`` (then that evaluation is redone on the new mesh, ``redo_factor = 1``:
LM accepts steps by comparing objective values, which must meet the tolerances).

Settling: a start whose LM run stopped on a mesh recorded more than ``settle_factor *
drift_tol`` from its final point (`MeshPolicy.settled`), or that was still running at the
iteration cap, runs again from there (a pass: a fresh record at its own point, then LM),
at most ``max_rerecords`` passes, so that the reported optimum is that of its own mesh.
The reported losses are half the residual sum of squares on a fresh record at each final
point.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

import gradsolve as gs

from .._result import FAILED, FitResult
from ._lm import CONVERGED, FAILED_START, REASONS, RUNNING, LMKernel, MeshTerms
from ..problem._policy import MeshPolicy
from ..problem._problem import MAX_STEPS, TOLERANCES, Problem
from ..problem._space import checked_init
from ..problem._starts import prior_draws

__all__ = ["fit_least_squares", "LeastSquaresResiduals"]

_MAX_ITER = REASONS.index("max_iter")


def _is_lognormal(model, params) -> bool:
    d = model.noise(params, jnp.ones((2, len(model.observed_names))))
    while isinstance(d, (dist.Independent, dist.ExpandedDistribution)):
        d = d.base_dist
    return isinstance(d, dist.LogNormal)


class LeastSquaresResiduals:
    """The residuals of one problem as `LMKernel` takes them.

    Which coordinates move the predictions (a forward-mode Jacobian of an adaptive solve at
    the defaults): only those, ``v (P,)``, are fitted; the others (e.g. ``sigma``) are held
    at the defaults. Residuals are ``ys - y_pred`` (of their logs for LogNormal noise),
    none at missing observations (zero).

    Args:
        problem: the `Problem` (model, data, solver, tolerances).
        policy: the `MeshPolicy` (record tolerances; error ratios in requested units).
    """

    def __init__(self, problem: Problem, policy: MeshPolicy):
        self.problem, self.policy = problem, policy
        model, space = problem.model, problem.space
        defaults = {k: jnp.asarray(v) for k, v in model.defaults.items()}
        self.u_default = space.to_unconstrained(defaults)
        self.log_res = _is_lognormal(model, defaults)
        self.missing = jnp.isnan(problem.ys_obs)
        self.obs = jnp.log(problem.ys_obs) if self.log_res else problem.ys_obs

        def predict(u):
            x = space.from_unconstrained(u)
            return problem.observe(x, problem.states(x).ys)

        jac = jax.jit(jax.jacfwd(predict))(self.u_default)
        self.moves = np.asarray(jnp.any(jnp.abs(jnp.reshape(jac, (-1, space.dim))) > 0, axis=0))
        if not self.moves.any():
            raise ValueError("fit_least_squares: no parameter changes the predictions")
        self.dyn = jnp.asarray(np.nonzero(self.moves)[0])
        self.mesh_terms = MeshTerms(record=self.record, terms=self.terms)

    def full(self, v: jax.Array) -> jax.Array:
        """The unconstrained vector ``(..., D)`` of fitted coordinates ``v (..., P)``."""
        base = jnp.broadcast_to(self.u_default, jnp.shape(v)[:-1] + self.u_default.shape)
        return base.at[..., self.dyn].set(v)

    def residuals(self, y_pred: jax.Array) -> jax.Array:
        """``(..., k, m)`` residuals of predictions ``(..., k, m)``, zero where missing."""
        yt = jnp.log(y_pred) if self.log_res else y_pred
        return jnp.where(self.missing, 0.0, self.obs - yt)

    def record(self, v: jax.Array):
        """The mesh at ``v (P,)`` (or ``(n, P)``), at the policy's record tolerances."""
        return self.problem.record(self.full(v), self.policy.record_tol_factor)

    def terms(self, v: jax.Array, mesh) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`MeshTerms.terms` at ``v (P,)``: residuals ``(k * m,)`` by a replay of ``mesh``
        (NaN where its record failed), zero log noise scales, the replay's error ratio in
        units of the requested tolerances (``inf`` where the record failed)."""
        x = self.problem.space.from_unconstrained(self.full(v))
        sol = self.problem.states(x, mesh)
        r = jnp.reshape(self.residuals(self.problem.observe(x, sol.ys)), (-1,))
        ok = mesh.status == 0
        err = jnp.where(ok, self.policy.error_ratio(sol.error_ratio), jnp.inf)
        return jnp.where(ok, r, jnp.nan), jnp.zeros_like(r), jnp.reshape(err, (-1,))

    def finish(self, v: np.ndarray) -> tuple[jax.Array, np.ndarray, np.ndarray]:
        """``(u (n, D), loss (n,), ok (n,))`` at the final points ``v (n, P)``: half the
        residual sum of squares on one fresh (ensemble) record; a scalar or per-state
        ``sigma`` that moves no prediction is set to the residuals' RMS."""
        problem = self.problem
        u = self.full(jnp.asarray(v))
        mesh = problem.record(u, self.policy.record_tol_factor)
        x = problem.space.from_unconstrained(u)
        r = np.asarray(self.residuals(problem.observe(x, problem.states(x, mesh).ys)))
        loss = 0.5 * np.sum(r**2, axis=(-2, -1))
        ok = (np.asarray(mesh.status) == 0) & np.isfinite(loss)
        rows = [self._sigma_from_residuals(u[i], r[i]) if ok[i] else u[i]
                for i in range(len(loss))]
        return jnp.stack(rows), np.where(ok, loss, np.inf), ok

    def _sigma_from_residuals(self, u, r) -> jax.Array:
        space = self.problem.space
        shape = space.shapes.get("sigma")
        if shape is None or self.moves[space.coords("sigma")].any():
            return u
        seen = ~np.asarray(self.missing)
        if shape == ():
            sig = np.sqrt(np.sum(r**2) / np.sum(seen))
        elif shape == (r.shape[1],):
            sig = np.sqrt(np.sum(r**2, axis=0) / np.maximum(np.sum(seen, axis=0), 1))
        else:
            return u
        x = dict(space.from_unconstrained(u), sigma=jnp.asarray(sig, jnp.result_type(float)))
        return space.to_unconstrained(x)


def fit_least_squares(
    model, data, init: Mapping[str, Any] | None = None, *, n_starts: int = 1, seed: int = 0,
    max_iter: int = 200, max_rerecords: int = 20, drift_tol: float = 0.1,
    error_ratio_max: float = 1.0, lm_rtol: float = 1e-10, lm_atol: float = 1e-10,
    rtol: float = TOLERANCES.rtol, atol: float = TOLERANCES.atol, solver=None,
    max_steps: int = MAX_STEPS, record_tol_factor: float = 0.5,
) -> FitResult:
    """Least-squares fit with Levenberg–Marquardt on replayed meshes, every start at once.

    Residuals are ``ys - y_pred`` (``log ys - log y_pred`` when the model's noise is
    LogNormal), unweighted; missing observations give none. Only the parameters that change
    the predictions are fitted (the others, e.g. ``sigma``, are found by a forward-mode
    Jacobian at the defaults and held); afterwards a ``sigma`` parameter of shape ``()`` or
    ``(m,)`` is set to the residuals' RMS (per observed state).

    The optimiser is the batched Levenberg–Marquardt of the PEtab multistart
    (`inference.optimize._lm.LMKernel`, unbounded in the unconstrained coordinates): all
    starts advance together, each iteration one ensemble evaluation of the residuals and
    their forward-mode Jacobians (``jax.jacfwd`` through ``gs.replay``) on each start's
    kept mesh. A start's mesh is re-recorded when its point moved more than ``drift_tol``
    in any unconstrained coordinate (for a positive parameter, a log: 0.1 is about 10 %)
    or when the replay's error ratio passes ``error_ratio_max``; a start that stopped on a
    mesh recorded elsewhere runs again from a fresh record at its point (module
    docstring), so the solution is that of its own mesh.

    Args:
        model, data: as `fit`.
        init: ``None`` (prior draws; the first start is ``model.defaults`` when
            ``n_starts == 1``) or a parameter dict (the first start).
        n_starts: starts, all advanced together in one ensemble.
        seed: seeds the prior draws of the starts.
        max_iter: LM iterations (each one evaluation, accepted or not) per pass.
        max_rerecords: passes per start (a pass: a fresh record at the start's point, then
            up to ``max_iter`` LM iterations with re-records on drift); a start is run
            again while it was still iterating at ``max_iter`` or stopped more than
            ``0.1 * drift_tol`` from its mesh's record point.
        lm_rtol: LM's ``ftol``: a start has converged when an accepted, nearly undamped
            step lowers the loss by at most ``lm_rtol * (1 + loss)``.
        lm_atol: LM's ``gtol``: or when the loss's gradient in the fitted coordinates is
            at most ``lm_atol`` in every entry.
        drift_tol, error_ratio_max, record_tol_factor: the mesh rule (`MeshPolicy`;
            ``drift_tol`` measured on the unconstrained coordinates, see above).
        rtol, atol, solver, max_steps: as `fit`.

    Returns:
        `FitResult` with ``objective="least_squares"``, ``method="lm"`` and ``losses`` half
        the residual sum of squares (a fresh record at each final point);
        ``loss_history`` each start's loss after every LM iteration (on its kept mesh);
        ``n_grad_evals`` counts ensemble evaluations (residuals and Jacobians),
        ``n_steps`` LM iterations; ``converged`` whether each start's last pass met LM's
        convergence test (``ftol``, ``gtol`` or a vanished step) on a mesh recorded within
        ``0.1 * drift_tol`` of its final point, ``exit_reasons`` why it stopped
        (`inference.optimize._lm.REASONS`; ``"not_finite"``: failed); ``max_error_ratio``
        each start's replay error ratio at its final point on the mesh its last pass ran
        on (requested units; ``inf`` where that record failed).

    Example:
        >>> res = inference.fit_least_squares(models.lynx_hare(),
        ...                                   models.load_dataset("lynx_hare"))
        >>> res.params["theta"], res.losses      # (4,), (1,)
    """
    for name, v in (("n_starts", n_starts), ("max_iter", max_iter),
                    ("max_rerecords", max_rerecords)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
    for name, v in (("lm_rtol", lm_rtol), ("lm_atol", lm_atol)):
        if not (isinstance(v, (int, float, np.number)) and v >= 0):
            raise ValueError(f"`{name}` must be a number >= 0, got {v!r}")
    t_start = time.perf_counter()
    gs.ensure_compilation_cache()  # as `fit`: a second run loads its compiled programs
    policy = MeshPolicy.checked("fit", "auto", drift_tol=drift_tol,
                                error_ratio_max=error_ratio_max,
                                record_tol_factor=record_tol_factor, redo_factor=1.0,
                                drift_measure="absolute")
    problem = Problem(model, data, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)
    res = LeastSquaresResiduals(problem, policy)
    starts = prior_draws(model, problem.space, jax.random.PRNGKey(seed), int(n_starts))
    if init is not None:
        u0, n_init = checked_init(model, problem.space, init)
        if n_init is not None:
            raise ValueError("`init` of fit_least_squares is one parameter dict (no ensemble "
                             "axis); use `n_starts` for more starts")
        starts[0] = u0
    elif n_starts == 1:
        starts = np.asarray(res.u_default)[None]

    n_fit = len(res.dyn)
    kernel = LMKernel(None, lower=np.full(n_fit, -np.inf), upper=np.full(n_fit, np.inf),
                      ftol=lm_rtol, gtol=lm_atol, mesh_terms=res.mesh_terms, policy=policy)
    err_of = jax.jit(jax.vmap(lambda v, mesh: jnp.max(res.terms(v, mesh)[2])))

    n = len(starts)
    v = np.array(starts[:, np.asarray(res.dyn)], float)
    code = np.zeros(n, np.int64)
    reason = np.zeros(n, np.int64)
    failed = np.zeros(n, bool)
    settled = np.zeros(n, bool)
    records = np.zeros(n, np.int64)
    err = np.zeros(n)
    history = []
    n_steps = 0
    todo = np.arange(n)
    for _ in range(int(max_rerecords)):
        # every pass runs at the full batch size, padded with repeats of its first row:
        # one compiled program for all passes (at these sizes an LM iteration costs
        # milliseconds and a program for a smaller batch seconds to compile)
        rows = np.concatenate([todo, np.full(n - len(todo), todo[0])])
        s = kernel.init(v[rows])
        hist = [np.asarray(s.f)]
        for _ in range(int(max_iter)):
            if not np.any(np.asarray(s.code) == RUNNING):
                break
            s = kernel.step(s)
            hist.append(np.asarray(s.f))
        k = len(todo)
        s_code, s_reason = np.asarray(s.code)[:k], np.asarray(s.reason)[:k]
        v[todo] = np.asarray(s.x)[:k]
        code[todo] = s_code
        reason[todo] = np.where(s_code == RUNNING, _MAX_ITER, s_reason)
        failed[todo] |= s_code == FAILED_START
        records[todo] += np.asarray(s.records)[:k]
        err[todo] = np.asarray(err_of(s.x, s.mesh))[:k]
        last = history[-1] if history else np.full(n, np.nan)
        for h in hist:
            last = last.copy()
            last[todo] = h[:k]
            history.append(last)
        n_steps += len(hist) - 1
        moved = policy.distance(np.asarray(s.x)[:k], np.asarray(s.x_rec)[:k])
        own = moved <= policy.settle_factor * policy.drift_tol
        settled[todo] = own
        again = ~failed[todo] & ((s_code == RUNNING) | ~own)
        todo = todo[again]
        if not len(todo):
            break

    u_all, losses, ok = res.finish(v)
    status = np.where(failed | ~ok, FAILED, 0).astype(np.int32)
    converged = (code == CONVERGED) & settled & (status == 0)
    reasons = np.where(status != 0, "not_finite", np.asarray(REASONS)[reason])
    return FitResult.of_starts(
        problem.space.from_unconstrained(u_all), losses,
        loss_history=np.stack(history) if history else losses[None].copy(),
        n_records=kernel.n_records + 1, n_records_per_start=records + 1,
        n_grad_evals=kernel.n_evals, wall_time=time.perf_counter() - t_start,
        status=status, objective="least_squares", n_steps=n_steps,
        max_error_ratio=np.where(np.isfinite(err), err, np.inf), converged=converged,
        method="lm", exit_reasons=reasons)
