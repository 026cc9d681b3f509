"""`log_density` and `numpyro_model`: the log posterior of a model given data, and its
NumPyro program.

Both solve with ``gs.solve`` (record + replay in one call): values and gradients are those
of the adaptive solution, as Diffrax's default adjoint gives. Both are jittable and
differentiable, and both evaluate the package's one log-posterior path
(`inference.problem._problem.Problem.log_posterior`; the NumPyro program observes the same
`Problem.predictions` through the model's noise distribution). A solver failure (max_steps
reached, non-finite state, step underflow), a non-finite likelihood or a parameter outside
its prior's support gives ``-inf`` with a zero (not NaN) gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

from ._ode import ode
from ._problem import MAX_STEPS, TOLERANCES, Problem, check_data_names

__all__ = ["log_density", "numpyro_model"]


# ----------------------------------------------------------------------------- public


def log_density(
    model,
    data,
    params: Mapping[str, Any],
    *,
    solver=None,
    rtol: float = TOLERANCES.rtol,
    atol: float = TOLERANCES.atol,
    max_steps: int = MAX_STEPS,
) -> jax.Array:
    """Unnormalised log posterior ``log p(params) + log p(data | params)``.

    Args:
        model: a `models.ODEModel`.
        data: a `models.Dataset` (``ts (k,)``, ``ys (k, m)``).
        params: a constrained parameter dict (the keys of ``model.priors``); with every leaf
            carrying a leading axis ``n`` it is an ensemble and the result has shape ``(n,)``.
        solver, rtol, atol, max_steps: how the ODE is solved (``gs.solve``; default solver
            the model's, ``gs.Tsit5()`` or ``gs.Rodas5P()``).

    Returns:
        A scalar (or ``(n,)``). ``-inf`` where a parameter lies outside its prior's
        support, where the solve fails or where the likelihood is not finite. Jittable and differentiable (the gradient is the discrete adjoint of the
        adaptive solve's accepted steps, as Diffrax's default).

    Example:
        >>> lp = jax.jit(lambda p: inference.log_density(model, data, p))(model.defaults)
    """
    prob = Problem(model, data, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)
    model.check_params(params)
    x = {k: jnp.asarray(params[k]) for k in model.priors}
    # Outside the priors' support the density is -inf; the solve and the noise model run at
    # the defaults there, so no NaN (nor NumPyro's argument check) escapes.
    bad = functools.reduce(jnp.logical_or, prob.space.outside(x).values())
    safe = {k: jnp.where(jnp.reshape(bad, bad.shape + (1,) * (v.ndim - bad.ndim)),
                         jnp.asarray(model.defaults[k], v.dtype), v) for k, v in x.items()}
    lp = prob.log_posterior(safe, prob.solve(safe).ys)
    return jnp.where(bad, -jnp.inf, lp)


def numpyro_model(
    model,
    data=None,
    *,
    solver=None,
    rtol: float = TOLERANCES.rtol,
    atol: float = TOLERANCES.atol,
    max_steps: int = MAX_STEPS,
):
    """The NumPyro program of ``model`` given ``data``, solving the ODE with gradsolve.

    Returns a function ``program(ts=data.ts, ys=data.ys)`` that samples each parameter from
    its prior (``numpyro.sample(name, prior)``), solves at an `inference.ode` site named
    ``"ode"`` and observes
    ``numpyro.sample("obs", model.observations(params, y_pred), obs=ys)`` (the model's
    ``noise``, skipping missing observations: NaN in ``ys``). Pass ``ys=None`` for
    predictive simulation. A failed solve adds ``numpyro.factor("solver_failure", -inf)``.
    ``numpyro.infer.util.log_density`` of it equals `log_density`.

    Under plain NumPyro the site is ``gs.solve``; passed to `inference.sample` or
    `inference.fit` with a data set (``inference.sample(numpyro_model(model), data)``: the
    program is then called as ``program(data)``) its mesh is recorded and reused like any
    program's, so a NumPyro user can extend the model's program and keep the fast gradient.

    Args:
        model: a `models.ODEModel`.
        data: a `models.Dataset` (``ts (k,)``, ``ys (k, m)``) giving the program's
            default ``ts`` and ``ys``; ``None``: pass ``ts`` (and ``ys``) when calling it.
        solver, rtol, atol, max_steps: how the ODE is solved (``gs.solve``; default solver
            the model's).

    Returns:
        The NumPyro program ``program(ts=..., ys=...)``; its ``"obs"`` site has shape
        ``(k, m)``.

    Example:
        >>> mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(inference.numpyro_model(m, data)),
        ...                           num_warmup=500, num_samples=500)
    """
    if data is not None:
        check_data_names(model, data)
    default_ts = None if data is None else np.asarray(data.ts, dtype=float)
    default_ys = None if data is None else jnp.asarray(data.ys)

    def program(ts=default_ts, ys=default_ys):
        if hasattr(ts, "ts") and hasattr(ts, "ys"):  # program(data), as sample and fit call it
            check_data_names(model, ts)
            ts, ys = ts.ts, ts.ys
        if ts is None:
            raise ValueError("numpyro_model: pass `ts` (no data given)")
        ts = np.asarray(ts, dtype=float)
        obs = np.full((ts.shape[0], len(model.observed_names)), np.nan) if ys is None else ys
        prob = Problem(model, _Data(ts, obs), solver=solver, rtol=rtol, atol=atol,
                       max_steps=max_steps)
        params = {k: numpyro.sample(k, d) for k, d in model.priors.items()}
        sol = ode("ode", *prob._args(params), ts=prob.ts, solver=prob.solver, rtol=rtol,
                  atol=atol, max_steps=max_steps)
        y_pred, ok = prob.predictions(params, sol.ys)
        numpyro.deterministic("y_pred", y_pred)
        numpyro.factor("solver_failure", jnp.where(ok, 0.0, -jnp.inf))
        numpyro.sample("obs", model.observations(params, y_pred), obs=ys)

    program.__doc__ = f"NumPyro program of model {model.name!r} (gradsolve ODE solve)."
    return program


class _Data(NamedTuple):
    """Observation times and values handed to the NumPyro program at call time."""

    ts: np.ndarray
    ys: Any
