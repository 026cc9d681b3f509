"""`FitResult`: what `inference.fit` and `inference.fit_least_squares` return."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

__all__ = ["FitResult", "FAILED", "best_index"]

FAILED = 1  # FitResult.status of a start whose solve failed

_PER_START = ("n_records_per_start", "status", "max_error_ratio", "starts", "converged",
              "exit_reasons")


def best_index(losses: np.ndarray) -> int:
    """The start with the smallest finite loss (0 if none is finite)."""
    return int(np.argmin(losses)) if np.isfinite(losses).any() else 0


@dataclasses.dataclass(frozen=True, repr=False)
class FitResult:
    """Result of `fit` / `fit_least_squares`.

    Attributes:
        params: the best start's constrained parameter dict.
        all_params: every start's parameters (leaves with a leading axis ``n_starts``).
        losses: ``(n_starts,)`` final loss of each start (negative log posterior for
            ``"map"``, negative log likelihood for ``"mle"``, half the residual sum of
            squares for least squares), evaluated on a fresh adaptive solve; ``inf`` for
            failed starts.
        loss_history: ``(steps, n_starts)`` loss at each step (on the mesh in use).
        n_records: number of (ensemble) ``gs.record`` calls.
        n_records_per_start: ``(n_starts,)`` how often each start was re-recorded.
        n_grad_evals: number of (ensemble) loss-and-gradient evaluations.
        wall_time: seconds (summed over resumed runs).
        best_index: index of the best start.
        status: ``(n_starts,)`` 0 ok, 1 failed (its solve failed; frozen, loss ``inf``).
        objective: ``"map"``, ``"mle"`` or ``"least_squares"``.
        n_steps: optimisation steps done.
        max_error_ratio: ``(n_starts,)`` largest replay ``error_ratio`` met per start (in
            units of ``rtol``/``atol``).
        n_redrawn: starts re-drawn from the prior because their first solve failed.
        starts: ``(n_starts, D)`` each start's initial point (PEtab fits; else ``None``).
        converged: ``(n_starts,)`` whether each start met its optimiser's convergence
            test (PEtab fits and `fit_least_squares`; else ``None``).
        parameter_ids: the order of a row of ``starts`` (PEtab fits; else ``None``).
        method: the optimiser (``"lm"``, ``"lbfgs"``; PEtab fits and `fit_least_squares`;
            else ``None``).
        exit_reasons: ``(n_starts,)`` why each start stopped (PEtab fits and
            `fit_least_squares`; else ``None``),
            Fides' names: ``"ftol"`` (a converged step's decrease at most ``1e-8 (1 +
            |F|)``), ``"gtol"`` (projected gradient at most ``1e-6``), ``"xtol"`` (no step
            left inside the bounds), ``"damping"`` (the LM damping grew past ``1e12``
            without a decrease), ``"max_iter"``, ``"not_finite"`` (the solve failed at
            the start), ``"abnormal"`` (L-BFGS-B's line search failed).

    A PEtab fit (`fit` of a `models.PetabProblem`) orders its starts by final objective,
    best first (``losses`` is the waterfall); ``params`` is a dict by parameter id on the
    parameter scale, ``all_params`` the same with one entry per start.

    Example:
        >>> res = inference.fit(model, data, n_starts=8, steps=500)
        >>> res.params                       # the best start's parameter dict
        >>> res.losses.shape                 # (8,)
        >>> res.loss_history.shape           # (500, 8)
        >>> res.n_records, res.n_grad_evals  # meshes recorded vs gradients taken
    """

    params: dict
    all_params: dict
    losses: np.ndarray
    loss_history: np.ndarray
    n_records: int
    n_records_per_start: np.ndarray
    n_grad_evals: int
    wall_time: float
    best_index: int
    status: np.ndarray
    objective: str
    n_steps: int
    max_error_ratio: np.ndarray
    n_redrawn: int = 0
    starts: np.ndarray | None = None
    converged: np.ndarray | None = None
    parameter_ids: tuple | None = None
    method: str | None = None
    exit_reasons: np.ndarray | None = None

    @classmethod
    def of_starts(cls, all_params: dict, losses, *, sort: bool = False,
                  **fields) -> "FitResult":
        """The result of a multistart from each start's final parameters and loss (the one
        builder of every fitter): ``params`` and ``best_index`` are the start with the
        smallest finite loss; with ``sort``, every per-start field is ordered by final
        loss, best first (the waterfall order PEtab fits report). A ``RuntimeWarning``
        where no start ended with a finite loss.

        Args:
            all_params: each start's parameters (leaves with a leading axis ``n``).
            losses: ``(n,)`` final losses (non-finite: ``inf``).
            fields: the other attributes (``loss_history`` ``(steps, n)``; per-start
                arrays ``(n, ...)``).
        """
        losses = np.asarray(losses, float)
        losses = np.where(np.isfinite(losses), losses, np.inf)
        if not np.isfinite(losses).any():
            warnings.warn("inference.fit: no start ended with a finite loss", RuntimeWarning,
                          stacklevel=3)
        if sort:
            order = np.argsort(losses, kind="stable")
            losses = losses[order]
            all_params = {k: np.asarray(v)[order] for k, v in all_params.items()}
            for k in _PER_START:
                v = fields.get(k)
                if v is not None:
                    fields[k] = np.asarray(v)[order]
            if fields.get("loss_history") is not None:
                fields["loss_history"] = np.asarray(fields["loss_history"])[:, order]
        best = best_index(losses)
        return cls(params={k: v[best] for k, v in all_params.items()},
                   all_params=all_params, losses=losses, best_index=best, **fields)

    @property
    def loss(self) -> float:
        """The best start's final loss."""
        return float(self.losses[self.best_index])

    def plot_waterfall(self, ax=None, *, tol: float = 0.1, reference: float | None = None,
                       reference_label: str = "reference"):
        """Plot the final objective of every start, sorted (a waterfall plot).

        The y axis is ``loss - floor + 1`` on a log scale, where ``floor`` is the best loss
        (or ``reference`` where that is lower), so the lowest point sits at 1 and a plateau of
        equal optima is flat; starts within ``tol`` of the best are marked.

        Args:
            ax: a matplotlib ``Axes`` (``None``: a new figure).
            tol: the distance to the best loss within which a start counts as having
                reached it.
            reference: an objective value known from elsewhere (a published optimum, the
                objective at nominal parameters), drawn as a horizontal line. Where it lies
                below every start, the axis starts at it, so a missed optimum shows as a
                gap between the line and the lowest start instead of falling off the axis.
            reference_label: the legend's name for that line.

        Returns:
            The ``Axes``.

        Example:
            >>> res = inference.fit(problem, n_starts=20)
            >>> res.plot_waterfall()
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        losses = np.sort(np.asarray(self.losses, float))
        finite = np.isfinite(losses)
        rank = np.arange(1, len(losses) + 1)
        ref = None if reference is None else float(reference)
        if ref is not None and not np.isfinite(ref):
            raise ValueError(f"`reference` must be a finite objective value, got {reference!r}")
        if finite.any():
            best = losses[finite][0]
            floor = best if ref is None else min(best, ref)
            y = losses[finite] - floor + 1.0
            near = losses[finite] - best <= tol
            ax.plot(rank[finite], y, "-", color="0.6", lw=1, zorder=1)
            ax.scatter(rank[finite][~near], y[~near], s=14, color="C0", zorder=2)
            ax.scatter(rank[finite][near], y[near], s=14, color="C3", zorder=2,
                       label=f"within {tol:g} of best ({int(near.sum())})")
            if ref is not None:
                ax.axhline(ref - floor + 1.0, color="k", ls=":", lw=1,
                           label=f"{reference_label} ({ref:.6g})")
            ax.set_yscale("log")
            ax.legend(loc="upper left", frameon=False)
            what = "best" if ref is None or best <= ref else reference_label
            ax.set_ylabel(f"objective - {what} + 1")
        else:
            ax.set_ylabel("objective")
        n_bad = int((~finite).sum())
        ax.set_xlabel("start (sorted by final objective)" + (f"; {n_bad} failed" if n_bad else ""))
        return ax

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={np.round(np.asarray(v), 5).tolist()}" for k, v in self.params.items())
        n_failed = int(np.sum(self.status != 0))
        return (
            f"FitResult(objective={self.objective!r}, loss={self.loss:.6g}, params={{{ps}}}, "
            f"n_starts={len(self.losses)}, failed={n_failed}, best_index={self.best_index}, "
            f"n_steps={self.n_steps}, n_records={self.n_records}, "
            f"n_grad_evals={self.n_grad_evals}, wall_time={self.wall_time:.2f}s)"
        )


