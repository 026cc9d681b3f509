"""`profile`: profile likelihoods and likelihood-ratio intervals of any problem's parameters.

The profile of coordinate ``j`` is ``F_p(v) = min { F(u) : u_j = v }``, ``F`` the objective
a fit minimises (`AbstractProblem.objective`: the negative log-likelihood, plus the negative
log prior for a ``"map"`` fit; half the OFV of a population fit). Where ``F_p(v) - F_opt``
stays below ``chi2_1(confidence) / 2`` (1.92 for 95 %) is the likelihood-ratio confidence
interval of ``u_j``; a side on which the profile does not cross that threshold inside the
bounds is open, and the parameter is not identifiable on that side (Raue et al. 2009,
"Structural and practical identifiability analysis of partially observed dynamical models
by exploiting the profile likelihood", Bioinformatics 25:1923; pyPESTO's
``pypesto.profile``; for population models PsN's ``llp``). Unlike a Wald interval it
follows the objective where it is not quadratic, and it is invariant to
reparametrisation: the interval of ``log k`` is the log of the interval of ``k``.

How it runs (`inference.profiles._walks`, `inference.profiles._inner`):

- Every profiled coordinate is walked in both directions from the optimum, and all those
  walks are ONE ensemble: each round proposes every walk's next value, and one inner run
  re-optimises the other coordinates of every walk at once, each warm-started from its
  walk's last point, moved along the path (first order). Where the problem's objective
  has the Levenberg–Marquardt's form (`AbstractProblem.residual_terms`: PEtab) that run
  is one batched bounded LM on kept meshes, as `inference.fit` uses it; otherwise SciPy's
  L-BFGS-B per walk on the problem's exact gradient.
- Steps are adaptive on the coordinate's scale (pyPESTO's rule, ``delta_ratio_max``): each
  aims to lower the ratio ``exp(-(F_p - F_opt))`` by ``ratio_step``, predicted by
  extrapolating ``sqrt(F_p - F_opt)`` linearly in the value (exact for a quadratic
  profile), at most ``GROWTH`` times the last step, within ``[min_step, max_step]``;
  halved where a solve fails.
- A walk stops where its profile passes the threshold, then places up to ``REFINE``
  points by regula falsi on ``sqrt(F_p - F_opt) - sqrt(threshold)`` until one lies within
  ``tol`` of the threshold; the interval end is that function's linear interpolation
  between the points bracketing the crossing. A walk also stops at the bound (open side),
  after ``max_steps`` points (open side) or where the solve fails at the smallest step.
- The intervals need the optimum: a point more than ``tol`` below the one the walks
  started from (a fit stopped short of the optimum, or in another basin) abandons them;
  one more inner run with every coordinate free, from each walk's lowest point, gives a
  better start, and the walks begin again there (at most ``max_restarts`` times).
  Without restarts left, the intervals refer to the lowest point and are flagged
  unreliable, and a side whose start is already past the threshold has no end (``nan``):
  never the zero-width interval a start outside the confidence region would give.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from scipy.stats import chi2

import gradsolve as gs

from .._progress import progress_bar
from .._result import FitResult
from ..optimize._lm import FAILED_START
from ..problem._abstract import AbstractProblem
from ._inner import host_runner, lm_runner
from ._result import ProfilePath, ProfileResult
from ._walks import REFINE, crossing, trace

__all__ = ["profile"]


def profile(problem, result, data=None, *, confidence: float = 0.95, parameters=None,
            max_steps: int = 50, first_step: float = 0.01, min_step: float = 1e-3,
            max_step: float = 1.0, ratio_step: float = 0.1, tol: float = 1e-3,
            max_iter: int = 200, max_restarts: int = 2, progress: bool | None = None,
            solver=None, rtol: float | None = None, atol: float | None = None
            ) -> ProfileResult:
    """Profile likelihoods and likelihood-ratio intervals of a problem's parameters (Raue
    et al. 2009, Bioinformatics 25:1923; pyPESTO's ``pypesto.profile``), for every kind of
    problem: a `models.ODEModel` and its data, a NumPyro program with `inference.ode`
    sites, a population model fitted by `fit_population`, a `models.PetabProblem`.

    For each coordinate ``u_j`` the profile ``F_p(v) = min {F(u): u_j = v}`` of the fit's
    objective ``F`` is traced from the optimum both ways until ``F_p - F_opt`` passes
    ``chi2_1(confidence) / 2``; the interval is where it stays below. All walks advance as
    one ensemble, every round re-optimising each walk's next point at once (the batched
    bounded Levenberg–Marquardt where the objective is a sum of weighted residuals, as for
    PEtab; L-BFGS-B on exact gradients otherwise). The module docstring says how the steps,
    the crossing and the stops are chosen.

    The coordinates are those a fit moves in (``ProfileResult.scales``): a PEtab table's
    parameter scales; the unconstrained coordinates of an ODE model or a program (a
    positive parameter's natural log); `fit_population`'s outer vector.

    The intervals are only meaningful relative to the optimum: where a profile point lies
    more than ``tol`` below the objective at the fit's point (the fit stopped short of the
    optimum, or in another basin), the walks are abandoned, every coordinate is
    re-optimised from the lowest points found, and the profiles start again from that
    better point (at most ``max_restarts`` times); ``estimate`` and ``objective_opt`` are
    then that point's, ``fit_objective`` the fit's, and a ``RuntimeWarning`` and ``notes``
    give both objective values. If the restarts run out and a profile still goes below the
    point it started from, the ratios refer to the lowest point found, ``reliable`` is
    false, and a side whose start already lies past the threshold has a ``nan`` end
    (``stop_reasons`` ``"not_optimum"``).

    With PEtab's hierarchical optimisation (`models.load_petab`'s default) the profiled
    parameters are the outer ones; the inner ones (scalings, offsets, noise) are
    re-optimised in closed form at every point (load with ``hierarchical=False`` to
    profile them too).

    Args:
        problem: what was fitted: a `models.PetabProblem` (it carries its data), a
            `models.ODEModel` or a NumPyro program (with ``data``), a population model
            (with ``data`` and a `PopulationFit`), or any `AbstractProblem`.
        result: the fit: ``inference.fit(...)``'s `FitResult` (its ``params`` where the
            profiles start, re-optimised first if not the optimum; its ``objective``,
            ``"map"`` or ``"mle"``, the profiled objective; its loss checked against the
            problem's objective there) or ``inference.fit_population(...)``'s
            `PopulationFit` (its OFV checked likewise).
        data: the data fitted (an ODE model's `models.Dataset`, a program's argument, a
            population's `models.PopulationDataset`); ``None`` for PEtab.
        confidence: the interval's level, in (0, 1).
        parameters: the coordinates to profile, by name (one or several: ``"alpha"``,
            ``"omega[1]"``, or a vector site's name for all its elements); default all.
        max_steps: points per direction before a side is given up as open (refinement
            points not counted).
        first_step, min_step, max_step: the first step and the steps' range, on the
            coordinate's scale (pyPESTO's defaults: 0.01, 0.001, 1).
        ratio_step: how far each step aims to lower the ratio ``exp(-(F_p - F_opt))``
            (pyPESTO's ``delta_ratio_max``).
        tol: the crossing is located to ``|F_p - F_opt - threshold| <= tol`` (at most
            ``REFINE`` points), then interpolated; a profile point more than ``tol`` below
            the optimum restarts the profiles from a re-optimised point (above). Below
            half the threshold (the default 1e-3: a confidence of 0.0505 or more).
        max_iter: inner iterations per profile point (and per re-optimisation).
        max_restarts: re-optimisations at most (0: none; the result is then marked
            unreliable where a profile goes below the start).
        progress: a progress bar (default: only on a terminal).
        solver, rtol, atol: the ODE solves, as the fit's (``None``: a PEtab problem's
            own; `inference.TOLERANCES` for a model or a program; `fit_population`'s
            defaults for a population model). Pass the fit's own.

    Returns:
        A `ProfileResult`: ``intervals`` by name on ``scales`` (``+-inf`` on an open
        side), ``identifiable`` per side, the paths, ``reliable``, and ``plot()``.

    Raises:
        ValueError: a bad argument, named: a name that is not a coordinate of the problem
            (a PEtab inner parameter says so), a result of another problem (other
            parameters, a point outside the bounds or not finite, a loss that is not this
            problem's objective at its point), bad numbers (reversed step bounds, a zero
            step).

    Why one ensemble: a profile point costs an inner optimisation of several evaluations,
    and a batched evaluation of many rows costs little more than one of a few (one
    condition of Boehm_JProteomeRes2014: 5 rows 90 ms, 20 rows 161 ms); batched, Boehm's 6
    profiles (12 walks, 130 points) took 15 rounds and 173 evaluations from its optimum
    (``benchmarks/bench_petab_profile.py``).

    Example:
        >>> res = inference.fit(model, data, n_starts=8)
        >>> prof = inference.profile(model, res, data)
        >>> prof.intervals["alpha"]          # of log(alpha): ``prof.scales["alpha"]``
        >>> problem = models.load_petab("Boehm_JProteomeRes2014")
        >>> prof = inference.profile(problem, inference.fit(problem, n_starts=20))
        >>> prof.plot()
    """
    t0 = time.perf_counter()
    gs.ensure_compilation_cache()
    _check_numbers(confidence, (
        ("max_steps", max_steps, "int"), ("max_iter", max_iter, "int"),
        ("max_restarts", max_restarts, "count"),
        ("first_step", first_step, "float"), ("min_step", min_step, "float"),
        ("max_step", max_step, "float"), ("ratio_step", ratio_step, "float"),
        ("tol", tol, "float")))
    if not min_step <= max_step:
        raise ValueError(f"inference.profile: `min_step` {min_step:g} is above `max_step` "
                         f"{max_step:g} (reversed bounds of the step)")
    if not ratio_step < 1.0:
        raise ValueError(f"inference.profile: `ratio_step` must be below 1, got {ratio_step}")
    threshold = float(chi2.ppf(float(confidence), 1)) / 2.0
    if not tol < threshold / 2:
        raise ValueError(f"inference.profile: `tol` {tol:g} must be below half the "
                         f"threshold, {threshold:.3g} at confidence {confidence:g}: the "
                         "crossing cannot be located more coarsely than the rise it marks")
    problem, objective, x_fit, f_claimed, f_tol = _problem_and_point(
        problem, result, data, solver, rtol, atol)
    prior = objective == "map"
    ids = tuple(problem.names())
    d = len(ids)
    which = _which(problem, ids, parameters)
    lo, hi = (np.asarray(b, float) for b in problem.bounds())
    reversed_ = [p for p, a, b in zip(ids, lo, hi) if not a < b]
    if reversed_:
        raise ValueError(f"inference.profile: the problem's bounds of {reversed_} are "
                         "reversed or empty (lower >= upper): a coordinate needs room to "
                         "move")
    outside = [p for p, a, b, v in zip(ids, lo, hi, x_fit) if not a <= v <= b]
    if outside:
        raise ValueError(f"inference.profile: `result` is a fit of another problem: "
                         f"{outside} lie outside the problem's bounds")

    # the fit's loss must be this problem's objective at its point (a fresh solve)
    f_fit = _objective_at(problem, x_fit, prior)
    if not abs(f_fit - f_claimed) <= f_tol * (1.0 + abs(f_claimed)):
        raise ValueError(f"inference.profile: `result` is a fit of another problem (or "
                         f"of other settings): its objective {f_claimed:.8g}, this "
                         f"problem's at its point {f_fit:.8g}")

    terms = problem.residual_terms(prior=prior)
    if terms is not None and not np.any(np.asarray(
            terms.laplace if terms.laplace is not None else False)):
        run, counts = lm_runner(problem, terms, max_iter, ftol=1e-8)
    else:
        run, counts = host_runner(problem, prior, max_iter)
    n = 2 * len(which)

    steps = dict(first_step=first_step, min_step=min_step, max_step=max_step,
                 ratio_step=ratio_step)
    bar = progress_bar(progress, total=int(max_steps) + REFINE + 1, done=0,
                       desc="profile")
    x_opt, f_opt, rounds, starts = x_fit, f_fit, 0, [(x_fit, f_fit)]
    try:
        while True:
            # below this, the start is not the optimum: re-optimise (while restarts last)
            floor = f_opt - tol if len(starts) <= max_restarts else -np.inf
            walks, f_ref, k = trace(run, which, x_opt, f_opt, floor, lo, hi, threshold,
                                    int(max_steps), tol, steps, bar)
            rounds += k
            if f_ref >= floor:
                break
            # every coordinate free (held index d) from each walk's lowest point
            f, x, code = run(np.stack([w.x[int(np.argmin(w.f))] for w in walks]), [d] * n)
            rounds += 1
            f = np.where((code != FAILED_START) & np.isfinite(f), f, np.inf)
            low = min(walks, key=lambda w: min(w.f))
            i = int(np.argmin(low.f))
            x_opt = x[int(np.argmin(f))] if np.min(f) <= low.f[i] else low.x[i]
            f_opt = _objective_at(problem, x_opt, prior)
            starts.append((x_opt, f_opt))
            bar.set_postfix(restarts=len(starts) - 1, objective=f"{f_opt:.6f}")
    finally:
        bar.close()
    return _result(problem, walks, which, starts, f_ref, tol, confidence, threshold,
                   objective, prior, rounds, counts, time.perf_counter() - t0)


def _problem_and_point(problem, result, data, solver, rtol, atol):
    """The `AbstractProblem` a fit ran on, its objective (``"map"`` / ``"mle"``), the fit's
    point ``u (D,)``, the objective the fit reported there and the relative tolerance it is
    checked to."""
    from ..population._population_fit import PopulationFit
    from ..problem._program import carries_data, problem_of

    if isinstance(result, PopulationFit):
        from ..population._problem import PopulationProblem

        if isinstance(problem, AbstractProblem):
            pp = problem
        else:
            if data is None:
                raise ValueError("inference.profile: a population fit is profiled with its "
                                 "data: pass data= (the PopulationDataset fitted)")
            pp = PopulationProblem(problem, data, method=result.method, params=result.params,
                                   solver=solver, **{k: v for k, v in
                                                     dict(rtol=rtol, atol=atol).items()
                                                     if v is not None})
        u = _finite_point(pp, pp.start_point(result.params))
        return pp, "mle", u, 0.5 * float(result.ofv), 1e-6
    if not isinstance(result, FitResult):
        raise TypeError("inference.profile: `result` must be the FitResult of "
                        "inference.fit(problem, ...) or the PopulationFit of "
                        f"inference.fit_population, got {type(result).__name__}")
    if result.objective not in ("map", "mle"):
        raise ValueError(f"inference.profile: `result` has objective {result.objective!r}; "
                         "profiles are of a 'map' or 'mle' fit's objective")
    if isinstance(problem, AbstractProblem):
        pp, f_tol = problem, 1e-4
    elif carries_data(problem):
        if data is not None:
            raise ValueError("inference.profile: `data` does not apply to a PEtab problem "
                             "(it carries its measurements); pass data=None")
        pp = problem_of(problem, None, solver=solver, rtol=rtol, atol=atol, fit=True)
        f_tol = 1e-6
    else:
        from ..problem._problem import InferenceModel

        if not (isinstance(problem, InferenceModel) or callable(problem)):
            raise TypeError("inference.profile: `problem` must be what was fitted: a "
                            "models.PetabProblem, a models.ODEModel, a NumPyro program, a "
                            "population model (with its PopulationFit) or an "
                            f"inference.AbstractProblem, got {type(problem).__name__}")
        if data is None:
            raise ValueError("inference.profile: pass the data fitted (data=...) with a "
                             "model or a program")
        pp, f_tol = problem_of(problem, data, solver=solver, rtol=rtol, atol=atol), 1e-4
    if hasattr(pp, "fit_point"):
        u = pp.fit_point(result)
    else:
        try:
            u = np.asarray(pp.start_point(result.params), float)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError("inference.profile: `result` is a fit of another problem: its "
                             f"params {sorted(result.params)} do not map to this problem's "
                             f"coordinates {list(pp.names())} ({e})") from None
        u = _finite_point(pp, u)
    return pp, result.objective, u, float(result.loss), f_tol


def _finite_point(problem, u) -> np.ndarray:
    u = np.asarray(u, float)
    if u.shape != (len(problem.names()),):
        raise ValueError("inference.profile: `result` is a fit of another problem: its "
                         f"point has {u.size} coordinates, the problem "
                         f"{len(problem.names())}")
    bad = [p for p, v in zip(problem.names(), u) if not np.isfinite(v)]
    if bad:
        raise ValueError(f"inference.profile: `result`'s params {bad} are not finite (a "
                         "failed fit, or a value on its support's boundary)")
    return u


def _objective_at(problem, x, prior: bool) -> float:
    """The objective at ``x (D,)`` from a fresh solve (as a fit's losses are)."""
    return float(np.asarray(problem.objective(np.asarray(x, float), None, prior=prior)[0]))


def _check_numbers(confidence, numbers) -> None:
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


def _which(problem, ids, parameters) -> list[int]:
    """The profiled coordinates' indices; a name that is none of them refused, naming it."""
    if parameters is None:
        return list(range(len(ids)))
    try:
        names = [parameters] if isinstance(parameters, str) else list(parameters)
    except TypeError:  # not iterable: reported below
        names = [parameters]
    odd = [p for p in names if not isinstance(p, str)]
    if odd or not names:
        raise ValueError(f"inference.profile: `parameters` must be parameter ids "
                         f"(strings), got {parameters!r} (the problem's: {list(ids)})")
    if hasattr(problem, "refuse_parameters"):
        problem.refuse_parameters(names)
    out, unknown = set(), []
    for p in names:
        if p in ids:
            out.add(ids.index(p))
            continue
        elements = [i for i, q in enumerate(ids) if q.startswith(p + "[")]
        if elements:  # a vector site: all its elements
            out.update(elements)
        else:
            unknown.append(p)
    if unknown:
        verb = "is not a parameter" if len(unknown) == 1 else "are not parameters"
        raise ValueError(f"inference.profile: `parameters`: {unknown} {verb} of the "
                         f"problem (its estimated parameters: {list(ids)})")
    return sorted(out)


def _result(problem, walks, which, starts, f_ref, tol, confidence, threshold, objective,
            prior, rounds, counts, wall) -> ProfileResult:
    ids = tuple(problem.names())
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
            c = crossing(w, f_ref, threshold)
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
    scales = tuple(problem.scales())
    terms = problem.residual_terms(prior=prior)
    has_prior = prior and (terms is None or terms.penalty is not None)
    return ProfileResult(
        parameter_ids=tuple(ids[j] for j in which), scales={ids[j]: scales[j] for j in which},
        estimate={ids[j]: float(x_opt[j]) for j in which}, intervals=intervals,
        identifiable=identifiable, stop_reasons=reasons, paths=paths,
        objective_opt=float(f_ref), confidence=float(confidence), threshold=threshold,
        objective=objective, all_parameter_ids=ids, n_rounds=rounds,
        n_evals=int(counts.n_evals), n_records=int(counts.n_records), wall_time=wall,
        optimum=np.asarray(x_opt, float), fit_objective=float(f_fit),
        n_restarts=len(starts) - 1, reliable=bool(reliable), priors=bool(has_prior),
        notes=tuple(notes))
