"""`profile_intervals`: a population fit's profile-likelihood intervals in NONMEM's terms
(PsN's ``llp``; Venzon & Moolgavkar 1988, "A method for computing profile-likelihood-based
confidence intervals", Applied Statistics 37:87): `inference.profile` of the population
problem, read back as ``OFV`` rises and site-shaped bounds on the sites' own scales."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..population._population_fit import PopulationFit
from ..population._problem import PopulationProblem
from ..problem._problem import TOLERANCES
from ._profile import profile

__all__ = ["profile_intervals", "ProfileIntervals"]


class ProfileIntervals(NamedTuple):
    """What `profile_intervals` returns: `inference.profile`'s result of a population fit
    in NONMEM's terms (``OFV = -2 log L``, bounds on each site's own scale).

    Attributes:
        lower, upper: the bounds by site name, each the site's shape, on the site's own
            (constrained) scale; NaN where not found (see `found_lower`) or not asked for.
        found_lower, found_upper: boolean arrays of the same shapes: whether the profile
            crossed ``ofv_min + threshold`` on that side.
        estimate: the fit's estimates of the profiled sites.
        level: the confidence level; threshold: ``chi2_1(level)`` (3.841 for 0.95).
        ofv_min: the objective at the estimate, recomputed (equal to ``fit.ofv``; lower
            where the profiles found a better point: ``notes``).
        profiles: by element label (``"lKa"``, ``"omega[1]"``): ``(values, rise)`` arrays of
            every profile point computed, sorted by value; ``rise = OFV_p - ofv_min``.
        notes: why bounds were not found, and anything else worth knowing (the fit was
            not the optimum along a profile).
        n_evaluations: objective evaluations (each one ensemble solve with its gradient).
        wall_time: seconds, everything counted.
        result: the `ProfileResult` itself (paths, stop reasons, ``plot()``).

    Example:
        >>> ci = inference.profile_intervals(fit, model, data)
        >>> ci.lower["lQ"], ci.upper["lQ"], ci.found_upper["omega"]
    """

    lower: dict
    upper: dict
    found_lower: dict
    found_upper: dict
    estimate: dict
    level: float
    threshold: float
    ofv_min: float
    profiles: dict
    notes: list
    n_evaluations: int
    wall_time: float
    result: object = None


def profile_intervals(
    fit: PopulationFit,
    model,
    data,
    *,
    names: Sequence[str] | None = None,
    level: float = 0.95,
    tol: float = 0.01,
    max_steps: int = 8,
    rtol: float = TOLERANCES.population_rtol,
    atol: float = TOLERANCES.population_atol,
    solver=None,
    inner_iterations: int = 50,
    driver=None,
) -> ProfileIntervals:
    """Likelihood-profile confidence intervals of the population parameters of a
    `fit_population` result (PsN's ``llp``; Venzon & Moolgavkar 1988).

    For each element ``j`` of each named site, on its unconstrained scale ``u_j``: the
    profile ``OFV_p(u_j)`` minimises the fit's own objective over every other population
    coordinate, and the interval is where ``OFV_p - OFV_min <= chi2_1(level)``. This is
    `inference.profile` of the population problem (all walks one ensemble, adaptive steps,
    the crossing located by regula falsi, a restart from a better point where a profile
    goes below the fit), with its bounds mapped back to each site's own scale. A side
    whose profile stays below the threshold (a variance flat down to zero) is reported
    not found, not extrapolated.

    Why: Wald intervals take the objective as quadratic at the estimate; on a ridge
    (absorption against volume) or near a variance's zero bound they can be far too narrow
    or cross the support's boundary; the profile interval is the likelihood-ratio test's.

    Args:
        fit: the `PopulationFit` of ``model`` on ``data``.
        model, data: the model and data set fitted.
        names: sites to profile (each element of a vector site), or single elements as
            ``"omega[1]"``; default every population site.
        level: the confidence level, in (0, 1).
        tol: the tolerance on ``OFV_p - OFV_min`` at a bound.
        max_steps: the walk's length per side, in units of about four profile points (a
            side not crossed within ``4 * max_steps`` points is not found).
        rtol, atol, solver, inner_iterations, driver: the objective's settings, as
            `fit_population`'s: pass those of the fit (its OFV is checked against the
            objective's at its estimate).

    Returns:
        A `ProfileIntervals`: site-shaped ``lower``, ``upper`` on the constrained scale
        (NaN where not found), ``found_lower``, ``found_upper``, each profile's points,
        and the `ProfileResult` (``result``).

    Example:
        >>> fit = inference.fit_population(model, data)
        >>> ci = inference.profile_intervals(fit, model, data, names=["lQ", "omega"])
        >>> ci.lower["lQ"], ci.upper["lQ"]
    """
    t0 = time.perf_counter()
    _check_arguments(fit, level, tol, max_steps)
    pp = PopulationProblem(model, data, method=fit.method, params=fit.params, rtol=rtol,
                           atol=atol, solver=solver, inner_iterations=inner_iterations,
                           driver=driver, caller="inference.profile_intervals")
    pb = pp.pb
    targets = _targets(pb, names)
    u_hat = pp.u0
    ofv = 2.0 * pp.value_and_grad(u_hat)[0]
    if not abs(ofv - fit.ofv) < max(tol, 1e-6 * abs(fit.ofv)):
        raise ValueError(
            f"inference.profile_intervals: the objective at `fit`'s estimate is {ofv:.6f}, "
            f"`fit.ofv` {fit.ofv:.6f}: `fit` is not a fit of this `model` and `data` with these "
            "settings (pass the fit's rtol, atol, solver and driver).")
    _check_elementwise(pb, u_hat, targets)
    labels = [label for _, _, label in targets]
    res = profile(pp, fit, confidence=float(level), parameters=labels, tol=float(tol) / 2,
                  max_steps=4 * int(max_steps), first_step=0.05, progress=False)
    ids = pp.names()
    sites = list(dict.fromkeys(site for site, _, _ in targets))
    bounds = {side: {k: np.full(pb.shapes[k], np.nan) for k in sites} for side in (0, 1)}
    profiles, notes = {}, []
    for site, i, label in targets:
        j = ids.index(label)

        def element(v, site=site, i=i, j=j):
            u = res.optimum.copy()
            u[j] = v
            return np.ravel(np.asarray(pb.unflatten(jnp.asarray(u))[site]))[i]

        for side in (0, 1):
            end = res.intervals[label][side]
            if res.identifiable[label][side]:
                bounds[side][site].reshape(-1)[i] = element(end)
            else:
                why = {"max_steps": f"the profile stays below the threshold for "
                                    f"{4 * int(max_steps)} points",
                       "bound": "the profile stays below the threshold to the bound",
                       "failed": "the objective is not finite further out",
                       "not_optimum": "the fit is not the optimum (see the notes)"}
                notes.append(f"{label} {'lower' if side == 0 else 'upper'} bound not found: "
                             + why.get(res.stop_reasons[label][side],
                                       res.stop_reasons[label][side]))
        path = res.paths[label]
        profiles[label] = (np.array([element(v) for v in path.values]),
                           2.0 * (path.objective - res.objective_opt))
    notes.extend(res.notes)
    lower, upper = bounds[0], bounds[1]
    return ProfileIntervals(
        lower=lower, upper=upper, found_lower={k: ~np.isnan(v) for k, v in lower.items()},
        found_upper={k: ~np.isnan(v) for k, v in upper.items()},
        estimate={k: np.asarray(fit.params[k]) for k in sites}, level=float(level),
        threshold=2.0 * res.threshold, ofv_min=2.0 * res.objective_opt, profiles=profiles,
        notes=notes, n_evaluations=pp.n_evaluations, wall_time=time.perf_counter() - t0,
        result=res)


def _check_arguments(fit, level, tol, max_steps) -> None:
    if not isinstance(fit, PopulationFit):
        raise TypeError("inference.profile_intervals: `fit` must be a PopulationFit "
                        f"(inference.fit_population's result), got {type(fit).__name__}.")
    if not (isinstance(level, (int, float)) and 0.0 < float(level) < 1.0):
        raise ValueError(f"inference.profile_intervals: `level` must be in (0, 1), got {level!r}.")
    if not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"inference.profile_intervals: `tol` must be positive, got {tol!r}.")
    if not (isinstance(max_steps, (int, np.integer)) and max_steps >= 1):
        raise ValueError("inference.profile_intervals: `max_steps` must be an integer >= 1, "
                         f"got {max_steps!r}.")


def _targets(pb, names) -> list[tuple[str, int, str]]:
    """``(site, flat element index, label)`` of every element to profile."""
    if names is None:
        names = pb.names
    if isinstance(names, str):
        names = [names]
    out = []
    for name in names:
        m = re.fullmatch(r"(\w+)\[(\d+)\]", str(name))
        site = m.group(1) if m else name
        if site not in pb.names:
            raise ValueError(f"inference.profile_intervals: `names` has {name!r}, not a "
                             f"population site of the model; its sites: {pb.names}.")
        size = pb.sizes[site]
        if m and int(m.group(2)) >= size:
            raise ValueError(f"inference.profile_intervals: `names` has {name!r}, but "
                             f"{site!r} has {size} elements.")
        for i in ([int(m.group(2))] if m else range(size)):
            label = f"{site}[{i}]" if pb.shapes[site] != () else site
            if all(label != t[2] for t in out):
                out.append((site, i, label))
    return out


def _offset(pb, site) -> int:
    return sum(pb.sizes[k] for k in pb.names[:pb.names.index(site)])


def _check_elementwise(pb, u, targets) -> None:
    """Fixing ``u_j`` fixes one element only where each site's constraint acts elementwise
    (a real line, a positive or an interval support)."""
    J = np.asarray(jax.jacfwd(lambda v: jnp.concatenate(
        [jnp.ravel(x) for x in pb.unflatten(v).values()]))(jnp.asarray(u)))
    off = J - np.diag(np.diag(J))
    for site in dict.fromkeys(t[0] for t in targets):
        a = _offset(pb, site)
        rows = slice(a, a + pb.sizes[site])
        if np.any(off[rows] != 0):
            raise ValueError(f"inference.profile_intervals: `names` has {site!r}, whose "
                             "constraint mixes its elements; only elementwise constraints "
                             "(real, positive, interval) can be profiled element by element.")
