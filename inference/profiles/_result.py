"""What `inference.profile` returns: `ProfileResult` (every profiled parameter's interval,
its path and one plot), `ProfilePath` (one parameter's profile points)."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["ProfileResult", "ProfilePath"]

@dataclasses.dataclass(frozen=True)
class ProfilePath:
    """One parameter's profile: every point computed, sorted by the profiled value.

    Attributes:
        values: ``(k,)`` the profiled coordinate's values, on its scale
            (``ProfileResult.scales``; the optimum's among them).
        objective: ``(k,)`` the profile ``F_p``: the objective minimised over the other
            parameters with this one held at ``values`` (meeting the problem's
            tolerances).
        ratio: ``(k,)`` ``exp(-(objective - objective_opt))``, the likelihood ratio to
            the optimum (posterior ratio where the objective includes priors:
            ``ProfileResult.priors``).
        x: ``(k, D)`` every coordinate at each point (``ProfileResult.all_parameter_ids``
            order; the profiled column is ``values``).
        converged: ``(k,)`` whether each point's inner optimisation (the batched
            Levenberg–Marquardt, or L-BFGS-B) met its convergence test (otherwise ``objective`` is an upper bound of the profile).

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
    """What `inference.profile` returns, for every kind of problem: each parameter's
    likelihood-ratio interval and profile.

    Attributes:
        parameter_ids: the profiled parameters (coordinate names: ``"alpha"``,
            ``"omega[1]"``), in the problem's order.
        scales: ``{id: "lin" | "log" | "log10" | "unconstrained"}``, the scale of the
            values below: a PEtab table's ``parameterScale``; for an ODE model, a program
            or a population model the coordinate a fit moves in (``"log"``: the natural
            log of a positive parameter; ``"unconstrained"``: another bijection of its
            support, e.g. a logit).
        estimate: ``{id: value}`` the optimum the profiles start from, on ``scales``:
            the fit's ``params``, or the point re-optimised from where a profile went
            below them (``n_restarts``).
        intervals: ``{id: (lower, upper)}`` the ``confidence`` interval on ``scales``; ``-inf`` / ``inf`` on a side whose profile does not cross the
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
        objective: ``"map"`` or ``"mle"``, the fit's (a population fit's: ``"mle"``,
            half its OFV).
        all_parameter_ids: the problem's coordinate names (columns of ``ProfilePath.x``).
        n_rounds: ensemble rounds (each: every walk's next point at once); n_evals,
            n_records: the inner optimiser's (batched) evaluations and mesh records.
        wall_time: seconds, compilation included.
        optimum: ``(D,)`` every parameter at ``estimate`` (``all_parameter_ids`` order).
        fit_objective: the objective at the fit's ``params`` (its loss); above
            ``objective_opt`` where the fit was not the optimum.
        n_restarts: times the profiles were restarted from a re-optimised point because
            a profile went more than ``tol`` below the point they started from.
        reliable: false where, the restarts spent, a profile still went more than
            ``tol`` below its start: the intervals are then relative to a point that is
            not the optimum.
        priors: whether the objective includes priors (a ``"map"`` fit of a problem
            with priors): the ratios are then posterior ratios.
        notes: what the caller should know (the fit was not the optimum; the intervals
            are unreliable), each also given as a ``RuntimeWarning``.

    Example:
        >>> prof = inference.profile(problem, inference.fit(problem, n_starts=20))
        >>> prof = inference.profile(model, inference.fit(model, data), data)
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
        the priors, ``priors``); an unreliable result says so in the legend's
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
