"""A population model's latent sites as a population fit reads them: which are population
parameters and which is the random-effects site (the one inside the subjects plate), and
the random effects' prior density. Shared by the fit and its diagnostics, which would
otherwise import each other."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from numpyro import handlers


class _Sites(NamedTuple):
    population: dict      # name -> prior distribution (for its support and shape)
    effects: str          # the random-effects site


def _sites(model, data, key) -> tuple[_Sites, dict]:
    """Which latent sites are population parameters and which is the random-effects site
    (the one inside the subjects plate), and a draw of every site."""
    tr = handlers.trace(handlers.seed(model.latent_fn, rng_seed=key)).get_trace(data)
    pop, eff = {}, []
    for name, s in tr.items():
        if s["type"] != "sample" or s["is_observed"]:
            continue
        if s["cond_indep_stack"]:
            eff.append(name)
        else:
            pop[name] = s["fn"]
    if len(eff) != 1:
        raise ValueError(f"inference.fit_population: the model's `latent` must sample one "
                         f"random-effects site inside its subjects plate; found {eff}.")
    draw = {k: s["value"] for k, s in tr.items() if s["type"] == "sample"}
    return _Sites(pop, eff[0]), draw


def _effect_site(model, data, theta, name):
    """The random-effects site ``name`` of the model's latent program at the values of
    ``theta``: its prior (``"fn"``) and value."""
    tr = handlers.trace(handlers.substitute(handlers.seed(model.latent_fn, rng_seed=0),
                                            data=theta)).get_trace(data)
    return tr[name]


def _effect_logprob(model, data, theta, name):
    """``(S,)`` log density of the random effects ``theta[name]`` at the population values
    of ``theta``."""
    s = _effect_site(model, data, theta, name)
    lp = s["fn"].log_prob(s["value"])
    return lp if lp.ndim else jnp.broadcast_to(lp, (data.n_subjects,))
