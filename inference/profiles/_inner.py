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
  gradient and curvature and the LM never moves it (nor ``j``).
- `host_runner` otherwise (an ODE model's or a program's likelihood with its noise
  parameters, a population's integrated likelihood): SciPy's L-BFGS-B per row over the
  free coordinates (inside the bounds), on `AbstractProblem.value_and_grad` (exact
  gradients of adaptive solves).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import minimize

from ..optimize._lm import CONVERGED, FAILED_START, LM_POLICY, RUNNING, LMKernel, MeshTerms

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
                      gtol=1e-6, policy=LM_POLICY, profiled=terms.profiled)

    def run(points, which):
        xe = np.concatenate([points, np.asarray(which, float)[:, None]], axis=1)
        s, _ = kernel.run(xe, int(max_iter))
        return (np.asarray(s.f) + terms.constant, np.asarray(s.x)[:, :d],
                np.asarray(s.code))

    return run, kernel


def host_runner(problem, prior: bool, max_iter: int, *, gtol: float = 1e-6):
    """L-BFGS-B per row on ``problem.value_and_grad``: ``(run, counts)``."""
    d = len(problem.names())
    lo, hi = problem.bounds()
    counts = _Counts()

    def one(x0, j):
        free = np.arange(d) != j
        x0 = np.clip(np.asarray(x0, float), lo, hi)

        def fg(v):
            x = x0.copy()
            x[free] = v
            counts.n_evals += 1
            f, g = problem.value_and_grad(x, prior=prior)
            # a failed solve: a large value (not inf) turns L-BFGS-B's line search back
            return (f, g[free]) if np.isfinite(f) else (1e300, np.zeros(int(free.sum())))

        f0 = fg(x0[free])[0]
        if not f0 < 1e300:
            return np.inf, x0, FAILED_START
        if not free.any():
            return f0, x0, CONVERGED
        res = minimize(fg, x0[free], jac=True, method="L-BFGS-B",
                       bounds=list(zip(lo[free], hi[free])),
                       options=dict(maxiter=int(max_iter), gtol=gtol, ftol=1e-13,
                                    maxcor=20))
        x = x0.copy()
        x[free] = res.x
        f = float(res.fun) if res.fun < 1e300 else np.inf
        if f > f0:  # never worse than the start (a lost line search)
            f, x = f0, x0
        ok = res.success or np.max(np.abs(np.asarray(res.jac))) <= 1e3 * gtol
        return f, x, CONVERGED if ok else RUNNING

    def run(points, which):
        # rows repeated to keep a batch's size are computed once here
        memo = {}
        out = []
        for p, j in zip(np.asarray(points, float), which):
            key = (p.tobytes(), int(j))
            if key not in memo:
                memo[key] = one(p, int(j))
            out.append(memo[key])
        return (np.array([o[0] for o in out]), np.stack([o[1] for o in out]),
                np.array([o[2] for o in out]))

    return run, counts
