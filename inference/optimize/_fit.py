"""`fit`: the front of every fit (MAP / maximum likelihood) of every problem.

`fit` validates its arguments, builds the problem (`problem_of`; a PEtab problem fits in
its own coordinates, ``problem.fit_problem``), picks the optimiser (``method`` through the
one table of ``_methods.py``, or the ``optimizer`` object given), draws the starts (the
problem's ``fit_starts`` where it has them, else ``init`` then prior draws), runs
``optimizer.minimize`` and maps the final points back to parameters (``fit_params``
where the problem has them, else its `ParamSpace`). How each optimiser works is in its own
file: ``_optax.py`` (Optax, mesh reuse), ``_lm.py`` (the batched Levenberg–Marquardt),
``_scipy.py`` (L-BFGS-B, BFGS), ``_global.py`` (CMA-ES restarts).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax

import gradsolve as gs

from .. import _checkpoint
from .._result import FAILED, FitResult
from ..problem._abstract import AbstractProblem
from ..problem._program import problem_of
from ..problem._starts import fit_starts
from ._methods import METHODS, OPTAX_ONLY, FitArgs, method_names
from ._optax import FitKernel, FitState
from ._optimizer import AbstractOptimizer, OptimizeResult, checked_bounds

__all__ = ["fit", "FitState", "FitKernel", "GLOBAL_OPTIONS"]

GLOBAL_OPTIONS = METHODS["global"].options
"""The global search's own keyword arguments `fit` passes on (``method="global"``)."""


def _fit_defaults() -> dict:
    import inspect

    return {k: p.default for k, p in inspect.signature(fit).parameters.items()
            if k not in ("model", "data", "options")}


def _refuse_options(options: Mapping, what: str, extra: tuple[str, ...],
                    optax_args: bool = True) -> None:
    """``ValueError`` naming the keyword arguments in ``options`` that `fit` does not take
    for ``what`` (its own arguments, without the Optax fit's unless ``optax_args``, and
    ``extra``), listing those it takes."""
    if options:
        own = [p for p in _fit_defaults() if optax_args or p not in OPTAX_ONLY]
        raise ValueError(
            f"inference.fit: unknown keyword argument(s) {sorted(options)} for {what}; "
            f"fit takes {own + list(extra)}")


def _refuse_unread(given: dict, what: str, why: str) -> None:
    """``ValueError`` naming an argument in ``given`` with a value other than its default
    that the chosen optimiser would ignore."""
    defaults = _fit_defaults()
    for name, v in given.items():
        if v is not defaults[name] and v != defaults[name]:
            raise ValueError(f"`{name}` does not apply to {what} ({why}; got {name}={v!r})")


def _checked_int(name: str, v, lo: int) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
        raise ValueError(f"`{name}` must be an int >= {lo}, got {v!r}")
    return int(v)


def _checked_max_time(max_time) -> None:
    if max_time is not None and not (isinstance(max_time, (int, float, np.number))
                                     and not isinstance(max_time, bool) and max_time > 0):
        raise ValueError(f"`max_time` must be a number of seconds > 0 or None, got "
                         f"{max_time!r}")


def _kind(problem) -> str:
    """How messages name the problem: its ``kind`` where it says, else its model's type."""
    kind = getattr(problem, "kind", None)
    if kind:
        return f"a {kind}"
    return f"`model` of type {type(problem.source).__name__}"


def _optimizer_of(problem, method, optimizer, steps, n_starts, init, seed, max_time,
                  checkpoint, checkpoint_every, optax_args: dict, options: dict
                  ) -> AbstractOptimizer:
    """The optimiser object `fit` runs, from ``optimizer`` (an object, an Optax
    transformation or ``None``) and ``method`` (a name of `METHODS` or ``"auto"``: the
    problem's ``default_method``), its arguments checked with errors naming them."""
    if isinstance(optimizer, AbstractOptimizer):
        if method != "auto":
            raise ValueError(f"`method`={method!r} and an optimizer object "
                             f"({type(optimizer).__name__}) were both given; pass one")
        what = f"an optimizer object ({type(optimizer).__name__})"
        _refuse_options(options, what, ())
        _refuse_unread(optax_args, what, "its own arguments say how it runs")
        if checkpoint is not None:
            raise ValueError(f"`checkpoint` does not apply to {what}: give it to the "
                             "optimizer where it takes one")
        _checked_max_time(max_time)
        return optimizer if steps == 1000 else optimizer.with_max_iter(
            _checked_int("steps", steps, 1))
    if method == "auto":
        # the problem's own choice; else Optax where it has a ParamSpace and meshes to
        # reuse, L-BFGS-B (inside any bounds) where it has not
        method = "optax" if optimizer is not None else getattr(
            problem, "default_method", "optax" if problem.space is not None else "lbfgs")
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {method_names()}, got {method!r}")
    entry = METHODS[method]
    is_optax = entry.optax
    if not is_optax:
        _refuse_unread(dict(optax_args, optimizer=optimizer), _kind(problem),
                       f"it is fitted by method={method!r}, which takes no Optax "
                       "arguments")
    options = dict(options)
    own = {k: options.pop(k) for k in entry.options if k in options}
    if options:
        if is_optax:
            hint = (f"fitted by Optax; {list(GLOBAL_OPTIONS)} are the global search's, "
                    "method='global'")
            _refuse_options(options, f"{_kind(problem)} ({hint})", ())
        what = (f"method={method!r}" if entry.options
                else f"{_kind(problem)} with method={method!r}")
        _refuse_options(options, what, entry.options, optax_args=False)
    _checked_int("steps", steps, 0 if is_optax else 1)
    for name, v, allowed in (("max_time", max_time, entry.max_time),
                             ("checkpoint", checkpoint, entry.checkpoint)):
        if v is not None and not allowed:
            takes = sorted(m for m, e in METHODS.items() if getattr(e, name))
            why = ("takes no time limit" if name == "max_time" else "keeps no state to resume")
            raise ValueError(f"`{name}` applies to method={' or '.join(map(repr, takes))} "
                             f"only (method={method!r}, which fits {_kind(problem)}, {why}; "
                             f"got {name}={v!r})")
    _checked_max_time(max_time)
    return entry.build(FitArgs(
        steps=int(steps), seed=int(seed), n_starts=int(n_starts), init=init,
        optimizer=optimizer, max_time=max_time, checkpoint=checkpoint,
        checkpoint_every=int(checkpoint_every), optax=optax_args, options=own))


def _starts(problem, init, n_starts: int, seed: int) -> np.ndarray:
    """The starts ``(n, D)``: the problem's own ``fit_starts(init, n, seed)`` where it has
    them (PEtab: Latin hypercube draws after the given rows); else ``init`` (a parameter
    dict: the first start; an ensemble dict: all of them) and draws from the priors."""
    own = getattr(problem, "fit_starts", None)
    if own is not None:
        return np.asarray(own(init, n_starts, seed), float)
    _, k0 = jax.random.split(jax.random.PRNGKey(seed))
    if problem.space is not None:
        return fit_starts(problem.model, problem.space, init, n_starts, k0)
    given = _given(problem, init, n_starts)
    x = np.array(problem.sample_starts(k0, n_starts), float)  # a writable copy
    if given is not None:
        x[: len(given)] = given
    return x


def _given(problem, init, n_starts: int) -> np.ndarray | None:
    """``init`` as rows ``(k, D)`` of a problem that draws its own starts without a
    `ParamSpace` (``ValueError`` naming unknown or missing parameters, or too many rows);
    ``None`` where the problem checks ``init`` itself or none is given."""
    if init is None or getattr(problem, "fit_starts", None) is not None or \
            problem.space is not None:
        return None
    given = np.atleast_2d(np.asarray(problem.start_point(init), float))
    if len(given) > n_starts:
        raise ValueError(f"`init` holds {len(given)} starts, more than n_starts={n_starts}")
    return given


def _params(problem, x: np.ndarray) -> dict:
    """Each start's parameters (leaves with a leading axis ``n``) at ``x (n, D)``: the
    problem's own ``fit_params`` where it has them, else its `ParamSpace`'s constrained
    values, else one entry per coordinate name."""
    own = getattr(problem, "fit_params", None)
    if own is not None:
        return own(x)
    if problem.space is not None:
        return jax.jit(problem.space.from_unconstrained)(jax.numpy.asarray(x))
    return {p: np.asarray(x)[:, i] for i, p in enumerate(problem.names())}


def _result(problem, opt: AbstractOptimizer, res: OptimizeResult, x0, objective: str,
            wall_time: float) -> FitResult:
    """The `FitResult` of ``res``: Optax's starts in their order (as a checkpoint resumes
    them), every other optimiser's sorted by final objective (the waterfall)."""
    extra = res.extra or {}
    value = np.where(np.isfinite(res.value), res.value, np.inf)
    status = extra.get("status")
    if status is None:
        status = np.where(np.isfinite(value), 0, FAILED).astype(np.int32)
    if not getattr(opt, "waterfall", True):
        return FitResult.of_starts(
            _params(problem, res.x), value, loss_history=res.history,
            n_records=res.n_records, n_records_per_start=res.n_records_per_start,
            n_grad_evals=res.n_evals, wall_time=extra.get("elapsed", 0.0) + wall_time,
            status=status, objective=objective, n_steps=int(np.max(res.n_iter, initial=0)),
            max_error_ratio=res.max_error_ratio, n_redrawn=extra.get("n_redrawn", 0))
    n = len(value)
    per_start = res.n_records_per_start
    return FitResult.of_starts(
        _params(problem, res.x), value, sort=True, loss_history=res.history,
        n_records=res.n_records,
        n_records_per_start=(np.zeros(n, np.int64) if per_start is None
                             else np.asarray(per_start).astype(np.int64)),
        n_grad_evals=res.n_evals, wall_time=wall_time, status=status, objective=objective,
        n_steps=max(len(res.history) - 1, 0),
        max_error_ratio=(np.zeros(n) if res.max_error_ratio is None
                         else res.max_error_ratio),
        starts=np.asarray(extra.get("starts", x0)), converged=np.asarray(res.converged),
        parameter_ids=tuple(problem.names()), method=opt.name,
        exit_reasons=np.asarray(res.reason))


def fit(
    model, data=None, init: Mapping[str, Any] | None = None, *,
    optimizer: optax.GradientTransformation | AbstractOptimizer | None = None,
    steps: int = 1000,
    n_starts: int = 1, objective: str = "map", rerecord: str = "auto",
    drift_tol: float = 0.1, error_ratio_max: float = 1.0, seed: int = 0,
    checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 100,
    progress: bool | None = None, rtol: float | None = None,
    atol: float | None = None, solver=None, max_steps: int | None = None,
    record_tol_factor: float = 0.5, jacobian: bool = False, max_redraws: int = 10,
    callback: Callable[[int, dict], Any] | None = None, method: str = "auto",
    max_time: float | None = None, **options,
) -> FitResult:
    """Fit ``model`` to ``data`` from one or many starts, by the optimiser ``method`` or
    ``optimizer`` names.

    Every problem is fitted the same way: its starts (``init``, then the problem's own
    draws) go to an optimiser object (`inference.optimize.AbstractOptimizer`), which
    minimises the problem's objective over the coordinates it moves in, and the result
    maps them back to parameters. ``method="auto"`` is the problem's own choice: Optax
    (Adam) for an ODE model or a program; the batched Levenberg–Marquardt for a PEtab
    problem whose noise is all normal, else L-BFGS-B; L-BFGS-B for a problem object
    without unconstrained coordinates of its own (a population model's outer problem).
    With Optax the starts form one ensemble recorded by one ``gs.record``; the loss
    gradient comes from replaying the recorded mesh (``gs.replay``), recorded again when
    some start's parameters drift, all starts at once inside the compiled loop
    (``inference/optimize/_optax.py``).

    A `models.PetabProblem` (which carries its data: ``data=None``) is fitted by a
    multistart local optimiser instead: starts by Latin hypercube inside the bounds on the
    parameter scale, all starts and conditions one ensemble, Levenberg–Marquardt on the
    noise-weighted residuals where every noise model is normal (Fisher scoring when noise
    parameters are estimated), SciPy's L-BFGS-B otherwise; ``steps`` caps the iterations
    per start, ``objective="map"`` adds the priors the parameter table gives, and the
    result's starts are sorted by final objective (`FitResult.plot_waterfall`). With
    ``method="global"`` any problem is fitted by a global search instead (where bounds span
    many decades and local starts stall far from the optimum): CMA-ES restarts with a
    growing population, every generation one ensemble, a run ending when it stagnates, each
    run's best polished by the problem's local optimiser (Levenberg–Marquardt on residuals,
    else L-BFGS-B), and the ``n_starts`` best distinct points found refined at the end,
    inside ``max_time`` where it is given (``inference/optimize/_global.py``).

    Args:
        model: a `models.ODEModel` (or a NumPyro program, a population model, a
            `models.PetabProblem`, or a problem object, an `inference.AbstractProblem`,
            fitted as given); data: a `models.Dataset` (``None`` for a PEtab problem or a
            problem object).
        init: ``None`` (starts drawn from the priors), a parameter dict (the first start;
            others are prior draws), or an ensemble dict (leaves with leading axis ``n``).
            For a PEtab problem: a dict by parameter id, a vector or rows on the parameter
            scale (the first starts; the others Latin hypercube draws).
        optimizer: an optimiser object (`inference.optimize.LevenbergMarquardt`,
            ``LBFGSB``, ``BFGS``, ``GlobalSearch``, ``Optax`` or one's own
            `inference.optimize.AbstractOptimizer`; then ``steps`` and ``method`` are its
            own), or an Optax transformation of the flat unconstrained vector (default
            ``optax.adam(1e-2)``, with ``method="auto"`` or ``"optax"``).
        steps: total optimisation steps (a resumed fit continues up to this number); for
            a PEtab problem the LM's iterations per start, or with ``method="global"`` the
            search's generations (all its runs together).
        n_starts: number of starts (``method="global"``: the best distinct points found
            that are refined at the end, the rows of the result).
        objective: ``"map"`` (log prior + log likelihood; the constrained-space mode unless
            ``jacobian=True``) or ``"mle"`` (log likelihood only).
        rerecord, drift_tol, error_ratio_max, record_tol_factor: the mesh policy
            (`MeshPolicy`): ``"auto"`` re-records a start whose parameters moved by more
            than ``drift_tol`` (relative) since its record or whose replay ``error_ratio``
            (units of ``rtol``/``atol``) exceeds ``error_ratio_max``; ``"always"`` every
            step (the plain adaptive-solve gradient); ``"never"`` keeps one mesh. Meshes
            are recorded at ``record_tol_factor`` times ``rtol``/``atol``.
        seed: seeds the prior draws.
        checkpoint: a file path. The fit state is saved there atomically every
            ``checkpoint_every`` steps, at the end and when an exception (e.g.
            ``KeyboardInterrupt``) stops the fit; a later call with the same path resumes
            from it and ends at the same result as an uninterrupted run. A path that
            cannot be written is a ``ValueError`` before the fit starts; a save that fails
            later (a full disk) is a ``RuntimeWarning`` and the fit goes on. For a PEtab
            problem only with ``method="global"`` (the search's state, saved every
            ``checkpoint_every`` generations and after each polish); likewise for any
            other method but Optax.
        progress: ``None`` (default): a tqdm bar when stderr is a terminal, else a plain
            line on stderr now and then (steps, seconds, best loss); ``True``: the
            bar; ``False``: nothing.
        rtol, atol, solver, max_steps: the ODE solve (``None``: ``rtol = 1e-6``,
            ``atol = 1e-8``, the model's solver; ``max_steps=None``: 4,096 steps, or 16,384
            for the ode sites of a population model or program; a PEtab problem's own
            settings for one).
        jacobian: add the unconstrained transform's log-Jacobian to the MAP objective (the
            mode in unconstrained space, as a Laplace approximation there would use).
        max_redraws: rounds of re-drawing starts whose first record fails.
        callback: ``callback(step, info)`` after every step (``info`` has ``losses``,
            ``params``, ``n_records``); returning ``True`` stops the fit early.
        method: ``"auto"`` (the problem's choice, above), ``"optax"``, ``"lm"`` (the
            batched Levenberg–Marquardt, where the objective has residuals), ``"lbfgs"``
            (SciPy's L-BFGS-B inside the bounds), ``"bfgs"`` (SciPy's BFGS, unbounded
            coordinates), or ``"global"`` (the global search above; `FitResult.method`
            says which ran). The names map to the optimiser objects in one table
            (``inference/optimize/_methods.py``).
        max_time: ``method="global"``: seconds for the whole search, its final
            refinement included (``None``: none; a resumed search counts its earlier
            seconds); with an ``optimizer`` object: the seconds after which it returns
            its best points so far.
        **options: ``method="global"`` only, the global search's own:
            ``max_generations`` (another name for ``steps`` there) and ``local`` (its
            polisher: ``"lm"``, ``"lbfgs"`` or ``"auto"``, the LM where every noise model
            is normal). Any other keyword is a ``ValueError`` listing those `fit` takes.

    Returns:
        `FitResult`.

    Example:
        >>> res = inference.fit(models.lynx_hare(), models.load_dataset("lynx_hare"),
        ...                     n_starts=16, steps=1000)
        >>> res.params["theta"], res.n_records, res.n_grad_evals
        >>> res = inference.fit(models.load_petab("Boehm_JProteomeRes2014"), n_starts=20)
        >>> res.losses, res.params                 # sorted objectives; best by parameter id
        >>> res = inference.fit(models.load_petab("Fujita_SciSignal2010"),
        ...                     method="global", max_time=1800, n_starts=5, seed=1)
        >>> res = inference.fit(model, data, n_starts=8, method="lbfgs")  # by name
        >>> res = inference.fit(model, data, n_starts=8,                  # or as an object
        ...                     optimizer=inference.optimize.LBFGSB(max_iter=200))
    """
    t_start = time.perf_counter()
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"`seed` must be an int, got {seed!r}")
    if objective not in ("map", "mle"):
        raise ValueError(f"`objective` must be 'map' or 'mle', got {objective!r}")
    _checked_int("n_starts", n_starts, 1)
    _checked_int("checkpoint_every", checkpoint_every, 1)
    _checkpoint.check_path(checkpoint)
    if isinstance(model, AbstractProblem):
        if data is not None:
            raise ValueError("`data` does not apply to a problem object (it carries its "
                             "data); pass data=None")
        problem = model
    else:
        problem = problem_of(model, data, solver=solver, rtol=rtol, atol=atol,
                             max_steps=max_steps, fit=True)
    # a problem whose fits move in other coordinates than its sampler says so
    problem = getattr(problem, "fit_problem", problem)
    optax_args = dict(callback=callback, rerecord=rerecord, drift_tol=drift_tol,
                      error_ratio_max=error_ratio_max, record_tol_factor=record_tol_factor,
                      jacobian=jacobian, max_redraws=max_redraws)
    if optimizer is not None and not isinstance(optimizer, (AbstractOptimizer,
                                                            optax.GradientTransformation)):
        raise ValueError("`optimizer` must be an optimiser object (an inference.optimize."
                         "AbstractOptimizer) or an Optax GradientTransformation (with init "
                         f"and update), e.g. optax.adam(1e-2); got {optimizer!r}")
    opt = _optimizer_of(problem, method, optimizer, steps, n_starts, init, seed, max_time,
                        checkpoint, checkpoint_every, optax_args, options)
    # reversed bounds and an unknown parameter named before the optimiser looks at the
    # problem or a start is drawn
    if problem.space is not None or type(problem).bounds is not AbstractProblem.bounds:
        checked_bounds(problem)
    _given(problem, init, int(n_starts))
    opt.check(problem)
    gs.ensure_compilation_cache()
    x0 = _starts(problem, init, int(n_starts), int(seed))
    if init is not None and len(x0) == 1 and getattr(opt, "redraw", False):
        # a single given start is not re-drawn: its failure is the user's to see
        opt = copy.copy(opt)
        opt.redraw = False
    # an optimizer object given with max_time stops there (a named method takes max_time
    # where it applies, the global search with its final refinement inside it)
    deadline = (time.monotonic() + max_time
                if isinstance(optimizer, AbstractOptimizer) and max_time is not None else None)
    res = opt.minimize(problem, x0, deadline=deadline, progress=progress,
                       prior=objective == "map")
    return _result(problem, opt, res, x0, objective, time.perf_counter() - t_start)


