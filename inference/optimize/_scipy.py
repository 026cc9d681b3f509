"""SciPy's quasi-Newton optimisers as `AbstractOptimizer`s: `LBFGSB` (bounded) and `BFGS`.

Both run start by start on the host, each evaluation an adaptive solve and its gradient
(`inference.AbstractProblem.value_and_grad`, compiled once per problem): where a problem's
objective has no residual form (Laplace noise, a population's integrated likelihood) or a
start's evaluations cost too much to batch, these are the local optimisers. A coordinate
held by ``mask`` is left out of the vector SciPy moves.
"""

from __future__ import annotations

import time

import numpy as np

from .._progress import progress_bar
from ._optimizer import AbstractOptimizer, OptimizeResult, checked_bounds, checked_mask

__all__ = ["LBFGSB", "BFGS", "scipy_reason"]


def scipy_reason(res) -> str:
    """SciPy's exit message as one of `OptimizeResult.reason`'s names."""
    msg = str(res.message).upper()
    if "REDUCTION" in msg:
        return "ftol"
    if "GRADIENT" in msg or "SUCCESS" in msg:
        return "gtol"
    if "ITERATIONS" in msg or "EVALUATIONS" in msg:
        return "max_iter"
    if "CALLBACK" in msg:
        return "deadline"
    return "abnormal"


class _Scipy(AbstractOptimizer):
    """`scipy.optimize.minimize` with ``method`` from each start in turn."""

    method = ""
    bounded = False
    failed_value = np.inf  # what SciPy sees where the objective is not finite

    def __init__(self, max_iter: int = 1000, *, gtol: float | None = None):
        if not isinstance(max_iter, (int, np.integer)) or isinstance(max_iter, bool) \
                or max_iter < 1:
            raise ValueError(f"`max_iter` must be an int >= 1, got {max_iter!r}")
        if gtol is not None and not (isinstance(gtol, (int, float, np.number)) and gtol > 0):
            raise ValueError(f"`gtol` must be a number > 0 or None, got {gtol!r}")
        self.max_iter, self.gtol = int(max_iter), gtol

    def run(self, fun, x0, *, bounds=None, callback=None, deadline=None):
        """``scipy.optimize.minimize`` of ``fun(x) -> (value, gradient)`` from ``x0 (d,)``
        with this optimiser's method and options; ``callback(intermediate_result)`` after
        each iteration; past ``deadline`` (``time.monotonic()``) it stops with its best
        point. Returns SciPy's `OptimizeResult`."""
        from scipy.optimize import minimize

        def after(intermediate_result):
            if callback is not None:
                callback(intermediate_result)
            if deadline is not None and time.monotonic() > deadline:
                raise StopIteration

        options = dict(maxiter=self.max_iter)
        if self.gtol is not None:
            options["gtol"] = self.gtol
        return minimize(fun, x0, jac=True, method=self.method, bounds=bounds,
                        callback=after, options=options)

    def minimize(self, problem, x0, *, mask=None, deadline=None, progress=None,
                 prior: bool = True) -> OptimizeResult:
        """`AbstractOptimizer.minimize`, one start after another."""
        self.check(problem)
        mask = checked_mask(problem, mask)
        x0 = np.asarray(x0, float)
        free = np.ones(x0.shape[1], bool) if mask is None else ~mask
        lo, hi = (b[free] for b in checked_bounds(problem))
        xs, values, conv, iters, why, traces, n_eval = [], [], [], [], [], [], 0
        bar = progress_bar(progress, total=len(x0), done=0,
                           desc=f"fit ({self.name}, {len(x0)} starts)")
        try:
            for x in x0:
                trace = []

                def fun(v, x=x, trace=trace):
                    full = x.copy()
                    full[free] = v
                    f, g = problem.value_and_grad(full, prior=prior)
                    trace.append(f)
                    if not np.isfinite(f):
                        return self.failed_value, np.zeros(int(free.sum()))
                    return f, np.asarray(g, float)[free]

                f0 = fun(x[free])[0]
                if not (np.isfinite(f0) and f0 < self.failed_value):
                    xs.append(x), values.append(np.inf), conv.append(False), iters.append(0)
                    why.append("not_finite")
                elif deadline is not None and time.monotonic() > deadline:
                    xs.append(x), values.append(f0), conv.append(False), iters.append(0)
                    why.append("deadline")
                else:
                    res = self.run(fun, x[free], deadline=deadline,
                                   bounds=list(zip(lo, hi)) if self.bounded else None)
                    out = x.copy()
                    out[free] = res.x
                    f = float(res.fun)
                    xs.append(out), conv.append(bool(res.success)), iters.append(int(res.nit))
                    values.append(f if np.isfinite(f) and f < self.failed_value else np.inf)
                    why.append(scipy_reason(res))
                n_eval += len(trace)
                traces.append(np.minimum.accumulate(np.asarray(trace, float)))
                bar.update(1)
        finally:
            bar.close()
        width = max(len(t) for t in traces)
        history = np.stack([np.pad(t, (0, width - len(t)), mode="edge") for t in traces],
                           axis=1)
        return OptimizeResult(
            x=np.stack(xs), value=np.asarray(values), converged=np.asarray(conv),
            n_iter=np.asarray(iters), reason=np.asarray(why), history=history,
            n_records=n_eval, n_records_per_start=np.asarray([len(t) for t in traces]),
            n_evals=n_eval, max_error_ratio=np.zeros(len(xs)))


class LBFGSB(_Scipy):
    """SciPy's L-BFGS-B inside the problem's bounds, one start after another, each
    evaluation an adaptive solve and its gradient.

    Args:
        max_iter: iterations per start; gtol: SciPy's projected-gradient stop (``None``:
            SciPy's default).

    Example:
        >>> inference.fit(petab_problem, optimizer=inference.optimize.LBFGSB(500))
    """

    name = "lbfgs"
    method = "L-BFGS-B"
    bounded = True


class BFGS(_Scipy):
    """SciPy's BFGS on an unbounded problem, one start after another, each evaluation an
    adaptive solve and its gradient: what `inference.fit_population` runs on its outer
    problem (each evaluation finds the subjects' conditional modes again, so the
    objective is a host function, and the few outer coordinates make BFGS's dense
    inverse Hessian cheap).

    Args:
        max_iter: iterations per start; gtol: the largest gradient entry at convergence
            (``None``: SciPy's 1e-5).
    """

    name = "bfgs"
    method = "BFGS"
    failed_value = 1e300  # BFGS's line search backs off a huge finite value

    def check(self, problem) -> None:
        """``ValueError`` where ``problem`` has finite bounds (BFGS moves freely)."""
        lo, hi = problem.bounds()
        if np.isfinite(lo).any() or np.isfinite(hi).any():
            raise ValueError("BFGS moves the coordinates freely, and this problem has "
                             "bounds; use method='lbfgs' (L-BFGS-B) or method='lm'")
