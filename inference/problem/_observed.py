"""Checks of a NumPyro program's observed sites, made on the one trace `fit` and `sample`
take of it before any work: a program that observes nothing, an observation whose shape
broadcasts the likelihood beyond it, and a missing value (NaN) that the site's
distribution turns into a NaN (or -inf) log density. Each would otherwise run for seconds to
minutes and return a prior, a likelihood counted many times over, or NaN; and an
observation outside its distribution's support (a LogNormal DV <= 0), which would fail
after minutes without naming it."""

from __future__ import annotations

import warnings

import numpy as np
import numpyro.distributions as dist

__all__ = ["check_observed_sites", "outside_support"]


def _is_factor(site) -> bool:
    return isinstance(site["fn"], dist.Unit)


def _shape_of(fn) -> tuple[int, ...]:
    return tuple(fn.batch_shape) + tuple(fn.event_shape)


def _check_shape(site, name: str) -> None:
    """``ValueError`` where ``obs`` and the distribution broadcast to a shape larger than
    ``obs``: its log density would then count each observation several times (a ``(k, 1)``
    column against a ``(k,)`` prediction gives ``k * k`` terms). ``obs`` larger than the
    distribution (i.i.d. draws of one scalar distribution) is fine."""
    obs, want = tuple(np.shape(site["value"])), _shape_of(site["fn"])
    try:
        joint = tuple(np.broadcast_shapes(obs, want))
    except ValueError:
        joint = None
    if joint != obs:
        how = ("they do not broadcast" if joint is None else
               f"they broadcast to {joint}, so the likelihood would count each "
               f"observation {int(np.prod(joint)) // max(int(np.prod(obs)), 1)} times")
        hint = " (here obs[..., 0])" if obs == want + (1,) else ""
        raise ValueError(
            f"{name}: observed site {site['name']!r}: obs has shape {obs} but the "
            f"distribution's batch+event shape is {want} ({how}); reshape obs or the "
            f"distribution's parameters so that they agree{hint}")


def _check_missing(site, name: str) -> None:
    """``ValueError`` where ``obs`` holds NaN that the distribution's log density turns
    into NaN or ``-inf`` (a missing value neither dropped nor masked; NumPyro's validation
    gives ``-inf`` outside the support)."""
    value = np.asarray(site["value"])
    if not np.issubdtype(value.dtype, np.floating) or not np.isnan(value).any():
        return
    fn = site["fn"]
    with warnings.catch_warnings():  # NumPyro's warning of values outside the support
        warnings.simplefilter("ignore")
        lp = np.asarray(fn.log_prob(site["value"]))
    event = len(fn.event_shape)
    missing = np.isnan(value)
    if event:
        missing = missing.any(axis=tuple(range(-event, 0)))
    if np.any(~np.isfinite(lp) & np.broadcast_to(missing, np.broadcast_shapes(missing.shape,
                                                                          lp.shape))):
        raise ValueError(
            f"{name}: observed site {site['name']!r}: obs holds "
            f"{int(np.isnan(value).sum())} NaN value(s) of {value.size} and its "
            f"distribution ({type(fn).__name__}) gives them a log density of NaN or -inf; "
            "drop the missing values or mask them out of the likelihood "
            "(distribution.mask(~np.isnan(obs)))")


def _elementwise(constraint):
    """The per-entry constraint under NumPyro's ``independent`` wrappers."""
    while hasattr(constraint, "base_constraint"):
        constraint = constraint.base_constraint
    return constraint


def outside_support(fn, values, checked):
    """Booleans of ``values``' shape: the ``checked`` entries that lie outside the support
    of distribution ``fn``, entry by entry (under its ``independent`` wrappers); ``None``
    where that support cannot be checked entry by entry."""
    try:
        with warnings.catch_warnings():  # NumPyro's warning of values outside the support
            warnings.simplefilter("ignore")
            inside = np.asarray(_elementwise(fn.support)(np.where(checked, values, np.nan)))
    except Exception:  # noqa: BLE001 - a support that cannot be checked entry by entry
        return None
    return checked & ~inside if inside.shape == np.shape(values) else None


def _check_support(site, name: str) -> None:
    """``ValueError`` naming the first observation outside the support of its site's
    distribution (a DV <= 0 under LogNormal noise, a negative count under Poisson): its
    log density is -inf at every parameter value, so a fit or a sampler could only fail,
    after minutes, without saying where. Missing (NaN) and masked-out entries are left to
    `_check_missing` and the mask."""
    fn, value = site["fn"], np.asarray(site["value"])
    if not np.issubdtype(value.dtype, np.number):
        return
    keep = ~np.isnan(value) if np.issubdtype(value.dtype, np.floating) else np.ones(value.shape, bool)
    if isinstance(fn, dist.MaskedDistribution):
        mask = np.asarray(fn._mask)
        mask = mask.reshape(mask.shape + (1,) * len(fn.event_shape))
        try:
            keep = keep & np.broadcast_to(mask, keep.shape)
        except ValueError:  # a mask that does not line up with obs: leave it to the trace
            return
    bad = outside_support(fn, value, keep)
    if bad is not None and bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        base = fn  # the noise model under masks, batch wrappers and models' gap filler
        while True:
            if isinstance(base, (dist.MaskedDistribution, dist.Independent,
                                 dist.ExpandedDistribution)):
                base = base.base_dist
            elif isinstance(getattr(base, "noise", None), dist.Distribution):
                base = base.noise
            else:
                break
        raise ValueError(
            f"{name}: observed site {site['name']!r}: obs{list(first)} = {value[first]:g} "
            f"lies outside the support of its distribution ({type(base).__name__}), so the "
            f"log-likelihood is -inf at every parameter value ({int(bad.sum())} such "
            f"value(s) of {value.size}); drop or correct them, or use a noise model whose "
            "support includes them")


def check_observed_sites(trace, name: str) -> None:
    """``ValueError`` naming the program (``name``) and the site when the program's trace
    (one run at a prior draw, concrete values) observes no data, or when an observed site's
    ``obs`` broadcasts the likelihood beyond its own shape or holds missing values its
    distribution cannot take."""
    samples = [s for s in trace.values() if s["type"] == "sample"]
    data = [s for s in samples if s["is_observed"] and not _is_factor(s)]
    # a factor counts as data unless it is exactly 0 at the traced point: a guard such as
    # ``numpyro.factor("solver_failure", jnp.where(ok, 0.0, -jnp.inf))`` adds nothing
    # where the solve succeeds, while a hand-written likelihood is rarely exactly 0
    factors = [s for s in samples if s["is_observed"] and _is_factor(s)]
    likelihoods = [s for s in factors
                   if np.any(np.asarray(s["fn"].log_factor) != 0)]
    if not data and not likelihoods:
        latent = [s["name"] for s in samples if not s["is_observed"]]
        guards = (f" (its factors {[s['name'] for s in factors]} are 0 at a prior draw: "
                  "guards, not a likelihood)" if factors else "")
        raise ValueError(
            f"{name}: the program observes no data: none of its sample sites {latent} has "
            f"obs=...{guards}, so a fit or a posterior would be the prior's. Pass the data "
            "to the likelihood's site, numpyro.sample(name, distribution, obs=data) (a "
            "program without data can be run by inference.predictive for prior draws)")
    for s in data:
        _check_shape(s, name)
        _check_missing(s, name)
        _check_support(s, name)
