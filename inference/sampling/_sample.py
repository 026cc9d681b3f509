"""`sample`: NUTS/HMC (NumPyro), or another sampler object, whose potential gradients come
from gradsolve, returning ArviZ data.

The sampler works on the flat unconstrained vector ``u`` of `inference.ParamSpace`; its
chains are the sampler's kernel (``_samplers.py``: `NUTS` and `HMC` run NumPyro's,
`ChainKernel` in ``_chains.py``; `ChEES` runs BlackJAX's jittered HMC with its chains in
lockstep, ``_ensemble.py``), its warmup ``_warmup.py``; it carries a `SampleState` (what
its next step needs) and a `SampleInfo` (what it reports); a checkpoint holds both. The
run loop below and in ``_warmup.py`` is the same for every sampler: the meshes are
recorded for all chains at once (one ``problem.record`` of ``(C, D)`` points),
re-recorded between warmup windows, frozen for sampling and re-recorded where the draws
leave them; the defaults below are NUTS's (`NUTS`), chosen by the problem's
``hierarchical``.

Mesh policy (``rerecord``; `MeshPolicy`), and why each is exact:

- ``"warmup"`` (default). During warmup each chain has its own mesh, re-recorded at the
  chain's position between warmup windows; at the end of warmup ONE mesh is recorded at
  the chains' mean position with tolerances ``frozen_tol_factor`` times tighter and FROZEN
  for the whole sampling phase, shared by all chains. With the mesh fixed, ``U`` is a fixed
  smooth function of ``u`` (an explicit fixed-step Runge–Kutta solve on a fixed time grid)
  and the replay's gradient is its exact gradient, so NUTS/HMC is an exact MCMC for this
  *fixed-mesh posterior*: the leapfrog map is reversible and volume preserving for any
  fixed smooth potential and the accept/reject (NUTS's multinomial selection) uses that
  same ``U``. The fixed-mesh posterior differs from the adaptive-solution one only by the
  solver error on that mesh, measured at every draw (``sample_stats["error_ratio"]``, in
  units of the requested ``rtol``/``atol``: ``<= 1`` means the adaptive controller would
  accept the frozen mesh there); a warning is issued when its maximum exceeds 1.
  Re-recording *during* sampling would make the target depend on the chain's path and
  break detailed balance, so it is never done. At every mesh change the current point's
  potential and gradient are recomputed on the new mesh before the next transition.
- ``"always"``: ``gs.solve`` (record + replay) in every evaluation, warmup and sampling:
  exactly the adaptive solution's posterior (the record is a deterministic function of the
  parameters, so ``U`` is still a fixed function of ``u``, piecewise smooth where the
  accepted step sequence changes). Slower: each gradient pays a record, and under
  vectorised chains the replay runs the whole step capacity ``max_steps`` (default: room for
  1.5x the steps needed at the initial points; parameters needing more give ``-inf``).
- ``"never"``: one mesh recorded at the initial points' mean (tightened as above), frozen
  for warmup and sampling.

The default (``rerecord=None``) is ``"warmup"`` for an `ODEModel` and ``"always"`` for a
population model or a NumPyro program with latent sites in a plate (random effects, e.g.
per subject); a program without (its parameters shared by every trajectory) gets an
`ODEModel`'s defaults (``"warmup"``, 0.8, dense). A population's posterior spans a wide range of
every subject's own time scales (a subject's absorption rate varies by several times
across it), and NUTS trajectories reach beyond the warmup's draws; a fixed explicit mesh
is then too coarse, even unstable, where a subject's dynamics are faster, and the
fixed-mesh potential there is not smooth enough to sample. Measured on theophylline
(4 chains x (500 + 500), Tsit5): under ``"warmup"`` 180 divergences, step sizes ~0.01
and replay error ratios up to 1e6 at accepted draws, against 0 divergences and step sizes
~0.11 under ``"always"`` (which then agrees with the closed-form posterior). A program's
ode sites solve at their own ``max_steps`` under ``"always"`` (16,384 by default, or
``sample``'s ``max_steps``), since a population's subjects need far more steps in parts of
the posterior than at the start.

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
jitter in unconstrained space. Warmup starts from the inverse Hessian of the potential at
that point (or at a single given ``init`` point) instead of NumPyro's identity metric, and
no coordinate is jittered by more than its sd under it: before NumPyro's first metric
update (100 iterations in) the identity metric forces the step size of the posterior's
narrowest direction on all (theophylline: 32 of 45 s of warmup in trees of 100-300
leapfrog steps; `inference.sampling._metric`). The InferenceData's attributes say so.

A random-effects hierarchy (a population model, a program with latent sites in a plate)
starts elsewhere by default (``init="advi"``): its joint mode lies far from its draws (the
prior on the random effects pulls them towards zero and their scales up), so after the MAP
fit a mean-field ADVI fit from its best point moves into the typical set, and the chains
start at independent draws from it, warmup at its variances (`inference.sampling._advi`). On the
simulated 200-subject study (610 parameters, 4 chains, 2 CPU devices) the first 30 warmup
iterations took 311 s from the MAP point (trees of 350-720 leapfrog steps at step sizes
0.009-0.07) and 24 s from the ADVI draws (26-30 steps at 0.14-0.18), the fit itself ~30 s.

Defaults that depend on the problem. ``dense_mass``: dense with at most ``max(10,
num_warmup // 10)`` unconstrained parameters (50 at the default warmup), diagonal
otherwise. An ODE's parameters are correlated (rates that the data identify only through
their ratio or product), and a diagonal metric makes NUTS take many short steps along those
ridges: lynx–hare (8 parameters, 2 chains x (500 + 1,000), 2-core CPU) takes 30-33 leapfrog
steps a draw for a min ESS of ~490 with a diagonal metric (seeds 0, 1), 7 for 1,500-2,350
with a dense one (seeds 0-5). The bound keeps the covariance estimable: the last warmup
window, a little under half of ``num_warmup``, then holds at least four draws per
parameter; at four, sampling noise alone spreads the estimate's eigenvalues over a factor of
about 9 (Marchenko–Pastur). Random-effects hierarchies under the bound are dense too:
theophylline (30 parameters, 4 chains x (500 + 1,000)) took 112,000-122,000 leapfrog steps
in sampling for a min bulk ESS of 775-1,153 with a dense metric at target 0.97 (seeds 0, 1,
3, 4), against 176,000-186,000 for 680-799 with a diagonal one at 0.9 (seeds 0, 1). (Started
from NumPyro's identity, the dense adaptation had left a chain stuck in one of six runs
there; warmup now starts from the curvature at the MAP point, and none stuck in 21 dense
runs.) ``target_accept``: 0.8 (NumPyro's and Stan's) for an `ODEModel`; for a population
model or a program with random effects 0.9 with a diagonal metric and 0.97 with a dense
one. A random-effects hierarchy's curvature grows with its variances, and at 0.8 NUTS
diverges there now and then on an exact potential (theophylline, hand-written program,
seed 0: one divergence in 4,000 draws, every evaluation on its trajectory equal to the
closed form's to 1e-4), which a smaller step prevents at less cost than re-adapting after
warmup; the dense metric's longer steps along the correlations diverged in up to 11 of
4,000 draws at 0.9 and in one on 3 of 9 runs at 0.95 (theophylline and the hand-written
program, seeds 0-5), in none of 6 at 0.97.

Divergences: a step size too large for part of the posterior shows as divergent
transitions late in warmup or in the first draws. When warmup's terminal step-size
window (but its first 10 iterations) diverges at step sizes at most 1.5 times the final
one (dual averaging's larger trial steps predict nothing of the sampling phase), or the
first 100 draws diverge, or any draws diverge on a dense metric (its bulk covariance
can send long steps into tails whose correlations differ, which the chains may first
reach hundreds of draws in), the draws so far are dropped and the step size is
re-adapted (a diagonal mass matrix kept, a dense one replaced by its diagonal) at
``target_accept`` raised to ``1 - (1 - target_accept) / 2`` over 150 more warmup
iterations, up to ``max_retunes`` times, and the attributes say so. Divergences left in
the sampling phase are reported with a warning naming what to try next.

How it runs (``_warmup.py``'s phases, each advancing ``(SampleState, SampleInfo)``):
`sample` validates, settles the defaults, builds the first state (`start`, or a
checkpoint's), warms up (`warm_up`: the windows, `freeze_mesh`,
`respond_to_divergences`), draws (`draw`, whose first loop call is a probe,
`respond_to_draws`) and returns `inference_data` of the final state and info.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

import gradsolve as gs

from .. import _checkpoint
from ._chains import CHUNK, ChainKernel, SampleInfo, SampleState, chain_devices
from ._samplers import MAX_TREE_DEPTH, Sampler, default_sampler, sampler_of
from ._idata import inference_data
from ..problem._policy import MeshPolicy
from ..problem._problem import InferenceModel
from ..problem._program import problem_of
from .._progress import progress_bar
from ._warmup import RETUNE_ITERATIONS, Run, respond_to_draws, start, warm_up

__all__ = ["sample"]


def sampling_chunk(run: Run, s: SampleState, info: SampleInfo) -> tuple[SampleState, SampleInfo]:
    """Up to `CHUNK` draws (up to ``run.total`` iterations) on the frozen mesh, kept in
    ``info.draws`` with the mesh's error ratios at them (``info.error_ratios``)."""
    t = time.perf_counter()
    kernel = run.kernel(s)
    s, draws, failed = kernel.run(s, min(CHUNK, run.total - s.iteration))
    err = ()
    if not kernel.policy.solves_each_evaluation:
        err = (kernel.error_ratios(s.mesh.row(0), draws.z, tol_factor=s.sampling_tol_factor),)
    return s, info._replace(draws=info.draws + (draws,),
                            error_ratios=info.error_ratios + err,
                            failures_sampling=info.failures_sampling + failed,
                            sampling_time=info.sampling_time + time.perf_counter() - t)


def draw(run: Run, s: SampleState, info: SampleInfo) -> tuple[SampleState, SampleInfo]:
    """The sampling phase: draws in chunks up to ``run.total`` iterations, the first
    chunk after warmup a probe (`respond_to_draws`, which also answers a dense metric's
    divergences in any chunk), a checkpoint about every
    ``run.checkpoint_every`` draws and at the end."""
    every = run.checkpoint_every
    next_save = (s.iteration - run.num_warmup) // every * every
    while s.iteration < run.total:
        s, info = sampling_chunk(run, s, info)
        if run.num_warmup:
            s, info, again = respond_to_draws(run, s, info)
            if again:
                next_save = 0
                continue
        run.advance(info.draws[-1].z.shape[1], s)
        done = s.iteration - run.num_warmup
        if done >= next_save + every or s.iteration == run.total:
            run.save(s, info)
            next_save = done // every * every
    return s, info


def _advancer(bar):
    """``advance(n, state=None)`` for `Run`: ``n`` more iterations on ``bar``, with the
    chains' step size (their median) from ``state`` where given."""
    def advance(n, state=None):
        if state is not None:
            size = np.median(np.asarray(state.chains.adapt_state.step_size))
            bar.set_postfix(step_size=f"{size:.3g}")
        bar.update(n)

    return advance


def _check_fit_kwargs(fit_kwargs) -> None:
    """``ValueError`` naming a key of ``fit_kwargs`` that `inference.fit` does not take
    (checked before the model is traced, not when the MAP fit starts)."""
    import inspect

    from ..optimize._fit import GLOBAL_OPTIONS, fit

    if fit_kwargs is None:
        return
    if not isinstance(fit_kwargs, Mapping):
        raise ValueError(f"`fit_kwargs` must be None or a dict of inference.fit's keyword "
                         f"arguments, got {type(fit_kwargs).__name__}")
    takes = [k for k in inspect.signature(fit).parameters if k not in ("model", "data",
                                                                        "options")]
    unknown = sorted(set(fit_kwargs) - set(takes) - set(GLOBAL_OPTIONS))
    if unknown:
        raise ValueError(f"`fit_kwargs` has unknown key(s) {unknown}; inference.fit takes "
                         f"{takes}")


def _checked_sample_args(o: dict) -> None:
    """``ValueError`` naming the first bad argument of `sample` (its arguments ``o``)."""
    num_warmup, target_accept, init_jitter, init, max_steps = (
        o[k] for k in ("num_warmup", "target_accept", "init_jitter", "init", "max_steps"))
    # no sampler named: chosen with the problem (`default_sampler`)
    o["sampler"] = (None if o["sampler"] is None and o["kernel"] is None
                    else sampler_of(o["sampler"], o["kernel"]))
    for name, v, lo in (("num_warmup", num_warmup, 0),
                        ("num_samples", 1 if o["num_samples"] is None else o["num_samples"], 1),
                        ("num_chains", 1 if o["num_chains"] is None else o["num_chains"], 1),
                        ("checkpoint_every", o["checkpoint_every"], 1),
                        ("max_tree_depth", 1 if o["max_tree_depth"] is None
                         else o["max_tree_depth"], 1),
                        ("max_retunes", o["max_retunes"], 0),
                        ("max_steps", 1 if max_steps is None else max_steps, 1)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            raise ValueError(f"`{name}` must be an int >= {lo}, got {v!r}")
    _check_fit_kwargs(o["fit_kwargs"])
    if not isinstance(o["seed"], (int, np.integer)) or isinstance(o["seed"], bool):
        raise ValueError(f"`seed` must be an int, got {o['seed']!r}")
    for name in ("dense_mass", "count_failures"):
        if o[name] is not None and not isinstance(o[name], (bool, np.bool_)):
            raise ValueError(f"`{name}` must be None, True or False, got {o[name]!r}")
    if not (isinstance(o["frozen_tol_factor"], (int, float, np.number))
            and 0 < o["frozen_tol_factor"] <= 1):
        raise ValueError(
            f"`frozen_tol_factor` must lie in (0, 1], got {o['frozen_tol_factor']}")
    if target_accept is not None and not (
            isinstance(target_accept, (int, float, np.number)) and 0 < target_accept < 1):
        raise ValueError(f"`target_accept` must lie in (0, 1), got {target_accept!r}")
    if not (isinstance(init_jitter, (int, float, np.number)) and init_jitter >= 0):
        raise ValueError(f"`init_jitter` must be a non-negative number, got {init_jitter!r}")
    if init is not None and ((isinstance(init, str) and init not in ("map", "advi", "prior"))
                             or not isinstance(init, (str, Mapping))):
        raise ValueError(
            f"`init` must be None, 'map', 'advi', 'prior' or a parameter dict, got {init!r}")
    if num_warmup == 0:
        warnings.warn(
            "inference.sample: num_warmup=0 adapts neither the step size nor the mass matrix "
            "(the step size stays at 1.0): expect divergences and few distinct draws unless "
            "the posterior is already standardised", stacklevel=3)


def _settled(model, data, o: dict) -> tuple[Any, MeshPolicy, dict]:
    """The problem, the mesh policy and the options ``o`` of `sample` with their
    problem-dependent defaults (``None``) settled by the sampler (`Sampler.settle`) and
    ``count`` (whether failed potential evaluations are counted) added."""
    # an ODEModel records at the default capacity (max_steps is its in-potential solve's);
    # a program's ode sites solve at max_steps themselves
    problem = problem_of(model, data, solver=o["solver"], rtol=o["rtol"], atol=o["atol"],
                         max_steps=None if isinstance(model, InferenceModel) else o["max_steps"])
    sampler = o.get("sampler")
    if sampler is None and o.get("kernel") is None:
        sampler = default_sampler(problem, o)
    elif not isinstance(sampler, Sampler):
        sampler = sampler_of(sampler, o.get("kernel"))
    o = dict(o, sampler=sampler)
    if o.get("max_tree_depth") is None:
        o["max_tree_depth"] = MAX_TREE_DEPTH
    o = sampler.settle(problem, o)
    o["kernel"] = sampler.name
    # lockstep chains are one ensemble: split over devices they would wait for each other
    o["devices"] = (chain_devices(o["chain_method"], int(o["num_chains"]))
                    if sampler.name in ("nuts", "hmc") else 1)
    policy = MeshPolicy.checked("sample", o["rerecord"],
                                record_tol_factor=float(o["frozen_tol_factor"]))
    # the counter's callback runs at every evaluation under vectorised chains (the
    # lax.cond becomes a select): a program's default "always" policy does not pay it
    o["count"] = (o["rerecord"] == "always" and problem.count_failures_by_default
                  if o["count_failures"] is None else bool(o["count_failures"]))
    return problem, policy, o


def _fingerprint(problem, policy, o: dict) -> dict:
    """What a checkpoint of this run must share with the run that resumes it."""
    init = o["init"]
    return _checkpoint.fingerprint(
        problem, policy, num_chains=o["num_chains"], num_warmup=o["num_warmup"],
        **o["sampler"].fingerprint(o), num_samples=o["num_samples"], seed=o["seed"],
        target_accept=o["target_accept"], dense_mass=o["dense_mass"],
        max_tree_depth=o["max_tree_depth"], init_jitter=o["init_jitter"],
        max_steps_solve=o["max_steps"], max_retunes=int(o["max_retunes"]),
        init=init if isinstance(init, str) else _checkpoint.digest(dict(init)),
        fit_kwargs=sorted((k, v) for k, v in (o["fit_kwargs"] or {}).items()
                          if isinstance(v, (bool, int, float, str))))


def _saver(path, fingerprint: dict):
    """``save(state, info)``: a checkpoint at ``path`` (nothing if ``path`` is ``None``; a
    warning if it cannot be written)."""
    def save(s: SampleState, info: SampleInfo) -> None:
        if path is not None:
            _checkpoint.save_or_warn(path, fingerprint, s, info)
    return save


def _first_state(problem, policy, data, o: dict, fingerprint: dict
                 ) -> tuple[ChainKernel, dict, SampleState, SampleInfo]:
    """The run's first kernel, its re-adapting kernels (`Run.retuned`) and its first
    ``(state, info)``: a fresh start (`start`, then NumPyro's chain states) or the
    checkpoint's, whose kernel is built as the interrupted run had it (NumPyro's init
    also builds the kernel's potential and adaptation)."""
    k_init, k_mcmc = jax.random.split(jax.random.PRNGKey(o["seed"]))
    saved = _checkpoint.load(o["checkpoint"], fingerprint, "run", with_info=True)
    if saved is None:
        u0, metric, state, info = start(
            problem, policy, data, init=o["init"], num_chains=int(o["num_chains"]),
            key=k_init, init_jitter=o["init_jitter"], seed=o["seed"],
            # the MAP fit that places the chains shows its progress as the sampler does
            fit_kwargs={"progress": o["progress"], **(o["fit_kwargs"] or {})},
            max_steps=o["max_steps"],
            target_accept=o["target_accept"], dense_mass=o["dense_mass"])
    else:
        state, info = saved
        state = state._replace(chains=_checkpoint.to_device(state.chains))
    base = o["sampler"].kernel(problem, policy, o, state.solve_max_steps)
    if saved is None:
        chains = base.init(u0, k_mcmc, state, metric=metric)
        return base, {}, state._replace(chains=chains), info
    if not state.retunes:
        base.init(np.asarray(state.chains.z), k_mcmc, state)
        return base, {}, state, info
    retuned = base.retuned(state.target_accept, RETUNE_ITERATIONS)
    retuned.init(np.asarray(state.chains.z), k_mcmc, state, tuned=state.chains.adapt_state)
    return base, {state.target_accept: retuned}, state, info


def sample(
    model, data=None, *, num_warmup: int = 500, num_samples: int | None = None,
    num_chains: int | None = None, kernel: str | None = None, sampler: Any = None,
    rerecord: str | None = None, seed: int = 0, init: Any = None,
    checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 250,
    progress: bool | None = None, target_accept: float | None = None,
    rtol: float | None = None, atol: float | None = None, solver=None,
    max_steps: int | None = None, frozen_tol_factor: float = 0.1, dense_mass: bool | None = None,
    max_tree_depth: int | None = None, init_jitter: float = 0.05,
    fit_kwargs: Mapping[str, Any] | None = None, count_failures: bool | None = None,
    max_retunes: int = 3, chain_method: str = "auto",
):
    """Sample the posterior of ``model`` given ``data`` with NumPyro NUTS, or another
    sampler (``sampler=``: HMC, BlackJAX's ChEES-HMC with its chains in lockstep).

    A `models.PetabProblem` (``data=None``: it carries its data) is sampled as the NumPyro
    program of its posterior (one site per estimated parameter
    on its scale, inside its bounds, with the table's prior or uniform; its
    pre-equilibration and simulation as ode sites), with every option below; its MAP
    start is `fit`'s least-squares multistart (10 starts).

    Args:
        model: a `models.ODEModel` (or a NumPyro program, a population model, a
            `models.PetabProblem`); data: a `models.Dataset` (``None`` for a PEtab problem).
        num_warmup, num_samples, num_chains: as NumPyro's ``MCMC``; ``None``: the
            sampler's defaults, 2 chains x 1,000 draws for NUTS and HMC, 16 chains x 250
            draws for ChEES (Stan's 4,000 draws in all: the lockstep chains share them);
            a ``num_chains`` given with ``sampler=None`` runs NUTS.
        chain_method: ``"vectorized"`` (all chains in one ``jax.vmap`` on one device),
            ``"parallel"`` (the chains split over the local devices, each device
            vectorising its share; on a CPU, one device per core: call
            ``jax.config.update("jax_num_cpu_devices", os.cpu_count())`` or
            ``numpyro.set_host_device_count`` first thing in the program), or ``"auto"``
            (``"parallel"`` where JAX has several CPU devices, else ``"vectorized"``).
            The draws are the same either way; apart, each device waits only for its
            own chains' trees and runs on a core of its own (theophylline, 4 chains on 2
            CPU devices: sampling 1.7x faster).
        sampler: ``None`` (chosen with the problem, below), a name (``"nuts"``,
            ``"hmc"``, ``"chees"``) or a sampler object of `inference.sampling`
            (``NUTS(...)``, ``HMC(...)``, ``ChEES(...)``): its kernel and adaptation, and
            its defaults for the settings below left at ``None``. Every sampler runs in
            the same loop (meshes recorded for all chains at once, re-recorded in warmup,
            frozen and checked while sampling, checkpoints). ``None`` runs ChEES on its
            16 chains (any problem: an `ODEModel`, a PEtab problem, a program, a
            population) when the call sets none of ``num_chains``, ``max_tree_depth``,
            ``chain_method`` and a per-chain ``init``; NUTS otherwise (a call written
            for NUTS). ChEES adapts its
            step size and trajectory length from statistics across the chains and wants
            many; with them it gave more effective draws per gradient and per second on
            a 2-core CPU (against Stan's ESS/s, second runs: lynx–hare 50.3x, NUTS
            10.2x; theophylline 32.0x, NUTS 7.7x; eight schools, second runs of
            ``benchmarks/bench_samplers.py``: 282 ESS/s against NUTS's 40).
        kernel: ``"nuts"`` or ``"hmc"`` (the older spelling of ``sampler``).
        rerecord: mesh policy, ``"warmup"``, ``"always"`` or ``"never"``; ``None``: ``"warmup"``
            for an `ODEModel` or a program with no latent site in a plate, ``"always"``
            for a population model or a program with such sites (random effects, e.g. in
            a subjects plate; see the module docstring for why each keeps the sampler
            exact).
        seed: seeds initialisation and the chains.
        init: ``"map"`` (multi-start MAP fit, jittered), ``"advi"`` (the MAP fit, then a
            mean-field ADVI fit from its best point; the chains start at draws from it),
            ``"prior"`` (prior draws), or a constrained parameter dict (one point,
            jittered, or leaves with a leading axis ``num_chains``); ``None``: ``"advi"``
            for a population model or a program with latent sites in a plate, ``"map"``
            otherwise (why: the module docstring).
        checkpoint: a file path; the state is saved at every warmup re-record, at the end
            of warmup and about every ``checkpoint_every`` draws; a later call with the same
            path resumes and gives the same draws as an uninterrupted run. A path that
            cannot be written is a ``ValueError`` before the run starts; a save that fails
            later (a full disk) is a ``RuntimeWarning`` and the run goes on.
        progress: ``None`` (default): a progress bar when stderr is a terminal, else a
            plain line on stderr now and then (phase, iterations, seconds, step size);
            ``True``: the bar; ``False``: nothing.
        target_accept: NUTS/HMC's target acceptance probability; ``None``: 0.8 (NumPyro's
            and Stan's default) for an `ODEModel` or a program with no latent site in a
            plate; for a population model or program with them 0.9 with a diagonal
            metric, 0.97 with a dense one (why: the module docstring).
        dense_mass: a dense (``True``) or diagonal (``False``) mass matrix, adapted in warmup
            as NumPyro's; ``None``: dense with at most ``max(10, num_warmup // 10)``
            unconstrained parameters (random-effects hierarchies included), diagonal
            otherwise
            (why: the module docstring). A dense metric whose late warmup diverges is
            replaced by its diagonal when the step size is re-adapted; the attribute
            ``mass_matrix`` is the metric the draws were made with.
        max_tree_depth: NumPyro NUTS/HMC's (``None``: 10, NumPyro's).
        max_retunes: how many times the step size may be re-adapted at a higher
            ``target_accept`` when the end of warmup or the first draws (on a dense metric:
            any draws) diverge (``0``:
            never; "Divergences" in the module docstring).
        rtol, atol, solver: the ODE solve (``None``: ``rtol = 1e-6``, ``atol = 1e-8``,
            the model's solver; a PEtab problem's own settings for one).
        max_steps: step capacity of ``gs.solve`` inside the potential when
            ``rerecord="always"`` (``None``: automatic for an `ODEModel`, 16,384 for the
            ode sites of a population model or program).
        frozen_tol_factor: meshes are recorded at this times ``rtol``/``atol``.
        init_jitter: standard deviation of the per-chain jitter in unconstrained space
            (capped per coordinate at its sd under the initial metric).
        fit_kwargs: overrides for the MAP fit of ``init="map"`` or ``"advi"`` (e.g.
            ``n_starts``).
        count_failures: count failed potential evaluations with a host callback (about
            doubles the cost of a gradient on CPU); default: only for ``rerecord="always"`` on an
            `ODEModel`.

    Returns:
        ``arviz.InferenceData`` with ``posterior`` (the model's parameter names and shapes,
        e.g. ``theta (chain, draw, 4)``), ``sample_stats`` (``diverging``, ``tree_depth``,
        ``n_steps``, ``step_size``, ``energy``, ``lp``, ``acceptance_rate``,
        ``error_ratio``) and ``observed_data`` (``obs (time, observed_state)``). The groups'
        ``attrs`` record the mesh policy (``mesh_policy``, ``mesh_policy_description``,
        ``sampling_mesh``), ``max_error_ratio``, ``solver_failures_warmup`` /
        ``solver_failures_sampling`` (``-1`` if not counted), ``record_failures``,
        ``divergences``, ``n_records``, the initialisation (``init``, ``init_fit_*``),
        the divergence response (``target_accept`` finally used,
        ``target_accept_requested``, ``retunes``, ``warmup_late_divergences``,
        ``divergence_response``) and timings (``warmup_time_s``, ``sampling_time_s``,
        ``wall_time_s``).

    Example:
        >>> idata = inference.sample(models.lynx_hare(), models.load_dataset("lynx_hare"))
        >>> arviz.summary(idata)
    """
    o = dict(locals())
    del o["model"], o["data"]
    _checked_sample_args(o)
    _checkpoint.check_path(checkpoint)
    t_start = time.perf_counter()
    gs.ensure_compilation_cache()
    problem, policy, o = _settled(model, data, o)
    fingerprint = _fingerprint(problem, policy, o)
    base, retuned, state, info = _first_state(problem, policy, data, o, fingerprint)
    num_samples = int(o["num_samples"])
    total = int(num_warmup) + num_samples
    bar = progress_bar(progress, total=total, done=state.iteration,
                       desc=f"sample {problem.model.name} ({o['num_chains']} chains)",
                       phases=(("warmup", int(num_warmup)), ("sampling", int(num_samples))))
    run = Run(base, int(num_warmup), total, int(max_retunes), checkpoint_every,
              _saver(checkpoint, fingerprint), _advancer(bar), retuned)
    try:
        state, info = draw(run, *warm_up(run, state, info))
    finally:
        bar.close()
    return inference_data(run.base, state, info, dict(
        kernel=o["kernel"], rtol=problem.rtol, atol=problem.atol, num_warmup=int(num_warmup),
        target_accept_requested=float(o["target_accept"]), max_retunes=int(max_retunes),
        mass_matrix="dense" if run.kernel(state).settings["dense_mass"] else "diagonal",
        mass_matrix_requested="dense" if o["dense_mass"] else "diagonal",
        num_samples=int(num_samples), num_chains=int(o["num_chains"]),
        count_failures=o["count"],
        chain_method="parallel" if o["devices"] > 1 else "vectorized",
        chain_devices=int(o["devices"]),
        wall_time_s=time.perf_counter() - t_start))
