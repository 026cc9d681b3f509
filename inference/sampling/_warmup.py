"""Warmup of `inference.sample` as named phases, each advancing the sampler's
``(SampleState, SampleInfo)`` within a `Run`: `start` (the MAP fit, prior draws or given
points, and the first meshes), `warmup_window` (NumPyro's step-size and mass-matrix
adaptation windows, each followed by `rerecord_chains`), `freeze_mesh` (the sampling
mesh, tightened where it does not hold), `respond_to_divergences` (`retune`) and
`respond_to_draws` (the sampling phase's first draws, any draws that leave the frozen
mesh, and any that diverge on a dense metric); `warm_up` runs them in order.

Under ``rerecord="warmup"`` each chain has its own mesh, re-recorded at the chain's
position between windows of 10, 20, 40, 80, 100, 100, ... iterations (warmup draws are
discarded and only tune the step size and mass matrix, so the target may change). After
the last window ONE mesh is recorded at the chains' mean position (unconstrained space),
tightened by the policy's ``record_tol_factor``; if it does not hold at every chain's
position and at the last window's draws (e.g. chains in different modes, or a posterior
wide in the ODE's time scales), it is merged with meshes recorded there
(`sampling_mesh`, `gs.Mesh.merge`).

Divergences are answered, not only counted (`respond_to_divergences`): NUTS's step size
is adapted by dual averaging towards ``target_accept``, and a step size too large for
part of the posterior (the neck of a random-effects funnel, say) shows as divergent
transitions. Those early in warmup are expected (the step size and mass matrix are still
far off, and each adaptation window restarts the step size search), so only the late
iterations of the terminal step-size window count (`late_iterations`), and of those only
the ones at step sizes near the final one (`counted_late`); the first loop call of
sampling is a probe (`probe_diverged`): if it diverges, its draws count as warmup; on a
dense metric, so do all draws up to any loop call that diverges (`dense_diverged`).
Either way the response re-adapts the step size at a higher target (``1 - (1 - target) /
2``: 0.8, 0.9, 0.95, 0.975), keeping the mass matrix, over `RETUNE_ITERATIONS` more
warmup iterations on the sampling mesh, until both are clean or ``max_retunes``
re-adaptations are spent; the result's attributes report each step. This is the advice
Stan and PyMC print ("increase target_accept"), taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import numpy as np

import gradsolve as gs

from ._chains import (CHUNK, ChainKernel, SampleInfo, SampleState, capacity, solve_capacity,
                      spaced)
from ..optimize._fit import fit
from ._metric import curvature_metric
from ..problem._abstract import AbstractProblem
from ._advi import advi_start
from ..problem._space import checked_init
from ..problem._starts import jittered, prior_draws

__all__ = ["Run", "windows", "start", "warm_up", "warmup_window", "rerecord_chains",
           "freeze_mesh", "sampling_mesh", "tail_points", "late_iterations", "late_steps",
           "counted_late", "respond_to_divergences", "retune", "respond_to_draws",
           "RETUNE_ITERATIONS"]

RETUNE_ITERATIONS = 150
"""Iterations of one re-adaptation of the step size. NumPyro's schedule for 150 warmup
iterations ends in a 50-iteration dual-averaging window, as its default warmup does, so
the re-adapted step size is averaged over as many iterations as the original."""


class Run(NamedTuple):
    """What one sampler run holds fixed while its phases advance ``(state, info)``.

    Attributes:
        base: the `ChainKernel` the run starts with; the re-adapting kernels derive from
            it (`kernel`).
        num_warmup, total: warmup iterations, and warmup plus sampling iterations.
        max_retunes: how many re-adaptations the response to divergences may make.
        checkpoint_every: draws between checkpoints of the sampling phase.
        save: ``save(state, info)`` writes a checkpoint (or nothing).
        advance: ``advance(n, state=None)`` reports ``n`` more iterations done (the
            progress; negative where draws already counted are dropped), and the step
            size of ``state`` where given.
        retuned: the re-adapting kernels built so far, by ``target_accept``.
    """

    base: ChainKernel
    num_warmup: int
    total: int
    max_retunes: int
    checkpoint_every: int
    save: Callable
    advance: Callable
    retuned: dict

    def kernel(self, s: SampleState) -> ChainKernel:
        """The kernel that advances ``s``: `base` until the step size is re-adapted, then
        its re-adapting kernel at ``s.target_accept`` (built once)."""
        if not s.retunes:
            return self.base
        if s.target_accept not in self.retuned:
            self.retuned[s.target_accept] = self.base.retuned(s.target_accept,
                                                              RETUNE_ITERATIONS)
        return self.retuned[s.target_accept]


def windows(num_warmup: int) -> list[int]:
    """Lengths of the warmup windows between re-records: 10, 20, 40, ..., up to `CHUNK`."""
    out, w, left = [], 10, num_warmup
    while left > 0:
        out.append(min(w, CHUNK, left))
        left -= out[-1]
        w *= 2
    return out


def _chain_starts(problem: AbstractProblem, data, init, C: int, key, jitter: float, seed: int,
                  fit_kwargs) -> tuple[np.ndarray, str, dict, np.ndarray | None]:
    """``(u0 (C, D), how they were chosen, the MAP fit's summary, the one point they are
    jittered around (None for prior draws and per-chain points))``."""
    model, space = problem.model, problem.space
    k_fit, k_jit = jax.random.split(key)
    if isinstance(init, str) and init in ("map", "advi"):
        kw = dict(problem.map_fit_options, seed=seed, rtol=problem.rtol, atol=problem.atol,
                  solver=problem.solver, max_steps=problem.max_steps, progress=False)
        kw.update(fit_kwargs or {})
        res = fit(problem.source, data, **kw)
        info = dict(n_starts=int(kw["n_starts"]), steps=int(kw["steps"]),
                    best_loss=float(res.loss), n_records=int(res.n_records),
                    n_grad_evals=int(res.n_grad_evals), wall_time_s=float(res.wall_time))
        how = "Adam" if res.method is None else res.method.upper()
        desc = (f"MAP fit (inference.fit, {kw['n_starts']} starts, at most {kw['steps']} "
                f"{how} steps, best loss {res.loss:.6g})")
        if init == "map":
            desc += (f"; chains start at its best point plus N(0, {jitter}^2) jitter in "
                     "unconstrained space")
        centre = np.asarray(problem.start_point(res.params))
        return jittered(centre, jitter, k_jit, C), desc, info, centre
    if isinstance(init, str) and init == "prior":
        return prior_draws(model, space, k_jit, C), "independent prior draws", {}, None
    u, n = checked_init(model, space, init)
    u = np.asarray(problem.start_point(init), dtype=np.float64)
    if n is None:
        desc = f"given point plus N(0, {jitter}^2) jitter in unconstrained space"
        return jittered(u, jitter, k_jit, C), desc, {}, np.asarray(u, dtype=np.float64)
    if n != C:
        raise ValueError(f"`init` has {n} points but num_chains={C}")
    return np.asarray(u, dtype=np.float64), "given per-chain points", {}, None


def start(problem: AbstractProblem, policy, data, *, init, num_chains: int, key,
          init_jitter: float, seed: int, fit_kwargs: Mapping | None, max_steps: int | None,
          target_accept: float, dense_mass: bool
          ) -> tuple[np.ndarray, np.ndarray | None, SampleState, SampleInfo]:
    """Where the chains start (the MAP fit, prior draws or given points), the initial
    metric (`curvature_metric` at the MAP or the one given point; NumPyro's identity for
    prior draws and per-chain points), every chain's first mesh (prior starts whose solve
    fails are re-drawn, up to 20 rounds) and the step capacities: ``(u0 (C, D), the
    initial inverse mass matrix or None, the state without NumPyro's chain states, its
    info)``."""
    C, tf = num_chains, policy.record_tol_factor
    u0, desc, fit_info, centre = _chain_starts(problem, data, init, C, key, init_jitter,
                                               seed, fit_kwargs)
    metric = None
    if centre is not None:
        metric, how = curvature_metric(problem, centre, dense=dense_mass)
        desc += f"; initial metric: {how}"
        if isinstance(init, str) and init == "advi":
            u0, metric, desc, fit_info = _typical_starts(
                problem, u0, centre, metric, key, max_steps, dense_mass, desc, fit_info)
        elif metric is not None and init_jitter > 0:
            # no coordinate jittered by more than its sd under the metric: a start several
            # posterior sds out (a rate known to 1 %) begins warmup with divergences
            sd = np.sqrt(np.diagonal(metric) if metric.ndim == 2 else metric)
            u0 = centre + (u0 - centre) * np.minimum(1.0, sd / init_jitter)
            desc += " (jitter capped at each coordinate's sd under it)"
    m0 = problem.record(u0, tf).to_host()
    for _ in range(20 if isinstance(init, str) and init == "prior" else 0):
        if m0.ok.all():
            break
        key, kd = jax.random.split(key)
        u0 = np.where(m0.ok[:, None], u0, prior_draws(problem.model, problem.space, kd, C))
        m0 = problem.record(u0, tf).to_host()
    if not m0.ok.all():
        raise RuntimeError(
            "inference.sample: the ODE solve fails at initial point(s) "
            f"{np.nonzero(~m0.ok)[0].tolist()}; pass init= (e.g. a fitted point), a "
            "stiff solver such as gs.Rodas5P() or a looser rtol."
        )
    need = int(np.max(m0.n_steps))
    ragged = policy.rerecord != "always" and problem.ragged_replay(u0[0], m0.row(0))
    mesh, cap = m0, capacity(need, ragged)
    if policy.rerecord == "never":
        mesh = problem.record(np.mean(u0, axis=0), tf).to_host()
        cap = max(cap, mesh.capacity)
    kind = {"warmup": "", "always": "none (gs.solve)", "never": "initial points' mean"}
    state = SampleState(
        chains=None, mesh=mesh, capacity=cap,
        solve_max_steps=int(max_steps) if max_steps is not None else solve_capacity(need),
        ragged=ragged, iteration=0, window=0, target_accept=float(target_accept), retunes=0,
        sampling_tol_factor=tf, mesh_probes=0)
    return u0, metric, state, SampleInfo(draws=(), init=desc, init_fit=fit_info,
                                         sampling_mesh=kind[policy.rerecord])


def _typical_starts(problem: AbstractProblem, u0: np.ndarray, centre: np.ndarray, metric,
                    key, max_steps: int | None, dense_mass: bool, desc: str, fit_info: dict):
    """``init="advi"``: the chains start at draws from a mean-field ADVI fit from the MAP
    point ``centre`` (`advi_start`), whose variances are the initial metric (the diagonal
    of a dense one); ``(u0 (C, D), metric, description, fit summary)``. Where the fit
    fails, the jittered MAP starts ``u0`` and the curvature ``metric`` are kept."""
    D, C = centre.shape[0], u0.shape[0]
    var = (np.ones(D) if metric is None else
           np.diagonal(metric) if metric.ndim == 2 else np.asarray(metric))
    starts, var, adv = advi_start(problem, centre, var, jax.random.fold_in(key, 1), C,
                                  max_steps=max_steps)
    fit_info = dict(fit_info, **{f"advi_{k}": v for k, v in adv.items()})
    if not adv["ok"]:
        return u0, metric, desc + ("; the mean-field ADVI fit failed, so chains start at "
                                   "its best point plus jitter"), fit_info
    desc += (f"; then mean-field ADVI from its best point ({adv['steps']} Adam steps, "
             f"{adv['draws']} draws a step, negative ELBO {adv['negative_elbo']:.6g}): "
             "chains start at independent draws from it, warmup at its variances")
    return starts, (np.diag(var) if dense_mass else var), desc, fit_info


BULK_POINTS = 64
"""Warmup draws of the last window at which the sampling mesh is checked (and, where it
does not hold, recorded): where the chains are about to sample."""


def warm_up(run: Run, s: SampleState, info: SampleInfo) -> tuple[SampleState, SampleInfo]:
    """The remaining warmup windows (a checkpoint after each), the sampling mesh frozen
    (`freeze_mesh`; after the last window, or at once without warmup) and the response to
    divergences late in warmup (`respond_to_divergences`)."""
    lengths = windows(run.num_warmup)
    while s.window < len(lengths):
        s, info = warmup_window(run, s, info)
        run.advance(lengths[s.window - 1], s)
        run.save(s, info)
    if not lengths and run.base.policy.warmup_rerecords and s.mesh.is_ensemble:
        s, info = freeze_mesh(run, s, info)
    if run.num_warmup:
        s, info = respond_to_divergences(run, s, info)
    return s, info


def warmup_window(run: Run, s: SampleState, info: SampleInfo
                  ) -> tuple[SampleState, SampleInfo]:
    """Warmup window ``s.window`` (NumPyro adapts the step size and mass matrix in it),
    its late divergences noted, then, under ``rerecord="warmup"``, every chain's mesh
    re-recorded at its position (`rerecord_chains`) or, after the last window, the
    sampling mesh frozen (`freeze_mesh`, checked at the window's draws)."""
    t = time.perf_counter()
    lengths = windows(run.num_warmup)
    begin = s.iteration
    s, draws, failed = run.base.run(s, lengths[s.window])
    s = s._replace(window=s.window + 1)
    info = info._replace(failures_warmup=info.failures_warmup + failed,
                         late_steps=info.late_steps + late_steps(draws, begin, sum(lengths)))
    if run.base.policy.warmup_rerecords:
        if s.iteration > run.num_warmup // 2:
            info = info._replace(tail_draws=info.tail_draws + (np.asarray(draws.z),))
        if s.window == len(lengths):
            s, info = freeze_mesh(run, s, info, np.asarray(draws.z))
        else:
            s, info = rerecord_chains(run, s, info)
    return s, info._replace(warmup_time=info.warmup_time + time.perf_counter() - t)


def rerecord_chains(run: Run, s: SampleState, info: SampleInfo
                    ) -> tuple[SampleState, SampleInfo]:
    """Every chain's mesh re-recorded at its position (a chain whose record fails keeps
    its mesh, counted in ``record_failures``)."""
    kernel = run.base
    new = kernel.problem.record(np.asarray(s.chains.z),
                                kernel.policy.record_tol_factor).to_host()
    ok = np.asarray(new.ok)
    old = s.mesh if s.mesh.is_ensemble else s.mesh.repeat(kernel.C)
    mesh = old.scatter(np.nonzero(ok)[0], new.select(ok)).trim() if ok.any() else old
    return kernel.with_mesh(s, mesh), info._replace(
        n_records=info.n_records + 1, record_failures=info.record_failures + int(np.sum(~ok)))


def bulk_draws(z: np.ndarray, count: int = BULK_POINTS) -> np.ndarray:
    """Up to ``count`` of a window's draws ``z (C, n, D)``, evenly spaced in each chain,
    as ``(m, D)``."""
    C, n, D = z.shape
    return z[:, spaced(n, count // C)].reshape(-1, D)


def freeze_mesh(run: Run, s: SampleState, info: SampleInfo, draws: np.ndarray | None = None,
                hold: np.ndarray | None = None) -> tuple[SampleState, SampleInfo]:
    """``s`` on the mesh the sampling phase freezes, at the chains' positions (see
    `sampling_mesh`). After warmup (``draws (C, n, D)``: its last window's, or the latest
    sampling draws when they left the mesh) the mesh is also made to hold at `bulk_draws`
    of them, at the points ``hold (m, D)`` (draws that left the previous mesh) and in
    the tails the sampling phase will reach (`tail_points` of ``info.tail_draws``, scaled
    by the chains' adapted mass matrices); without warmup nothing says where the
    posterior is."""
    bulk = tails = None
    if draws is not None:
        bulk = bulk_draws(draws)
        if hold is not None:
            bulk = np.concatenate([bulk, hold])
        imm = np.asarray(s.chains.adapt_state.inverse_mass_matrix)
        var = np.diagonal(imm, axis1=-2, axis2=-1) if imm.ndim == 3 else imm
        late = np.concatenate(info.tail_draws or (draws,), axis=1)
        n_draws = draws.shape[0] * max(run.total - run.num_warmup, 1)
        tails = tail_points(late.reshape(-1, late.shape[-1]),
                            np.sqrt(np.mean(var, axis=0)), n_draws)
    mesh, kind, records, tf = sampling_mesh(run.base, np.asarray(s.chains.z), bulk, tails)
    return (run.base.with_mesh(s, mesh)._replace(sampling_tol_factor=tf),
            info._replace(sampling_mesh=kind, n_records=info.n_records + records))


REACH = (3.0, 8.0)
"""Least and most reach of `tail_points`, in posterior standard deviations."""


def tail_points(z: np.ndarray, scale: np.ndarray, n_draws: int) -> np.ndarray:
    """Points ``(2 D, D)`` in the posterior's tails, one beyond each end of each coordinate
    of the draws ``z (n, D)`` (``scale (D,)``: the posterior's standard deviations in
    unconstrained space), as far as ``n_draws`` draws are expected to reach.

    NUTS draws reach further than warmup's: ``n_draws`` of them reach about the
    ``1 / n_draws`` quantile of each margin, and the frozen mesh must hold there. Each end
    is extrapolated from the draws' top ``k`` exceedances as an exponential tail (the
    peaks-over-threshold estimate: the mean excess over the ``k``-th largest value ``u``
    is the tail's scale ``b``, and ``P(x > u + t) = (k / n) exp(-t / b)``), so the reach
    is ``u + b log(k n_draws / n)``; a Gaussian margin gives about 4 standard deviations
    at 2,000 draws, a log-scale parameter with a flat likelihood and a half-Cauchy prior
    (exponential in the log) ~6 (Davison & Smith 1990, JRSS B 52: 393-442). The reach is
    kept within `REACH` standard deviations: at least three (a light tail, or too few
    draws to show one), at most eight (beyond, an extrapolation from a few hundred draws
    says little)."""
    n, D = z.shape
    centre = np.mean(z, axis=0)
    k = max(4, n // 8)
    points = []
    for side in (1.0, -1.0):
        x = -np.sort(-side * (z - centre), axis=0)           # (n, D), largest first
        u = x[min(k, n - 1)]
        b = np.mean(x[:k] - u, axis=0)
        reach = u + b * np.log(max(k * n_draws / n, 1.0))
        reach = np.clip(reach, REACH[0] * scale, REACH[1] * scale)
        points.append(centre + side * np.diag(reach))
    return np.concatenate(points)


TIGHTEN = 4.0
"""How much tighter each further attempt at the sampling mesh records (`sampling_mesh`)."""

MAX_TIGHTENINGS = 3
"""How many times the sampling mesh may be recorded `TIGHTEN` times tighter."""


def sampling_mesh(kernel: ChainKernel, z: np.ndarray, bulk: np.ndarray | None = None,
                  tails: np.ndarray | None = None) -> tuple[gs.Mesh, str, int, float]:
    """One mesh for every chain at positions ``z (C, D)``, checked there and at the last
    warmup window's draws ``bulk (m, D)`` (where the chains are about to sample) and at
    the points ``tails (t, D)`` (`tail_points`).

    Those points reach the posterior's tails, which NUTS visits (a heavy-tailed posterior
    more than warmup's draws suggest); the mesh must hold there too, since the sampling
    phase may not re-record. The mesh is recorded at the policy's ``record_tol_factor``
    times the tolerances (`_sampling_mesh_at`). If its error ratio (requested units) still
    exceeds the policy's bound at one of the chains or draws, it is recorded again
    `TIGHTEN` times tighter, up to `MAX_TIGHTENINGS` times, so that the frozen posterior
    meets the requested tolerances where the chains sample without a hand-tuned
    ``frozen_tol_factor``. Returns ``(mesh, description, records, tolerance factor it was
    recorded at)``."""
    tf, records = kernel.policy.record_tol_factor, 0
    check = z if bulk is None else np.concatenate([z, bulk])
    ok = tails is not None and np.all(np.isfinite(tails))
    reach = tails if ok else np.empty((0, z.shape[1]))
    for attempt in range(MAX_TIGHTENINGS + 1):
        mesh, kind, n, err = _sampling_mesh_at(kernel, z, check, reach, tf)
        records += n
        if np.all(err <= kernel.policy.error_ratio_max) or attempt == MAX_TIGHTENINGS:
            break
        tf /= TIGHTEN
    if tf != kernel.policy.record_tol_factor:
        kind += (f", recorded at rtol*{tf:g} (tightened from "
                 f"rtol*{kernel.policy.record_tol_factor:g}: the error ratio at warmup's last "
                 "draws exceeded the bound)")
    return mesh, kind, records, tf


def _sampling_mesh_at(kernel: ChainKernel, z: np.ndarray, check: np.ndarray,
                      reach: np.ndarray, tf: float) -> tuple[gs.Mesh, str, int, np.ndarray]:
    """The sampling mesh recorded at ``tf`` times the tolerances: ``(mesh, description,
    records, its error ratios at check (requested units))``.

    The mesh recorded at the chains' mean serves if it holds at every one of the points
    ``check`` (the chains ``z`` and warmup draws) and ``reach`` (points in the tails),
    within `MeshPolicy.shared_margin` of the bound. Otherwise it is merged with meshes
    recorded at the chains and at every point where it did not hold (`gs.Mesh.merge`:
    each trajectory's steps no longer than any part's there; a point whose own record
    fails is left out), so it holds across the region the chains explore. This matters
    where the posterior is wide in the ODE's own time scales (a population's absorption
    rates, say): a mesh recorded at one point is too coarse where a subject's dynamics
    are faster."""
    problem, policy = kernel.problem, kernel.policy
    pts = np.concatenate([check, reach])
    mean = problem.record(np.mean(z, axis=0), tf).to_host()
    fails = np.ones(len(pts), bool)
    if bool(mean.ok):
        err = kernel.error_ratios(mean, pts[None], tol_factor=tf)[0]
        fails = ~(err <= policy.shared_margin * policy.error_ratio_max)
        if not fails.any():
            return mean, "chains' mean", 1, err[:len(check)]
    where = np.concatenate([z, pts[len(z):][fails[len(z):]]])
    # one record of a fixed number of points (padded with repeats): one compiled program
    padded = np.concatenate([where, np.repeat(where[-1:], len(pts) - len(where), axis=0)])
    per = problem.record(padded, tf).to_host().select(np.arange(len(where)))
    if not bool(mean.ok) and not np.any(per.ok):
        raise RuntimeError(
            "inference.sample: recording the sampling mesh failed at the chains' "
            "positions and at their mean; try rerecord='always' or another solver."
        )
    if per.n_jumps and bool(mean.ok):
        # meshes with jumps cannot be merged (each jump owns a node): keep the mean's,
        # whose error ratio at every draw is reported
        return mean, "chains' mean (meshes with jumps cannot be merged)", 2, err[:len(check)]
    parts = [per] if not bool(mean.ok) else [per, mean]
    n_draws = int(np.sum(fails[len(z):len(check)]))
    n_reach = int(np.sum(fails[len(check):]))
    what = "the chains' mean, their positions" + (
        f", the {n_draws} warmup draws" if n_draws else "") + (
        f", {n_reach} points in the tails" if n_reach else "") + (
        " where the mean's did not hold" if n_draws or n_reach else "")
    merged = type(per).merge(parts)
    err = kernel.error_ratios(merged, check[None], tol_factor=tf)[0]
    return merged, f"merge of the meshes at {what}", 2, err


SETTLE = 10
"""Iterations at the start of a step-size window that do not count as late: NumPyro
restarts dual averaging there from ten times the last step size, so its first
iterations try steps far longer than the one it settles on."""


def late_iterations(num_warmup: int) -> int:
    """How many of the last of ``num_warmup`` adaptation iterations count as late:
    NumPyro's terminal step-size window (50 iterations at ``num_warmup >= 150``) but its
    first `SETTLE` (at most a fifth)."""
    from numpyro.infer.hmc_util import build_adaptation_schedule

    if num_warmup < 2:
        return 0
    last = build_adaptation_schedule(int(num_warmup))[-1]
    n = last.end - last.start + 1
    return max(1, n - min(SETTLE, n // 5))


STEP_MARGIN = 1.5
"""A late warmup divergence counts (`counted_late`) where its transition's step size was
at most this times the chain's final one."""


def late_steps(draws, start: int, num_warmup: int) -> tuple[tuple[int, float], ...]:
    """``(chain, step size used)`` of each divergent transition among ``draws``
    (iterations ``start``, ``start + 1``, ...) in the `late_iterations` of an adaptation
    of ``num_warmup`` iterations."""
    it = start + np.arange(draws.diverging.shape[1])
    late = it >= num_warmup - late_iterations(num_warmup)
    c, i = np.nonzero(draws.diverging & late[None])
    return tuple((int(a), float(e)) for a, e in zip(c, draws.step_size[c, i]))


def counted_late(steps: tuple, final_step_size) -> int:
    """How many late warmup divergences ``steps`` (`late_steps`) predict divergences on
    the final step sizes ``(C,)``: those whose step size was at most `STEP_MARGIN` times
    their chain's final one.

    Dual averaging keeps trying steps until warmup ends; in its terminal window the
    iterates still reach two to four times the step size it settles on, and a divergence
    there says nothing about the sampling phase (measured on theophylline: every late
    divergence of seed 0 at 2-2.5 times the final step size, none in 4,000 draws at the
    final one). A step size too large for part of the posterior, such as a funnel's neck,
    diverges at the final step size too, and the first draws probe that directly
    (`probe_diverged`)."""
    final = np.asarray(final_step_size, dtype=float).reshape(-1)
    return sum(1 for c, e in steps if e <= STEP_MARGIN * final[c])


MAX_MESH_PROBES = 2
"""How many times the sampling phase's draws may send the sampling mesh back to be
re-recorded."""


def left_mesh(kernel: ChainKernel, s: SampleState, info: SampleInfo) -> np.ndarray:
    """The draws ``(m, D)`` of the sampling phase's latest loop call at which the frozen
    sampling mesh (``rerecord="warmup"``) does not hold (error ratio above the policy's
    bound, ``info.error_ratios``), while re-records are left (`MAX_MESH_PROBES`); none
    otherwise. A posterior with heavy tails may reach beyond the tails `tail_points`
    extrapolated, or into a corner (several coordinates far out at once) that no point
    on an axis covers."""
    z = info.draws[-1].z
    if not (kernel.policy.warmup_rerecords and s.mesh_probes < MAX_MESH_PROBES
            and len(info.error_ratios) == len(info.draws)):
        return z[:0, 0]
    return z[~(info.error_ratios[-1] <= kernel.policy.error_ratio_max)]


def respond_to_draws(run: Run, s: SampleState, info: SampleInfo
                     ) -> tuple[SampleState, SampleInfo, bool]:
    """The sampling phase's answer to its latest loop call: its draws and all before them
    become warmup iterations and the sampler adapts again (a checkpoint after) where

    - the first call diverges (`probe_diverged`), or any call diverges on a dense metric
      (`dense_diverged`): the step size is re-adapted (`respond_to_divergences`; a dense
      metric replaced by its diagonal);
    - the call leaves the frozen mesh (`left_mesh`): the mesh is recorded again
      (`freeze_mesh`) to hold at those draws, in the tails extrapolated from every draw
      so far, and at the chains.

    Dropping the draws made on the old kernel or mesh keeps the sampling phase one Markov
    chain on one fixed-mesh posterior. Returns ``(state, info, whether the sampling phase
    starts again)``."""
    diverged = probe_diverged(info, run.max_retunes) or dense_diverged(run, s, info)
    left = left_mesh(run.base, s, info) if not diverged else info.draws[-1].z[:0, 0]
    if not (diverged or len(left)):
        return s, info, False
    dropped = info.draws
    # the progress bar counted every dropped chunk but this last one: take them back
    run.advance(-sum(int(d.z.shape[1]) for d in dropped[:-1]))
    s = s._replace(iteration=run.num_warmup)
    info = info._replace(draws=(), error_ratios=(), sampling_time=0.0,
                         warmup_time=info.warmup_time + info.sampling_time,
                         failures_warmup=info.failures_warmup + info.failures_sampling,
                         failures_sampling=0)
    if diverged:
        (target, late), = info.adaptations[-1:]
        late += sum(int(np.sum(d.diverging)) for d in dropped)
        info = info._replace(adaptations=info.adaptations[:-1] + ((target, late),))
        s, info = respond_to_divergences(run, s, info)
    else:
        z = np.concatenate([np.asarray(d.z) for d in dropped], axis=1)
        info = info._replace(tail_draws=info.tail_draws + (z,))
        s, info = freeze_mesh(run, s, info, np.asarray(dropped[-1].z), left)
        s = s._replace(mesh_probes=s.mesh_probes + 1)
        run.save(s, info)
    return s, info, True


def probe_diverged(info: SampleInfo, max_retunes: int) -> bool:
    """Whether the first loop call of the sampling phase (the last of ``info.draws``, on
    the final step size) diverged while re-adaptations are left: its draws are then
    dropped (they count as warmup) and the step size re-adapted. Rare divergences slip
    past the late warmup iterations; a chain stuck in a funnel's neck shows here."""
    return (len(info.draws) == 1 and bool(np.any(info.draws[0].diverging))
            and len(info.adaptations) <= max_retunes)


def dense_diverged(run: Run, s: SampleState, info: SampleInfo) -> bool:
    """Whether the latest loop call of the sampling phase diverged on the dense metric
    warmup adapted (no re-adaptation yet, one left).

    A dense metric is the covariance of the bulk's draws; where a posterior's correlations
    change in its tails (Michaelis–Menten elimination with a weakly identified ``K_m``:
    ``V_m`` and ``K_m`` correlated in the bulk, ``V_m`` pinned by the data where ``K_m``
    is small) its long steps along the bulk's correlations diverge there, which the chains
    may first reach hundreds of draws into the sampling phase (measured: divergences from
    draw 139 to 951 in 4 x 1,000 draws, none late in warmup nor in the first 100 draws; on
    the diagonal none, at ~6 times the leapfrog steps a draw). Those draws are biased, so
    they are dropped and the sampling phase starts again on the diagonal, once."""
    return (not s.retunes and bool(run.base.settings["dense_mass"])
            and bool(np.any(info.draws[-1].diverging))
            and len(info.adaptations) <= run.max_retunes)


def respond_to_divergences(run: Run, s: SampleState, info: SampleInfo
                           ) -> tuple[SampleState, SampleInfo]:
    """While the latest adaptation's late iterations diverged and fewer than
    ``max_retunes`` re-adaptations were made, re-adapt the step size at a higher
    ``target_accept`` (`retune`; a checkpoint after each). ``info.adaptations`` then
    lists every adaptation's target and late divergences."""
    if not info.adaptations:
        n = counted_late(info.late_steps, s.chains.adapt_state.step_size)
        info = info._replace(adaptations=((s.target_accept, n),))
    while info.adaptations[-1][1] > 0 and len(info.adaptations) <= run.max_retunes:
        s, info = retune(run, s, info)
        run.save(s, info)
    return s, info


def retune(run: Run, s: SampleState, info: SampleInfo) -> tuple[SampleState, SampleInfo]:
    """`RETUNE_ITERATIONS` warmup iterations of the re-adapting kernel at ``target_accept``
    raised to ``1 - (1 - target_accept) / 2``, from the chains' positions, step sizes and
    mass matrices; the iteration count of ``s`` (warmup windows and draws) is left as it
    was."""
    t = time.perf_counter()
    key = jax.random.fold_in(s.chains.rng_key[0], len(info.adaptations))
    s = s._replace(target_accept=1.0 - (1.0 - s.target_accept) / 2.0, retunes=s.retunes + 1)
    kernel = run.kernel(s)
    r = s._replace(chains=kernel.init(np.asarray(s.chains.z), key, s,
                                      tuned=s.chains.adapt_state))
    late, failures = (), 0
    for n in windows_of(RETUNE_ITERATIONS):
        begin = r.iteration - s.iteration
        r, draws, failed = kernel.run(r, n)
        late += late_steps(draws, begin, RETUNE_ITERATIONS)
        failures += failed
    n_late = counted_late(late, r.chains.adapt_state.step_size)
    return r._replace(iteration=s.iteration), info._replace(
        adaptations=info.adaptations + ((s.target_accept, n_late),),
        failures_warmup=info.failures_warmup + failures,
        warmup_time=info.warmup_time + time.perf_counter() - t)


def windows_of(n: int) -> list[int]:
    """``n`` iterations as loop calls of at most `CHUNK`."""
    return [min(CHUNK, n - i) for i in range(0, n, CHUNK)]
