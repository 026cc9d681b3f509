"""The inner re-optimisation of a profile: the other coordinates of many rows minimised at
once, each row holding one coordinate fixed.

A runner is ``run(points (n, D), held (n,)) -> (objective (n,), points (n, D), codes (n,))``:
row ``r`` starts at ``points[r]`` and keeps coordinate ``held[r]`` where it is (``D``:
none, a plain re-optimisation); codes are `CONVERGED`, `FAILED_START` (not finite at the
start) or anything else (stopped without converging).

- `lm_runner`, where the problem's objective has the Levenberg–Marquardt's form
  (`AbstractProblem.residual_terms`): one batched bounded LM over every row, on kept
  meshes (`LM_POLICY`), compiled once for every profiled coordinate. A row is ``(u (D,),
  j)``; the terms see ``u`` with ``u_j`` behind ``stop_gradient``, so ``u_j`` has zero
  gradient and curvature and the LM never moves it; ``j`` is a data column, in which no
  derivative is taken (``D`` tangents a row, not ``D + 1``). The batch stays whole as
  rows converge (`LMKernel.run`'s ``shrink=False``): one compiled evaluation for the
  whole profile.
- `host_runner` otherwise (an ODE model's or a program's likelihood with its noise
  parameters, a population's integrated likelihood): `inference.optimize.LBFGSB`
  (SciPy's L-BFGS-B, row by row) with the held coordinate masked, on
  `AbstractProblem.value_and_grad` (exact gradients of adaptive solves).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..optimize._lm import CONVERGED, FAILED_START, LM_POLICY, RUNNING, LMKernel, MeshTerms
from ..optimize._scipy import LBFGSB

__all__ = ["lm_runner", "host_runner"]


class _Counts:
    n_evals = 0
    n_records = 0


def lm_runner(problem, terms, max_iter: int, *, ftol: float = 1e-8):
    """The batched LM over rows ``(u, j)`` of ``problem`` whose objective is ``terms``
    (`ResidualTerms`): ``(run, counts)``, ``counts.n_evals`` / ``n_records`` the LM's."""
    d = len(problem.names())
    lo, hi = problem.bounds()

    def held(xe):
        x, j = xe[:d], jax.lax.stop_gradient(xe[d])
        fixed = jnp.arange(d) == jnp.round(j).astype(jnp.int32)
        return jnp.where(fixed, jax.lax.stop_gradient(x), x)

    def record(xe):
        return terms.record(held(xe), LM_POLICY.record_tol_factor)

    def terms_on(xe, mesh):
        z, s, err = terms.terms(held(xe), mesh)
        return z, s, LM_POLICY.error_ratio(err)

    pen = None if terms.penalty is None else (lambda xe: terms.penalty(held(xe)))
    kernel = LMKernel(None, terms.laplace, pen, lower=np.append(lo, 0.0),
                      upper=np.append(hi, d),
                      mesh_terms=MeshTerms(record, terms_on, terms.cost), ftol=ftol,
                      gtol=1e-6, policy=LM_POLICY, profiled=terms.profiled,
                      data_columns=1)

    def run(points, which):
        xe = np.concatenate([points, np.asarray(which, float)[:, None]], axis=1)
        s, _ = kernel.run(xe, int(max_iter), shrink=False)
        return (np.asarray(s.f) + terms.constant, np.asarray(s.x)[:, :d],
                np.asarray(s.code))

    return run, kernel


def host_runner(problem, prior: bool, max_iter: int, *, gtol: float = 1e-6):
    """`inference.optimize.LBFGSB` on ``problem.value_and_grad`` (exact gradients of
    adaptive solves), the held coordinate masked: ``(run, counts)``. Rows holding the
    same coordinate are one call; a row repeated to keep a batch's size is computed
    once."""
    lo, hi = problem.bounds()
    counts = _Counts()
    optimizer = LBFGSB(int(max_iter), gtol=gtol)
    d = len(problem.names())

    def run(points, which):
        points = np.clip(np.asarray(points, float), lo, hi)
        which = np.asarray(which, int)
        keys = [(p.tobytes(), int(j)) for p, j in zip(points, which)]
        first = {k: r for r, k in reversed(list(enumerate(keys)))}
        f = np.full(len(points), np.inf)
        x = points.copy()
        code = np.full(len(points), RUNNING)
        for j in sorted(set(which.tolist())):
            rows = sorted({first[k] for k in keys if k[1] == j})
            mask = None if j >= d else np.arange(d) == j
            res = optimizer.minimize(problem, points[rows], mask=mask, prior=prior,
                                     progress=False)
            counts.n_evals += int(res.n_evals)
            f[rows] = res.value
            x[rows] = res.x
            code[rows] = np.where(np.asarray(res.reason) == "not_finite", FAILED_START,
                                  np.where(res.converged, CONVERGED, RUNNING))
        src = np.array([first[k] for k in keys])
        return f[src], x[src], code[src]

    return run, counts
