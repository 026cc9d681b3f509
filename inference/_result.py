"""`FitResult`: what `inference.fit` and `inference.fit_least_squares` return."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["FitResult", "FAILED", "best_index"]

FAILED = 1  # FitResult.status of a start whose solve failed


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

    @property
    def loss(self) -> float:
        """The best start's final loss."""
        return float(self.losses[self.best_index])

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={np.round(np.asarray(v), 5).tolist()}" for k, v in self.params.items())
        n_failed = int(np.sum(self.status != 0))
        return (
            f"FitResult(objective={self.objective!r}, loss={self.loss:.6g}, params={{{ps}}}, "
            f"n_starts={len(self.losses)}, failed={n_failed}, best_index={self.best_index}, "
            f"n_steps={self.n_steps}, n_records={self.n_records}, "
            f"n_grad_evals={self.n_grad_evals}, wall_time={self.wall_time:.2f}s)"
        )


