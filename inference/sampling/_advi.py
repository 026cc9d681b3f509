"""Where a random-effects hierarchy's chains start: the typical set, by mean-field ADVI.

The joint mode of a hierarchical posterior is far from where its draws lie. In a
non-centred hierarchy (``eta_i ~ Normal(0, 1)``, individual parameters ``theta + omega
eta_i``) the data fix each product ``omega eta_i``, and the prior on the ``eta`` pulls the
mode to small ``eta`` and a large ``omega``: on the simulated 200-subject study (true
random-effect sds 0.3, 0.25, 0.2) the MAP start had ``omega`` = (2.4, 1.0, 1.8) and the
``eta`` an sd of 0.3, where 600 standard-normal draws have a sum of squares near 600, not
54. Chains started there spend warmup's first iterations travelling to the typical set at
step sizes of 0.01 in trees of up to 1,023 leapfrog steps (311 s of the 200-subject run's
first 30 iterations), and the curvature there is the wrong initial metric (it describes the
mode, not the draws). The same pull is behind the neck of a centred funnel.

A mean-field Gaussian fitted by maximising the evidence lower bound (ADVI; Kucukelbir,
Tran, Ranganath, Gelman and Blei 2017, "Automatic differentiation variational inference",
JMLR 18) counts the entropy of the random effects, so its mean sits among the draws
(there: ``omega`` = (0.11, 0.24, 0.18)), and its variances are a usable diagonal metric. The
fit starts at the MAP point with a tenth of the curvature's sds, takes a fixed number of
Adam steps on a Monte Carlo estimate of the bound (a few draws a step, the reparameterisation
gradient), averages the last quarter's iterates, and the chains start at independent draws
from it. Stan offers the same idea for its initial values as Pathfinder (Zhang, Carpenter, Gelman and Vehtari 2022, JMLR 23).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..problem._abstract import AbstractProblem

__all__ = ["advi_start", "ADVI_STEPS", "ADVI_DRAWS"]

ADVI_STEPS = 400
"""Adam steps of the fit (the 200-subject study, from the MAP point: the negative bound from
2,133 to 791, its mean's random-effect sds within one posterior sd of the posterior means;
about 30 s on a 2-core CPU, its compilation included)."""

ADVI_DRAWS = 8
"""Monte Carlo draws of the bound's gradient at each step."""

_LEARNING_RATE = 0.02
_SD_SCALE = 0.1   # the fit starts this many times the curvature's sds wide
_MAX_VAR = 1.0    # nor wider than this in any direction


def _fitted(problem: AbstractProblem, steps: int, draws: int, max_steps: int | None):
    """A compiled ``(mean (D,), log sd (D,)), key -> (mean, log sd, negative bounds
    (steps,), the fewest finite draws of a step)``."""
    opt = optax.adam(_LEARNING_RATE)

    def negative_bound(params, key):
        mean, log_sd = params
        eps = jax.random.normal(key, (draws,) + mean.shape, mean.dtype)
        lp = jax.vmap(lambda u: problem.log_density(u, None, max_steps=max_steps)[0])(
            mean + jnp.exp(log_sd) * eps)
        # a draw whose solve fails (-inf) is left out of the estimate, not propagated
        ok = jnp.isfinite(lp)
        lp = jnp.where(ok, lp, 0.0)
        return -(jnp.sum(lp) / jnp.maximum(ok.sum(), 1) + jnp.sum(log_sd)), ok.sum()

    tail = max(1, steps // 4)

    def run(params, key):
        def step(carry, xs):
            p, st, avg = carry
            i, k = xs
            (value, n_ok), g = jax.value_and_grad(negative_bound, has_aux=True)(p, k)
            upd, st = opt.update(g, st, p)
            p = optax.apply_updates(p, upd)
            # the last quarter's iterates averaged (Polyak and Juditsky 1992): a constant
            # step on a noisy gradient leaves the last iterate a few steps' noise away
            w = jnp.where(i >= steps - tail, 1.0 / tail, 0.0)
            avg = jax.tree_util.tree_map(lambda a, q: a + w * q, avg, p)
            return (p, st, avg), (value, n_ok)

        zero = jax.tree_util.tree_map(jnp.zeros_like, params)
        (_, _, p), (values, n_ok) = jax.lax.scan(
            step, (params, opt.init(params), zero),
            (jnp.arange(steps), jax.random.split(key, steps)))
        return p, values, jnp.min(n_ok)

    return jax.jit(run)


def advi_start(problem: AbstractProblem, centre: np.ndarray, variance: np.ndarray, key,
               num_chains: int, *, max_steps: int | None = None, steps: int = ADVI_STEPS,
               draws: int = ADVI_DRAWS) -> tuple[np.ndarray, np.ndarray, dict]:
    """Mean-field ADVI from ``centre (D,)`` (unconstrained; the MAP point), its initial
    variances a hundredth of ``variance (D,)`` (the curvature's), then ``num_chains``
    independent draws from the fit.

    Returns ``(starts (num_chains, D), the fit's variances (D,), a summary)``; where the
    fit fails (a non-finite mean or every draw of a step failing) the starts are the
    centre's and the summary says so (``ok`` 0)."""
    f = jnp.result_type(float)
    centre = np.asarray(centre, dtype=np.float64)
    var0 = np.clip(np.asarray(variance, dtype=np.float64) * _SD_SCALE**2, 1e-12, _MAX_VAR)
    k_fit, k_draw = jax.random.split(key)
    t = time.perf_counter()
    (mean, log_sd), values, n_ok = _fitted(problem, int(steps), int(draws), max_steps)(
        (jnp.asarray(centre, f), jnp.asarray(0.5 * np.log(var0), f)), k_fit)
    mean, var = np.asarray(mean, np.float64), np.exp(2.0 * np.asarray(log_sd, np.float64))
    values = np.asarray(values)
    tail = values[-max(1, steps // 8):]
    info = dict(steps=int(steps), draws=int(draws), wall_time_s=time.perf_counter() - t,
                negative_elbo=float(np.mean(tail[np.isfinite(tail)])) if np.isfinite(
                    tail).any() else float("nan"), fewest_finite_draws=int(n_ok))
    info["ok"] = int(np.all(np.isfinite(mean)) and np.all(np.isfinite(var))
                     and int(n_ok) > 0)
    if not info["ok"]:
        return np.repeat(centre[None], num_chains, 0), np.asarray(variance), info
    eps = np.asarray(jax.random.normal(k_draw, (num_chains, centre.shape[0]), f))
    return mean + np.sqrt(var) * eps, var, info
