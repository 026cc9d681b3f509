"""Starting points of fits and chains, as flat unconstrained vectors ``u (n, D)``.

A user's ``init`` is validated and flattened here, once (`checked_init`); prior draws are
flattened the same way, so every driver starts from the same kind of array.
"""

from __future__ import annotations

import jax
import numpy as np

from ._space import ParamSpace, checked_init

__all__ = ["prior_draws", "fit_starts", "jittered"]


def prior_draws(model, space: ParamSpace, key, n: int) -> np.ndarray:
    """``(n, D)`` unconstrained draws from the model's priors."""
    return np.array(space.to_unconstrained(model.sample_prior(key, n)), dtype=float)


def fit_starts(model, space: ParamSpace, init, n_starts: int, key) -> np.ndarray:
    """The starts ``(n, D)`` of `inference.fit`: prior draws (``init=None``); a given point
    first and prior draws after it; or a given ensemble of ``n_starts`` (or any size with
    ``n_starts=1``)."""
    if init is None:
        return prior_draws(model, space, key, n_starts)
    u, n_init = checked_init(model, space, init)
    if n_init is None:
        u = u[None]
        if n_starts > 1:
            u = np.concatenate([u, prior_draws(model, space, key, n_starts)[1:]], axis=0)
        return u
    if n_starts not in (1, n_init):
        raise ValueError(
            f"`init` is an ensemble of {n_init} starts but n_starts={n_starts}; pass "
            f"n_starts={n_init} (or 1)."
        )
    return u


def jittered(centre: np.ndarray, jitter: float, key, count: int) -> np.ndarray:
    """``(count, D)`` points ``centre (D,)`` plus ``N(0, jitter^2)`` noise."""
    noise = np.asarray(jax.random.normal(key, (count, centre.shape[-1])))
    return np.asarray(centre[None] + jitter * noise, dtype=np.float64)
