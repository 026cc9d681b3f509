"""`AbstractOptimizer` and `OptimizeResult`: one interface for every optimiser of a fit.

An optimiser minimises a problem's objective (`inference.AbstractProblem.objective`, or
its `residual_terms` where it reads residuals) over the flat coordinates ``u`` the problem
moves in, from ``n`` starts at once:

    result = optimizer.minimize(problem, x0 (n, D), mask=None, deadline=None,
                                progress=None, prior=True)

Each family (Optax's gradient methods, the batched Levenberg–Marquardt, SciPy's L-BFGS-B
and BFGS, CMA-ES) is one class in a file of its own under ``inference/optimize/``; the
method names `inference.fit` takes (``method="lm"``, ...) map to them in one table
(``inference/optimize/_methods.py``). Where the problem records meshes, the optimiser
records, replays and re-records them under a `inference.MeshPolicy`, as every fit does.
"""

from __future__ import annotations

import abc
from typing import NamedTuple

import numpy as np

__all__ = ["AbstractOptimizer", "OptimizeResult", "checked_x0", "checked_mask", "checked_bounds"]


class OptimizeResult(NamedTuple):
    """What `AbstractOptimizer.minimize` returns (``n`` starts, ``D`` coordinates).

    Attributes:
        x: ``(n, D)`` each start's final point.
        value: ``(n,)`` the objective there (``inf`` where the start failed); evaluated by
            an adaptive solve where the iterations replayed meshes.
        converged: ``(n,)`` whether the start met its optimiser's convergence test.
        n_iter: ``(n,)`` iterations each start took.
        reason: ``(n,)`` why each start stopped (strings): ``"ftol"``, ``"gtol"``,
            ``"xtol"``, ``"damping"``, ``"max_iter"``, ``"deadline"`` (the time limit),
            ``"not_finite"`` (the objective was not finite at the start, or a solve failed
            for good), ``"abnormal"`` (a line search failed), ``"steps"`` (a fixed number of
            steps was taken: Optax).
        history: ``(T, n)`` the objective after each iteration (best so far per start).
        n_records: ensemble records made; n_records_per_start: ``(n,)`` records per start.
        n_evals: ensemble evaluations of the objective and its derivatives.
        max_error_ratio: ``(n,)`` the largest replay error ratio met (in units of the
            tolerances), or zeros where not measured.
        extra: what a particular optimiser adds (e.g. Optax's re-drawn starts).
    """

    x: np.ndarray
    value: np.ndarray
    converged: np.ndarray
    n_iter: np.ndarray
    reason: np.ndarray
    history: np.ndarray
    n_records: int = 0
    n_records_per_start: np.ndarray | None = None
    n_evals: int = 0
    max_error_ratio: np.ndarray | None = None
    extra: dict | None = None

    @property
    def failed(self) -> np.ndarray:
        """``(n,)`` starts that ended without a finite objective."""
        return ~np.isfinite(np.asarray(self.value, float))


class AbstractOptimizer(abc.ABC):
    """An optimiser of a problem's objective over ``u``, from many starts at once.

    Subclasses give `minimize` and, where they need more than the objective, `check`
    (e.g. a Levenberg–Marquardt needs the problem's residuals).

    Attributes:
        name: what `inference.FitResult.method` reports (``"lm"``, ``"lbfgs"``, ...).
        max_iter: the iteration cap per start (steps, generations).

    Example:
        An optimiser of one's own is a subclass with ``name`` and `minimize`; `fit` takes
        it as it takes the built-in ones:

        >>> class RandomSearch(inference.optimize.AbstractOptimizer):
        ...     name = "random"
        ...     def minimize(self, problem, x0, *, mask=None, deadline=None,
        ...                  progress=None, prior=True):
        ...         ...  # evaluate problem.objective(u, prior=prior)[0] around x0
        ...         return OptimizeResult(x=..., value=..., ...)
        >>> inference.fit(problem, optimizer=RandomSearch())
    """

    name: str = "optimizer"
    max_iter: int = 1000

    def check(self, problem) -> None:
        """``ValueError`` where this optimiser cannot run on ``problem`` (saying why),
        before any solve."""

    @abc.abstractmethod
    def minimize(self, problem, x0: np.ndarray, *, mask: np.ndarray | None = None,
                 deadline: float | None = None, progress: bool | None = None,
                 prior: bool = True) -> OptimizeResult:
        """Minimise ``problem.objective`` from the starts ``x0 (n, D)``.

        Args:
            problem: an `inference.AbstractProblem`.
            x0: ``(n, D)`` starting points in the problem's coordinates (inside its
                `bounds`).
            mask: ``(D,)`` bool, coordinates held fixed at their start's value (a
                profile's), or ``None``.
            deadline: a ``time.monotonic()`` value after which the optimiser stops and
                returns its best points so far (reason ``"deadline"``), or ``None``.
            progress: a progress line or bar (``None``: only on a terminal).
            prior: include the log prior in the objective (MAP) or not (maximum
                likelihood).

        Returns:
            `OptimizeResult`.
        """

    def with_max_iter(self, max_iter: int) -> "AbstractOptimizer":
        """A copy with another iteration cap (what `inference.fit`'s ``steps`` sets)."""
        import copy

        out = copy.copy(self)
        out.max_iter = int(max_iter)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_iter={self.max_iter})"


def checked_x0(problem, x0) -> np.ndarray:
    """``x0`` as a float ``(n, D)`` array, refused with a ``ValueError`` naming the start
    and coordinate where it is not a start of ``problem`` (wrong width, not finite,
    outside the bounds)."""
    x0 = np.atleast_2d(np.asarray(x0, float))
    names = tuple(problem.names())
    if x0.ndim != 2 or x0.shape[1] != len(names):
        raise ValueError(f"`x0` must have shape (n, {len(names)}) (one column per coordinate "
                         f"{list(names)}), got {x0.shape}")
    if x0.shape[0] < 1:
        raise ValueError("`x0` holds no start")
    lo, hi = (np.asarray(b, float) for b in problem.bounds())
    bad = np.argwhere(~np.isfinite(x0) | (x0 < lo) | (x0 > hi))
    if len(bad):
        row, j = bad[0]
        raise ValueError(f"`x0`'s coordinate '{names[j]}' (start {row}) is {x0[row, j]:g}, "
                         f"not finite or outside its bounds [{lo[j]:g}, {hi[j]:g}]")
    return x0


def checked_mask(problem, mask) -> np.ndarray | None:
    """``mask`` as a ``(D,)`` bool array (``None`` where nothing is held), refused with a
    ``ValueError`` where it is not one per coordinate or holds every coordinate."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    d = len(tuple(problem.names()))
    if mask.shape != (d,) or mask.dtype != bool:
        raise ValueError(f"`mask` must be a bool array of shape ({d},), got {mask.dtype} "
                         f"{mask.shape}")
    if mask.all():
        raise ValueError("`mask` holds every coordinate fixed: nothing to optimise")
    return mask if mask.any() else None


def checked_bounds(problem) -> tuple[np.ndarray, np.ndarray]:
    """The problem's ``(lower (D,), upper (D,))``, refused with a ``ValueError`` naming the
    first coordinate whose lower bound is not below its upper one."""
    lo, hi = (np.asarray(b, float) for b in problem.bounds())
    bad = np.flatnonzero(~(lo < hi))
    if len(bad):
        j = int(bad[0])
        raise ValueError(f"the bounds of '{tuple(problem.names())[j]}' are [{lo[j]:g}, "
                         f"{hi[j]:g}]: the lower must lie below the upper")
    return lo, hi
