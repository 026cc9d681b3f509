"""The sampler's initial metric: the inverse of the potential's curvature at the start.

NumPyro's NUTS starts warmup from the identity metric and first replaces it after its
initial fast window and first slow window (75 + 25 iterations of the default schedule).
On an ODE posterior whose directions differ in scale by orders of magnitude (a rate
constant's posterior sd of 0.02 beside a random effect's 1), those iterations run at the
step size the narrowest direction allows, in trees of hundreds of leapfrog steps: on
theophylline (30 parameters) the first 150 warmup iterations cost 32 of its 45 s of
warmup. Started from a MAP point, the inverse Hessian of the potential there is the
Laplace approximation's covariance, the metric the adaptation is looking for (Stan's
warmup guide; Betancourt 2017, "A conceptual introduction to Hamiltonian Monte Carlo",
section 4.2). It is computed from central differences of gradients on one mesh recorded
at the start (the replay is a smooth function of the parameters, where gradients of
adaptive solves at neighbouring points would differ by the solver's tolerance), and
regularised where the curvature is not positive. The adaptation still replaces it after
its first slow window; it only makes the iterations before that cheap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._transfer import to_device
from ..problem._abstract import AbstractProblem

__all__ = ["curvature_metric", "prior_variance", "MAX_METRIC_DIM"]

MAX_METRIC_DIM = 2000
"""Above this many unconstrained parameters the curvature is not computed (``2 D``
gradients and a ``D x D`` eigendecomposition) and NumPyro's identity start is kept."""

_STEP = 1e-4      # central-difference step in unconstrained space
_BLOCK = 64       # points per compiled gradient call
_MAX_VAR = 1e2    # no direction gets a larger initial variance than this
_MIN_VAR = 1e-10


def _hessian(problem: AbstractProblem, centre: np.ndarray, mesh) -> np.ndarray:
    """``(D, D)`` central differences of the potential's gradient at ``centre (D,)``,
    every point replaying ``mesh`` (recorded at the centre), symmetrised."""
    D = centre.shape[0]
    grad = jax.jit(jax.vmap(jax.grad(lambda u: -problem.log_density(u, mesh)[0])))
    eye = np.eye(D) * _STEP
    points = np.concatenate([centre + eye, centre - eye])
    out = []
    for i in range(0, 2 * D, _BLOCK):
        part = points[i:i + _BLOCK]
        pad = _BLOCK - part.shape[0]
        if pad:
            part = np.concatenate([part, np.repeat(part[-1:], pad, axis=0)])
        out.append(np.asarray(grad(to_device(part)))[: _BLOCK - pad])
    g = np.concatenate(out)
    H = (g[:D] - g[D:]).T / (2 * _STEP)
    return 0.5 * (H + H.T)


def curvature_metric(problem: AbstractProblem, centre: np.ndarray, *, dense: bool
                     ) -> tuple[np.ndarray | None, str]:
    """The initial inverse mass matrix at ``centre (D,)`` (unconstrained): the inverse of
    the potential's Hessian there, ``(D, D)`` if ``dense`` else its diagonal ``(D,)`` (the
    marginal variances, what NumPyro's diagonal adaptation estimates). Directions of
    non-positive or non-finite curvature get variance 1 (NumPyro's identity start);
    variances are kept within ``[1e-10, 100]``. Returns ``(metric, what was done)``, or
    ``(None, why not)`` where the record at ``centre`` fails or ``D > MAX_METRIC_DIM``."""
    centre = np.asarray(centre, dtype=np.float64)
    D = centre.shape[0]
    if D > MAX_METRIC_DIM:
        return None, f"identity (more than {MAX_METRIC_DIM} parameters)"
    mesh = problem.record(centre)
    if not bool(np.all(np.asarray(mesh.ok))):
        return None, "identity (the solve fails at the starting point)"
    H = _hessian(problem, centre, mesh)
    if not np.all(np.isfinite(H)):
        return None, "identity (non-finite curvature at the starting point)"
    lam, V = np.linalg.eigh(H)
    good = lam > 0
    var = np.clip(np.where(good, 1.0 / np.where(good, lam, 1.0), 1.0), _MIN_VAR, _MAX_VAR)
    cov = (V * var) @ V.T
    cov, capped = _capped_at_prior(problem, cov)
    metric = cov if dense else np.diag(cov).copy()
    what = (f"inverse Hessian of the potential at the start "
            f"({'dense' if dense else 'its diagonal'}; central differences of gradients)")
    if not good.all():
        what += f", {int((~good).sum())} of {D} directions without positive curvature at 1"
    if capped:
        what += (f", {capped} of {D} parameters' variances capped at their prior's "
                 "(flat there)")
    return metric, what


PRIOR_DRAWS = 1024
"""Prior draws that estimate the prior's variance in unconstrained space (no solve)."""


def prior_variance(problem: AbstractProblem) -> np.ndarray | None:
    """``(D,)`` the prior's marginal variances in unconstrained space, from `PRIOR_DRAWS`
    draws of the model's priors; ``None`` where the problem has no priors to draw from
    (or they give no finite variance)."""
    from ..problem._starts import prior_draws

    model, space = getattr(problem, "model", None), getattr(problem, "space", None)
    if model is None or space is None or not hasattr(model, "sample_prior"):
        return None
    try:
        u = prior_draws(model, space, jax.random.PRNGKey(0), PRIOR_DRAWS)
    except Exception:  # an improper or undrawable prior: nothing to cap with
        return None
    var = np.var(u, axis=0)
    return var if var.shape == (space.dim,) and np.all(np.isfinite(var)) else None


def _capped_at_prior(problem: AbstractProblem, cov: np.ndarray) -> tuple[np.ndarray, int]:
    """``cov (D, D)`` with each parameter's marginal variance at most its prior's
    (`prior_variance`; a row and column scaled together, which keeps it positive
    definite), and how many were capped.

    Where the data leave a parameter flat up to a bound (PEtab's uniform priors inside
    bounds: a logistic of variance ``pi^2 / 3`` in unconstrained space), the curvature
    there is nearly zero and the inverse Hessian's variance is the clip, 100: ten
    times the posterior's sd, which the step size must then resolve. Measured on Boehm
    (two such parameters): NUTS's first warmup windows took trees of ~200 leapfrog steps
    at step sizes 0.016-0.03 on the uncapped metric; ChEES's first window (16 chains)
    settled at a step size of 0.021 and 29.9 leapfrog steps a chain-iteration uncapped,
    0.21 and 10.1 capped. The posterior is no wider than its prior in a parameter the
    likelihood leaves flat."""
    pv = prior_variance(problem)
    if pv is None:
        return cov, 0
    d = np.diag(cov)
    scale = np.sqrt(np.minimum(1.0, pv / d))
    capped = int(np.sum(scale < 1.0))
    return cov * scale[:, None] * scale[None, :], capped

