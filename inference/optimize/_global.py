"""The global search: CMA-ES restarts whose every generation is one ensemble, each run's
best polished by a local optimiser, the best points refined at the end.

Why: a multistart of a local optimiser fails where the bounds span many decades
(Fujita_SciSignal2010: 19 parameters in [1e-8, 1e8]; 20 Levenberg–Marquardt starts from a
Latin hypercube reached 46.59 against the optimum's -66.58, 8 of them on a plateau where the
outputs do not respond). A population method needs only objective values, ranks them (so
an objective of 1e39 far out does not distort the step), and hands its whole population to
one batched call.

Method (Hansen 2016, "The CMA Evolution Strategy: A Tutorial", arXiv:1604.00772; with IPOP
restarts, Auger & Hansen 2005, "A restart CMA evolution strategy with increasing
population size"):

- Coordinates: the distribution lives in normalised coordinates. A coordinate bounded on
  both sides maps its bounds to [0, 1], and each sample is evaluated at its mirror image
  in the box (the periodic reflection ``|((u + 1) mod 2) - 1|``, pycma's
  ``BoundTransform``): the update sees the samples it drew, so step-size adaptation is
  undisturbed, and an optimum on a bound lies on a fold. A coordinate without both bounds
  maps the spread of the problem's own starts (`sample_starts`: their median +- twice
  their standard deviation) to [0, 1], reflected at the one bound it has.
- Each run starts at one of the problem's starts (`sample_starts`; the first run at the
  first of the given starts) with step size 0.3 of the unit box.
- Each generation draws ``lambda`` points ``m + sigma B D z`` and evaluates them as one
  ensemble (compiled once, in chunks of the first population's size), at 100 times the
  problem's tolerances where the problem can loosen them (a ranking needs no eight
  digits); a point whose solve fails gets ``+inf``.
- The update: weighted recombination of the best ``mu = lambda / 2`` (failed points get no
  weight), cumulative step-size adaptation, rank-one and rank-mu covariance updates with
  the tutorial's default constants.
- A run ends on TolX (``sigma`` times the largest standard deviation below 1e-4 of the
  box), TolFun (the best values of the last ``10 + 30 D / lambda`` generations within
  1e-8 (1 + |f|)), stagnation (its best improved by at most 1e-4 (1 + |f|) over the last
  ``2 (120 + 30 D / lambda)`` generations: a run that creeps costs the time of new ones;
  or not at all over the last ``120 + 30 D / lambda``), a
  covariance condition number above 1e14, or ``10 + 30 D / lambda`` consecutive flat
  generations (all the best quarter equal, or none finite: the step size grows at each,
  as pycma does). Its best point is then polished by the local optimiser, and a new run
  starts with twice the population (IPOP; at most 64 times the first,
  ``4 + floor(3 ln D)``).
- Kept points: the ``n`` best points seen (evaluated or polished; ``n`` the number of
  starts given), each at least 0.01 of the unit box from every better one in some
  coordinate (Chebyshev distance), so that they are not all one point (where too few are
  that far apart, the best of the others fill in).
- Time: with a time limit (``max_time`` or a ``deadline``) the search runs until the
  final refinement's share is left (generations unlimited unless ``max_iter`` is given):
  10 % of the time, or 1.5 times the longest polish so far where that is more (at most
  half). Each polish stops where the search does, and the final refinement of the kept
  points (one ensemble) gets the rest and is stopped at the limit (its optimiser returns
  its best points so far); the whole call returns by the limit plus one generation or one
  local iteration. Without one, the search stops after ``max_iter`` generations (all runs
  together; 1000 by default).

The whole search is a `GlobalState` (a NamedTuple of host values, the NumPy generator's
state included) advanced by `CMAKernel.ask` / `CMAKernel.tell`; a checkpoint is that
state, so a resumed search continues bit for bit.
"""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import jax
import numpy as np

from .. import _checkpoint
from .._progress import progress_bar
from ._optimizer import AbstractOptimizer, OptimizeResult, checked_x0

__all__ = ["CMAState", "GlobalState", "CMAKernel", "GlobalSearch", "mirror"]

_SIGMA0 = 0.3
"""Each run's initial step size, as a fraction of the unit box (Hansen's ``0.3 (b - a)``)."""

_TOL_X = 1e-4
"""A run has converged when ``sigma`` times its largest standard deviation falls below
this fraction of the box: the local polish does the rest at quadratic speed."""

_TOL_FUN = 1e-8
"""... or when its generations' best values of the last ``10 + 30 D / lambda``
generations lie within this times ``1 + |f|``."""

_STAGNATION_RTOL = 1e-4
"""... or when its best improved by at most this times ``1 + |f|`` over the last
``2 (120 + 30 D / lambda)`` generations. Chosen on Fujita_SciSignal2010 (16 coordinates,
``lambda = 12``: 320 generations) from two first runs traced generation by generation:
seed 0's crept from 2,428 at generation 1,100 to 2,403 at 4,700 (tolfun), which this rule
ends at generation 1,641; seed 3's sat at 111.9-112.0 for 800 generations (1,300-2,100)
before it fell to the optimum (-52 by generation 2,960), and its smallest improvement over
any 320 generations on the way was 1.03e-4 of its value: it is not cut (a narrow margin).
Half the window (160) or ten times the tolerance (1e-3) would have cut seed 3's run at
111.9 (generations 1,495 and 1,525). A run whose best has not moved at all for
``120 + 30 D / lambda`` generations ends too (the rule before this one, Hansen's: seed 1's
first run sat at 2,723.9 from its fifth generation and waited 325 for the relative rule;
neither traced run went more than 81 generations without improving)."""

_MAX_CONDITION = 1e14
"""... or when the covariance's condition number passes this."""

_MAX_POPSIZE_FACTOR = 64
"""IPOP doubles the population at each restart, up to this times the first."""

_DISTINCT = 1e-2
"""Kept points lie at least this fraction of the unit box apart (Chebyshev distance)."""

_SCREEN_TOL_FACTOR = 100.0
"""The search ranks points by solves at this many times the problem's tolerances."""

_REFINE_SHARE = 0.1
"""With a time limit, the final refinement gets this share of it (the search the rest)."""

_REFINE_POLISHES = 1.5
"""... or at least this many times the longest polish so far (at most half the time): on
Fujita_SciSignal2010 under a load of 20 on 2 cores a polish took 200-380 s and the
refinement 232 s, against a share of 180 s of 1,800."""

_DEFAULT_GENERATIONS = 1000
"""The search's generations where no time limit and no ``max_iter`` is given."""

_N_SPREAD_DRAWS = 64
"""Starts drawn to scale the coordinates that lack a bound."""


class CMAState(NamedTuple):
    """One CMA-ES run (normalised coordinates; ``D`` parameters).

    Attributes:
        mean: ``(D,)`` the distribution's mean (unbounded; `CMAKernel.to_params` maps it
            to the point it stands for).
        sigma: the step size.
        cov: ``(D, D)`` the covariance matrix.
        p_sigma, p_c: ``(D,)`` the evolution paths of the step size and the covariance.
        popsize: ``lambda``, the points per generation.
        generation: generations of this run.
        best_x: ``(D,)`` the run's best point in the problem's coordinates; best_f: its
            objective.
        recent: ``(k,)`` the best objective of each of the run's last generations (at most
            ``10 + 30 D / lambda``), oldest first.
        trail: ``(k,)`` the run's best objective so far after each of its last
            ``1 + 2 (120 + 30 D / lambda)`` generations, oldest first (the stagnation
            rule's).
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
    trail: np.ndarray
    flat: int
    why: str | None = None


class GlobalState(NamedTuple):
    """The whole global search (host values). A checkpoint is this state.

    Attributes:
        run: the current `CMAState`; n_runs: runs started (the current one included).
        rng: the NumPy generator's state (``bit_generator.state``).
        generation: generations done, all runs together; n_evals: points evaluated.
        kept_x: ``(k, D)`` the best mutually distinct points seen, best first; kept_f:
            ``(k,)`` their objectives (the search's, at loose tolerances, or a polish's).
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
        dim: ``D``, the number of coordinates.
        lower, upper: ``(D,)`` the bounds (``-inf`` / ``inf`` where none); a coordinate
            bounded on both sides has its bounds at ``0`` and ``1`` of the normalised one.
        draws: ``(m, D)`` points spread as the problem's starts: a coordinate without both
            bounds has their median +- twice their standard deviation at ``0`` and ``1``
            (needed only where a bound is missing).
    """

    def __init__(self, dim: int, lower, upper, draws=None):
        self.dim = int(dim)
        self.lower, self.upper = np.asarray(lower, float), np.asarray(upper, float)
        lo_ok, hi_ok = np.isfinite(self.lower), np.isfinite(self.upper)
        self.boxed = lo_ok & hi_ok
        self.lower_only, self.upper_only = lo_ok & ~hi_ok, hi_ok & ~lo_ok
        self.offset = np.where(self.boxed, self.lower, 0.0)
        self.scale = np.where(self.boxed, self.upper - self.lower, 1.0)
        if not self.boxed.all():
            if draws is None:
                raise ValueError("CMAKernel: coordinates without both bounds need `draws` "
                                 "to scale them")
            draws = np.asarray(draws, float)
            center = np.median(draws, axis=0)
            spread = 4.0 * np.std(draws, axis=0)
            spread = np.where(np.isfinite(spread) & (spread > 0), spread,
                              np.maximum(1.0, np.abs(center)))
            self.offset = np.where(self.boxed, self.offset, center - spread / 2.0)
            self.scale = np.where(self.boxed, self.scale, spread)
        self.popsize0 = 4 + int(math.floor(3.0 * math.log(max(self.dim, 1))))

    def to_params(self, u) -> np.ndarray:
        """Normalised (unbounded) points ``(..., D)`` -> the points they stand for in the
        problem's coordinates (mirrored into the bounds)."""
        u = np.asarray(u, float)
        y = self.offset + self.scale * np.where(self.boxed, mirror(u), u)
        lo = np.where(self.lower_only, self.lower, 0.0)
        hi = np.where(self.upper_only, self.upper, 0.0)
        y = np.where(self.lower_only, lo + np.abs(y - lo), y)
        return np.where(self.upper_only, hi - np.abs(hi - y), y)

    def to_unit(self, x) -> np.ndarray:
        """Points ``(..., D)`` in the problem's coordinates -> normalised ones."""
        return (np.asarray(x, float) - self.offset) / self.scale

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
                    stagnation=2 * (120 + int(math.ceil(30.0 * n / lam))))

    def start(self, mean, popsize: int) -> CMAState:
        """A new run at ``mean`` (``(D,)`` normalised) with ``lambda = popsize``."""
        n = self.dim
        return CMAState(mean=np.asarray(mean, float).copy(), sigma=_SIGMA0, cov=np.eye(n),
                        p_sigma=np.zeros(n), p_c=np.zeros(n), popsize=int(popsize),
                        generation=0, best_x=self.to_params(mean), best_f=np.inf,
                        recent=np.zeros(0), trail=np.zeros(0), flat=0)

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
        recent = np.append(s.recent, f[best])[-c["tolfun_window"]:]
        trail = np.append(s.trail, best_f)[-(c["stagnation"] + 1):]
        q = int(math.ceil(0.1 + s.popsize / 4.0))
        flat = not np.isfinite(f[best]) or f[order[q - 1]] == f[best]
        s = s._replace(generation=s.generation + 1, best_x=best_x, best_f=best_f,
                       recent=recent, trail=trail, flat=s.flat + 1 if flat else 0)
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
        stuck = c["stagnation"] // 2
        if len(s.trail) > stuck and np.isfinite(s.trail[-1]) \
                and s.trail[-stuck - 1] == s.trail[-1]:
            return "stagnation"  # no improvement at all for 120 + 30 D / lambda
        if len(s.trail) > c["stagnation"]:
            old, new = s.trail[0], s.trail[-1]
            # (inf - inf: nothing finite yet in the window: the flat rule's case)
            if np.isfinite(old) and not old - new > _STAGNATION_RTOL * (1.0 + abs(new)):
                return "stagnation"
        if (d.max() / d.min()) ** 2 > _MAX_CONDITION:
            return "condition"
        if s.flat >= w:
            return "flat"
        return None


def _keep(kept_x, kept_f, x, f, k: int, kernel: CMAKernel) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of the kept and the new points, each at least `_DISTINCT` of the unit
    box from every better one chosen (ties: the kept first); where fewer are that far
    apart, the best of the others fill the ``k``, best first."""
    xs = np.concatenate([kept_x, np.asarray(x, float)])
    fs = np.concatenate([kept_f, np.where(np.isfinite(f), f, np.inf)])
    u = kernel.to_unit(xs)
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
    once, for chunks of ``chunk`` rows, the last padded with repeats of its first row):
    the problem's objective at `_SCREEN_TOL_FACTOR` times its tolerances where it can
    loosen them (``with_tolerance_factor``), ``inf`` where it is not finite."""

    def __init__(self, problem, prior: bool, chunk: int):
        loosen = getattr(problem, "with_tolerance_factor", None)
        screen = problem if loosen is None else loosen(_SCREEN_TOL_FACTOR)

        def values(x):
            v = screen.objective(x, None, prior=prior)[0]
            return jax.numpy.where(jax.numpy.isfinite(v), v, jax.numpy.inf)

        self._f = jax.jit(values)
        self.chunk = int(chunk)

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x, float)
        out = []
        for i in range(0, len(x), self.chunk):
            part = x[i:i + self.chunk]
            pad = np.concatenate([part, np.repeat(part[:1], self.chunk - len(part), 0)])
            out.append(np.asarray(self._f(pad), float)[:len(part)])
        return np.concatenate(out)


def default_local(problem) -> AbstractOptimizer:
    """The local optimiser that polishes and refines for ``problem``: the batched
    Levenberg–Marquardt where its objective has a residual form with normal noise only
    (`residual_terms`), else L-BFGS-B (inside the bounds where it has them)."""
    from ._lm import LevenbergMarquardt
    from ._scipy import LBFGSB

    rt = problem.residual_terms()
    if rt is not None and not np.any(np.asarray(
            False if rt.laplace is None else rt.laplace)):
        return LevenbergMarquardt()
    return LBFGSB()


class GlobalSearch(AbstractOptimizer):
    """CMA-ES with IPOP restarts, every generation one ensemble, each run's best polished
    by a local optimiser and the best distinct points refined by it at the end (the module
    docstring says how; ``method="global"`` of `inference.fit`).

    Args:
        seed: seeds the search (a NumPy generator, and the problem's `sample_starts` for
            each run's start).
        max_time: seconds for the whole call, the final refinement included (``None``: no
            limit); a resumed search counts its earlier seconds.
        max_iter: the search's generations, all runs together (``None``: unlimited where
            there is a time limit, else 1000).
        local: the `AbstractOptimizer` that polishes each run's best and refines the kept
            points (``None``: the Levenberg–Marquardt where the problem reads residuals,
            else L-BFGS-B).
        checkpoint: a file path: the search's `GlobalState` is saved there every
            ``checkpoint_every`` generations, after each polish, at the end of the search
            and when an exception stops it; a later call with the same path (problem,
            seed, starts, ``prior`` and local optimiser) resumes from it and ends at the
            same result as an uninterrupted search.
        checkpoint_every: generations between saves.

    `minimize` returns the refined kept points (one row per start given, unsorted), with
    ``extra``: ``starts`` (the kept points they were refined from), ``generations``,
    ``evaluations``, ``runs`` (one dict per finished run: ``popsize``, ``generations``,
    ``why`` it ended, ``best``, ``polished``, ``at_s``), ``restarts`` and
    ``stagnation_restarts`` (runs ended by the stagnation rule), ``search_history`` (the
    best kept objective after each generation) and ``search_s`` (seconds of search).

    Example:
        >>> opt = GlobalSearch(seed=1, max_time=1800)
        >>> res = opt.minimize(problem, problem.sample_starts(jax.random.PRNGKey(1), 5))
        >>> res.value.min(), res.extra["restarts"]
    """

    name = "global"
    max_iter = None

    def __init__(self, *, seed: int = 0, max_time: float | None = None,
                 max_iter: int | None = None, local: AbstractOptimizer | None = None,
                 checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 100):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise ValueError(f"`seed` must be an int, got {seed!r}")
        if max_time is not None and not (
                isinstance(max_time, (int, float, np.integer, np.floating))
                and not isinstance(max_time, bool) and max_time > 0):
            raise ValueError(f"`max_time` must be a number of seconds > 0 or None, got "
                             f"{max_time!r}")
        for name, v in (("max_iter", max_iter), ("checkpoint_every", checkpoint_every)):
            if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool)
                                  or v < 1):
                raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
        if local is not None and not isinstance(local, AbstractOptimizer):
            raise ValueError(f"`local` must be an optimiser (an AbstractOptimizer), got "
                             f"{local!r}")
        _checkpoint.check_path(checkpoint)
        self.seed, self.max_time = int(seed), max_time
        self.max_iter = None if max_iter is None else int(max_iter)
        self.local, self.checkpoint = local, checkpoint
        self.checkpoint_every = int(checkpoint_every)

    def __repr__(self) -> str:
        return (f"GlobalSearch(seed={self.seed}, max_time={self.max_time}, "
                f"max_iter={self.max_iter}, local={self.local!r})")

    def check(self, problem) -> None:
        """``ValueError`` where the problem has no starts to scale an unbounded coordinate
        by, or the local optimiser refuses it."""
        (self.local or default_local(problem)).check(problem)

    def minimize(self, problem, x0=None, *, mask=None, deadline: float | None = None,
                 progress: bool | None = None, prior: bool = True) -> OptimizeResult:
        """Search ``problem`` globally from the starts ``x0 (n, D)`` (``None``: one drawn
        by `sample_starts`): the first run starts at ``x0[0]``, every row is evaluated
        and may be kept, and the ``n`` best distinct points found are refined and
        returned. ``deadline`` (a ``time.monotonic()`` value) and ``max_time``: the
        earlier limits the whole call, refinement included."""
        t_start = time.monotonic()
        if mask is not None and np.asarray(mask).any():
            raise ValueError("`mask`: the global search moves every coordinate (hold a "
                             "coordinate fixed with a local optimiser)")
        if x0 is None:
            x0 = problem.sample_starts(jax.random.PRNGKey(self.seed), 1)
        x0 = checked_x0(problem, x0)
        lo, hi = (np.asarray(b, float) for b in problem.bounds())
        if not np.all(lo < hi):
            j = int(np.argmin(lo < hi))
            raise ValueError(f"the bounds of '{problem.names()[j]}' are [{lo[j]:g}, "
                             f"{hi[j]:g}]: the lower must lie below the upper")
        local = self.local or default_local(problem)
        local.check(problem)
        draws = None
        if not (np.isfinite(lo) & np.isfinite(hi)).all():
            draws = np.asarray(problem.sample_starts(jax.random.PRNGKey(self.seed),
                                                     _N_SPREAD_DRAWS), float)
        kernel = CMAKernel(x0.shape[1], lo, hi, draws)
        evaluate = _Evaluate(problem, bool(prior), kernel.popsize0)
        k = len(x0)
        fingerprint = dict(problem.fingerprint(), method="global", search="cma-ipop-2",
                           seed=self.seed, starts=_checkpoint.digest(x0), prior=bool(prior),
                           local=repr(local))
        state = _checkpoint.load(self.checkpoint, fingerprint, "global fit")
        if state is None:
            rng = np.random.default_rng(self.seed)
            f0 = evaluate(x0)
            kept_x, kept_f = _keep(np.zeros((0, kernel.dim)), np.zeros(0), x0, f0, k, kernel)
            state = GlobalState(run=kernel.start(kernel.to_unit(x0[0]), kernel.popsize0),
                                n_runs=1, rng=rng.bit_generator.state, generation=0,
                                n_evals=k, kept_x=kept_x, kept_f=kept_f, history=(),
                                runs=(), n_records=0, n_grad_evals=0, elapsed=0.0)
        rng = np.random.default_rng()
        rng.bit_generator.state = state.rng
        elapsed = state.elapsed

        # the limits: the whole call ends by `end`, the search by `search_end`
        end = deadline
        if self.max_time is not None:
            end = min(np.inf if end is None else end,
                      t_start + max(self.max_time - elapsed, 0.0))
        # the refinement's share: 10 % of the time, or more where a polish (one local
        # fit, its compilation included) took longer, up to half the time
        budget = None if end is None else max(end - t_start, 0.0)
        reserve = None if end is None else _REFINE_SHARE * budget

        def search_end():
            return None if end is None else end - reserve
        max_gen = self.max_iter
        if max_gen is None and end is None:
            max_gen = _DEFAULT_GENERATIONS

        def now():
            return elapsed + time.monotonic() - t_start

        def save(s):
            if self.checkpoint is not None:
                _checkpoint.save_or_warn(self.checkpoint, fingerprint,
                                         s._replace(elapsed=now()))

        def new_mean():
            key = jax.random.PRNGKey(int(rng.integers(2**31 - 1)))
            return kernel.to_unit(np.asarray(problem.sample_starts(key, 1), float)[0])

        # the bar counts generations, or the search's seconds where time limits it
        if max_gen is None:
            bar = progress_bar(progress, total=max(int(math.ceil(search_end() - t_start)), 1),
                               done=0, desc="fit (global search, seconds)")
        else:
            bar = progress_bar(progress, total=max_gen, done=state.generation,
                               desc="fit (global search, generations)")
        shown = 0

        def tick():
            nonlocal shown
            done = (state.generation if max_gen is not None
                    else int(time.monotonic() - t_start))
            if done > shown:
                bar.update(done - shown)
                shown = done

        if max_gen is not None:
            shown = state.generation
        try:
            # (a fresh search runs one generation whatever the time: the refinement gets
            # its points from the search)
            while ((max_gen is None or state.generation < max_gen)
                   and (state.generation == 0 or end is None
                        or time.monotonic() < search_end())):
                if state.run.why is not None:
                    # the run ended: polish its best and start the next (a search
                    # interrupted in the polish redoes it when resumed)
                    t_polish = time.monotonic()
                    state = _next_run(state, kernel, local, problem, prior, new_mean, k,
                                      now, search_end())
                    state = state._replace(rng=rng.bit_generator.state)
                    if end is not None:
                        reserve = min(max(reserve, _REFINE_POLISHES
                                          * (time.monotonic() - t_polish)), 0.5 * budget)
                    bar.set_postfix(best=f"{state.kept_f[0]:.6g}", runs=state.n_runs)
                    save(state)
                    continue
                u = kernel.ask(state.run, rng)
                x = kernel.to_params(u)
                f = evaluate(x)
                kept_x, kept_f = _keep(state.kept_x, state.kept_f, x, f, k, kernel)
                state = state._replace(run=kernel.tell(state.run, u, f),
                                       rng=rng.bit_generator.state,
                                       generation=state.generation + 1,
                                       n_evals=state.n_evals + len(x), kept_x=kept_x,
                                       kept_f=kept_f, history=state.history + (kept_f[0],))
                tick()
                if state.generation % self.checkpoint_every == 0:
                    save(state)
            save(state)
        except BaseException:
            save(state)
            raise
        finally:
            bar.close()
        search_s = now()

        # the final refinement of the kept points: one ensemble, stopped at the limit
        ref = local.minimize(problem, state.kept_x, deadline=end, progress=progress,
                             prior=prior)
        search = np.broadcast_to(np.asarray(state.history, float)[:, None],
                                 (len(state.history), k))
        hist = np.asarray(ref.history, float).reshape(-1, k)
        runs = [dict(popsize=int(r[0]), generations=int(r[1]), why=r[2], best=float(r[3]),
                     polished=float(r[4]), at_s=float(r[5])) for r in state.runs]
        extra = dict(starts=state.kept_x, generations=int(state.generation),
                     evaluations=int(state.n_evals), runs=runs,
                     restarts=int(state.n_runs - 1),
                     stagnation_restarts=sum(r["why"] == "stagnation" for r in runs),
                     search_history=np.asarray(state.history, float), search_s=search_s,
                     wall_s=now(), local=dict(ref.extra or {}))
        return OptimizeResult(
            x=np.asarray(ref.x, float), value=np.asarray(ref.value, float),
            converged=np.asarray(ref.converged, bool), n_iter=np.asarray(ref.n_iter),
            reason=np.asarray(ref.reason), history=np.concatenate([search, hist]),
            n_records=state.n_records + int(ref.n_records),
            n_records_per_start=ref.n_records_per_start,
            n_evals=state.n_grad_evals + int(ref.n_evals),
            max_error_ratio=ref.max_error_ratio, extra=extra)


def _next_run(state: GlobalState, kernel: CMAKernel, local, problem, prior: bool,
              new_mean, k: int, now, deadline) -> GlobalState:
    """``state`` after its run ended: the run's best polished by ``local`` (stopped at
    ``deadline``) and kept (among the ``k`` best), and a new run at ``new_mean()`` with
    twice the population (IPOP); ``now()`` the search's seconds so far."""
    run = state.run
    polished = np.nan
    kept_x, kept_f = state.kept_x, state.kept_f
    n_records, n_grad = state.n_records, state.n_grad_evals
    if np.isfinite(run.best_f):
        res = local.minimize(problem, run.best_x[None], deadline=deadline, progress=False,
                             prior=prior)
        n_records, n_grad = n_records + int(res.n_records), n_grad + int(res.n_evals)
        value = np.asarray(res.value, float)
        if np.isfinite(value[0]):
            polished = float(value[0])
            kept_x, kept_f = _keep(kept_x, kept_f, np.asarray(res.x, float)[:1], value[:1],
                                   k, kernel)
    popsize = min(2 * run.popsize, _MAX_POPSIZE_FACTOR * kernel.popsize0)
    return state._replace(
        run=kernel.start(new_mean(), popsize), n_runs=state.n_runs + 1,
        kept_x=kept_x, kept_f=kept_f, n_records=n_records, n_grad_evals=n_grad,
        runs=state.runs + ((run.popsize, run.generation, run.why, run.best_f, polished,
                            now()),))
