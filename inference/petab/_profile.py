"""Profile likelihoods of a PEtab problem's parameters: `profile`, `ProfileResult`.

The profile of parameter ``j`` is ``F_p(v) = min { F(x) : x_j = v }``, ``F`` the fit's
objective (the negative log-likelihood, minus the table's priors for ``"map"``). Where
``F_p(v) - F_opt`` stays below ``chi2_1(confidence) / 2`` (1.92 for 95 %) is the
likelihood-ratio confidence interval of ``x_j``; a side on which the profile does not
cross that threshold inside the bounds is open, and the parameter is not identifiable on
that side (Raue et al. 2009, "Structural and practical identifiability analysis of
partially observed dynamical models by exploiting the profile likelihood",
Bioinformatics 25:1923; pyPESTO's ``pypesto.profile``). Unlike a Wald interval it follows
the objective where it is not quadratic, and it is invariant to reparametrisation.

How it runs:

- Every profiled parameter is walked in both directions from the optimum, and all those
  walks are ONE ensemble: each round proposes every walk's next value, and one batched
  bounded Levenberg–Marquardt run (`inference.optimize._lm.LMKernel`, on kept meshes as
  `inference.fit` uses it, `LM_POLICY`) re-optimises the other coordinates of every walk at
  once, each warm-started from its walk's last point, moved along the path (first order).
- The profiled coordinate is held by the residual function, not by the bounds: a row of
  the kernel's state is ``(x (D,), j)``, and the residuals see ``x`` with ``x_j`` behind
  ``stop_gradient``, so ``x_j`` has zero gradient and curvature and the LM never moves it
  (nor ``j``). One kernel, compiled once, serves every parameter's profile; the cost is
  one forward-mode tangent more than a fit's.
- Steps are adaptive on the parameter scale (pyPESTO's rule, ``delta_ratio_max``): each
  aims to lower the ratio ``exp(-(F_p - F_opt))`` by ``ratio_step``, predicted by
  extrapolating ``sqrt(F_p - F_opt)`` linearly in the value (exact for a quadratic
  profile, so the steps are neither wasted near the optimum nor too long far out), at most
  ``GROWTH`` times the last step, within ``[min_step, max_step]``; halved where a solve
  fails.
- A walk stops where its profile passes the threshold, then places up to `REFINE` points
  by regula falsi on ``sqrt(F_p - F_opt) - sqrt(threshold)`` (linear in the value for a
  quadratic profile) until one lies within ``tol`` of the threshold; the interval end is
  that function's linear interpolation between the points bracketing the crossing. A walk
  also stops at the bound (open side: ``-inf``/``inf``), after ``max_steps`` points
  (open side) or where the solve fails at the smallest step (open side).
- The intervals need the optimum: a point more than ``tol`` below the one the walks
  started from (a fit stopped short of the optimum, or in another basin) abandons them;
  one more batched LM run, with every coordinate free (the held index ``D``, which
  matches none), from each walk's lowest point gives a better start, and the walks begin
  again there (at most ``max_restarts`` times, the rounds' compiled batch unchanged).
  Without restarts left, the intervals refer to the lowest point and are flagged
  unreliable, and a side whose start is already past the threshold has no end (``nan``):
  never the zero-width interval a start outside the confidence region would give.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import chi2

import gradsolve as gs

from .._progress import progress_bar
from .._result import FitResult
from ..optimize._lm import CONVERGED, FAILED_START, LM_POLICY, LMKernel, MeshTerms
from ._petab import _objective_parts
from ._problem import is_petab

__all__ = ["profile", "ProfileResult", "ProfilePath"]

GROWTH = 3.0
"""A profile step is at most this many times the walk's previous step."""

REFINE = 3
"""Points a walk places after passing the threshold to locate the crossing (regula falsi),
at most; it stops earlier at one within ``tol`` of the threshold."""

_OVERSHOOT = 1.1
"""A walk whose next ratio target lies below the threshold aims at this times the
threshold (just past it: a short bracket for the refinement)."""

_REASONS = ("threshold", "bound", "max_steps", "failed", "not_optimum")


@dataclasses.dataclass(frozen=True)
class ProfilePath:
    """One parameter's profile: every point computed, sorted by the profiled value.

    Attributes:
        values: ``(k,)`` the profiled parameter's values, on its parameter scale (the
            optimum's among them).
        objective: ``(k,)`` the profile ``F_p``: the objective minimised over the other
            parameters with this one held at ``values`` (on kept meshes meeting the
            problem's tolerances).
        ratio: ``(k,)`` ``exp(-(objective - objective_opt))``, the likelihood ratio to
            the optimum (posterior ratio where the objective includes priors:
            ``ProfileResult.priors``).
        x: ``(k, D)`` every parameter at each point (``ProfileResult.all_parameter_ids``
            order; the profiled column is ``values``).
        converged: ``(k,)`` whether each point's inner Levenberg–Marquardt met its
            convergence test (otherwise ``objective`` is an upper bound of the profile).

    Example:
        >>> path = inference.profile(problem, res).paths["k"]
        >>> path.values, path.ratio
    """

    values: np.ndarray
    objective: np.ndarray
    ratio: np.ndarray
    x: np.ndarray
    converged: np.ndarray


@dataclasses.dataclass(frozen=True, repr=False)
class ProfileResult:
    """What `profile` returns: each parameter's likelihood-ratio interval and profile.

    Attributes:
        parameter_ids: the profiled parameters, in the problem's order.
        scales: ``{id: "lin" | "log" | "log10"}``, the scale of the values below.
        estimate: ``{id: value}`` the optimum the profiles start from, parameter scale:
            the fit's ``params``, or the point re-optimised from where a profile went
            below them (``n_restarts``).
        intervals: ``{id: (lower, upper)}`` the ``confidence`` interval on the parameter
            scale; ``-inf`` / ``inf`` on a side whose profile does not cross the
            threshold inside the bounds (nor within ``max_steps`` points); ``nan`` on a
            side that has no end because its start is past the threshold (only where
            ``reliable`` is false).
        identifiable: ``{id: (lower_side, upper_side)}`` whether the profile crossed the
            threshold on each side (Raue et al. 2009: a parameter is practically
            identifiable where both are true).
        stop_reasons: ``{id: (lower_side, upper_side)}`` why each walk stopped:
            ``"threshold"`` (crossed), ``"bound"`` (reached the parameter's bound below
            the threshold), ``"max_steps"``, or ``"failed"`` (the solve failed at the
            smallest step), or ``"not_optimum"`` (the start is past the threshold, so
            there is no end: only where ``reliable`` is false).
        paths: ``{id: ProfilePath}``.
        objective_opt: the objective the ratios and the threshold refer to: the
            objective at ``estimate``, or the lowest profile point where lower (within
            ``tol`` of it where ``reliable``).
        confidence: the level; threshold: ``chi2_1(confidence) / 2``, the rise of the
            objective (a negative log-likelihood) that bounds the interval.
        objective: ``"map"`` or ``"mle"``, the fit's.
        all_parameter_ids: the problem's parameter ids (columns of ``ProfilePath.x``).
        n_rounds: ensemble rounds (each: every walk's next point at once); n_evals,
            n_records: the LM's batched evaluations and mesh records.
        wall_time: seconds, compilation included.
        optimum: ``(D,)`` every parameter at ``estimate`` (``all_parameter_ids`` order).
        fit_objective: the objective at the fit's ``params`` (its loss); above
            ``objective_opt`` where the fit was not the optimum.
        n_restarts: times the profiles were restarted from a re-optimised point because
            a profile went more than ``tol`` below the point they started from.
        reliable: false where, the restarts spent, a profile still went more than
            ``tol`` below its start: the intervals are then relative to a point that is
            not the optimum.
        priors: whether the objective includes the table's priors (a ``"map"`` fit of a
            problem with priors): the ratios are then posterior ratios.
        notes: what the caller should know (the fit was not the optimum; the intervals
            are unreliable), each also given as a ``RuntimeWarning``.

    Example:
        >>> prof = inference.profile(problem, inference.fit(problem, n_starts=20))
        >>> prof.intervals["k"], prof.identifiable["k"]
        >>> prof.plot()
    """

    parameter_ids: tuple
    scales: dict
    estimate: dict
    intervals: dict
    identifiable: dict
    stop_reasons: dict
    paths: dict
    objective_opt: float
    confidence: float
    threshold: float
    objective: str
    all_parameter_ids: tuple
    n_rounds: int
    n_evals: int
    n_records: int
    wall_time: float
    optimum: np.ndarray
    fit_objective: float
    n_restarts: int
    reliable: bool
    priors: bool
    notes: tuple = ()

    def __repr__(self) -> str:
        extra = (f", {self.n_restarts} restart(s) from the fit's {self.fit_objective:.6g}"
                 if self.n_restarts else "") + ("" if self.reliable else ", UNRELIABLE")
        rows = [f"ProfileResult({self.confidence:g} intervals, {self.n_rounds} rounds, "
                f"{self.wall_time:.1f} s, objective {self.objective_opt:.6g}{extra}):"]
        for p in self.parameter_ids:
            lo, hi = self.intervals[p]
            rows.append(f"  {p} ({self.scales[p]}): {self.estimate[p]:.6g} in "
                        f"[{lo:.6g}, {hi:.6g}]  ({' / '.join(self.stop_reasons[p])})")
        return "\n".join(rows)

    def plot(self, parameters=None, *, axes=None, ncols: int = 3):
        """Each profile as pyPESTO draws it: the ratio ``exp(-(F_p - F_opt))`` against
        the parameter's value, the optimum marked, the threshold ``exp(-threshold)`` as a
        dashed line and the interval's finite ends as dotted lines.

        The ratio is a likelihood ratio (a posterior ratio where the objective includes
        the table's priors, ``priors``); an unreliable result says so in the legend's
        title. A new figure has a constrained layout, the
        y label on its first column only and one legend above the panels, so that long
        parameter ids do not run into the neighbouring panels.

        Args:
            parameters: ids to draw (default every profiled one).
            axes: matplotlib ``Axes``, one per parameter (``None``: a new figure with
                ``ncols`` columns).
            ncols: columns of the new figure.

        Returns:
            The ``Axes``, a flat array with one per parameter.

        Example:
            >>> axes = prof.plot(["k", "sigma"])
        """
        import matplotlib.pyplot as plt

        ids = list(self.parameter_ids if parameters is None else
                   ([parameters] if isinstance(parameters, str) else parameters))
        unknown = [p for p in ids if p not in self.paths]
        if unknown:
            raise ValueError(f"ProfileResult.plot: {unknown} were not profiled "
                             f"(profiled: {list(self.parameter_ids)})")
        new = axes is None
        if new:
            nc = max(1, min(int(ncols), len(ids)))
            nr = -(-len(ids) // nc)
            _, axes = plt.subplots(nr, nc, figsize=(3.4 * nc, 2.7 * nr + 0.4),
                                   squeeze=False, layout="constrained")
        axes = np.ravel(np.asarray(axes, dtype=object))
        if len(axes) < len(ids):
            raise ValueError(f"ProfileResult.plot: {len(ids)} parameters, {len(axes)} axes")
        what = "posterior ratio" if self.priors else "likelihood ratio"
        level = float(np.exp(-self.threshold))
        for ax, p in zip(axes, ids):
            path = self.paths[p]
            ax.plot(path.values, path.ratio, "-o", ms=3, lw=1.2, color="C0",
                    label="profile")
            # the start's own ratio: 1 unless the result is unreliable
            ax.plot([self.estimate[p]], [np.interp(self.estimate[p], path.values,
                                                   path.ratio)],
                    "o", color="C3", ms=5, zorder=3, label="estimate")
            ax.axhline(level, ls="--", color="k", lw=0.8,
                       label=f"{self.confidence:.0%} threshold")
            for end in self.intervals[p]:
                if np.isfinite(end):
                    ax.axvline(end, ls=":", color="0.4", lw=0.8, label="interval end")
            ax.set_xlabel(f"{p} ({self.scales[p]})")
            spec = ax.get_subplotspec()
            if spec is None or spec.is_first_col():
                ax.set_ylabel(what)
            ax.set_ylim(0.0, 1.05)
        for ax in axes[len(ids):]:
            ax.set_visible(False)
        handles, labels = axes[0].get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        title = None if self.reliable else \
            "unreliable: a profile went below the estimate (ProfileResult.notes)"
        if new:
            legend = axes[0].figure.legend(unique.values(), unique.keys(),
                                           loc="outside upper center", ncols=len(unique),
                                           fontsize="small", frameon=False, title=title)
        else:
            legend = axes[0].legend(unique.values(), unique.keys(), loc="upper left",
                                    fontsize="x-small", frameon=False, title=title,
                                    title_fontsize="x-small")
        if title:
            legend.get_title().set_color("C3")
        return axes[: len(ids)]


class _Walk:
    """One direction of one parameter's profile (host-side bookkeeping)."""

    def __init__(self, j: int, sign: int):
        self.j, self.sign = j, sign
        self.v, self.f, self.x, self.conv = [], [], [], []  # points, in walk order
        self.phase = "explore"  # then "refine", then "done"
        self.reason = None
        self.h = None  # the last step taken
        self.cap = np.inf  # the step limit after a failed solve
        self.n_explore = 0
        self.n_refine = 0

    def add(self, v, f, x, conv):
        self.v.append(float(v)), self.f.append(float(f))
        self.x.append(np.asarray(x, float)), self.conv.append(bool(conv))

    def stop(self, reason: str):
        self.phase, self.reason = "done", reason

    def sorted(self):
        """The points ordered by distance from the optimum: ``(d, v, f, x)``."""
        d = self.sign * (np.asarray(self.v) - self.v[0])
        order = np.argsort(d, kind="stable")
        return (d[order], np.asarray(self.v)[order], np.asarray(self.f)[order],
                np.stack(self.x)[order])


def _crossing(walk: _Walk, f_ref: float, threshold: float):
    """``(index of the first point past the threshold, interpolated crossing value)`` along
    the walk, or ``None``: ``sqrt(F_p - f_ref)`` interpolated linearly between the two
    points around the first crossing (exact where the profile is quadratic)."""
    d, v, f, _ = walk.sorted()
    past = np.flatnonzero(f - f_ref >= threshold)
    if not len(past):
        return None
    i = int(past[0])
    if i == 0:
        return 0, v[0]
    q0, q1 = np.sqrt(max(f[i - 1] - f_ref, 0.0)), np.sqrt(f[i] - f_ref)
    t = (np.sqrt(threshold) - q0) / (q1 - q0) if q1 > q0 else 1.0
    return i, float(v[i - 1] + np.clip(t, 0.0, 1.0) * (v[i] - v[i - 1]))


def _propose(walk: _Walk, f_ref, threshold, lo, hi, *, first_step, min_step, max_step,
             ratio_step):
    """The walk's next value and its warm start ``(D,)``, or ``None`` (done)."""
    j, s = walk.j, walk.sign
    if walk.phase == "refine":
        d, v, f, x = walk.sorted()
        c = _crossing(walk, f_ref, threshold)
        if c is None or c[0] == 0:
            return None
        i = c[0]
        q0, q1 = np.sqrt(max(f[i - 1] - f_ref, 0.0)), np.sqrt(f[i] - f_ref)
        t = float(np.clip((np.sqrt(threshold) - q0) / (q1 - q0), 0.02, 0.98))
        value = v[i - 1] + t * (v[i] - v[i - 1])
        if abs(v[i] - v[i - 1]) <= 1e-12 * (1.0 + abs(value)):
            return None
        x0 = x[i - 1] + t * (x[i] - x[i - 1])
    else:
        df = walk.f[-1] - f_ref
        r_target = np.exp(-max(df, 0.0)) - ratio_step
        target = -np.log(r_target) if r_target > np.exp(-threshold) else \
            _OVERSHOOT * threshold
        if len(walk.v) == 1:
            h = first_step
        else:
            dk = s * (walk.v[-1] - walk.v[-2])
            q1 = np.sqrt(max(df, 0.0))
            q0 = np.sqrt(max(walk.f[-2] - f_ref, 0.0))
            slope = (q1 - q0) / dk
            h = (np.sqrt(target) - q1) / slope if slope > 0 else np.inf
            h = min(h, GROWTH * walk.h)
        h = float(np.clip(min(h, walk.cap), min_step, max_step))
        value = float(np.clip(walk.v[-1] + s * h, lo[j], hi[j]))
        x0 = walk.x[-1]
        if len(walk.v) > 1:
            # first order along the path: the others move as they did over the last step
            x0 = x0 + (walk.x[-1] - walk.x[-2]) * ((value - walk.v[-1])
                                                  / (walk.v[-1] - walk.v[-2]))
    x0 = np.clip(np.asarray(x0, float), lo, hi)
    x0[j] = value
    return value, x0


def _longest_condition(mesh):
    """Each row's cost: its longest condition's steps (`MeshTerms.cost`)."""
    return np.max(np.asarray(mesh.n_steps), axis=-1)


def _kernel(problem, objective: str, *, ftol: float):
    """The LM over rows ``(x (D,), j)`` that holds ``x_j``: (kernel, objective constant)."""
    _, lap, penalty, const = _objective_parts(problem, objective)
    d = len(problem.parameter_ids)
    lo, hi = (np.asarray(b, float) for b in problem.bounds)

    def held(xe):
        x, j = xe[:d], jax.lax.stop_gradient(xe[d])
        fixed = jnp.arange(d) == jnp.round(j).astype(jnp.int32)
        return jnp.where(fixed, jax.lax.stop_gradient(x), x)

    def record(xe):
        return problem.record(held(xe), LM_POLICY.record_tol_factor)

    def terms_on(xe, mesh):
        z, s, err = problem.replay_residuals(held(xe), mesh)
        return z, s, LM_POLICY.error_ratio(err)

    # several conditions: rows evaluated in groups of similar mesh length, as in the fit
    cost = _longest_condition if len(problem.condition_ids) > 1 else None
    pen = None if penalty is None else (lambda xe: penalty(held(xe)))
    kernel = LMKernel(None, lap, pen, lower=np.append(lo, 0.0), upper=np.append(hi, d),
                      mesh_terms=MeshTerms(record, terms_on, cost), ftol=ftol,
                      gtol=1e-6, policy=LM_POLICY)
    return kernel, const


def _check(problem, result, confidence, parameters, numbers):
    """The profiled indices and the fit's point ``(D,)``; every bad argument named."""
    if not is_petab(problem):
        raise TypeError("inference.profile: `problem` must be a models.PetabProblem, got "
                        f"{type(problem).__name__}")
    if not isinstance(result, FitResult):
        raise TypeError("inference.profile: `result` must be the FitResult of "
                        f"inference.fit(problem, ...), got {type(result).__name__}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)) \
            or not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"inference.profile: `confidence` must be in (0, 1), got "
                         f"{confidence!r}")
    for name, v, kind in numbers:
        if kind in ("int", "count"):
            ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool) and \
                v >= (1 if kind == "int" else 0)
            want = "an int >= 1" if kind == "int" else "an int >= 0"
        else:
            ok = isinstance(v, (int, float, np.integer, np.floating)) and \
                not isinstance(v, bool) and bool(np.isfinite(v)) and v > 0
            want = "a number > 0"
        if not ok:
            raise ValueError(f"inference.profile: `{name}` must be {want}, got {v!r}")
    ids = tuple(problem.parameter_ids)
    inner = tuple(problem.inner_parameter_ids)
    if result.objective not in ("map", "mle"):
        raise ValueError(f"inference.profile: `result` has objective {result.objective!r}; "
                         "a PEtab fit's is 'map' or 'mle'")
    theirs = tuple(result.parameter_ids) if result.parameter_ids is not None else \
        tuple(result.params)
    if theirs != ids:
        extra = [p for p in theirs if p not in ids]
        missing = [p for p in ids if p not in theirs]
        how = ("; it was fitted without hierarchical optimisation: profile it on "
               "problem.full" if inner and set(theirs) == set(problem.full_parameter_ids)
               else "")
        raise ValueError("inference.profile: `result` is a fit of another problem: "
                         + (f"it estimates {extra}, which this problem does not"
                            if extra else "") + ("; " if extra and missing else "")
                         + (f"it lacks {missing}" if missing else "")
                         + ("" if extra or missing else
                            f"its parameters are in another order {list(theirs)}")
                         + f" (the problem's: {list(ids)}){how}")
    x = np.array([float(np.asarray(result.params[p])) for p in ids])
    bad = [p for p, v in zip(ids, x) if not np.isfinite(v)]
    if bad:
        raise ValueError(f"inference.profile: `result`'s params {bad} are not finite "
                         "(a failed fit)")
    lo, hi = (np.asarray(b, float) for b in problem.bounds)
    outside = [p for p, a, b, v in zip(ids, lo, hi, x) if not (a <= v <= b)]
    if outside:
        raise ValueError(f"inference.profile: `result` is a fit of another problem: "
                         f"{outside} lie outside the problem's bounds")
    if parameters is None:
        which = list(range(len(ids)))
    else:
        try:
            names = [parameters] if isinstance(parameters, str) else list(parameters)
        except TypeError:  # not iterable: reported below
            names = [parameters]
        odd = [p for p in names if not isinstance(p, str)]
        if odd or not names:
            raise ValueError(f"inference.profile: `parameters` must be parameter ids "
                             f"(strings), got {parameters!r} (the problem's: {list(ids)})")
        hier = [p for p in names if p in inner]
        if hier:
            kinds = ", ".join(f"'{p}' ({problem.inner_kinds[p]})" for p in hier)
            raise ValueError(
                f"inference.profile: `parameters`: {kinds} "
                f"{'is an inner parameter' if len(hier) == 1 else 'are inner parameters'} "
                "of hierarchical optimisation: computed in closed form at every point (so "
                "profiled out, not profiled). To profile it, load the problem without "
                "hierarchical optimisation, models.load_petab(..., hierarchical=False) "
                "(or problem.full), and fit and profile that")
        unknown = [p for p in names if p not in ids]
        if unknown:
            verb = "is not a parameter" if len(unknown) == 1 else "are not parameters"
            raise ValueError(f"inference.profile: `parameters`: {unknown} {verb} of the "
                             f"problem (its estimated parameters: {list(ids)})")
        which = sorted({ids.index(p) for p in names})
    if np.asarray(problem.residual_layout().laplace).any():
        raise NotImplementedError("inference.profile: the profiles run the batched "
                                  "Levenberg-Marquardt, which needs normal noise; this "
                                  "problem has Laplace noise")
    return which, x


def profile(problem, result: FitResult, *, confidence: float = 0.95, parameters=None,
            max_steps: int = 50, first_step: float = 0.01, min_step: float = 1e-3,
            max_step: float = 1.0, ratio_step: float = 0.1, tol: float = 1e-3,
            max_iter: int = 200, max_restarts: int = 2,
            progress: bool | None = None) -> ProfileResult:
    """Profile likelihoods and likelihood-ratio intervals of a PEtab problem's parameters
    (Raue et al. 2009, Bioinformatics 25:1923; pyPESTO's ``pypesto.profile``).

    For each parameter ``x_j`` the profile ``F_p(v) = min {F(x): x_j = v}`` of the fit's
    objective ``F`` is traced from the optimum both ways, on the parameter scale, until
    ``F_p - F_opt`` passes ``chi2_1(confidence) / 2``; the interval is where it stays
    below. All parameters' walks in both directions advance as one ensemble, every round
    re-optimising each walk's next point with the batched bounded Levenberg–Marquardt of
    `inference.fit` (module docstring: the steps, the crossing, the stops).

    The intervals are only meaningful relative to the optimum: where a profile point lies
    more than ``tol`` below the objective at ``result.params`` (the fit stopped short of
    the optimum, or in another basin), the walks are abandoned, every parameter is
    re-optimised from the lowest points found, and the profiles start again from that
    better point (at most ``max_restarts`` times); ``estimate`` and ``objective_opt`` are
    then that point's, ``fit_objective`` the fit's, and a ``RuntimeWarning`` and ``notes``
    give both objective values. If the restarts run out and a profile still goes below the
    point it started from, the ratios refer to the lowest point found, ``reliable`` is
    false, and a side whose start already lies past the threshold has a ``nan`` end
    (``stop_reasons`` ``"not_optimum"``).

    With hierarchical optimisation (`models.load_petab`'s default) the profiled
    parameters are the outer ones; the inner ones (scalings, offsets, noise) are
    re-optimised in closed form at every point, as profiling requires (load with
    ``hierarchical=False`` to profile them too).

    Args:
        problem: the `models.PetabProblem` (normal noise).
        result: ``inference.fit(problem, ...)``'s `FitResult`: ``params`` is where the
            profiles start (re-optimised first if it is not the optimum, above) and
            ``objective`` (``"map"`` or ``"mle"``) the profiled objective; its loss is
            checked against the problem's objective there.
        confidence: the interval's level, in (0, 1).
        parameters: the ids to profile (one id or several; default all).
        max_steps: points per direction before a side is given up as open (refinement
            points not counted).
        first_step, min_step, max_step: the first step and the steps' range, on the
            parameter scale (pyPESTO's defaults: 0.01, 0.001, 1).
        ratio_step: how far each step aims to lower the ratio ``exp(-(F_p - F_opt))``
            (pyPESTO's ``delta_ratio_max``).
        tol: the crossing is located to ``|F_p - F_opt - threshold| <= tol`` (at most
            `REFINE` points), then interpolated; a profile point more than ``tol`` below
            the optimum restarts the profiles from a re-optimised point (above). Below
            half the threshold (the default 1e-3: a confidence of 0.0505 or more).
        max_iter: LM iterations per profile point (and per re-optimisation).
        max_restarts: re-optimisations at most (0: none; the result is then marked
            unreliable where a profile goes below the start).
        progress: a progress bar (default: only on a terminal).

    Returns:
        A `ProfileResult`: ``intervals`` by id on the parameter scale (``+-inf`` on an open
        side), ``identifiable`` per side, the paths, ``reliable``, and ``plot()``.

    Raises:
        ValueError: a bad argument, named: an id that is not a parameter of the problem
            (an inner parameter of hierarchical optimisation says so), a result of another
            problem (other parameter ids, params outside the bounds or not finite, a loss
            that is not this problem's objective at its params).

    Why one ensemble: a profile point costs an LM run of several evaluations, and an
    evaluation of many rows costs little more than one of a few (one condition of
    Boehm_JProteomeRes2014: 5 rows 90 ms, 20 rows 161 ms, ``petab/_petab.py``); batched,
    Boehm's 6 profiles (hierarchical: 12 walks, 130 points) took 15 rounds and 173
    evaluations from its optimum; from the 145.76 local optimum, one restart more and the
    same intervals to 3e-8 of their widths (``benchmarks/bench_petab_profile.py``).

    Example:
        >>> problem = models.load_petab("Boehm_JProteomeRes2014")
        >>> res = inference.fit(problem, n_starts=20)
        >>> prof = inference.profile(problem, res)
        >>> prof.intervals["Epo_degradation_BaF3"]
        >>> prof.plot()
    """
    t0 = time.perf_counter()
    gs.ensure_compilation_cache()
    which, x_fit = _check(problem, result, confidence, parameters, (
        ("max_steps", max_steps, "int"), ("max_iter", max_iter, "int"),
        ("max_restarts", max_restarts, "count"),
        ("first_step", first_step, "float"), ("min_step", min_step, "float"),
        ("max_step", max_step, "float"), ("ratio_step", ratio_step, "float"),
        ("tol", tol, "float")))
    if not (min_step <= max_step and ratio_step < 1.0):
        raise ValueError(f"inference.profile: need min_step <= max_step and ratio_step < 1, "
                         f"got {min_step}, {max_step}, {ratio_step}")
    ids = tuple(problem.parameter_ids)
    d = len(ids)
    objective = result.objective
    threshold = float(chi2.ppf(float(confidence), 1)) / 2.0
    if not tol < threshold / 2:
        raise ValueError(f"inference.profile: `tol` {tol:g} must be below half the "
                         f"threshold, {threshold:.3g} at confidence {confidence:g}: the "
                         "crossing cannot be located more coarsely than the rise it marks")
    lo, hi = (np.asarray(b, float) for b in problem.bounds)

    # the fit's loss must be this problem's objective at its optimum (a fresh solve, as
    # the fit's losses are)
    f_fit = _objective_at(problem, x_fit, objective)
    if not abs(f_fit - result.loss) <= 1e-6 * (1.0 + abs(result.loss)):
        raise ValueError(f"inference.profile: `result` is a fit of another problem: its "
                         f"loss {result.loss:.8g}, this problem's objective at its "
                         f"params {f_fit:.8g}")

    kernel, const = _kernel(problem, objective, ftol=1e-8)
    n = 2 * len(which)

    def run(points, held):
        """The LM of ``n`` rows from ``points (n, D)``, row ``r`` holding coordinate
        ``held[r]`` (``d``: none): (objective (n,), points (n, D), codes (n,))."""
        xe = np.concatenate([points, np.asarray(held, float)[:, None]], axis=1)
        s, _ = kernel.run(xe, int(max_iter))
        return np.asarray(s.f) - const, np.asarray(s.x)[:, :d], np.asarray(s.code)

    steps = dict(first_step=first_step, min_step=min_step, max_step=max_step,
                 ratio_step=ratio_step)
    bar = progress_bar(progress, total=int(max_steps) + REFINE + 1, done=0,
                       desc="profile PEtab")
    x_opt, f_opt, rounds, starts = x_fit, f_fit, 0, [(x_fit, f_fit)]
    try:
        while True:
            # below this, the start is not the optimum: re-optimise (while restarts last)
            floor = f_opt - tol if len(starts) <= max_restarts else -np.inf
            walks, f_ref, k = _trace(run, which, x_opt, f_opt, floor, lo, hi, threshold,
                                     int(max_steps), tol, steps, bar)
            rounds += k
            if f_ref >= floor:
                break
            # every parameter free (held index d) from each walk's lowest point
            f, x, code = run(np.stack([w.x[int(np.argmin(w.f))] for w in walks]),
                             [d] * n)
            rounds += 1
            f = np.where((code != FAILED_START) & np.isfinite(f), f, np.inf)
            low = min(walks, key=lambda w: min(w.f))
            i = int(np.argmin(low.f))
            x_opt = x[int(np.argmin(f))] if np.min(f) <= low.f[i] else low.x[i]
            f_opt = _objective_at(problem, x_opt, objective)
            starts.append((x_opt, f_opt))
            bar.set_postfix(restarts=len(starts) - 1, objective=f"{f_opt:.6f}")
    finally:
        bar.close()

    return _result(problem, result, walks, which, starts, f_ref, tol, confidence,
                   threshold, objective, rounds, kernel, time.perf_counter() - t0)


def _objective_at(problem, x, objective: str) -> float:
    """The profiled objective at ``x (D,)`` from a fresh solve (as the fit's losses are):
    the negative log-likelihood, minus the table's priors for ``"map"``."""
    penalty = _objective_parts(problem, objective)[2]  # the fit's own prior term
    return -float(problem.log_likelihood(x)) + (0.0 if penalty is None else float(penalty(x)))


def _trace(run, which, x_opt, f_opt, floor, lo, hi, threshold, max_steps, tol, steps,
           bar):
    """Every walk of the profiles of ``which`` from ``x_opt`` (objective ``f_opt``), in
    rounds, until all are done or a point goes below ``floor``: (walks, lowest objective
    seen, rounds)."""
    walks = [_Walk(j, s) for j in which for s in (-1, 1)]
    n = len(walks)
    # round 0: each walk's first point, the optimum re-optimised with x_j held
    f, x, code = run(np.repeat(x_opt[None], n, axis=0), [w.j for w in walks])
    rounds = 1
    bar.update(1)
    for w, fi, xi, ci in zip(walks, f, x, code):
        ok = ci != FAILED_START and np.isfinite(fi)
        w.add(x_opt[w.j], fi if ok else f_opt, xi if ok else x_opt, ci == CONVERGED)
        if x_opt[w.j] <= lo[w.j] if w.sign < 0 else x_opt[w.j] >= hi[w.j]:
            w.stop("bound")
    f_ref = min(f_opt, min(w.f[0] for w in walks))
    while f_ref >= floor:
        proposals = {}
        for r, w in enumerate(walks):
            if w.phase == "done":
                continue
            p = _propose(w, f_ref, threshold, lo, hi, **steps)
            if p is None:
                w.stop("threshold")
            else:
                proposals[r] = p
        if not proposals:
            break
        # a finished walk's row repeats a running one's (the same path: no iterations
        # added), so that every round runs the same compiled batch
        active = sorted(proposals)
        src = [r if r in proposals else active[r % len(active)] for r in range(n)]
        f, x, code = run(np.stack([proposals[r][1] for r in src]),
                         [walks[r].j for r in src])
        rounds += 1
        bar.update(1)
        for r in active:
            _advance(walks[r], proposals[r][0], f[r], x[r], code[r], f_ref, threshold,
                     lo, hi, max_steps, tol, steps["min_step"])
        f_ref = min(f_ref, min(min(w.f) for w in walks))
    return walks, f_ref, rounds


def _advance(w: _Walk, value, f, x, code, f_ref, threshold, lo, hi, max_steps, tol,
             min_step):
    """Take a round's point (at ``value``) into its walk and decide the walk's next phase."""
    j = w.j
    if code == FAILED_START or not np.isfinite(f):
        if w.phase == "refine":
            w.stop("threshold")  # keep the bracket found
            return
        step = abs(value - w.v[-1])
        if step <= min_step * (1.0 + 1e-9):
            w.stop("failed")
        else:
            w.cap = step / 2.0
        return
    # (the LM leaves the held coordinate exactly at ``value``: zero gradient and curvature)
    w.add(value, f, x, code == CONVERGED)
    if w.phase == "refine":
        w.n_refine += 1
        if abs(f - f_ref - threshold) <= tol or w.n_refine >= REFINE:
            w.stop("threshold")
        return
    w.h = abs(value - w.v[-2])
    w.cap = np.inf
    w.n_explore += 1
    if f - f_ref >= threshold:
        if abs(f - f_ref - threshold) <= tol:
            w.stop("threshold")
        else:
            w.phase = "refine"
    elif (w.sign < 0 and value <= lo[j]) or (w.sign > 0 and value >= hi[j]):
        w.stop("bound")
    elif w.n_explore >= max_steps:
        w.stop("max_steps")


def _result(problem, result, walks, which, starts, f_ref, tol, confidence, threshold,
            objective, rounds, kernel, wall) -> ProfileResult:
    ids = tuple(problem.parameter_ids)
    (x_fit, f_fit), (x_opt, f_opt) = starts[0], starts[-1]
    notes = []
    if len(starts) > 1:
        notes.append(
            f"`result` is not the optimum: its objective is {f_fit:.6f}, and profiles went "
            f"lower; re-optimised {len(starts) - 1} time(s) from their lowest points, the "
            f"profiles start from objective {f_opt:.6f} (`estimate`, `optimum`; refit, "
            "e.g. inference.fit(problem, init=...), or use more starts)")
    reliable = not f_ref < f_opt - tol
    if not reliable:
        lowest = min(walks, key=lambda w: min(w.f))
        notes.append(
            f"the profile of {ids[lowest.j]} reached objective {f_ref:.6f}, below the "
            f"{f_opt:.6f} at the point it started from"
            + (f", after {len(starts) - 1} re-optimisation(s)" if len(starts) > 1 else "")
            + ": the intervals are not reliable; the ratios refer to the lowest point, and "
            "a side whose start already lies past the threshold has no end (nan)")
    for msg in notes:
        warnings.warn(f"inference.profile: {msg}", RuntimeWarning, stacklevel=3)
    intervals, identifiable, reasons, paths = {}, {}, {}, {}
    for j in which:
        pid = ids[j]
        ends, found, why = [], [], []
        for w in walks:
            if w.j != j:
                continue
            c = _crossing(w, f_ref, threshold)
            if c is not None and c[0] == 0:  # the start itself is past the threshold
                ends.append(np.nan), found.append(False), why.append("not_optimum")
                continue
            found.append(c is not None)
            ends.append(c[1] if c is not None else w.sign * np.inf)
            why.append("threshold" if c is not None else
                       (w.reason if w.reason != "threshold" else "failed"))
        intervals[pid] = (float(ends[0]), float(ends[1]))
        identifiable[pid] = (bool(found[0]), bool(found[1]))
        reasons[pid] = tuple(why)
        lower, upper = [w for w in walks if w.j == j]
        v = np.concatenate([lower.v[1:], upper.v])
        f = np.concatenate([lower.f[1:], upper.f])
        xs = np.concatenate([np.reshape(lower.x[1:], (-1, len(ids))), np.stack(upper.x)])
        conv = np.concatenate([lower.conv[1:], upper.conv]).astype(bool)
        order = np.argsort(v, kind="stable")
        paths[pid] = ProfilePath(values=v[order], objective=f[order],
                                 ratio=np.exp(-(f[order] - f_ref)), x=xs[order],
                                 converged=conv[order])
    profiled = tuple(ids[j] for j in which)
    scales = tuple(problem.scales)
    return ProfileResult(
        parameter_ids=profiled, scales={ids[j]: scales[j] for j in which},
        estimate={ids[j]: float(x_opt[j]) for j in which}, intervals=intervals,
        identifiable=identifiable, stop_reasons=reasons, paths=paths,
        objective_opt=float(f_ref), confidence=float(confidence), threshold=threshold,
        objective=objective, all_parameter_ids=ids, n_rounds=rounds,
        n_evals=kernel.n_evals, n_records=kernel.n_records, wall_time=wall,
        optimum=np.asarray(x_opt, float), fit_objective=float(f_fit),
        n_restarts=len(starts) - 1, reliable=bool(reliable),
        priors=objective == "map" and bool(np.any(problem.priors.given)),
        notes=tuple(notes))
