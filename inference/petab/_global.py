"""A global optimiser for PEtab problems: CMA-ES restarts whose every generation is one
ensemble, the best points polished by the batched Levenberg–Marquardt.

Why: a Latin hypercube multistart of a local optimiser fails where the bounds span many
decades (Fujita_SciSignal2010: 19 parameters in [1e-8, 1e8]; 20 LM starts reached 46.59
against the optimum's -53.08, 8 of them on a plateau at 10011.5 where the outputs do not
respond; of 400 screened points the best five lay 4.3-6.9 decades from the optimum). A
population method needs only objective values, ranks them (so an objective of 1e39 far
out does not distort the step), and hands its whole population to one batched call.

Method (Hansen 2016, "The CMA Evolution Strategy: A Tutorial", arXiv:1604.00772; with IPOP
restarts, Auger & Hansen 2005, "A restart CMA evolution strategy with increasing
population size"):

- Coordinates: each parameter's bounds on its parameter scale mapped to [0, 1]. The
  distribution lives in the unbounded normalised space and each sample is evaluated at
  its mirror image in the box (the periodic reflection ``|((u + 1) mod 2) - 1|``, a
  boundary transformation as pycma's ``BoundTransform``): the update sees the samples it
  drew, so step-size adaptation is undisturbed, and an optimum on a bound lies on a fold.
- Each generation draws ``lambda`` points ``m + sigma B D z`` and evaluates them as one
  ensemble (`models.PetabProblem.log_likelihood` under ``jax.vmap``, compiled once, in
  chunks of the first population's size) at 100 times the problem's tolerances (a ranking
  needs no eight digits; the LM's loose pass uses the same factor); a point whose solve
  fails gets ``+inf``. The objective is `inference.fit`'s: the negative log-likelihood,
  minus the table's given log priors for ``"map"``.
- The update: weighted recombination of the best ``mu = lambda / 2`` (failed points get no
  weight), cumulative step-size adaptation, rank-one and rank-mu covariance updates with
  the tutorial's default constants.
- A run ends on TolX (``sigma`` times the largest standard deviation below 1e-4 of the
  box), TolFun (the best values of the last ``10 + 30 D / lambda`` generations within
  1e-8 (1 + |f|)), stagnation (no improvement in ``120 + 30 D / lambda`` generations), a
  covariance condition number above 1e14, or ``10 + 30 D / lambda`` consecutive flat
  generations (all the best quarter equal, or none finite: the step size grows at each,
  as pycma does). Its best point is then polished by the batched LM (L-BFGS-B where a
  noise model is Laplace) at the problem's tolerances, and a new run starts from a
  uniform random mean with twice the population (IPOP; at most 64 times the first,
  ``4 + floor(3 ln D)``).
- Kept points: the ``n_starts`` best points seen (evaluated or polished), each at least
  0.01 of the box from every better one in some coordinate (Chebyshev distance), so
  that they are not all one point (where too few are that far apart, the best of the
  others fill in).
- The search stops after ``max_generations`` generations (all runs together) or once
  ``max_time`` seconds have passed (checked before each generation and each polish); then
  the kept points are refined by the LM as one ensemble (the refinement runs after
  ``max_time``), and the result is the refined points, sorted (`FitResult`, ``method =
  "global"``).

The whole search is a `GlobalState` (a NamedTuple of host values, the NumPy generator's
state included) advanced by `CMAKernel.ask` / `CMAKernel.tell`; a checkpoint is that
state, so a resumed search continues bit for bit.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

from .. import _checkpoint
from .._progress import progress_bar
from .._result import FAILED, FitResult
from ._petab import _LOOSE_TOL_FACTOR, _fit_lbfgs, _fit_lm, _objective_parts, _starts
from ._problem import finite_bounds

__all__ = ["CMAState", "GlobalState", "CMAKernel", "fit_global"]

_SIGMA0 = 0.3
"""Each run's initial step size, as a fraction of the box (Hansen's ``0.3 (b - a)``)."""

_TOL_X = 1e-4
"""A run has converged when ``sigma`` times its largest standard deviation falls below
this fraction of the box: the LM polish does the rest at quadratic speed."""

_TOL_FUN = 1e-8
"""... or when its generations' best values of the last ``10 + 30 D / lambda``
generations lie within this times ``1 + |f|``."""

_MAX_CONDITION = 1e14
"""... or when the covariance's condition number passes this."""

_MAX_POPSIZE_FACTOR = 64
"""IPOP doubles the population at each restart, up to this times the first."""

_DISTINCT = 1e-2
"""Kept points lie at least this fraction of the box apart (Chebyshev distance)."""

_LM_MAX_ITER = 1000
"""Iterations per start of the LM polishes and of the final refinement."""


class CMAState(NamedTuple):
    """One CMA-ES run (normalised coordinates: the box is ``[0, 1]^D``; ``D`` parameters).

    Attributes:
        mean: ``(D,)`` the distribution's mean (unbounded; its mirror image in the box is
            the point it stands for).
        sigma: the step size.
        cov: ``(D, D)`` the covariance matrix.
        p_sigma, p_c: ``(D,)`` the evolution paths of the step size and the covariance.
        popsize: ``lambda``, the points per generation.
        generation: generations of this run.
        best_x: ``(D,)`` the run's best point on the parameter scale; best_f: its objective.
        recent: ``(k,)`` the best objective of each of the run's last generations (at most
            ``120 + 30 D / lambda``), oldest first.
        flat: consecutive flat generations.
        why: why the run ended (``"tolx"``, ``"tolfun"``, ``"stagnation"``,
            ``"condition"``, ``"flat"``), ``None`` while it goes on.
    """

    mean: np.ndarray
    sigma: float
    cov: np.ndarray
    p_sigma: np.ndarray
    p_c: np.ndarray
    popsize: int
    generation: int
    best_x: np.ndarray
    best_f: float
    recent: np.ndarray
    flat: int
    why: str | None = None


class GlobalState(NamedTuple):
    """The whole global search (host values). A checkpoint is this state.

    Attributes:
        run: the current `CMAState`; n_runs: runs started (the current one included).
        rng: the NumPy generator's state (``bit_generator.state``).
        generation: generations done, all runs together; n_evals: points evaluated.
        kept_x: ``(k, D)`` the best mutually distinct points seen (parameter scale), best
            first; kept_f: ``(k,)`` their objectives (the search's, at 100x the
            tolerances, or a polish's, at the tolerances).
        history: the best kept objective after each generation.
        runs: one ``(popsize, generations, why it ended, its best objective, the
            polished objective, seconds since the search began)`` per finished run
            (``nan``: the polish failed).
        n_records, n_grad_evals: the polishes' ensemble records and evaluations.
        elapsed: seconds spent before the current call (resumed searches add up).
    """

    run: CMAState
    n_runs: int
    rng: dict
    generation: int
    n_evals: int
    kept_x: np.ndarray
    kept_f: np.ndarray
    history: tuple
    runs: tuple
    n_records: int
    n_grad_evals: int
    elapsed: float


def mirror(u):
    """``u`` (any shape) reflected into ``[0, 1]`` at its faces, periodically."""
    return np.abs(np.mod(np.asarray(u, float) + 1.0, 2.0) - 1.0)


class CMAKernel:
    """`start`, `ask` and `tell` of a (mu/mu_w, lambda)-CMA-ES in ``D`` normalised
    coordinates, with the tutorial's default constants (Hansen 2016, Table 1 and (A.1)).

    Args:
        dim: ``D``, the number of parameters.
        lower, upper: ``(D,)`` the finite bounds (parameter scale): ``0`` and ``1`` of the
            normalised coordinates.
    """

    def __init__(self, dim: int, lower, upper):
        self.dim = int(dim)
        self.lower, self.upper = np.asarray(lower, float), np.asarray(upper, float)
        self.popsize0 = 4 + int(math.floor(3.0 * math.log(self.dim)))

    def to_params(self, u) -> np.ndarray:
        """Normalised (unbounded) points ``(..., D)`` -> their mirror images on the
        parameter scale."""
        return self.lower + (self.upper - self.lower) * mirror(u)

    def constants(self, popsize: int) -> dict:
        """The strategy's constants for ``lambda = popsize`` (Hansen 2016, Table 1)."""
        n, lam = self.dim, int(popsize)
        mu = lam // 2
        w = np.log((lam + 1) / 2.0) - np.log(np.arange(1, mu + 1))
        w /= w.sum()
        mu_eff = 1.0 / np.sum(w**2)
        c_sigma = (mu_eff + 2.0) / (n + mu_eff + 5.0)
        d_sigma = 1.0 + 2.0 * max(0.0, math.sqrt((mu_eff - 1.0) / (n + 1.0)) - 1.0) + c_sigma
        c_c = (4.0 + mu_eff / n) / (n + 4.0 + 2.0 * mu_eff / n)
        c_1 = 2.0 / ((n + 1.3) ** 2 + mu_eff)
        c_mu = min(1.0 - c_1, 2.0 * (mu_eff - 2.0 + 1.0 / mu_eff)
                   / ((n + 2.0) ** 2 + mu_eff))
        chi_n = math.sqrt(n) * (1.0 - 1.0 / (4.0 * n) + 1.0 / (21.0 * n**2))
        window = 10 + int(math.ceil(30.0 * n / lam))
        return dict(mu=mu, weights=w, mu_eff=mu_eff, c_sigma=c_sigma, d_sigma=d_sigma,
                    c_c=c_c, c_1=c_1, c_mu=c_mu, chi_n=chi_n, tolfun_window=window,
                    stagnation=120 + int(math.ceil(30.0 * n / lam)))

    def start(self, mean, popsize: int) -> CMAState:
        """A new run at ``mean`` (``(D,)`` normalised) with ``lambda = popsize``."""
        n = self.dim
        return CMAState(mean=np.asarray(mean, float).copy(), sigma=_SIGMA0, cov=np.eye(n),
                        p_sigma=np.zeros(n), p_c=np.zeros(n), popsize=int(popsize),
                        generation=0, best_x=self.to_params(mean), best_f=np.inf,
                        recent=np.zeros(0), flat=0)

    @staticmethod
    def _eigen(cov):
        """``(B, d)`` with ``cov = B diag(d^2) B^T``."""
        d2, b = np.linalg.eigh(0.5 * (cov + cov.T))
        return b, np.sqrt(np.maximum(d2, 1e-300))

    def ask(self, s: CMAState, rng: np.random.Generator) -> np.ndarray:
        """``(lambda, D)`` normalised points ``m + sigma B D z``, ``z ~ N(0, I)``."""
        b, d = self._eigen(s.cov)
        z = rng.standard_normal((s.popsize, self.dim))
        return s.mean + s.sigma * (z * d) @ b.T

    def tell(self, s: CMAState, u: np.ndarray, f: np.ndarray) -> CMAState:
        """The run after the points ``u (lambda, D)`` (from `ask`) scored ``f (lambda,)``
        (``inf``: failed), with ``why`` set where it ends."""
        c = self.constants(s.popsize)
        f = np.where(np.isfinite(f), f, np.inf)
        order = np.argsort(f, kind="stable")
        best = order[0]
        best_x, best_f = s.best_x, s.best_f
        if f[best] < best_f:
            best_x, best_f = self.to_params(u[best]), float(f[best])
        recent = np.append(s.recent, f[best])[-c["stagnation"]:]
        q = int(math.ceil(0.1 + s.popsize / 4.0))
        flat = not np.isfinite(f[best]) or f[order[q - 1]] == f[best]
        s = s._replace(generation=s.generation + 1, best_x=best_x, best_f=best_f,
                       recent=recent, flat=s.flat + 1 if flat else 0)
        if np.isfinite(f[best]):
            s = self._update(s, u, f, order, c)
        if flat:
            # a plateau (or no finite point): widen the search (pycma's rule)
            s = s._replace(sigma=s.sigma * math.exp(0.2 + c["c_sigma"] / c["d_sigma"]))
        return s._replace(why=self._why_stop(s, f, c))

    def _update(self, s: CMAState, u, f, order, c) -> CMAState:
        """Mean, evolution paths, covariance and step size (the tutorial's (A.1))."""
        n, mu = self.dim, c["mu"]
        sel = order[:mu]
        w = np.where(np.isfinite(f[sel]), c["weights"], 0.0)
        w /= w.sum()
        y = (u[sel] - s.mean) / s.sigma
        y_w = w @ y
        mean = s.mean + s.sigma * y_w
        b, d = self._eigen(s.cov)
        inv_sqrt = (b / d) @ b.T
        cs, cc, mu_eff = c["c_sigma"], c["c_c"], c["mu_eff"]
        p_sigma = (1.0 - cs) * s.p_sigma + math.sqrt(cs * (2.0 - cs) * mu_eff) * inv_sqrt @ y_w
        norm = float(np.linalg.norm(p_sigma))
        h_sigma = norm / math.sqrt(1.0 - (1.0 - cs) ** (2 * s.generation)) < (
            1.4 + 2.0 / (n + 1.0)) * c["chi_n"]
        p_c = (1.0 - cc) * s.p_c + h_sigma * math.sqrt(cc * (2.0 - cc) * mu_eff) * y_w
        c1, cmu = c["c_1"], c["c_mu"]
        delta = (1.0 - h_sigma) * cc * (2.0 - cc)
        cov = ((1.0 + c1 * delta - c1 - cmu) * s.cov + c1 * np.outer(p_c, p_c)
               + cmu * (w[:, None] * y).T @ y)
        sigma = s.sigma * math.exp(cs / c["d_sigma"] * (norm / c["chi_n"] - 1.0))
        return s._replace(mean=mean, sigma=sigma, cov=0.5 * (cov + cov.T), p_sigma=p_sigma,
                          p_c=p_c)

    def _why_stop(self, s: CMAState, f, c) -> str | None:
        """Why the run ends after this generation (``None``: it goes on)."""
        _, d = self._eigen(s.cov)
        if s.sigma * max(d.max(), np.abs(s.p_c).max()) < _TOL_X:
            return "tolx"
        w = c["tolfun_window"]
        finite = f[np.isfinite(f)]
        if (len(s.recent) >= w and finite.size and np.isfinite(s.recent[-w:]).all()
                and max(np.ptp(s.recent[-w:]), np.ptp(finite))
                <= _TOL_FUN * (1.0 + abs(s.best_f))):
            return "tolfun"
        if (len(s.recent) >= c["stagnation"]
                and not np.min(s.recent[-c["stagnation"] + 1:]) < s.recent[0]):
            return "stagnation"
        if (d.max() / d.min()) ** 2 > _MAX_CONDITION:
            return "condition"
        if s.flat >= w:
            return "flat"
        return None


def _keep(kept_x, kept_f, x, f, k: int, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of the kept and the new points, each at least `_DISTINCT` of the box
    from every better one chosen (ties: the kept first); where fewer are that far apart,
    the best of the others fill the ``k``, best first."""
    xs = np.concatenate([kept_x, np.asarray(x, float)])
    fs = np.concatenate([kept_f, np.where(np.isfinite(f), f, np.inf)])
    u = (xs - lower) / (upper - lower)
    order = np.argsort(fs, kind="stable")
    chosen: list[int] = []
    for i in order:
        if len(chosen) == k:
            break
        if not chosen or np.min(np.max(np.abs(u[chosen] - u[i]), axis=1)) > _DISTINCT:
            chosen.append(int(i))
    if len(chosen) < k:
        chosen += [int(i) for i in order if i not in chosen][:k - len(chosen)]
        chosen.sort(key=lambda i: (fs[i], i))
    return xs[chosen], fs[chosen]


class _Evaluate:
    """The search's objective of ``(n, D)`` points as one ensemble per chunk (compiled
    once, for chunks of ``chunk`` rows, the last padded with repeats of its first row)."""

    def __init__(self, problem, objective: str, chunk: int):
        loose = problem.with_settings(rtol=problem.rtol * _LOOSE_TOL_FACTOR,
                                      atol=problem.atol * _LOOSE_TOL_FACTOR)
        _, _, penalty, _ = _objective_parts(problem, objective)

        def one(x):
            value = -loose.log_likelihood(x)
            if penalty is not None:
                value = value + penalty(x)
            return jnp.where(jnp.isfinite(value), value, jnp.inf)

        self._f = jax.jit(jax.vmap(one))
        self.chunk = int(chunk)

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x, float)
        out = []
        for i in range(0, len(x), self.chunk):
            part = x[i:i + self.chunk]
            pad = np.concatenate([part, np.repeat(part[:1], self.chunk - len(part), 0)])
            out.append(np.asarray(self._f(pad))[:len(part)])
        return np.concatenate(out)


def _fingerprint(problem, **settings) -> dict:
    """What a checkpoint of a global search must share with the search resuming it."""
    pp = problem.petab_problem
    return dict(model=problem.odes.model_id, parameters=tuple(problem.parameter_ids),
                bounds=_checkpoint.digest(tuple(np.asarray(b, float) for b in problem.bounds)),
                measurements=_checkpoint.digest(pp.measurement_df.to_csv(index=False).encode()),
                solver=repr(problem.solver), rtol=float(problem.rtol),
                atol=float(problem.atol), max_steps=int(problem.max_steps), **settings)


def fit_global(problem, *, init=None, n_starts: int = 1, seed: int = 0,
               objective: str = "map", max_generations: int = 1000,
               max_time: float | None = None, local: str = "auto", checkpoint=None,
               checkpoint_every: int = 100, progress: bool | None = None) -> FitResult:
    """Global fit of a `models.PetabProblem` (what `inference.fit` runs for
    ``method="global"``): CMA-ES restarts with a growing population, every generation one
    ensemble, each run's best polished by the batched LM, the best points refined at the
    end (the module docstring says how).

    Args:
        problem: the PEtab problem (finite bounds).
        init: ``None``, or points on the parameter scale (a dict by parameter id, a
            ``(D,)`` vector or ``(k, D)`` rows): the first run starts at the first; all
            are evaluated and may be kept.
        n_starts: how many of the best distinct points found are refined at the end (the
            rows of the result).
        seed: seeds the search (a NumPy generator).
        objective: ``"map"`` (negative log-likelihood minus the table's given log priors)
            or ``"mle"``.
        max_generations: the search's generations, all runs together.
        max_time: seconds after which the search stops (``None``: none); the final
            refinement comes after it.
        local: the polisher, ``"lm"``, ``"lbfgs"`` or ``"auto"`` (LM where every noise
            model is normal).
        checkpoint: a file path: the search's `GlobalState` is saved there every
            ``checkpoint_every`` generations, after each polish, at the end and when an
            exception stops it; a later call with the same path (and seed, objective,
            ``n_starts``, ``init``) resumes from it and ends at the same result as an
            uninterrupted search. ``max_generations`` and ``max_time`` count the resumed
            search's generations and seconds too.
        checkpoint_every: generations between saves.
        progress: a progress bar (default: only on a terminal).

    Returns:
        `FitResult` with ``method="global"``: the refined points sorted by objective
        (``starts``: the kept points they were refined from); ``loss_history``: the best
        kept objective after each generation (in every column), then each refined point's
        LM iterations; ``n_steps`` the rows after the first; ``n_records`` and
        ``n_grad_evals`` the LM's (polishes and refinement).

    Example:
        >>> problem = models.load_petab("Fujita_SciSignal2010")
        >>> res = fit_global(problem, n_starts=5, max_time=1800, seed=1)
        >>> res.loss, res.method                    # the best objective, "global"
    """
    t_start = time.perf_counter()
    gs.ensure_compilation_cache()
    if objective not in ("map", "mle"):
        raise ValueError(f"`objective` must be 'map' or 'mle', got {objective!r}")
    if local not in ("auto", "lm", "lbfgs"):
        raise ValueError(f"`local` must be 'auto', 'lm' or 'lbfgs', got {local!r}")
    for name, v in (("n_starts", n_starts), ("max_generations", max_generations),
                    ("checkpoint_every", checkpoint_every)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
    if max_time is not None and not (isinstance(max_time, (int, float, np.integer,
                                                           np.floating))
                                     and not isinstance(max_time, bool) and max_time > 0):
        raise ValueError(f"`max_time` must be a number of seconds > 0 or None, got "
                         f"{max_time!r}")
    _checkpoint.check_path(checkpoint)
    lo, hi = finite_bounds(problem)
    given = None
    if init is not None:
        rows = 1 if isinstance(init, dict) else len(np.atleast_2d(np.asarray(init, float)))
        given = _starts(problem, init, rows, seed)
    if local == "auto":
        local = "lbfgs" if np.asarray(problem.residual_layout().laplace).any() else "lm"
    polisher = _fit_lm if local == "lm" else _fit_lbfgs

    kernel = CMAKernel(len(lo), lo, hi)
    evaluate = _Evaluate(problem, objective, kernel.popsize0)
    k = int(n_starts)
    fingerprint = _fingerprint(problem, method="global", seed=int(seed), objective=objective,
                               n_starts=k, local=local, init=_checkpoint.digest(given))
    state = _checkpoint.load(checkpoint, fingerprint, "global fit")
    if state is None:
        rng = np.random.default_rng(seed)
        kept_x, kept_f, n_evals = np.zeros((0, len(lo))), np.zeros(0), 0
        if given is None:
            mean = rng.uniform(size=len(lo))
        else:
            mean = (given[0] - lo) / (hi - lo)
            kept_x, kept_f = _keep(kept_x, kept_f, given, evaluate(given), k, lo, hi)
            n_evals = len(given)
        state = GlobalState(run=kernel.start(mean, kernel.popsize0), n_runs=1,
                            rng=rng.bit_generator.state, generation=0, n_evals=n_evals,
                            kept_x=kept_x, kept_f=kept_f, history=(), runs=(),
                            n_records=0, n_grad_evals=0, elapsed=0.0)
    rng = np.random.default_rng()
    rng.bit_generator.state = state.rng
    elapsed = state.elapsed

    def now():
        return elapsed + time.perf_counter() - t_start

    def time_up():
        return max_time is not None and now() >= max_time

    def save(s):
        if checkpoint is not None:
            _checkpoint.save_or_warn(checkpoint, fingerprint, s._replace(elapsed=now()))

    bar = progress_bar(progress, total=max_generations, done=state.generation,
                       desc="fit PEtab (global)")
    try:
        # (a fresh search runs one generation whatever the time: it has points to refine)
        while state.generation < max_generations and (state.generation == 0
                                                      or not time_up()):
            if state.run.why is not None:
                # the run ended: polish its best and start the next (a search
                # interrupted in the polish redoes it when resumed)
                state = _next_run(state, kernel, polisher, problem, objective, rng, k,
                                  now)
                bar.set_postfix(best=f"{state.kept_f[0]:.6g}", runs=state.n_runs)
                save(state)
                continue
            u = kernel.ask(state.run, rng)
            x = kernel.to_params(u)
            f = evaluate(x)
            kept_x, kept_f = _keep(state.kept_x, state.kept_f, x, f, k, lo, hi)
            state = state._replace(run=kernel.tell(state.run, u, f),
                                   rng=rng.bit_generator.state,
                                   generation=state.generation + 1,
                                   n_evals=state.n_evals + len(x), kept_x=kept_x,
                                   kept_f=kept_f, history=state.history + (kept_f[0],))
            bar.update(1)
            if state.generation % checkpoint_every == 0:
                save(state)
        save(state)
    except BaseException:
        save(state)
        raise
    finally:
        bar.close()

    # the final refinement of the kept points: one ensemble
    x0 = state.kept_x
    x, losses, converged, failed, hist, (per_start, n_records, n_evals), reasons, _ = polisher(
        problem, x0, objective, _LM_MAX_ITER, progress)
    losses = np.where(failed | ~np.isfinite(losses), np.inf, losses)
    search = np.broadcast_to(np.asarray(state.history, float)[:, None],
                             (len(state.history), len(x0)))
    hist = np.concatenate([search, hist])
    ids = problem.parameter_ids
    return FitResult.of_starts(
        {p: x[:, i] for i, p in enumerate(ids)}, losses, sort=True, loss_history=hist,
        n_records=state.n_records + n_records,
        n_records_per_start=per_start.astype(np.int64),
        n_grad_evals=state.n_grad_evals + n_evals, wall_time=now(),
        status=np.where(failed, FAILED, 0).astype(np.int32), objective=objective,
        n_steps=len(hist) - 1, max_error_ratio=np.zeros(len(losses)), starts=x0,
        converged=converged, parameter_ids=tuple(ids), method="global",
        exit_reasons=reasons)


def _next_run(state: GlobalState, kernel: CMAKernel, polisher, problem, objective: str,
              rng: np.random.Generator, k: int, now) -> GlobalState:
    """``state`` after its run ended: the run's best polished and kept (among the ``k``
    best), and a new run at a uniform random mean with twice the population (IPOP);
    ``now()`` the search's seconds so far."""
    run = state.run
    polished = np.nan
    kept_x, kept_f = state.kept_x, state.kept_f
    n_records, n_grad = state.n_records, state.n_grad_evals
    if np.isfinite(run.best_f):
        x, losses, _, failed, _, (_, rec, ev), _, _ = polisher(
            problem, run.best_x[None], objective, _LM_MAX_ITER, False)
        n_records, n_grad = n_records + rec, n_grad + ev
        if not failed[0] and np.isfinite(losses[0]):
            polished = float(losses[0])
            kept_x, kept_f = _keep(kept_x, kept_f, x[:1], losses[:1], k, kernel.lower,
                                   kernel.upper)
    popsize = min(2 * run.popsize, _MAX_POPSIZE_FACTOR * kernel.popsize0)
    return state._replace(
        run=kernel.start(rng.uniform(size=kernel.dim), popsize), n_runs=state.n_runs + 1,
        rng=rng.bit_generator.state, kept_x=kept_x, kept_f=kept_f, n_records=n_records,
        n_grad_evals=n_grad,
        runs=state.runs + ((run.popsize, run.generation, run.why, run.best_f, polished,
                            now()),))
