"""`fit_least_squares`: Levenberg–Marquardt (Optimistix) on forward-mode Jacobians of the
replay, re-recording between LM solves until the mesh holds at the solution.

Each start is a `LeastSquaresState` advanced by `LeastSquaresKernel.step`: record a mesh
at the current point, run one LM solve on that fixed mesh, measure the solution's drift and
``error_ratio``; `MeshPolicy.settled` says when the solution ran on its own mesh.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jaxtyping import Array, Float

from ..problem._policy import MeshPolicy
from ..problem._problem import MAX_STEPS, TOLERANCES, Problem
from .._result import FAILED, FitResult
from ..problem._space import checked_init
from ..problem._starts import prior_draws

__all__ = ["fit_least_squares", "LeastSquaresState", "LeastSquaresKernel"]


class LeastSquaresState(NamedTuple):
    """One start of a least-squares fit between LM solves.

    Attributes:
        v: ``(P,)`` the unconstrained coordinates that move the predictions.
        base: ``(D,)`` the full unconstrained vector the others are taken from.
        solves: LM solves done; settled: the last one ran on its own mesh; failed: a
            record failed.
        max_error_ratio: largest replay ``error_ratio`` met (requested units).
        n_records, n_lm_steps: records made and LM steps (Jacobians) taken.
    """

    v: Float[Array, " P"]
    base: Float[Array, " D"]
    solves: int = 0
    settled: bool = False
    failed: bool = False
    max_error_ratio: float = 0.0
    n_records: int = 0
    n_lm_steps: int = 0


def _is_lognormal(model, params) -> bool:
    d = model.noise(params, jnp.ones((2, len(model.observed_names))))
    while isinstance(d, (dist.Independent, dist.ExpandedDistribution)):
        d = d.base_dist
    return isinstance(d, dist.LogNormal)


class LeastSquaresKernel:
    """LM solves of one problem: which coordinates move the predictions (a forward-mode
    Jacobian at the defaults), the residuals (``ys - y_pred``, or of their logs for
    LogNormal noise; missing observations give none), and `init`/`step`/`finish`."""

    def __init__(self, problem: Problem, policy: MeshPolicy, *, max_iter: int, lm_rtol: float,
                 lm_atol: float):
        import optimistix as optx

        self.problem, self.policy = problem, policy
        model, space = problem.model, problem.space
        defaults = {k: jnp.asarray(v) for k, v in model.defaults.items()}
        self.u_default = space.to_unconstrained(defaults)
        self.log_res = _is_lognormal(model, defaults)
        self.missing = jnp.isnan(problem.ys_obs)
        self.obs = jnp.log(problem.ys_obs) if self.log_res else problem.ys_obs
        jac = jax.jit(jax.jacfwd(lambda u: self.predict(u)[0]))(self.u_default)
        self.moves = np.asarray(jnp.any(jnp.abs(jnp.reshape(jac, (-1, space.dim))) > 0, axis=0))
        if not self.moves.any():
            raise ValueError("fit_least_squares: no parameter changes the predictions")
        self.dyn = jnp.asarray(np.nonzero(self.moves)[0])
        lm = optx.LevenbergMarquardt(rtol=lm_rtol, atol=lm_atol)

        def residuals(v, args):
            mesh, base = args
            r = self.residuals(self.predict(base.at[self.dyn].set(v), mesh)[0])
            return jnp.where(jnp.isfinite(r), r, 1e6)

        @eqx.filter_jit
        def solve(v, mesh, base):
            sol = optx.least_squares(residuals, lm, v, args=(mesh, base), max_steps=max_iter,
                                     throw=False)
            _, err = self.predict(base.at[self.dyn].set(sol.value), mesh)
            return sol.value, sol.stats["num_steps"], err

        self._solve = solve

    def predict(self, u, mesh=None):
        """Predicted observed states ``(k, m)`` at ``u (D,)`` (replay of ``mesh``, or an
        adaptive solve) and the replay's error ratio."""
        x = self.problem.space.from_unconstrained(u)
        sol = self.problem.states(x, mesh)
        return self.problem.observe(x, sol.ys), sol.error_ratio

    def residuals(self, y_pred) -> jax.Array:
        """``(k * m,)`` residuals, zero at missing observations."""
        yt = jnp.log(y_pred) if self.log_res else y_pred
        return jnp.reshape(jnp.where(self.missing, 0.0, self.obs - yt), (-1,))

    def full(self, s: LeastSquaresState) -> jax.Array:
        return s.base.at[self.dyn].set(s.v)

    def init(self, u: jax.Array) -> LeastSquaresState:
        """A start at ``u (D,)``; the coordinates that move nothing are held at the
        defaults."""
        base = jnp.where(jnp.asarray(self.moves), u, self.u_default)
        return LeastSquaresState(v=u[self.dyn], base=base)

    def step(self, s: LeastSquaresState) -> LeastSquaresState:
        """Record at the current point, one LM solve on that mesh, the policy's verdict."""
        u_rec = self.full(s)
        mesh = self.problem.record(u_rec, self.policy.record_tol_factor)
        s = s._replace(n_records=s.n_records + 1)
        if int(mesh.status) != 0:
            return s._replace(failed=True)
        v, n_steps, err = self._solve(s.v, mesh, s.base)
        err = float(self.policy.error_ratio(err))
        s = s._replace(v=v, solves=s.solves + 1, n_lm_steps=s.n_lm_steps + int(n_steps),
                       max_error_ratio=max(s.max_error_ratio, err if np.isfinite(err) else 0.0))
        flat = self.problem.space.flat_constrained
        drift = float(self.policy.drift(np.asarray(flat(self.full(s))), np.asarray(flat(u_rec))))
        return s._replace(settled=self.policy.settled(drift, err))

    def finish(self, s: LeastSquaresState) -> tuple[jax.Array, float, int, int]:
        """``(u, loss, status, records)``: half the residual sum of squares on a fresh
        record at the solution; a scalar or per-state ``sigma`` that moves no prediction
        is set to the residuals' RMS."""
        u = self.full(s)
        mesh = self.problem.record(u, self.policy.record_tol_factor)
        if int(mesh.status) != 0:
            return u, np.inf, FAILED, 1
        r = np.asarray(self.residuals(self.predict(u, mesh)[0])).reshape(self.obs.shape)
        loss = 0.5 * float(np.sum(r**2))
        if not np.isfinite(loss):
            return u, np.inf, FAILED, 1
        return self._sigma_from_residuals(u, r), loss, 0, 1

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
    """Least-squares fit with Levenberg–Marquardt (Optimistix) on the replayed mesh.

    Residuals are ``ys - y_pred`` (``log ys - log y_pred`` when the model's noise is
    LogNormal), unweighted. Only the parameters that change the predictions are fitted (the
    others, e.g. ``sigma``, are found by a forward-mode Jacobian at the start and held);
    afterwards a ``sigma`` parameter of shape ``()`` or ``(m,)`` is set to the residuals'
    RMS (per observed state). The Jacobians are forward mode (``jax.jacfwd`` through
    ``gs.replay``); each LM solve runs on a fixed mesh, which is re-recorded at the LM
    solution until that solution's drift and ``error_ratio`` are within bounds.

    Args:
        model, data: as `fit`.
        init: ``None`` (prior draws; the first start is ``model.defaults`` when
            ``n_starts == 1``) or a parameter dict (the first start).
        n_starts: starts, solved one after another with the same compiled solver.
        seed: seeds the prior draws of the starts.
        max_iter: LM steps per mesh; max_rerecords: LM solves per start.
        lm_rtol, lm_atol: Optimistix LM tolerances.
        drift_tol, error_ratio_max, rtol, atol, solver, max_steps, record_tol_factor: as
            `fit`.

    Returns:
        `FitResult` with ``objective="least_squares"`` and ``losses`` half the
        residual sum of squares; ``n_grad_evals`` counts LM steps (Jacobians).

    Example:
        >>> res = inference.fit_least_squares(models.lynx_hare(),
        ...                                   models.load_dataset("lynx_hare"))
        >>> res.params["theta"], res.losses      # (4,), (1,)
    """
    t_start = time.perf_counter()
    policy = MeshPolicy.checked("fit", "auto", drift_tol=drift_tol,
                                error_ratio_max=error_ratio_max,
                                record_tol_factor=record_tol_factor)
    problem = Problem(model, data, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)
    kernel = LeastSquaresKernel(problem, policy, max_iter=max_iter, lm_rtol=lm_rtol,
                                lm_atol=lm_atol)
    starts = prior_draws(model, problem.space, jax.random.PRNGKey(seed), max(n_starts, 1))
    if init is not None:
        u0, n_init = checked_init(model, problem.space, init)
        if n_init is not None:
            raise ValueError("`init` of fit_least_squares is one parameter dict (no ensemble "
                             "axis); use `n_starts` for more starts")
        starts[0] = u0
    elif n_starts == 1:
        starts = np.asarray(kernel.u_default)[None]
    out = []
    for u in starts:
        s = kernel.init(jnp.asarray(u))
        while not (s.settled or s.failed) and s.solves < max_rerecords:
            s = kernel.step(s)
        out.append((s, *kernel.finish(s)))
    u_all = jnp.stack([u for _, u, _, _, _ in out])
    losses = np.asarray([loss for _, _, loss, _, _ in out], float)
    x_all = problem.space.from_unconstrained(u_all)
    n_lm = sum(s.n_lm_steps for s, *_ in out)
    return FitResult.of_starts(
        x_all, losses, loss_history=losses[None].copy(),
        n_records=sum(s.n_records + r for s, *_, r in out),
        n_records_per_start=np.asarray([s.n_records + r for s, *_, r in out], np.int64),
        n_grad_evals=n_lm, wall_time=time.perf_counter() - t_start,
        status=np.asarray([st for *_, st, _ in out], np.int32), objective="least_squares",
        n_steps=n_lm, max_error_ratio=np.asarray([s.max_error_ratio for s, *_ in out]))
