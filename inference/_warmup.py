"""Warmup of `inference.sample`: where the chains start, and the warmup windows between
which each chain's mesh follows it; at the end, the one mesh the sampling phase freezes.

Under ``rerecord="warmup"`` each chain has its own mesh, re-recorded at the chain's
position between windows of 10, 20, 40, 80, 100, 100, ... iterations (warmup draws are
discarded and only tune the step size and mass matrix, so the target may change). After
the last window ONE mesh is recorded at the chains' mean position (unconstrained space),
tightened by the policy's ``record_tol_factor``; if it does not hold at every chain's
position and at the last window's draws (e.g. chains in different modes, or a posterior
wide in the ODE's time scales), it is merged with meshes recorded there
(`sampling_mesh`, `gs.Mesh.merge`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import jax
import numpy as np

import gradsolve as gs

from ._chains import CHUNK, ChainKernel, SampleState, capacity, solve_capacity
from ._fit import fit
from ._problem import Problem
from ._space import checked_init
from ._starts import jittered, prior_draws

__all__ = ["windows", "initial_state", "warmup_window", "sampling_mesh"]


def windows(num_warmup: int) -> list[int]:
    """Lengths of the warmup windows between re-records: 10, 20, 40, ..., up to `CHUNK`."""
    out, w, left = [], 10, num_warmup
    while left > 0:
        out.append(min(w, CHUNK, left))
        left -= out[-1]
        w *= 2
    return out


def _chain_starts(problem: Problem, data, init, C: int, key, jitter: float, seed: int,
                  fit_kwargs) -> tuple[np.ndarray, str, dict]:
    """``(u0 (C, D), how they were chosen, the MAP fit's summary)``."""
    model, space = problem.model, problem.space
    k_fit, k_jit = jax.random.split(key)
    if isinstance(init, str) and init == "map":
        kw = dict(n_starts=16, steps=300, seed=seed, rtol=problem.rtol, atol=problem.atol,
                  solver=problem.solver, progress=False)
        kw.update(fit_kwargs or {})
        res = fit(problem.source, data, **kw)
        info = dict(n_starts=int(kw["n_starts"]), steps=int(kw["steps"]),
                    best_loss=float(res.loss), n_records=int(res.n_records),
                    n_grad_evals=int(res.n_grad_evals), wall_time_s=float(res.wall_time))
        desc = (f"MAP fit (inference.fit, {kw['n_starts']} starts, {kw['steps']} Adam "
                f"steps, best loss {res.loss:.6g}); chains start at its best point plus "
                f"N(0, {jitter}^2) jitter in unconstrained space")
        centre = np.asarray(space.to_unconstrained(res.params))
        return jittered(centre, jitter, k_jit, C), desc, info
    if isinstance(init, str) and init == "prior":
        return prior_draws(model, space, k_jit, C), "independent prior draws", {}
    u, n = checked_init(model, space, init)
    if n is None:
        desc = f"given point plus N(0, {jitter}^2) jitter in unconstrained space"
        return jittered(u, jitter, k_jit, C), desc, {}
    if n != C:
        raise ValueError(f"`init` has {n} points but num_chains={C}")
    return np.asarray(u, dtype=np.float64), "given per-chain points", {}


def initial_state(problem: Problem, policy, data, *, init, num_chains: int, key,
                  init_jitter: float, seed: int, fit_kwargs: Mapping | None,
                  max_steps: int | None) -> SampleState:
    """The sampler's state before its first iteration (without NumPyro's chain states):
    the starting points, every chain's first mesh (prior starts whose solve fails are
    re-drawn, up to 20 rounds) and the step capacities."""
    C, tf = num_chains, policy.record_tol_factor
    u0, desc, info = _chain_starts(problem, data, init, C, key, init_jitter, seed, fit_kwargs)
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
    mesh, cap = m0, capacity(need)
    if policy.rerecord == "never":
        mesh = problem.record(np.mean(u0, axis=0), tf).to_host()
        cap = max(cap, mesh.capacity)
    kind = {"warmup": "", "always": "none (gs.solve)", "never": "initial points' mean"}
    return SampleState(
        chains=None, mesh=mesh, capacity=cap,
        solve_max_steps=int(max_steps) if max_steps is not None else solve_capacity(need),
        iteration=0, window=0, draws=(), u0=u0, init=desc, init_fit=info, n_records=1,
        record_failures=0, failures_warmup=0, failures_sampling=0, warmup_time=0.0,
        sampling_time=0.0, sampling_mesh=kind[policy.rerecord])


BULK_POINTS = 64
"""Warmup draws of the last window at which the sampling mesh is checked (and, where it
does not hold, recorded): where the chains are about to sample."""


def warmup_window(kernel: ChainKernel, s: SampleState, lengths: list[int]) -> SampleState:
    """Warmup window ``s.window`` (``lengths[s.window]`` iterations), then, under
    ``rerecord="warmup"``, every chain's mesh re-recorded at its position (or, after the
    last window, the sampling mesh installed, checked at the window's draws)."""
    t = time.perf_counter()
    s, draws, failed = kernel.run(s, lengths[s.window])
    s = s._replace(window=s.window + 1, failures_warmup=s.failures_warmup + failed)
    if kernel.policy.warmup_rerecords:
        z = np.asarray(s.chains.z)
        if s.window == len(lengths):
            s = install_sampling_mesh(kernel, s, z, bulk_draws(draws.z))
        else:
            new = kernel.problem.record(z, kernel.policy.record_tol_factor).to_host()
            ok = np.asarray(new.ok)
            old = s.mesh if s.mesh.is_ensemble else s.mesh.repeat(kernel.C)
            mesh = old.scatter(np.nonzero(ok)[0], new.select(ok)).trim() if ok.any() else old
            s = kernel.with_mesh(s, mesh)._replace(
                n_records=s.n_records + 1, record_failures=s.record_failures + int(np.sum(~ok)))
    return s._replace(warmup_time=s.warmup_time + time.perf_counter() - t)


def bulk_draws(z: np.ndarray, count: int = BULK_POINTS) -> np.ndarray:
    """Up to ``count`` of a window's draws ``z (C, n, D)``, evenly spaced in each chain,
    as ``(m, D)``."""
    C, n, D = z.shape
    per = max(1, min(n, count // C))
    take = np.unique(np.linspace(0, n - 1, per).round().astype(int))
    return z[:, take].reshape(-1, D)


def install_sampling_mesh(kernel: ChainKernel, s: SampleState, z: np.ndarray,
                          bulk: np.ndarray | None = None) -> SampleState:
    """``s`` on the mesh the sampling phase freezes (see `sampling_mesh`)."""
    mesh, kind, records = sampling_mesh(kernel, z, bulk)

    return kernel.with_mesh(s, mesh)._replace(sampling_mesh=kind,
                                              n_records=s.n_records + records)


def sampling_mesh(kernel: ChainKernel, z: np.ndarray, bulk: np.ndarray | None = None
                  ) -> tuple[gs.Mesh, str, int]:
    """One mesh for every chain at positions ``z (C, D)``, checked there and at the last
    warmup window's draws ``bulk (m, D)`` (where the chains are about to sample).

    The mesh recorded at the chains' mean serves if it holds at every one of those points
    (`MeshPolicy.holds_for_all`). Otherwise the sampling mesh merges it with meshes
    recorded at the chains and at every draw where it did not hold (`gs.Mesh.merge`: each
    trajectory's steps no longer than any part's there), so it holds across the region
    the chains explored. This matters where the posterior is wide in
    the ODE's own time scales (a population's absorption rates, say): a mesh recorded at
    one point is too coarse where a subject's dynamics are faster. Returns ``(mesh,
    description, records)``."""
    problem, tf = kernel.problem, kernel.policy.record_tol_factor
    pts = z if bulk is None else np.concatenate([z, bulk])
    mean = problem.record(np.mean(z, axis=0), tf).to_host()
    fails = np.ones(len(pts), bool)
    if bool(mean.ok):
        err = kernel.error_ratios(mean, pts[None])[0]
        fails = ~(err <= kernel.policy.shared_margin * kernel.policy.error_ratio_max)
        if not fails.any():
            return mean, "chains' mean", 1
    where = np.concatenate([z, pts[len(z):][fails[len(z):]]])
    # one record of a fixed number of points (padded with repeats): one compiled program
    padded = np.concatenate([where, np.repeat(where[-1:], len(pts) - len(where), axis=0)])
    per = problem.record(padded, tf).to_host().select(np.arange(len(where)))
    if not bool(mean.ok) and not np.any(per.ok):
        raise RuntimeError(
            "inference.sample: recording the sampling mesh failed at the chains' "
            "positions and at their mean; try rerecord='always' or another solver."
        )
    parts = [per] if not bool(mean.ok) else [per, mean]
    extra = len(where) - len(z)
    what = "the chains' mean, their positions" + (
        f" and the {extra} warmup draws where the mean's did not hold" if extra else "")
    if per.n_jumps and bool(mean.ok):
        # meshes with jumps cannot be merged (each jump owns a node): keep the mean's,
        # whose error ratio at every draw is reported
        return mean, "chains' mean (meshes with jumps cannot be merged)", 2
    return type(per).merge(parts), f"merge of the meshes at {what}", 2
