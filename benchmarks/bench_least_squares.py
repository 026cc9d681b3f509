"""fit_least_squares before and after its fold onto the batched Levenberg–Marquardt.

"before": a copy of the Optimistix implementation `inference.fit_least_squares` had until
it was folded onto `inference.optimize._lm.LMKernel` (kept here only, as the reference side):
one start at a time, one Optimistix LM solve per fixed mesh, re-recorded at each solution
until the solution has settled on its own mesh.
"after": `inference.fit_least_squares` (all starts at once in the batched LM, per-start
kept meshes re-recorded on drift).

Both sides fit `models.lynx_hare()` to `models.load_dataset("lynx_hare")` (log residuals)
from the same starts (the defaults for one start; prior draws with ``seed`` for more), in
one process, each call timed whole (its compilation included; one untimed call of each
side runs first, so that the process's first-use costs fall on neither). Printed per side and
``n_starts``: wall time, best loss, the starts within 1e-6 (relative) of the best loss
found by either side, converged starts (before: the settle rule held and no record
failed; after: LMKernel's ftol/gtol test met on the start's own mesh), (ensemble) records
and evaluations (before: LM steps, one start each; after: batched LM evaluations).

JAX's persistent compilation cache is off by default here, so every call compiles its
programs (each call builds new closures: nothing is reused across calls but JAX's own
small eager programs), as a fresh process would. ``--cache`` puts it in a new temporary
folder instead (both sides then reuse what an earlier call compiled: ``--repeat 2`` shows
the warm calls).

    python benchmarks/bench_least_squares.py                 # n_starts 1 and 16
    python benchmarks/bench_least_squares.py --n-starts 1 16 --cache --repeat 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jaxtyping import Array, Float  # noqa: E402

import gradsolve as gs  # noqa: E402
import inference  # noqa: E402
import models  # noqa: E402
from inference._result import FAILED, FitResult  # noqa: E402
from inference.problem._policy import MeshPolicy  # noqa: E402
from inference.problem._problem import MAX_STEPS, TOLERANCES, Problem  # noqa: E402
from inference.problem._space import checked_init  # noqa: E402
from inference.problem._starts import prior_draws  # noqa: E402
from inference.optimize._least_squares import LeastSquaresResiduals  # noqa: E402


# ------------------------------------------------------------------ before (Optimistix)
def _is_lognormal(model, params) -> bool:
    d = model.noise(params, jnp.ones((2, len(model.observed_names))))
    while isinstance(d, (dist.Independent, dist.ExpandedDistribution)):
        d = d.base_dist
    return isinstance(d, dist.LogNormal)


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

    # unchanged by the fold: the same rule (a sigma that moves no prediction set to the
    # residuals' RMS) on the same attributes
    _sigma_from_residuals = LeastSquaresResiduals._sigma_from_residuals


def fit_least_squares_optimistix(
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
        n_steps=n_lm, max_error_ratio=np.asarray([s.max_error_ratio for s, *_ in out]),
        # (benchmark only: the settle rule held and nothing failed, for the comparison)
        converged=np.asarray([s.settled and st == 0 for s, _, _, st, _ in out]))


# --------------------------------------------------------------------------- comparison
def run(side: str, model, data, n: int, seed: int):
    fn = fit_least_squares_optimistix if side == "before" else inference.fit_least_squares
    t = time.perf_counter()
    res = fn(model, data, n_starts=n, seed=seed)
    wall = time.perf_counter() - t
    return res, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-starts", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="calls per side and n_starts")
    ap.add_argument("--cache", action="store_true",
                    help="a persistent compilation cache in a new temporary folder")
    args = ap.parse_args()
    if args.cache:
        gs.use_compilation_cache(True, tempfile.mkdtemp(prefix="bench_least_squares_xla_"))
    else:
        gs.use_compilation_cache(False)
    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; lynx-hare, "
          f"seed {args.seed}; times include compilation; persistent cache "
          f"{'on (new folder)' if args.cache else 'off'}")
    print(f"{'side':7s} {'n':>3s} {'call':>4s} {'wall s':>8s} {'best loss':>14s} "
          f"{'at best':>7s} {'converged':>9s} {'records':>7s} {'evals':>6s}")
    # untimed: one call of each side first, so that neither pays the process's first-use
    # costs (backend start, JAX's small eager programs) in the table
    for side in ("before", "after"):
        run(side, model, data, 1, args.seed)
    for n in args.n_starts:
        rows = []
        for rep in range(args.repeat):
            for side in ("before", "after"):
                res, wall = run(side, model, data, n, args.seed)
                rows.append((side, rep, res, wall))
        best = min(r.loss for _, _, r, _ in rows)
        for side, rep, res, wall in rows:
            at_best = int(np.sum(np.abs(res.losses - best) <= 1e-6 * abs(best)))
            conv = res.converged
            print(f"{side:7s} {n:3d} {rep:4d} {wall:8.2f} {res.loss:14.9f} "
                  f"{at_best:4d}/{n:<2d} {int(np.sum(conv)):6d}/{n:<2d} "
                  f"{res.n_records:7d} {res.n_grad_evals:6d}")


if __name__ == "__main__":
    main()
