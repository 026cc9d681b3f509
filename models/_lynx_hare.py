"""`lynx_hare()`: the Stan predator–prey model of the Hudson's Bay Company pelts."""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from ._model import ODEModel

__all__ = ["lynx_hare"]


def _lynx_hare_field(t, z, p):
    alpha, beta, gamma, delta = p["theta"][0], p["theta"][1], p["theta"][2], p["theta"][3]
    u, v = z[0], z[1]
    return jnp.stack([(alpha - beta * v) * u, (-gamma + delta * u) * v])


def _lynx_hare_y0(p):
    return p["z_init"]


def _lynx_hare_noise(p, z_pred):
    # y[t, k] ~ lognormal(log(z[t, k]), sigma[k]), the t = 0 row (z_init) included.
    return dist.LogNormal(jnp.log(z_pred), p["sigma"]).to_event(2)


def lynx_hare() -> ODEModel:
    r"""Lotka–Volterra model of the lynx–hare pelts, exactly as in Carpenter's Stan case study.

    $$
    \frac{du}{dt} = (\alpha - \beta v)\,u, \qquad
    \frac{dv}{dt} = (-\gamma + \delta u)\,v
    $$

    States: ``u`` hare, ``v`` lynx (thousands of pelts); ``t`` in years since 1900,
    ``t0 = 0``. Fits ``models.load_dataset("lynx_hare")`` (``ts = 0, ..., 20``).

    Parameters and priors (the Stan program's):

    - ``theta = (alpha, beta, gamma, delta)``, shape ``(4,)``: ``alpha, gamma ~ Normal(1,
      0.5)`` and ``beta, delta ~ Normal(0.05, 0.05)``, each truncated below at 0
      (``TruncatedNormal(loc=(1, .05, 1, .05), scale=(.5, .05, .5, .05), low=0)``, a vector
      distribution whose log density includes the truncation's normalising constant);
      ``alpha`` hare birth rate (1/year), ``beta`` hare deaths per lynx (1/(thousand lynx ·
      year)), ``gamma`` lynx death rate (1/year), ``delta`` lynx growth per hare
      (1/(thousand hares · year));
    - ``z_init`` (2,): the states at ``t = 0``, ``LogNormal(log 10, 1)`` each (unknown
      initial state, hence ``y0 = z_init``);
    - ``sigma`` (2,): observation noise scale per species, ``LogNormal(-1, 1)`` each.

    Observations: every row, the ``t = 0`` row included, is
    ``y[t, k] ~ LogNormal(log z_k(t), sigma_k)``.

    Defaults: close to the posterior means reported in the case study
    (``theta ≈ (0.55, 0.028, 0.80, 0.024)``, ``z_init ≈ (33.9, 5.9)``, ``sigma ≈ (0.25,
    0.25)``), not the prior medians.

    Source: B. Carpenter (2018), "Predator-Prey Population Dynamics: the Lotka-Volterra
    model in Stan", Stan case study (https://mc-stan.org/users/documentation/case-studies/
    lotka-volterra-predator-prey.html); A. J. Lotka (1925); V. Volterra (1926).

    Example:
        >>> data = models.load_dataset("lynx_hare")
        >>> model = models.lynx_hare()
        >>> model.predict(model.defaults, data.ts).shape  # (21, 2): hare, lynx
        >>> model.log_joint(model.defaults, data)  # log prior + log likelihood
    """
    return ODEModel(
        name="lynx_hare",
        vector_field=_lynx_hare_field,
        priors={
            "theta": dist.TruncatedNormal(
                loc=jnp.array([1.0, 0.05, 1.0, 0.05]),
                scale=jnp.array([0.5, 0.05, 0.5, 0.05]),
                low=0.0,
            ).to_event(1),
            "z_init": dist.LogNormal(jnp.log(10.0), 1.0).expand([2]).to_event(1),
            "sigma": dist.LogNormal(-1.0, 1.0).expand([2]).to_event(1),
        },
        y0=_lynx_hare_y0,
        t0=0.0,
        noise=_lynx_hare_noise,
        observed=(0, 1),
        stiff=False,
        defaults={
            "theta": jnp.array([0.55, 0.028, 0.80, 0.024]),
            "z_init": jnp.array([33.9, 5.9]),
            "sigma": jnp.array([0.25, 0.25]),
        },
        state_names=("hare", "lynx"),
    )
