"""NUTS/HMC (NumPyro) whose potential gradients come from gradsolve, returning ArviZ data.

The sampler works on the flat unconstrained vector ``u`` of `inference.ParamSpace`:
the potential is ``U(u) = -(log prior(x(u)) + log|dx/du| + log likelihood(x(u)))`` and its
gradient is the discrete adjoint of ``gs.replay`` on a recorded mesh. NumPyro's own NUTS/HMC
kernel (``numpyro.infer.hmc.hmc(potential_fn_gen=...)``, with its dual-averaging step size
and Welford mass-matrix adaptation) runs on ``U``; the chains are vectorised with
``jax.vmap`` (NumPyro's ``chain_method="vectorized"``), the mesh being the kernel's model
argument, so one compiled loop serves warmup and sampling alike.

Mesh policy (``rerecord``), and why each is exact:

- ``"warmup"`` (default). During warmup each chain has its own mesh, re-recorded at the
  chain's current position between warmup windows of 10, 20, 40, 80, 100, 100, ...
  iterations. Changing the target during warmup is harmless: warmup draws are discarded
  and only tune the step size and mass matrix. At the end of warmup ONE mesh is recorded
  at the chains' mean position (unconstrained space) with tolerances ``frozen_tol_factor``
  times tighter (``rtol/10``, ``atol/10`` by default) and FROZEN for the whole sampling
  phase, shared by all chains. With the mesh fixed, ``U`` is a fixed smooth function of
  ``u`` (an explicit fixed-step Runge–Kutta solve on a fixed time grid), and the replay's
  gradient is its exact gradient, so NUTS/HMC is an exact MCMC for this *fixed-mesh
  posterior*: the leapfrog map is reversible and volume preserving for any fixed smooth
  potential and the accept/reject (NUTS's multinomial selection) uses that same ``U``.
  The fixed-mesh posterior differs from the adaptive-solution one only by the solver error
  on that mesh, which is measured at every draw (``sample_stats["error_ratio"]``, in units
  of the requested ``rtol``/``atol``: ``<= 1`` means the adaptive controller would accept
  the frozen mesh there at the requested tolerance); a warning is issued when its maximum
  exceeds 1. Re-recording *during* sampling would make the target depend on the chain's
  path and break detailed balance, so it is never done. At every mesh change the current
  point's potential and gradient are recomputed on the new mesh before the next transition.
- ``"always"``: ``gs.solve`` (record + replay) in every evaluation, warmup and sampling:
  exactly the adaptive solution's posterior (the record is a deterministic function of the
  parameters, so ``U`` is still a fixed function of ``u``, piecewise smooth where the
  accepted step sequence changes). Slower: each gradient pays a record, and under
  vectorised chains the replay runs the whole step capacity ``max_steps`` (default: room for
  1.5x the steps needed at the initial points; parameters needing more give ``-inf``).
- ``"never"``: one mesh recorded at the initial points' mean (tightened as above), frozen
  for warmup and sampling.

Solver failures and non-finite likelihoods give ``-inf`` log density with a finite gradient
(NumPyro then marks the transition divergent, ``sample_stats["diverging"]``). Failed
potential evaluations are counted (attributes ``solver_failures_warmup`` /
``solver_failures_sampling``) by a host callback that costs about as much as the gradient
itself on a CPU, so by default only under ``rerecord="always"``, where every evaluation
solves (``count_failures=True`` forces it; otherwise the counts are ``-1``). Records that
fail between warmup windows keep the chain's previous mesh and are counted in
``record_failures``.

Default initialisation (``init="map"``): a multi-start MAP fit (`inference.fit`,
16 starts, 300 Adam steps); each chain starts at its best point plus ``N(0, init_jitter^2)``
jitter in unconstrained space. The InferenceData's attributes say so.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import equinox as eqx

from ._density import SolveOptions, _Problem, checked_init, digest
from ._fit import (
    _PER_TRAJ,
    _load_checkpoint,
    _mesh_np,
    _pad_np,
    _save_atomic,
    _scatter_mesh,
    _to_jax,
    _to_numpy,
    _want_progress,
    fit,
)

__all__ = ["sample"]

_CKPT_VERSION = 2


class _FailureCounter:
    """Host-side count of potential evaluations whose solve failed (via a debug callback
    that runs only on failure)."""

    def __init__(self):
        self.count = 0

    def __call__(self, failed):
        self.count += int(np.sum(np.asarray(failed)))


def _pow2(x: int) -> int:
    return 1 << max(0, int(math.ceil(x)) - 1).bit_length()


def _stack_meshes(mesh_np, C: int, cap: int):
    """Host mesh (one trajectory, or an ensemble of ``C``) -> a stack of ``C`` single
    meshes (every leaf with leading axis ``C``) padded to capacity ``cap``, on device."""
    mesh_np = _pad_np(mesh_np, cap)
    ens = np.ndim(mesh_np.n_steps) == 1

    per = set(_PER_TRAJ)
    leaves = {}
    for k in _PER_TRAJ + ("t0", "t1", "rtol", "atol"):
        x = np.asarray(getattr(mesh_np, k))
        leaves[k] = x if (ens and k in per) else np.broadcast_to(x, (C,) + x.shape)
    params = jax.tree_util.tree_map(
        lambda x: np.asarray(x) if ens else np.broadcast_to(x, (C,) + np.shape(x)),
        mesh_np.params,
    )
    names = tuple(leaves)
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in names), mesh_np,
                      tuple(leaves[k] for k in names))
    out = eqx.tree_at(lambda m: m.params, out, params)
    return jax.tree_util.tree_map(jnp.asarray, out)


def _capacity(need: int) -> int:
    """Static step capacity of the meshes inside the sampler: ~15% headroom over ``need``,
    a multiple of 16. Under vectorised chains (``vmap``) the replay cannot skip padding
    steps, so the capacity is kept close to the steps actually needed; a mesh that needs
    more raises it (one recompile)."""
    return int(16 * math.ceil((1.15 * need + 8) / 16))


def _warmup_windows(num_warmup: int, chunk: int) -> list[int]:
    """Lengths of the warmup windows between re-records: 10, 20, 40, ..., up to ``chunk``."""
    out, w, left = [], 10, num_warmup
    while left > 0:
        n = min(w, chunk, left)
        out.append(n)
        left -= n
        w *= 2
    return out


def sample(
    model,
    data,
    *,
    num_warmup: int = 500,
    num_samples: int = 1000,
    num_chains: int = 2,
    kernel: str = "nuts",
    rerecord: str = "warmup",
    seed: int = 0,
    init: Any = "map",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 250,
    progress: bool | None = None,
    target_accept: float = 0.8,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    solver=None,
    max_steps: int | None = None,
    frozen_tol_factor: float = 0.1,
    dense_mass: bool = False,
    max_tree_depth: int = 10,
    init_jitter: float = 0.05,
    fit_kwargs: Mapping[str, Any] | None = None,
    count_failures: bool | None = None,
):
    """Sample the posterior of ``model`` given ``data`` with NumPyro NUTS (or HMC).

    Args:
        model: a `models.ODEModel`; data: a `models.Dataset`.
        num_warmup, num_samples, num_chains: as NumPyro's ``MCMC``; the chains run
            vectorised (``jax.vmap``, as ``chain_method="vectorized"``).
        kernel: ``"nuts"`` or ``"hmc"``.
        rerecord: mesh policy, ``"warmup"`` (default), ``"always"`` or ``"never"`` (see the
            module docstring for why each keeps the sampler exact).
        seed: seeds initialisation and the chains.
        init: ``"map"`` (multi-start MAP fit, jittered), ``"prior"`` (prior draws), or a
            constrained parameter dict (one point, jittered, or leaves with a leading axis
            ``num_chains``).
        checkpoint: a file path; the state is saved at every warmup re-record, at the end
            of warmup and about every ``checkpoint_every`` draws; a later call with the same
            path resumes and gives the same draws as an uninterrupted run.
        progress: a progress bar (default: only when stderr is a terminal).
        target_accept: NUTS/HMC target acceptance probability.
        rtol, atol, solver: the ODE solve (``solver=None``: the model's).
        max_steps: step capacity of ``gs.solve`` inside the potential when
            ``rerecord="always"`` (``None``: automatic).
        frozen_tol_factor: meshes are recorded at ``rtol * frozen_tol_factor``,
            ``atol * frozen_tol_factor``.
        dense_mass, max_tree_depth: NumPyro NUTS options.
        init_jitter: standard deviation of the per-chain jitter in unconstrained space.
        fit_kwargs: overrides for the MAP fit of ``init="map"`` (e.g. ``n_starts``,
            ``steps``).
        count_failures: count failed potential evaluations with a host callback (about
            doubles the cost of a gradient on CPU); default: only for
            ``rerecord="always"``.

    Returns:
        ``arviz.InferenceData`` with ``posterior`` (the model's parameter names and shapes,
        e.g. ``theta (chain, draw, 4)``), ``sample_stats`` (``diverging``, ``tree_depth``,
        ``n_steps``, ``step_size``, ``energy``, ``lp``, ``acceptance_rate``,
        ``error_ratio``) and ``observed_data`` (``obs (time, observed_state)``). The groups'
        ``attrs`` record the mesh policy (``mesh_policy``, ``mesh_policy_description``,
        ``sampling_mesh``), ``max_error_ratio``, ``solver_failures_warmup`` /
        ``solver_failures_sampling`` (``-1`` if not counted), ``record_failures``,
        ``divergences``, ``n_records``, the initialisation (``init``, ``init_fit_*``) and
        timings (``warmup_time_s``, ``sampling_time_s``, ``wall_time_s``).

    Example:
        >>> idata = inference.sample(models.lynx_hare(), models.load_dataset("lynx_hare"))
        >>> arviz.summary(idata)
    """
    import arviz as az
    from numpyro.infer.hmc import hmc

    if kernel not in ("nuts", "hmc"):
        raise ValueError(f"`kernel` must be 'nuts' or 'hmc', got {kernel!r}")
    if rerecord not in ("warmup", "always", "never"):
        raise ValueError(f"`rerecord` must be 'warmup', 'always' or 'never', got {rerecord!r}")
    for name, v in (("num_warmup", num_warmup), ("num_samples", num_samples),
                    ("num_chains", num_chains), ("checkpoint_every", checkpoint_every)):
        lo = 0 if name == "num_warmup" else 1
        if not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"`{name}` must be an int >= {lo}, got {v!r}")
    if num_warmup == 0:
        warnings.warn(
            "inference.sample: num_warmup=0 adapts neither the step size nor the mass matrix "
            "(the step size stays at 1.0): expect divergences and few distinct draws unless "
            "the posterior is already standardised", stacklevel=2)
    if not 0 < frozen_tol_factor <= 1:
        raise ValueError(f"`frozen_tol_factor` must lie in (0, 1], got {frozen_tol_factor}")
    if not (isinstance(target_accept, (int, float, np.number)) and 0 < target_accept < 1):
        raise ValueError(f"`target_accept` must lie in (0, 1), got {target_accept!r}")
    if not (isinstance(init_jitter, (int, float, np.number)) and init_jitter >= 0):
        raise ValueError(f"`init_jitter` must be a non-negative number, got {init_jitter!r}")
    if not isinstance(max_tree_depth, (int, np.integer)) or max_tree_depth < 1:
        raise ValueError(f"`max_tree_depth` must be a positive int, got {max_tree_depth!r}")
    if max_steps is not None and (not isinstance(max_steps, (int, np.integer)) or max_steps < 1):
        raise ValueError(f"`max_steps` must be a positive int or None, got {max_steps!r}")
    if (isinstance(init, str) and init not in ("map", "prior")) or not isinstance(
            init, (str, Mapping)):
        raise ValueError(f"`init` must be 'map', 'prior' or a parameter dict, got {init!r}")
    t_start = time.perf_counter()
    # records (between warmup windows, the sampling mesh) get a generous step budget; the
    # in-potential solve of rerecord="always" uses `max_steps` (below: `ms`)
    prob = _Problem(model, data, SolveOptions(solver, rtol, atol, 4096))
    space = prob.space
    D = space.dim
    C = int(num_chains)
    chunk = 100  # iterations per compiled loop call (the draw buffer's length)
    counter = _FailureCounter()
    if count_failures is None:
        count_failures = rerecord == "always"
    ftf = float(frozen_tol_factor)

    # --------------------------------------------------------------- log densities of u
    def _count(lp):
        if count_failures:
            bad = ~jnp.isfinite(lp)
            jax.lax.cond(bad, lambda: jax.debug.callback(counter, bad), lambda: None)
        return lp

    def logp_solve(u, ms):
        x = space.from_unconstrained(u)
        sol = prob.solve(x, None, max_steps=ms)
        ll = prob.log_lik_from_states(x, sol.ys, None)
        return _count(prob.log_prior(x) + space.log_abs_det_jacobian(u) + ll)

    def logp_mesh(u, mesh):
        x = space.from_unconstrained(u)
        sol = prob.replay(mesh, x, None)
        ll = prob.log_lik_from_states(x, sol.ys, None)
        return _count(prob.log_prior(x) + space.log_abs_det_jacobian(u) + ll)

    def record_np(u, n=None):
        """Host mesh recorded at unconstrained ``u`` ((D,) or (n, D)), tightened."""
        x = space.from_unconstrained(jnp.asarray(u))
        return _mesh_np(prob.record(x, n, rtol=rtol * ftf, atol=atol * ftf))

    fingerprint = dict(version=_CKPT_VERSION, model=model.name, dim=D, num_chains=C,
                       num_warmup=int(num_warmup), num_samples=int(num_samples),
                       kernel=kernel, rerecord=rerecord, seed=int(seed), rtol=float(rtol),
                       atol=float(atol), frozen_tol_factor=ftf,
                       target_accept=float(target_accept), dense_mass=bool(dense_mass),
                       max_tree_depth=int(max_tree_depth), init_jitter=float(init_jitter),
                       init=init if isinstance(init, str) else digest(dict(init)),
                       fit_kwargs=sorted(
                           (k, v) for k, v in (fit_kwargs or {}).items()
                           if isinstance(v, (bool, int, float, str))),
                       max_steps_solve=max_steps, **prob.fingerprint())
    ckpt = _load_checkpoint(checkpoint, fingerprint, "run")

    key = jax.random.PRNGKey(seed)
    k_init, k_mcmc = jax.random.split(key)

    if ckpt is None:
        u0, init_desc, fit_info = _initial_points(model, data, space, init, C, k_init,
                                                  init_jitter, seed, rtol, atol, solver,
                                                  fit_kwargs)
        m0 = record_np(u0, C)
        ok0 = m0.status == 0
        k_re = k_init
        for _ in range(20 if isinstance(init, str) and init == "prior" else 0):
            if ok0.all():
                break  # re-draw the prior starts whose solve fails
            k_re, kd = jax.random.split(k_re)
            draws = np.asarray(space.to_unconstrained(model.sample_prior(kd, C)))
            u0 = np.where(ok0[:, None], u0, draws)
            m0 = record_np(u0, C)
            ok0 = m0.status == 0
        if not ok0.all():
            raise RuntimeError(
                "inference.sample: the ODE solve fails at initial point(s) "
                f"{np.nonzero(~ok0)[0].tolist()}; pass init= (e.g. a fitted point), a "
                "stiff solver such as gs.Rodas5P() or a looser rtol."
            )
        need = int(np.max(m0.n_steps))
        ms = int(max_steps) if max_steps is not None else max(32, _pow2(1.5 * need + 16))
        cap = _capacity(need)
        if rerecord == "never":
            mesh_h = record_np(np.mean(u0, axis=0))
            cap = max(cap, mesh_h.capacity)
        else:
            mesh_h = m0
        it = 0  # iterations done (warmup + sampling)
        win = 0  # warmup windows done
        draws, extras = [], []
        failures_warmup = failures_sampling = record_failures = 0
        warmup_time = sample_time = 0.0
        state_np = None
        n_records = 1
        sampling_mesh_kind = {"warmup": "", "always": "none (gs.solve)",
                              "never": "initial points' mean"}[rerecord]
    else:
        u0 = ckpt["u0"]
        init_desc, fit_info = ckpt["init_desc"], ckpt["fit_info"]
        ms, cap, mesh_h = int(ckpt["ms"]), int(ckpt["cap"]), ckpt["mesh"]
        it, win = int(ckpt["it"]), int(ckpt["win"])
        draws, extras = list(ckpt["draws"]), list(ckpt["extras"])
        failures_warmup = int(ckpt["failures_warmup"])
        record_failures = int(ckpt["record_failures"])
        failures_sampling = int(ckpt["failures_sampling"])
        warmup_time, sample_time = float(ckpt["warmup_time"]), float(ckpt["sample_time"])
        state_np = ckpt["state"]
        n_records = int(ckpt["n_records"])
        sampling_mesh_kind = ckpt["sampling_mesh_kind"]

    # ------------------------------------------------------------------ the NumPyro kernel
    if rerecord == "always":
        def potential_gen(mesh):
            return lambda u: -logp_solve(u, ms)
    else:
        def potential_gen(mesh):
            return lambda u: -logp_mesh(u, mesh)

    init_kernel, sample_kernel = hmc(potential_fn_gen=potential_gen,
                                     algo="NUTS" if kernel == "nuts" else "HMC")

    def init_one(u, k, mesh):
        return init_kernel(u, int(num_warmup), dense_mass=dense_mass,
                           target_accept_prob=target_accept, max_tree_depth=max_tree_depth,
                           model_args=(mesh,), rng_key=k)

    meshes = _stack_meshes(mesh_h, C, cap)
    keys = jax.random.split(k_mcmc, C)
    state = jax.jit(jax.vmap(init_one))(jnp.asarray(u0), keys, meshes)  # sets the closure
    if state_np is not None:
        state = _to_jax(state_np)

    vstep = jax.vmap(lambda st, mesh: sample_kernel(st, (mesh,), {}))

    vgrad = jax.vmap(lambda u, mesh: jax.value_and_grad(potential_gen(mesh))(u))

    def _loop(state, meshes, n, buf):
        # the meshes may have just changed: recompute the current point's potential and
        # gradient on them, so every transition uses one target throughout
        pe, g = vgrad(state.z, meshes)
        state = state._replace(potential_energy=pe, z_grad=g)

        def body(i, carry):
            st, b = carry
            st = vstep(st, meshes)
            rec = (st.z, st.diverging, st.num_steps, st.adapt_state.step_size, st.energy,
                   st.potential_energy, st.accept_prob)
            b = jax.tree_util.tree_map(lambda a, r: a.at[:, i].set(r.astype(a.dtype)), b, rec)
            return st, b

        return jax.lax.fori_loop(0, n, body, (state, buf))

    loop = jax.jit(_loop)

    def new_buffers():
        f = jnp.result_type(float)
        return (jnp.zeros((C, chunk, D), f), jnp.zeros((C, chunk), bool),
                jnp.zeros((C, chunk), jnp.int32), jnp.zeros((C, chunk), f),
                jnp.zeros((C, chunk), f), jnp.zeros((C, chunk), f), jnp.zeros((C, chunk), f))

    def set_mesh(state, mesh_h_new):
        """Install new meshes (the loop recomputes the state's potential on them)."""
        nonlocal cap
        need = int(np.max(mesh_h_new.n_steps))
        if need > cap:
            cap = _capacity(need)
        return state, _stack_meshes(mesh_h_new, C, cap)

    def sampling_mesh(z):
        """One mesh at the chains' mean; if it does not hold at every chain's position
        (error ratio > 0.5 in units of rtol/atol, e.g. chains in different modes), the
        union of its step times and those of meshes recorded at each chain's position."""
        nonlocal n_records
        mean = record_np(np.mean(z, axis=0))
        n_records += 1
        if int(mean.status) == 0:
            er = _error_ratios(prob, space, _to_jax(mean), z[:, None, :]) * ftf
            if np.all(er <= 0.5):
                return mean, "chains' mean"
        per = record_np(z, C)
        n_records += 1
        parts = [per] if int(mean.status) != 0 else [per, mean]
        if not np.all(per.status == 0) and int(mean.status) != 0:
            raise RuntimeError(
                "inference.sample: recording the sampling mesh failed at the chains' "
                "positions and at their mean; try rerecord='always' or another solver."
            )
        return _union_mesh(parts), "union of the chains' meshes and the mean's"

    def save():
        if checkpoint is None:
            return
        _save_atomic(checkpoint, dict(
            fingerprint=fingerprint, state=_to_numpy(state), mesh=mesh_h, ms=ms, cap=cap,
            it=it, win=win, draws=draws, extras=extras, u0=np.asarray(u0),
            init_desc=init_desc, fit_info=fit_info, failures_warmup=failures_warmup,
            record_failures=record_failures,
            failures_sampling=failures_sampling, warmup_time=warmup_time,
            sample_time=sample_time, n_records=n_records,
            sampling_mesh_kind=sampling_mesh_kind,
        ))

    bar = None
    total = int(num_warmup) + int(num_samples)
    if _want_progress(progress) and it < total:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=it, desc=f"sample {model.name}", leave=False)
    windows = _warmup_windows(int(num_warmup), chunk)
    try:
        # ------------------------------------------------------------------ warmup
        while win < len(windows):
            n = windows[win]
            t_w = time.perf_counter()
            counter.count = 0
            state, _ = loop(state, meshes, n, new_buffers())
            jax.block_until_ready(state.z)
            failures_warmup += counter.count
            it += n
            win += 1
            last = win == len(windows)
            z = np.asarray(state.z)
            if rerecord == "warmup":
                if last:  # the sampling mesh: one for all chains, frozen from now on
                    mesh_h, sampling_mesh_kind = sampling_mesh(z)
                else:  # per chain, at each chain's position
                    new = record_np(z, C)
                    n_records += 1
                    okc = new.status == 0
                    record_failures += int(np.sum(~okc))
                    mesh_h = _scatter_mesh(mesh_h if np.ndim(mesh_h.n_steps) == 1
                                           else _ensemble_np(mesh_h, C), new, np.arange(C),
                                           okc)
                state, meshes = set_mesh(state, mesh_h)
            warmup_time += time.perf_counter() - t_w
            if bar is not None:
                bar.update(n)
            save()
        if num_warmup == 0 and rerecord == "warmup" and np.ndim(mesh_h.n_steps) == 1:
            mesh_h, sampling_mesh_kind = sampling_mesh(np.asarray(state.z))
            state, meshes = set_mesh(state, mesh_h)
        # ------------------------------------------------------------------ sampling
        done = it - int(num_warmup)
        next_ckpt = (done // checkpoint_every + 1) * checkpoint_every
        while done < num_samples:
            n = min(chunk, num_samples - done)
            t_s = time.perf_counter()
            counter.count = 0
            state, buf = loop(state, meshes, n, new_buffers())
            buf = tuple(np.asarray(b)[:, :n] for b in buf)
            failures_sampling += counter.count
            draws.append(buf[0])
            extras.append(buf[1:])
            done += n
            it += n
            sample_time += time.perf_counter() - t_s
            if bar is not None:
                bar.update(n)
            if done >= next_ckpt or done == num_samples:
                save()
                next_ckpt = (done // checkpoint_every + 1) * checkpoint_every
    finally:
        if bar is not None:
            bar.close()

    z = np.concatenate(draws, axis=1)  # (C, S, D)
    ex = [np.concatenate([e[i] for e in extras], axis=1) for i in range(6)]
    diverging, num_steps, step_size, energy, pe, accept = ex

    # ---------------------------------------------------------------- error ratio at draws
    if rerecord != "always":
        single = _single_np(mesh_h)
        err = _error_ratios(prob, space, _to_jax(single), z) * ftf
    else:
        err = np.full(z.shape[:2], np.nan)
    max_err = float(np.nanmax(err)) if np.isfinite(err).any() else float("nan")
    if np.isfinite(max_err) and max_err > 1.0:
        warnings.warn(
            f"inference.sample: the frozen mesh's error ratio reached {max_err:.3g} > 1 at "
            "some draws (the fixed-mesh posterior there is less accurate than rtol/atol); "
            "use a smaller frozen_tol_factor or rerecord='always'.",
            RuntimeWarning, stacklevel=2,
        )

    # ---------------------------------------------------------------- InferenceData
    xs = space.from_unconstrained(jnp.asarray(z))
    posterior = {k: np.asarray(v) for k, v in xs.items()}
    stats = {
        "diverging": np.asarray(diverging, bool),
        "n_steps": num_steps.astype(np.int64),
        "tree_depth": np.ceil(np.log2(num_steps.astype(float) + 1)).astype(np.int64),
        "step_size": step_size,
        "energy": energy,
        "lp": -pe,
        "acceptance_rate": accept,
        "error_ratio": err,
    }
    dims = {k: [f"{k}_dim_{i}" for i in range(len(s))] for k, s in space.shapes.items()}
    dims["obs"] = ["time", "observed_state"]
    coords = {"time": prob.ts_np, "observed_state": list(model.observed_names)}
    idata = az.from_dict(
        posterior=posterior,
        sample_stats=stats,
        observed_data={"obs": np.asarray(prob.ys_obs)},
        dims=dims,
        coords=coords,
    )
    policy = {
        "warmup": "warmup: per-chain meshes re-recorded between warmup windows (10, 20, 40, "
                  "... iterations); sampling: ONE mesh recorded at the chains' mean after "
                  f"warmup (rtol*{ftf}, atol*{ftf}) and frozen: exact MCMC for the "
                  "fixed-mesh posterior",
        "always": "gs.solve (record + replay) in every evaluation: exact MCMC for the "
                  "adaptive-solution posterior",
        "never": f"one mesh recorded at the initial points' mean (rtol*{ftf}, atol*{ftf}), "
                 "frozen throughout: exact MCMC for the fixed-mesh posterior",
    }[rerecord]
    single = _single_np(mesh_h)
    attrs = {
        "inference_library": "gradsolve.inference",
        "model": model.name,
        "kernel": kernel,
        "mesh_policy": rerecord,
        "mesh_policy_description": policy,
        "sampling_mesh_steps": int(np.max(single.n_steps)) if rerecord != "always" else -1,
        "sampling_mesh": sampling_mesh_kind,
        "n_records": n_records,
        "solve_max_steps": ms if rerecord == "always" else -1,
        "init": init_desc,
        "rtol": rtol,
        "atol": atol,
        "frozen_tol_factor": ftf,
        "solver": type(prob.solver).__name__,
        "warmup_time_s": warmup_time,
        "sampling_time_s": sample_time,
        "wall_time_s": time.perf_counter() - t_start,
        "num_warmup": int(num_warmup),
        "num_samples": int(num_samples),
        "num_chains": C,
        "max_error_ratio": max_err,
        "solver_failures_warmup": failures_warmup if count_failures else -1,
        "solver_failures_sampling": failures_sampling if count_failures else -1,
        "record_failures": record_failures,
        "divergences": int(np.sum(diverging)),
    }
    if fit_info:
        attrs.update({f"init_fit_{k}": v for k, v in fit_info.items()})
    for grp in ("posterior", "sample_stats", "observed_data"):
        getattr(idata, grp).attrs.update(attrs)
    return idata


def _ensemble_np(mesh_np, C: int):
    """A single host mesh as an ensemble of ``C`` identical trajectories."""
    vals = tuple(np.broadcast_to(np.asarray(getattr(mesh_np, k)),
                                 (C,) + np.shape(getattr(mesh_np, k))).copy()
                 for k in _PER_TRAJ)
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in _PER_TRAJ), mesh_np, vals)
    return eqx.tree_at(lambda m: m.params, out, jax.tree_util.tree_map(
        lambda x: np.broadcast_to(np.asarray(x), (C,) + np.shape(x)).copy(), mesh_np.params))


def _single_np(mesh_np):
    """The sampling mesh as one trajectory (row 0 of an ensemble)."""
    if np.ndim(mesh_np.n_steps) == 0:
        return mesh_np
    vals = tuple(np.asarray(getattr(mesh_np, k))[0] for k in _PER_TRAJ)
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in _PER_TRAJ), mesh_np, vals)
    return eqx.tree_at(lambda m: m.params, out,
                       jax.tree_util.tree_map(lambda x: np.asarray(x)[0], mesh_np.params))


_ER_CACHE: dict = {}


def _error_ratios(prob: _Problem, space, mesh, z: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Replay ``error_ratio`` (mesh tolerance units) of one mesh at every ``z (C, S, D)``."""
    C, S, D = z.shape
    flat = z.reshape(C * S, D)
    key = id(prob)
    er = _ER_CACHE.get(key)
    if er is None or er[0] is not prob:
        fn = jax.jit(lambda u, m: jax.vmap(
            lambda uu: prob.replay(m, space.from_unconstrained(uu), None).error_ratio)(u))
        _ER_CACHE.clear()
        _ER_CACHE[key] = er = (prob, fn)
    fn = er[1]
    out = []
    for i in range(0, flat.shape[0], chunk):
        block = flat[i:i + chunk]
        pad = chunk - block.shape[0]
        if pad:
            block = np.concatenate([block, np.repeat(block[-1:], pad, axis=0)])
        out.append(np.asarray(fn(jnp.asarray(block), mesh))[: chunk - pad])
    return np.concatenate(out).reshape(C, S)


def _union_mesh(parts) -> Any:
    """One host mesh whose step times are the union of those of ``parts`` (single meshes or
    ensembles); every save time is a node of each part, hence of the union."""
    times = []
    first = None
    for m in parts:
        t = np.atleast_2d(np.asarray(m.times))
        n = np.atleast_1d(np.asarray(m.n_steps))
        st = np.atleast_1d(np.asarray(m.status))
        for row, nn, s in zip(t, n, st):
            if s == 0:
                times.append(row[: nn + 1])
        if first is None:
            first = _single_np(m)
    union = np.unique(np.concatenate(times))
    ts = np.asarray(first.ts)
    save_index = np.searchsorted(union, ts).astype(np.asarray(first.save_index).dtype)
    if not np.array_equal(union[save_index], ts):
        raise RuntimeError("inference.sample: internal error: save times missing from the "
                           "union mesh")
    return eqx.tree_at(
        lambda m: (m.times, m.n_steps, m.n_rejected, m.status, m.save_index),
        first,
        (union, np.asarray(len(union) - 1, np.asarray(first.n_steps).dtype),
         np.zeros_like(np.asarray(first.n_rejected)), np.zeros_like(np.asarray(first.status)),
         save_index),
    )


def _initial_points(model, data, space, init, C, key, jitter, seed, rtol, atol, solver,
                    fit_kwargs):
    """``(u0 (C, D), description, fit_info)``."""
    k_fit, k_jit = jax.random.split(key)
    fit_info: dict = {}
    if isinstance(init, str) and init == "map":
        kw = dict(n_starts=16, steps=300, seed=seed, rtol=rtol, atol=atol, solver=solver,
                  progress=False)
        kw.update(fit_kwargs or {})
        res = fit(model, data, **kw)
        centre = np.asarray(space.to_unconstrained(res.params))
        fit_info = dict(n_starts=int(kw["n_starts"]), steps=int(kw["steps"]),
                        best_loss=float(res.loss), n_records=int(res.n_records),
                        n_grad_evals=int(res.n_grad_evals), wall_time_s=float(res.wall_time))
        desc = (f"MAP fit (inference.fit, {kw['n_starts']} starts, {kw['steps']} Adam "
                f"steps, best loss {res.loss:.6g}); chains start at its best point plus "
                f"N(0, {jitter}^2) jitter in unconstrained space")
        u0 = centre[None] + jitter * np.asarray(jax.random.normal(k_jit, (C, space.dim)))
    elif isinstance(init, str) and init == "prior":
        u0 = np.asarray(space.to_unconstrained(model.sample_prior(k_jit, C)))
        desc = "independent prior draws"
    elif isinstance(init, Mapping):
        init, n = checked_init(model, space, init)
        u = np.asarray(space.to_unconstrained(init))
        if n is None:
            u0 = u[None] + jitter * np.asarray(jax.random.normal(k_jit, (C, space.dim)))
            desc = f"given point plus N(0, {jitter}^2) jitter in unconstrained space"
        elif n == C:
            u0 = u
            desc = "given per-chain points"
        else:
            raise ValueError(f"`init` has {n} points but num_chains={C}")
    else:
        raise ValueError(f"`init` must be 'map', 'prior' or a parameter dict, got {init!r}")
    return np.asarray(u0, dtype=np.float64), desc, fit_info
