"""The least-squares multistart of PEtab problems (`models.PetabProblem`).

A PEtab problem carries its data, bounds, scales and priors, and solves all its conditions
as one ensemble (`models.PetabProblem.log_likelihood`); `inference.fit` of such a problem
runs `fit_petab` here, on the problem's residuals (`models.PetabProblem.record`,
`models.PetabProblem.replay_residuals`). (`inference.sample` runs it as a NumPyro program
with ode sites: `inference.petab._problem`.)

`fit_petab`: starts by Latin hypercube sampling inside the bounds on the parameter scale;
all starts advance together, each evaluation one ensemble of every start and every
condition (the solves under ``jax.vmap`` fold into one ensemble). Where every noise model is
normal, Levenberg–Marquardt on the noise-weighted residuals (`inference.optimize._lm`; Fisher
scoring when noise parameters are estimated), each start's solves replaying a kept mesh
(recorded at half the tolerances, re-recorded when the start moved or the replay's error
estimate exceeds the tolerances; the reported objectives are fresh solves'). The LM runs
twice: first with the solves at 100 times the problem's tolerances, to a decrease below
1e-6 (1 + |F|) (far from an optimum a path needs descent directions, not eight digits, and
a stiff solve at 100x looser tolerances takes about a third of the steps), then from there
at the problem's tolerances to Fides' default stop. Otherwise SciPy's L-BFGS-B, start by
start.

A problem with hierarchical optimisation (`models.load_petab`'s default) is fitted in its
outer parameters: its residuals are those at the closed-form optimum of the inner ones
(scalings, offsets, noise parameters), with their exact Jacobian, and the `FitResult`'s
``params`` and ``all_params`` also hold the inner parameters' optima at each start's end
(``models.PetabProblem.full_parameters``); ``parameter_ids`` and ``starts`` stay the outer
coordinates.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

from ..optimize._lm import CONVERGED, FAILED_START, LM_POLICY, REASONS, LMKernel, MeshTerms
from .._progress import progress_bar
from .._result import FAILED, FitResult
from ._problem import finite_bounds

__all__ = ["latin_hypercube", "fit_petab"]

_LOOSE_TOL_FACTOR = 100.0
"""LM fits first iterate with the solves at this many times the problem's tolerances, then
polish at the tolerances."""

_LOOSE_FTOL = 1e-6
"""The loose pass stops where an accepted step lowers F by at most this times (1 + |F|)."""


def latin_hypercube(lower, upper, n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, D)`` points inside ``[lower, upper]``: each coordinate's range cut into ``n``
    equal strata, one point in each, strata paired at random across coordinates (McKay,
    Beckman & Conover 1979)."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    d = lower.shape[0]
    strata = np.stack([rng.permutation(n) for _ in range(d)], axis=1)
    u = (strata + rng.uniform(size=(n, d))) / n
    return lower + (upper - lower) * u


def _starts(problem, init, n_starts: int, seed: int) -> np.ndarray:
    """The starts ``(n, D)``: Latin hypercube draws, after the given ``init`` rows (checked
    by `_given_starts`)."""
    lo, hi = finite_bounds(problem)
    rng = np.random.default_rng(seed)
    x = latin_hypercube(lo, hi, n_starts, rng)
    if init is None:
        return x
    given = _given_starts(problem, init, lo, hi)
    if len(given) > n_starts:
        raise ValueError(f"`init` holds {len(given)} starts, more than n_starts={n_starts}")
    x[: len(given)] = given
    return x


def _given_starts(problem, init, lo, hi) -> np.ndarray:
    """``init`` (a dict by parameter id, a ``(D,)`` vector or ``(k, D)`` rows, on the
    parameter scale) as ``(k, D)`` rows, refused with a ``ValueError`` naming the key,
    parameter or row where it is not a start of ``problem``: an unknown key, a missing
    parameter, a value that is not finite or lies outside the bounds (the optimiser would
    clip it to the bound without a word: typically a value given on the linear scale)."""
    ids = list(problem.parameter_ids)
    if isinstance(init, dict):
        # a previous fit's params hold the inner parameters too: known, set in closed form
        unknown = set(init) - set(ids) - set(problem.inner_parameter_ids)
        if unknown:
            raise ValueError(f"`init` has keys {sorted(unknown)} that are not parameters "
                             f"of the problem (estimated: {ids})")
        missing = set(ids) - set(init)
        if missing:
            raise ValueError(f"`init` is missing parameters {sorted(missing)}")
        given = np.stack([np.asarray(init[p], float).reshape(-1) for p in ids], axis=1)
    else:
        given = np.atleast_2d(np.asarray(init, float))
    if given.ndim != 2 or given.shape[1] != len(ids):
        inner = ""
        if given.shape[-1] == len(problem.full_parameter_ids) != len(ids):
            inner = (f"; the inner parameters {list(problem.inner_parameter_ids)} are set "
                     "in closed form: give the outer ones, or a dict by id")
        raise ValueError(f"`init` has {given.shape[-1]} parameters, the problem "
                         f"{len(ids)} ({ids}){inner}")
    bad = np.argwhere(~np.isfinite(given))
    if len(bad):
        row, j = bad[0]
        raise ValueError(f"`init`'s parameter '{ids[j]}' (start {row}) is {given[row, j]}; "
                         "starts must be finite")
    # a hair of slack: a start read back from a fit's result sits on its bound
    slack = 1e-9 * (hi - lo)
    bad = np.argwhere((given < lo - slack) | (given > hi + slack))
    if len(bad):
        row, j = bad[0]
        v, scale = given[row, j], problem.scales[j]
        hint = ""
        if scale != "lin" and v > 0:
            on_scale = np.log10(v) if scale == "log10" else np.log(v)
            if lo[j] <= on_scale <= hi[j]:
                hint = (f"; starts are on the parameter scale: was {v:g} given linear? "
                        f"its {scale} is {on_scale:.6g}")
        raise ValueError(f"`init`'s parameter '{ids[j]}' (start {row}) is {v:g}, outside "
                         f"its bounds [{lo[j]:g}, {hi[j]:g}] on its {scale} scale{hint}")
    return np.clip(given, lo, hi)


def _objective_parts(problem, objective: str):
    """(residual function of one start, laplace mask, penalty or None, the constant)."""
    ref = problem.residual_layout()
    penalty = None
    if objective == "map" and bool(np.any(problem.priors.given)):
        def penalty(x):
            return -problem.log_prior(x, jacobian=False, given_only=True)
    return (lambda x: tuple(problem.residuals(x))[:2], np.asarray(ref.laplace), penalty,
            float(ref.constant))


def _lm_pass(problem, x0, objective, max_iter, bar, tol_factor: float, ftol: float):
    """One batched LM run from ``x0`` with the solves at ``tol_factor`` times the problem's
    tolerances: (final state, objective history, the kernel)."""
    terms, lap, penalty, _ = _objective_parts(problem, objective)
    lo, hi = problem.bounds
    record_factor = tol_factor * LM_POLICY.record_tol_factor

    # every iteration replays each start's kept mesh, recorded at half the pass's
    # tolerances so that it meets them in a neighbourhood (error ratios below in the
    # pass's units)
    def terms_on(x, mesh):
        z, s, err = problem.replay_residuals(x, mesh)
        return z, s, LM_POLICY.error_ratio(err)

    # starts are evaluated in groups of similar mesh length (their longest condition's)
    # where each start solves several conditions: then a padded batch pads all of them
    # (Fujita_SciSignal2010, 6 conditions, 20 starts: 10-12 s an LM iteration -> 2-3 s);
    # with one condition a batch of small solves costs mostly its calls' fixed overhead
    # (Boehm_JProteomeRes2014: 5 starts 90 ms an evaluation, 20 starts 161 ms)
    cost = None
    if len(problem.condition_ids) > 1:
        def cost(mesh):
            return np.max(np.asarray(mesh.n_steps), axis=-1)
    mesh_terms = MeshTerms(lambda x: problem.record(x, record_factor), terms_on, cost)
    kernel = LMKernel(terms, lap, penalty, lower=lo, upper=hi, mesh_terms=mesh_terms,
                      ftol=ftol, gtol=1e-6, policy=LM_POLICY,
                      profiled=problem.residual_layout().profiled)
    s, history = kernel.run(x0, max_iter, callback=lambda s: bar.update(1))
    return s, history, kernel


def _fit_lm(problem, x0, objective, max_iter, progress):
    _, _, penalty, const = _objective_parts(problem, objective)
    loose = _LOOSE_TOL_FACTOR
    bar = progress_bar(progress, total=max_iter, done=0, desc="fit PEtab (LM)")
    try:
        passes = []
        x = x0
        if loose > 1.0:
            # far from an optimum the path needs descent directions, not the tolerances'
            # digits: iterate at ``loose`` times the tolerances, then polish
            passes.append(_lm_pass(problem, x, objective, max_iter, bar, loose,
                                   _LOOSE_FTOL))
            x = np.asarray(passes[-1][0].x)
        # Fides' default stop (pyPESTO's optimiser on these problems): an accepted step
        # that lowers F by at most 1e-8 (1 + |F|) (its fatol = frtol = 1e-8), or
        # max |g| <= 1e-6
        passes.append(_lm_pass(problem, x, objective, max_iter, bar, 1.0, 1e-8))
    finally:
        bar.close()
    s = passes[-1][0]
    failed = np.asarray(passes[0][0].code) == FAILED_START

    # the reported objective is a fresh solve's at each final point (the iterations'
    # values came from replays of kept meshes, equal to within the tolerances); the same
    # solve gives the inner parameters' optima of a hierarchical problem
    def fresh(x):
        full, ll = problem.full_parameters(x, log_likelihood=True)
        value = -ll
        if penalty is not None:
            value = value + penalty(x)
        return value, full

    losses, full = (np.asarray(a) for a in jax.jit(jax.vmap(fresh))(s.x))
    code = np.asarray(s.code)
    hist = np.concatenate([np.stack(h) for _, h, _ in passes]) - const
    counts = (sum(np.asarray(p[0].records) for p in passes),
              sum(p[2].n_records for p in passes), sum(p[2].n_evals for p in passes))
    failed = failed | (code == FAILED_START)
    reasons = np.where(failed, "not_finite", np.asarray(REASONS)[np.asarray(s.reason)])
    return (np.asarray(s.x), losses, code == CONVERGED, failed, hist, counts, reasons, full)


def _fit_lbfgs(problem, x0, objective, max_iter, progress):
    from scipy.optimize import minimize

    def loss(x):
        value = -problem.log_likelihood(x)
        if objective == "map":
            value = value - problem.log_prior(x, jacobian=False, given_only=True)
        return value

    vg = jax.jit(jax.value_and_grad(loss))
    lo, hi = (np.asarray(b, float) for b in problem.bounds)
    xs, losses, conv, failed, history, n_eval, why = [], [], [], [], [], [], []
    bar = progress_bar(progress, total=len(x0), done=0, desc="fit PEtab (L-BFGS-B)")
    for x in x0:
        trace = []

        def fun(x):
            v, g = vg(jnp.asarray(x))
            v, g = float(v), np.asarray(g, float)
            ok = np.isfinite(v) and np.isfinite(g).all()
            trace.append(v if ok else np.inf)
            return (v, g) if ok else (np.inf, np.zeros_like(g))

        v0 = fun(x)[0]
        if not np.isfinite(v0):
            xs.append(x), losses.append(np.inf), conv.append(False), failed.append(True)
            why.append("not_finite")
        else:
            res = minimize(fun, x, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                           options=dict(maxiter=max_iter))
            xs.append(res.x), losses.append(float(res.fun)), conv.append(bool(res.success))
            failed.append(False)
            why.append(_lbfgs_reason(res))
        n_eval.append(len(trace))
        history.append(np.minimum.accumulate(np.asarray(trace)))
        bar.update(1)
    bar.close()
    width = max(len(h) for h in history)
    hist = np.stack([np.pad(h, (0, width - len(h)), mode="edge") for h in history], axis=1)
    return (np.stack(xs), np.asarray(losses), np.asarray(conv), np.asarray(failed), hist,
            (np.asarray(n_eval), int(np.sum(n_eval)), int(np.sum(n_eval))), np.asarray(why),
            None)


def _full_params(problem, x, full=None) -> dict:
    """Each start's parameters by id from its outer point ``x (n, D)``: with inner
    parameters, every estimated parameter (``full (n, n_full)``, else computed here by
    ``problem.full_parameters``), else those of ``x``."""
    if not problem.inner_parameter_ids:
        return {p: x[:, i] for i, p in enumerate(problem.parameter_ids)}
    if full is None:
        full = np.asarray(jax.jit(jax.vmap(problem.full_parameters))(jnp.asarray(x)))
    return {p: full[:, i] for i, p in enumerate(problem.full_parameter_ids)}


def _lbfgs_reason(res) -> str:
    """SciPy's L-BFGS-B exit message as one of `FitResult.exit_reasons`' names."""
    msg = str(res.message).upper()
    if "REDUCTION" in msg:
        return "ftol"
    if "GRADIENT" in msg:
        return "gtol"
    if "ITERATIONS" in msg or "EVALUATIONS" in msg:
        return "max_iter"
    return "abnormal"


def fit_petab(problem, *, init=None, n_starts: int = 20, seed: int = 0,
              objective: str = "map", max_iter: int = 1000, method: str = "auto",
              progress: bool | None = None, max_time: float | None = None,
              checkpoint=None, checkpoint_every: int = 100, local: str = "auto") -> FitResult:
    """Multistart fit of a `models.PetabProblem` (what `inference.fit` runs for one).

    Args:
        problem: the PEtab problem.
        init: ``None``, or one or more starting points on the parameter scale (a dict by
            parameter id, a ``(D,)`` vector or ``(k, D)`` rows): the first starts; the rest
            are Latin hypercube draws inside the bounds. A value outside its bounds (as
            a log-scaled parameter given linear is), not finite, or under an id that is
            not the problem's is a ``ValueError`` naming it (a dict may also hold the
            inner parameters of a previous fit's ``params``: their closed forms set them).
        n_starts: number of starts; seed: seeds the Latin hypercube.
        objective: ``"map"`` (negative log-likelihood minus the log priors the parameter
            table gives: PEtab's and pyPESTO's objective) or ``"mle"``.
        max_iter: iterations per start.
        method: ``"lm"``, ``"lbfgs"`` or ``"auto"`` (LM where every noise model is normal),
            or ``"global"``: `inference.petab._global.fit_global` (CMA-ES restarts, every
            generation one ensemble, LM polishes; ``n_starts`` the best distinct points
            it refines at the end, ``max_iter`` its generations).
        progress: a progress bar (default: only on a terminal).
        max_time, checkpoint, checkpoint_every, local: ``method="global"`` only
            (`fit_global`'s; ``local`` its polisher).

    Returns:
        `FitResult` with the starts sorted by final objective (the waterfall, best first).
        For a problem with inner parameters (hierarchical optimisation), ``params`` and
        ``all_params`` hold every estimated parameter, the inner ones at their closed-form
        optimum given each start's final point (``problem.full_parameters``), while
        ``parameter_ids`` and ``starts`` are the outer parameters the optimiser moved.
    """
    t0 = time.perf_counter()
    gs.ensure_compilation_cache()
    if objective not in ("map", "mle"):
        raise ValueError(f"`objective` must be 'map' or 'mle', got {objective!r}")
    if method not in ("auto", "lm", "lbfgs", "global"):
        raise ValueError(f"`method` must be 'auto', 'lm', 'lbfgs' or 'global', got "
                         f"{method!r}")
    if method == "global":
        from ._global import fit_global

        res = fit_global(problem, init=init, n_starts=n_starts, seed=seed,
                         objective=objective, max_generations=max_iter, max_time=max_time,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                         progress=progress, local=local)
        if not problem.inner_parameter_ids:
            return res
        x = np.stack([np.asarray(res.all_params[p], float) for p in problem.parameter_ids],
                     axis=1)
        every = _full_params(problem, x)
        return dataclasses.replace(res, all_params=every, params={
            p: v[res.best_index] for p, v in every.items()})
    for name, v in (("max_time", max_time), ("checkpoint", checkpoint),
                    ("local", None if local == "auto" else local)):
        if v is not None:
            raise ValueError(f"`{name}` applies to method='global' only (the multistart "
                             f"{method!r} runs each start to convergence)")
    for name, v in (("n_starts", n_starts), ("max_iter", max_iter)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
    x0 = _starts(problem, init, int(n_starts), seed)
    lap = np.asarray(problem.residual_layout().laplace)
    if method == "auto":
        method = "lbfgs" if lap.any() else "lm"
    run = _fit_lm if method == "lm" else _fit_lbfgs
    # (records per start, ensemble records, ensemble evaluations)
    x, losses, converged, failed, hist, (per_start, n_records, n_evals), reasons, full = run(
        problem, x0, objective, int(max_iter), progress)
    losses = np.where(failed | ~np.isfinite(losses), np.inf, losses)
    ids = problem.parameter_ids
    return FitResult.of_starts(
        _full_params(problem, x, full), losses, sort=True, loss_history=hist,
        n_records=n_records, n_records_per_start=per_start.astype(np.int64),
        n_grad_evals=n_evals, wall_time=time.perf_counter() - t0,
        status=np.where(failed, FAILED, 0).astype(np.int32), objective=objective,
        n_steps=len(hist) - 1, max_error_ratio=np.zeros(len(losses)), starts=x0,
        converged=converged, parameter_ids=tuple(ids), method=method,
        exit_reasons=reasons)
