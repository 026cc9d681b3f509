"""`profile_intervals`: likelihood-profile confidence intervals of a population fit's
parameters (NONMEM users know them as PsN's ``llp``; Venzon & Moolgavkar 1988, "A method for
computing profile-likelihood-based confidence intervals", Applied Statistics 37:87).

For a coordinate ``u_j`` of the unconstrained population vector the profile is
``OFV_p(u_j) = min over the other coordinates of OFV`` and the interval is where
``OFV_p - OFV_min <= chi2_1(level)``: the likelihood-ratio test's acceptance region, which
follows the objective where it is not quadratic (a ridge between correlated parameters,
a variance near zero) and is invariant to reparametrisation, where the Wald interval
``estimate +- z SE`` is neither.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import minimize
from scipy.stats import chi2

from ._checks import float32_rtol
from ._population_fit import PopulationFit, _objective, _objective_hessian, _problem

__all__ = ["profile_intervals", "ProfileIntervals"]

MAX_STEP = 1.0      # the largest step unit on the unconstrained scale (a factor e on a log)
MAX_DISTANCE = 30.0  # how far from the estimate a bound is sought (unconstrained scale)
INNER_GTOL = 1e-3   # each profile point's BFGS: an OFV error of ~g^2/H, far below 0.01


class ProfileIntervals(NamedTuple):
    """The result of `profile_intervals`.

    Attributes:
        lower, upper: the bounds by site name, each the site's shape, on the site's own
            (constrained) scale; NaN where not found (see `found_lower`) or not asked for.
        found_lower, found_upper: boolean arrays of the same shapes: whether the profile
            crossed ``ofv_min + threshold`` on that side.
        estimate: the fit's estimates of the profiled sites.
        level: the confidence level; threshold: ``chi2_1(level)`` (3.841 for 0.95).
        ofv_min: the objective at the estimate, recomputed (equal to ``fit.ofv``).
        profiles: by element label (``"lKa"``, ``"omega[1]"``): ``(values, rise)`` arrays of
            every profile point computed, sorted by value; ``rise = OFV_p - ofv_min``.
        notes: why bounds were not found, and anything else worth knowing (a profile point
            below ``ofv_min``: the fit is not the minimum along that profile).
        n_evaluations: objective evaluations (each one ensemble solve with its gradient).
        wall_time: seconds, everything counted.

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


class _Point(NamedTuple):
    delta: float    # distance from the estimate on the unconstrained scale, signed
    rise: float     # OFV_p - ofv_min
    u: np.ndarray   # the full unconstrained vector at the profile's minimum
    eta: Any        # (S, q) the conditional modes there


def profile_intervals(
    fit: PopulationFit,
    model,
    data,
    *,
    names: Sequence[str] | None = None,
    level: float = 0.95,
    tol: float = 0.01,
    max_steps: int = 8,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    solver=None,
    inner_iterations: int = 50,
    driver=None,
) -> ProfileIntervals:
    """Likelihood-profile confidence intervals of the population parameters of a
    `fit_population` result (PsN's ``llp``; Venzon & Moolgavkar 1988).

    For each element ``j`` of each named site, on its unconstrained scale ``u_j``: the
    profile ``OFV_p(u_j)`` minimises the fit's own objective over every other population
    coordinate (SciPy BFGS, its start the nearest profile point's minimum moved along the
    ridge, its first inverse Hessian from the estimate's). From the estimate the bound is
    sought in steps starting at the Wald bound ``sqrt(chi2) SE`` (SE on the unconstrained
    scale, at most 1), each next step where a quadratic through the last point would cross
    (1.5 to 4 times the last; halfway back where the objective is not finite, e.g. a
    variance overflowing), until ``OFV_p - OFV_min`` passes ``chi2_1(level)``; then
    regula falsi (Illinois) on ``sqrt(OFV_p - OFV_min) - sqrt(chi2)``, nearly linear in
    ``u_j``, to ``|OFV_p - OFV_min - chi2| < tol``. A side where the profile stays below
    the threshold for ``max_steps`` steps or up to 30 units on the unconstrained scale (a
    variance whose profile is flat down to zero) is reported not found, not extrapolated.
    Where BFGS stops short (a subject's conditional mode changing branch makes the
    objective jump) the point is minimised again from the nearest point nearer the
    estimate, and the lower of the two kept. The profile follows the estimate's branch: a
    separate, lower region of the objective is found only if the profile runs into it.

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
        max_steps: steps out from the estimate per side before giving up.
        rtol, atol, solver, inner_iterations, driver: the objective's settings, as
            `fit_population`'s: pass those of the fit (its OFV is checked against the
            objective's at its estimate).

    Returns:
        A `ProfileIntervals`: site-shaped ``lower``, ``upper`` on the constrained scale
        (NaN where not found), ``found_lower``, ``found_upper``, and each profile's points.

    Example:
        >>> fit = inference.fit_population(model, data)
        >>> ci = inference.profile_intervals(fit, model, data, names=["lQ", "omega"])
        >>> ci.lower["lQ"], ci.upper["lQ"]
    """
    t0 = time.perf_counter()
    _check_arguments(fit, level, tol, max_steps)
    rtol = float32_rtol(fit.method, rtol, "inference.profile_intervals")
    pb = _problem(model, data, fit.method, {k: np.asarray(v) for k, v in fit.params.items()}, 0)
    targets = _targets(pb, names)
    obj = _objective(pb, rtol=rtol, atol=atol, solver=solver,
                     inner_iterations=inner_iterations, driver=driver)
    counter = {"n": 0}

    def fun(u):
        counter["n"] += 1
        return obj.fun(u)

    u_hat = np.asarray(pb.u0, float)
    ofv_min = fun(u_hat)[0]
    eta_hat = obj.modes.state["eta"]
    if not abs(ofv_min - fit.ofv) < max(tol, 1e-6 * abs(fit.ofv)):
        raise ValueError(
            f"inference.profile_intervals: the objective at `fit`'s estimate is {ofv_min:.6f}, "
            f"`fit.ofv` {fit.ofv:.6f}: `fit` is not a fit of this `model` and `data` with these "
            "settings (pass the fit's rtol, atol, solver and driver).")
    _check_elementwise(pb, u_hat, targets)
    Hm = _objective_hessian(fun, u_hat)
    threshold = float(chi2.ppf(float(level), 1))
    sites = list(dict.fromkeys(site for site, _, _ in targets))
    bounds = {side: {k: np.full(pb.shapes[k], np.nan) for k in sites} for side in (-1, 1)}
    profiles, notes = {}, []
    for site, i, label in targets:
        ctx = _Profile(fun, Hm, u_hat, _offset(pb, site) + i, threshold, tol, int(max_steps),
                       ofv_min, obj.modes.state)
        element = lambda u: np.ravel(np.asarray(pb.unflatten(jnp.asarray(u))[site]))[i]
        pts = [_Point(0.0, 0.0, u_hat, eta_hat)]
        for side in (-1, 1):
            bound, why = _bound(ctx, side, pts)
            if bound is not None:
                bounds[side][site].reshape(-1)[i] = element(bound.u)
            else:
                notes.append(f"{label} {'lower' if side < 0 else 'upper'} bound not found: "
                             f"{why}")
        if min(p.rise for p in pts) < -tol:
            notes.append(f"{label}: the profile reaches {min(p.rise for p in pts):.3f} below "
                         "ofv_min: the fit is not the minimum along this profile.")
        pts.sort(key=lambda p: p.delta)
        profiles[label] = (np.array([element(p.u) for p in pts]), np.array([p.rise for p in pts]))
    lower, upper = bounds[-1], bounds[1]
    return ProfileIntervals(
        lower=lower, upper=upper, found_lower={k: ~np.isnan(v) for k, v in lower.items()},
        found_upper={k: ~np.isnan(v) for k, v in upper.items()},
        estimate={k: np.asarray(fit.params[k]) for k in sites}, level=float(level),
        threshold=threshold, ofv_min=float(ofv_min), profiles=profiles, notes=notes,
        n_evaluations=counter["n"], wall_time=time.perf_counter() - t0)


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


class _Profile(NamedTuple):
    fun: Any            # u -> (OFV, gradient)
    Hm: np.ndarray      # (P, P) the objective's Hessian at the estimate
    u_hat: np.ndarray
    j: int              # the profiled coordinate
    threshold: float
    tol: float
    max_steps: int
    ofv_min: float
    modes: dict         # the objective's warm start of the conditional modes ("eta")

    @property
    def free(self):
        return np.arange(self.u_hat.size) != self.j

    def unit(self) -> float:
        """The step unit: the Wald SE of ``u_j`` (``2 H^-1``; eigenvalues floored at 1e-8 of
        the largest, a variance at zero has no curvature), at most `MAX_STEP`."""
        w, V = np.linalg.eigh(self.Hm)
        w = np.maximum(w, 1e-8 * w.max())
        var = 2.0 * (V[self.j] ** 2 / w).sum()
        return float(min(np.sqrt(var), MAX_STEP))

    def slope(self) -> np.ndarray:
        """``d u_free / d u_j`` along the quadratic ridge at the estimate (flat directions,
        a variance at zero, left out)."""
        f = self.free
        Hff = self.Hm[np.ix_(f, f)]
        return -np.linalg.pinv(Hff, rcond=1e-6, hermitian=True) @ self.Hm[f, self.j]

    def inverse_hessian(self) -> np.ndarray:
        """BFGS's first inverse Hessian of the other coordinates: the estimate's, its
        eigenvalues floored (positive definite)."""
        f = self.free
        w, V = np.linalg.eigh(self.Hm[np.ix_(f, f)])
        w = np.maximum(w, 1e-6 * w.max())
        Hi = (V / w) @ V.T
        return 0.5 * (Hi + Hi.T)


def _minimise(ctx: _Profile, delta: float, starts: list) -> _Point:
    """The profile at ``u_j = u_hat_j + delta``: BFGS over the other coordinates from
    ``starts[0]`` (a full vector; its ``j`` entry ignored), and from the next start where
    BFGS stops short of the gradient tolerance (its line search lost: a jump in the
    objective where a subject's conditional mode changes branch); the lowest kept."""
    best = None
    for start, eta in starts:
        p, ok = _bfgs(ctx, delta, start, eta)
        if best is None or p.rise < best.rise:
            best = p
        if ok:
            break
    return best


def _bfgs(ctx: _Profile, delta: float, start: np.ndarray, eta) -> tuple[_Point, bool]:
    """BFGS from ``start``, the conditional modes' search warm-started at ``eta`` (a
    subject with two local modes stays on the start point's branch: the profile is
    continued in the modes too)."""
    f, x = ctx.free, ctx.u_hat[ctx.j] + delta
    ctx.modes["eta"] = eta
    seen = {}

    def g(v):
        u = np.array(start, float)
        u[f], u[ctx.j] = v, x
        val, grad = ctx.fun(u)
        seen[np.asarray(v).tobytes()] = ctx.modes["eta"]
        return val, grad[f]

    res = minimize(g, np.asarray(start, float)[f], jac=True, method="BFGS",
                   options=dict(gtol=INNER_GTOL, maxiter=200, hess_inv0=ctx.inverse_hessian()))
    u = np.array(start, float)
    u[f], u[ctx.j] = res.x, x
    ok = bool(res.success) or np.max(np.abs(res.jac)) < 10 * INNER_GTOL
    eta_end = seen.get(np.asarray(res.x).tobytes(), ctx.modes["eta"])
    return _Point(float(delta), float(res.fun) - ctx.ofv_min, u, eta_end), ok


def _starts(ctx: _Profile, pts: list, delta: float) -> list:
    """Where to start the profile's minimisation at ``delta``, ``(u, eta)`` pairs: the
    line through the two computed points nearest to it (one point: along the estimate's
    ridge) with the nearest point's modes; then the nearest point on the estimate's side,
    as it is, with its modes."""
    near = sorted(pts, key=lambda p: abs(p.delta - delta))[:2]
    if len(near) == 1 or near[0].delta == near[1].delta:
        s = np.zeros_like(ctx.u_hat)
        s[ctx.free] = ctx.slope()
        first = near[0].u + s * (delta - near[0].delta)
    else:
        a, b = near
        first = a.u + (b.u - a.u) * (delta - a.delta) / (b.delta - a.delta)
    closer = [p for p in pts if abs(p.delta) < abs(delta) and p.delta * delta >= 0]
    c = min(closer, key=lambda p: abs(p.delta - delta))
    return [(first, near[0].eta), (c.u, c.eta)]


def _bound(ctx: _Profile, side: int, pts: list) -> tuple[_Point | None, str]:
    """The bound on one side (``side`` -1 or 1): steps out, then regula falsi. Appends every
    point computed to ``pts``; returns ``(point, "")`` or ``(None, why)``."""
    c2 = ctx.threshold
    inside = pts[0]
    step = side * np.sqrt(c2) * ctx.unit()
    outside = None
    for _ in range(ctx.max_steps):
        p = _minimise(ctx, step, _starts(ctx, pts, step))
        pts.append(p)
        if not np.isfinite(p.rise) or p.rise > 1e299:
            # past where the model can be evaluated (a variance overflowing): halfway back
            pts.pop()
            step = 0.5 * (inside.delta + step)
            continue
        if p.rise >= c2:
            outside = p
            break
        inside = p
        grow = np.sqrt(c2 / p.rise) if p.rise > 0 else 4.0
        step = step * float(np.clip(grow, 1.5, 4.0))
        if abs(step) > MAX_DISTANCE:
            if abs(inside.delta) >= MAX_DISTANCE - 1e-12:
                break
            step = side * MAX_DISTANCE
    if outside is None:
        return None, (f"the profile stays below the threshold (rise {inside.rise:.4g} < "
                      f"{c2:.4g}) up to {abs(inside.delta):.4g} from the estimate on the "
                      "unconstrained scale.")
    return _refine(ctx, pts, inside, outside)


def _refine(ctx, pts, inside, outside, iterations=20):
    """Regula falsi (Illinois) between ``inside`` and ``outside`` on ``sqrt(rise) -
    sqrt(chi2)``, to ``|rise - chi2| < tol``."""
    c2 = ctx.threshold
    z = lambda p: np.sqrt(max(p.rise, 0.0)) - np.sqrt(c2)
    za, zb = z(inside), z(outside)
    if abs(outside.rise - c2) < ctx.tol:
        return outside, ""
    last = None
    for _ in range(iterations):
        d = inside.delta - za * (outside.delta - inside.delta) / (zb - za)
        p = _minimise(ctx, d, _starts(ctx, pts, d))
        pts.append(p)
        if abs(p.rise - c2) < ctx.tol:
            return p, ""
        if p.rise < c2:
            inside, za = p, z(p)
            if last == "inside":
                zb /= 2
            last = "inside"
        else:
            outside, zb = p, z(p)
            if last == "outside":
                za /= 2
            last = "outside"
    a, b = sorted((ctx.u_hat[ctx.j] + inside.delta, ctx.u_hat[ctx.j] + outside.delta))
    return None, (f"the profile jumps across the threshold between u_j {a:.6g} and {b:.6g} "
                  f"(rise {inside.rise:.4f} to {outside.rise:.4f}; regula falsi, "
                  f"{iterations} steps): a discontinuity, where the other parameters' "
                  "minimum changes branch, or a profile point BFGS did not minimise.")
