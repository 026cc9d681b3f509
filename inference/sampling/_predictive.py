"""`predictive`: posterior and prior predictive draws of a model or NumPyro program, through
its own solver.

A posterior predictive check asks what the fitted model would have observed: every
posterior draw's trajectories, with the observation noise, at the data's times or at new
ones. Doing it through the model itself (not a closed form a user's model lacks) means
solving the ODE once per draw; here all draws are one ``jax.vmap``, so every ``ode`` site
(and an `models.ODEModel`'s solve) runs as one ensemble of ``draws x trajectories``.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
import numpyro
from numpyro.distributions.distribution import Unit
from numpyro.primitives import Messenger

from ..problem._density import numpyro_model
from ..problem._problem import InferenceModel
from ..problem._program import PopulationInferenceModel, population_program

__all__ = ["predictive"]


class _Unobserved(Messenger):
    """Treat every observed sample site as latent: its value is drawn from its distribution
    instead of being the data (NumPyro's `Predictive` would return the data there)."""

    def process_message(self, msg):
        # a factor (``numpyro.factor``: an observed Unit site) stays what it is
        if (msg["type"] == "sample" and msg.get("is_observed")
                and not isinstance(msg["fn"], Unit)):
            msg["value"] = None
            msg["is_observed"] = False


def _flat_draws(samples) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """``({site: (N, ...)}, batch shape)`` from an ArviZ ``InferenceData`` (its posterior
    group: batch ``(chain, draw)``) or a dict of arrays with one leading draw axis."""
    post = getattr(samples, "posterior", None)
    if post is not None:
        batch = (post.sizes["chain"], post.sizes["draw"])
        return ({k: np.asarray(v.values).reshape((-1,) + v.shape[2:])
                 for k, v in post.data_vars.items()}, batch)
    if not isinstance(samples, Mapping) or not samples:
        raise TypeError("inference.predictive: `samples` must be an arviz.InferenceData with a "
                        "posterior group, a non-empty dict of arrays with a leading draw axis, "
                        f"or None (prior predictive); got {type(samples).__name__}.")
    out = {k: np.asarray(v) for k, v in samples.items()}
    sizes = {k: (v.shape[0] if v.ndim else None) for k, v in out.items()}
    if None in sizes.values() or len(set(sizes.values())) != 1:
        raise ValueError("inference.predictive: every array in `samples` needs the same "
                         f"leading (draw) axis; got leading sizes {sizes}.")
    return out, (next(iter(sizes.values())),)


def predictive(
    model,
    data=None,
    samples=None,
    *,
    num_samples: int | None = None,
    seed: int = 0,
    return_sites: list[str] | None = None,
    batch_size: int = 1000,
) -> dict[str, np.ndarray]:
    """Posterior (``samples`` given) or prior (``samples=None``) predictive draws.

    Every observed site of the program is drawn anew from its distribution (the data's
    values only fix its shape and where it is masked); latent sites take the posterior
    draws' values, or are drawn from the prior. Each ODE solve runs through gradsolve
    (``gs.solve`` at an `inference.ode` site), vectorised over draws.

    Args:
        model: a `models.ODEModel` (its program, `numpyro_model`), a
            `models.PopulationModel` (its program, `population_program`) or a NumPyro
            program called as ``model(data)``.
        data: what the program is called with. For an `models.ODEModel`: a
            `models.Dataset` or an array of times ``(k,)`` (predict at new times). For a
            population program, a `models.PopulationDataset` whose subjects' times may be a
            fine grid.
        samples: ``arviz.InferenceData`` (as `inference.sample` returns), or a dict of
            arrays with a leading draw axis ``(N, ...)`` keyed by latent site name;
            ``None``: draw from the prior.
        num_samples: prior draws (with ``samples=None``), default 1,000.
        seed: the random key's seed.
        return_sites: sites to return; default every site that is not a given latent
            (observed sites, deterministic sites such as ``y_pred``, and, for the prior,
            every latent site).
        batch_size: draws vectorised at once (the memory of ``batch_size`` ensembles).

    Returns:
        ``{site: array}``, each of shape ``(chain, draw, ...)`` for an ``InferenceData``,
        else ``(N, ...)``.

    Example:
        >>> idata = inference.sample(m, data)
        >>> pp = inference.predictive(m, np.linspace(0, 20, 101), idata)
        >>> pp["obs"].shape                       # (2, 1000, 101, 2)
    """
    if isinstance(model, PopulationInferenceModel):
        program, args = population_program(model), (data,)
    elif isinstance(model, InferenceModel):
        if data is None:
            raise ValueError("inference.predictive: an ODEModel needs `data` (a Dataset or "
                             "the times to predict at).")
        program = numpyro_model(model)
        args = (data,) if hasattr(data, "ts") else (np.asarray(data, float),)
    elif callable(model):
        program, args = model, (data,)
    else:
        raise TypeError("inference.predictive: `model` must be a models.ODEModel or a NumPyro "
                        f"program (a callable); got {type(model).__name__}.")
    for name, v in (("batch_size", batch_size),
                    ("num_samples", 1 if num_samples is None else num_samples)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"inference.predictive: `{name}` must be an int >= 1, got "
                             f"{v!r}.")
    if samples is None:
        n = 1000 if num_samples is None else int(num_samples)
        draws, batch = {}, (n,)
    else:
        if num_samples is not None:
            raise ValueError("inference.predictive: `num_samples` is for prior draws; with "
                             "`samples` every given draw is used.")
        draws, batch = _flat_draws(samples)
    total = int(np.prod(batch))
    unobserved = _Unobserved(program)

    def one(key, values):
        tr = numpyro.handlers.trace(numpyro.handlers.seed(
            numpyro.handlers.substitute(unobserved, data=values), key)).get_trace(*args)
        names = return_sites if return_sites is not None else [
            k for k, s in tr.items()
            if s["type"] in ("sample", "deterministic") and k not in values
            and not isinstance(s.get("fn"), Unit)]
        stray = sorted(k for k in values if k not in tr)
        if stray:
            sites = [k for k, s in tr.items() if s["type"] == "sample"
                     and not isinstance(s.get("fn"), Unit)]
            raise ValueError(f"inference.predictive: `samples` has {stray}, which no site "
                             f"of the program is named (its sample sites: {sites}); the "
                             "draws must be of this model's parameters")
        missing = [k for k in names if k not in tr]
        if missing:
            raise ValueError(f"inference.predictive: no site named {missing} in the program; "
                             f"it has {sorted(tr)}.")
        return {k: tr[k]["value"] for k in names}

    keys = jax.random.split(jax.random.PRNGKey(seed), total)
    run = jax.jit(jax.vmap(one))
    chunks = []
    for lo in range(0, total, int(batch_size)):
        hi = min(total, lo + int(batch_size))
        chunk = {k: v[lo:hi] for k, v in draws.items()}
        chunks.append(jax.tree.map(np.asarray, run(keys[lo:hi], chunk)))
    out = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    return {k: v.reshape(batch + v.shape[1:]) for k, v in out.items()}
