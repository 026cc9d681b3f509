"""Samplers as objects: what `inference.sample(problem, sampler=...)` runs.

A sampler is, as in BlackJAX, a kernel (``init`` and ``step`` over ``C`` chains) and its
adaptation; it also says which of `sample`'s settings it fills in where the user gives
none. Every sampler runs inside the same run loop (``_warmup.py``, ``_sample.py``), which
keeps the meshes: one record for all chains, re-records between warmup windows, one
frozen mesh for the sampling phase re-recorded where the draws leave it, checkpoints and
resume.

- `NUTS` (and `HMC`): NumPyro's kernel with its windowed step-size and mass-matrix
  adaptation (``_chains.ChainKernel``). Each chain builds its own tree, so vectorised
  chains wait for the deepest one.
- `ChEES`: BlackJAX's jittered HMC with ChEES adaptation (Hoffman, Radul and Sountsov
  2021): every chain takes the same number of leapfrog steps at every iteration, so the
  ``C`` chains' solves are one ensemble in lockstep (``_ensemble.EnsembleKernel``).

The defaults that depend on the problem ask it one structural question,
``problem.hierarchical`` (latent sites in a plate: random effects).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..problem._abstract import AbstractProblem

__all__ = ["Sampler", "NUTS", "HMC", "ChEES", "sampler_of", "default_sampler", "MAX_TREE_DEPTH"]


def _hierarchical(problem: AbstractProblem) -> bool:
    return bool(getattr(problem, "hierarchical", False))


@dataclasses.dataclass(frozen=True)
class Sampler:
    """What every sampler gives the run loop (a base class; use `NUTS`, `HMC` or `ChEES`).

    Attributes:
        name: how results and checkpoints name it.
        target_accept, dense_mass: the adaptation's target acceptance probability and
            whether its metric is dense; ``None``: the sampler's default for the problem
            (`settle`). `sample`'s arguments of the same names take precedence.

    ``default_chains`` is the number of chains where `sample` is not given one, and
    `default_samples` the draws a chain makes where it is given no ``num_samples``.
    """

    name = "sampler"
    default_chains = 2
    target_accept: float | None = None
    dense_mass: bool | None = None

    def default_samples(self, num_chains: int) -> int:
        """Draws per chain where `sample` is given no ``num_samples``: NumPyro's and
        Stan's 1,000."""
        return 1000

    def default_init(self, problem: AbstractProblem) -> str:
        """Where the chains start: a random-effects hierarchy's joint mode lies far from
        its draws, so its chains start at draws of a mean-field variational fit from the
        MAP point (``"advi"``); otherwise at the MAP point, jittered (``"map"``)."""
        return "advi" if _hierarchical(problem) else "map"

    def default_rerecord(self, problem: AbstractProblem) -> str:
        """The mesh policy: a population's subjects need very different steps across the
        posterior, so a frozen mesh would not hold (``"always"``); one set of
        parameters for every trajectory moves the step counts little (``"warmup"``)."""
        return "always" if _hierarchical(problem) else "warmup"

    def default_dense(self, problem: AbstractProblem, num_warmup: int) -> bool:
        """Dense with at most ``max(10, num_warmup // 10)`` parameters (an ODE's rates
        are correlated; the bound keeps the covariance estimable from the last warmup
        window), diagonal otherwise."""
        return problem.space.dim <= max(10, int(num_warmup) // 10)

    def default_target(self, problem: AbstractProblem, dense: bool) -> float:
        raise NotImplementedError

    def settle(self, problem: AbstractProblem, o: dict) -> dict:
        """``o`` (`sample`'s options) with this sampler's defaults in place of ``None``."""
        o = dict(o)
        if o["num_chains"] is None:
            o["num_chains"] = self.default_chains
        if o.get("num_samples") is None:
            o["num_samples"] = self.default_samples(int(o["num_chains"]))
        if o["init"] is None:
            o["init"] = self.default_init(problem)
        if o["rerecord"] is None:
            o["rerecord"] = self.default_rerecord(problem)
        if o["dense_mass"] is None:
            o["dense_mass"] = (self.dense_mass if self.dense_mass is not None
                               else self.default_dense(problem, o["num_warmup"]))
        o["dense_mass"] = bool(o["dense_mass"])
        if o["target_accept"] is None:
            o["target_accept"] = (self.target_accept if self.target_accept is not None
                                  else self.default_target(problem, o["dense_mass"]))
        return o

    def kernel(self, problem, policy, o: dict, solve_max_steps: int):
        """The chain kernel (``init``, ``step``/``run``, ``retuned``) of ``C`` chains."""
        raise NotImplementedError

    def fingerprint(self, o: dict) -> dict:
        """What a checkpoint of a run with this sampler must share with its resume."""
        return dict(kernel=self.name)


@dataclasses.dataclass(frozen=True)
class NUTS(Sampler):
    """NumPyro's NUTS, windowed adaptation of the step size and mass matrix.

    Defaults: ``target_accept`` 0.8 (NumPyro's and Stan's); for a random-effects
    hierarchy 0.9 with a diagonal metric and 0.97 with a dense one (its curvature grows
    with its variances, and the dense metric's long steps along its correlations reach
    into the funnel; measurements in `inference.sample`'s module docstring).

    Args:
        target_accept, dense_mass: see `Sampler`.
        max_tree_depth: NumPyro's (``None``: `sample`'s ``max_tree_depth``).

    Example:
        >>> inference.sample(model, data, sampler=inference.sampling.NUTS(target_accept=0.9))
    """

    name = "nuts"
    algo = "NUTS"
    max_tree_depth: int | None = None

    def default_target(self, problem, dense: bool) -> float:
        if _hierarchical(problem):
            return 0.97 if dense else 0.9
        return 0.8

    def settle(self, problem, o: dict) -> dict:
        o = super().settle(problem, o)
        if self.max_tree_depth is not None:
            o["max_tree_depth"] = int(self.max_tree_depth)
        return o

    def kernel(self, problem, policy, o: dict, solve_max_steps: int):
        from ._chains import ChainKernel

        return ChainKernel(problem, policy, num_chains=int(o["num_chains"]),
                           devices=o["devices"], num_warmup=o["num_warmup"], algo=self.algo,
                           target_accept=o["target_accept"], dense_mass=o["dense_mass"],
                           max_tree_depth=int(o["max_tree_depth"]), count_failures=o["count"],
                           solve_max_steps=solve_max_steps)


@dataclasses.dataclass(frozen=True)
class HMC(NUTS):
    """NumPyro's static HMC (step size and trajectory length adapted as NumPyro does)."""

    name = "hmc"
    algo = "HMC"


@dataclasses.dataclass(frozen=True)
class ChEES(Sampler):
    """BlackJAX's jittered HMC with ChEES adaptation: all chains in lockstep.

    Every iteration every chain takes the same number of leapfrog steps (the adapted
    trajectory length over the step size, jittered by a Halton sequence shared by the
    chains), so the ``C`` chains' potentials are one ensemble replay per leapfrog step
    and no chain waits for another's tree. Warmup adapts one step size (dual averaging of
    the chains' harmonic-mean acceptance towards ``target_accept``) and one trajectory
    length (Adam on the ChEES criterion, the change in the ensemble's second moment),
    both from statistics across the chains, so it wants many chains: 16 by default.
    The metric is a preconditioner estimated between warmup windows from the pooled
    chains' draws (dense under the same rule as NUTS, diagonal otherwise); the chains run
    BlackJAX's kernel in the whitened coordinates, which is HMC with that mass matrix.
    Its chains run on one device as one ensemble (`sample`'s ``chain_method`` splits NUTS's
    chains over devices, where each waits only for its own trees; lockstep chains wait for
    none).

    Args:
        target_accept: the harmonic-mean acceptance dual averaging targets (``None``:
            BlackJAX's 0.651).
        dense_mass: see `Sampler`.
        num_chains: default number of chains.
        learning_rate: Adam's, on the log trajectory length.
        max_leapfrog_steps: the trajectory length's cap in steps.
        jitter_amount: how much of the trajectory length is jittered (BlackJAX's).
        chain_block: how many chains the compiled loop evaluates at once (``None``: all,
            halved where the loop runs out of device memory; a number that does not
            divide ``num_chains`` is lowered to one that does). The draws are the same for
            any block; a smaller one needs less memory (its temporaries are one block's:
            a population posterior under ``rerecord="always"`` solves at each ode site's
            full step capacity in every evaluation, ~270 MB per chain for theophylline on
            a TPU) and runs the blocks one after another.

    Example:
        >>> sampler = inference.sampling.ChEES(num_chains=64)
        >>> idata = inference.sample(model, data, sampler=sampler)
    """

    name = "chees"
    num_chains: int = 16
    learning_rate: float = 0.025
    max_leapfrog_steps: int = 256
    jitter_amount: float = 1.0
    chain_block: int | None = None

    def __post_init__(self):
        import numbers

        b = self.chain_block
        if b is not None and (isinstance(b, bool) or not isinstance(b, numbers.Integral)
                              or b < 1):
            raise ValueError(f"ChEES: `chain_block` must be None or an int >= 1, got {b!r}")

    @property
    def default_chains(self) -> int:  # type: ignore[override]
        return int(self.num_chains)

    def default_samples(self, num_chains: int) -> int:
        """Stan's default total of draws, 4 chains x 1,000, shared by the ensemble's
        chains (250 each of the default 16), at least 100 a chain: lockstep chains make
        about as many effective draws per draw as NUTS (Boehm, 16 chains x 1,000: min bulk
        ESS 8,000), so 1,000 each would give 4x the draws and the wait of Stan's default
        for nothing a summary needs."""
        return max(100, -(-4000 // int(num_chains)))

    def default_target(self, problem, dense: bool) -> float:
        from blackjax.adaptation.chees_adaptation import OPTIMAL_TARGET_ACCEPTANCE_RATE

        return float(OPTIMAL_TARGET_ACCEPTANCE_RATE)

    def kernel(self, problem, policy, o: dict, solve_max_steps: int):
        from ._ensemble import EnsembleKernel

        return EnsembleKernel(problem, policy, num_chains=int(o["num_chains"]),
                              num_warmup=o["num_warmup"], target_accept=o["target_accept"],
                              dense_mass=o["dense_mass"], count_failures=o["count"],
                              solve_max_steps=solve_max_steps,
                              learning_rate=float(self.learning_rate),
                              max_leapfrog_steps=int(self.max_leapfrog_steps),
                              jitter_amount=float(self.jitter_amount),
                              chain_block=self.chain_block)

    def fingerprint(self, o: dict) -> dict:
        return dict(kernel=self.name, learning_rate=float(self.learning_rate),
                    max_leapfrog_steps=int(self.max_leapfrog_steps),
                    jitter_amount=float(self.jitter_amount))


_BY_NAME = {"nuts": NUTS, "hmc": HMC, "chees": ChEES}

MAX_TREE_DEPTH = 10
"""NUTS's tree depth where neither `sample` nor the `NUTS` object gives one (NumPyro's)."""


def default_sampler(problem: AbstractProblem, o: dict) -> Sampler:
    """The sampler of a call that names none (`sample`'s options ``o``): `ChEES` with its
    16 chains where the call sets nothing that only NUTS reads (``num_chains``,
    ``max_tree_depth``, ``chain_method``, an ``init`` with a point per chain); `NUTS`
    otherwise, as written for it.

    Why: on a CPU the lockstep ensemble buys more effective draws per gradient and per
    second, and its chains are one ODE ensemble. Quiet 2-core machine, second runs
    against Stan's in the same script (`benchmarks/bench_vs_stan.py`): lynx–hare ChEES
    50.3x Stan's min bulk ESS per second, NUTS 10.2x (4.3 against 34.8 leapfrog steps a
    draw); the theophylline population (a random-effects hierarchy, ``rerecord="always"``,
    the ADVI start) ChEES 32.0x, NUTS 7.7x, the same posterior within 0.04 of Stan's sd.
    A call that asks for a number of chains or a tree depth gets the sampler those
    settings were written for."""
    if (o.get("num_chains") is not None or o.get("max_tree_depth") is not None
            or o.get("chain_method", "auto") != "auto"
            or _per_chain_init(problem, o.get("init"))):
        return NUTS()
    return ChEES()


def _per_chain_init(problem: AbstractProblem, init) -> bool:
    """Whether ``init`` gives a point per chain (a parameter with a leading axis more
    than its shape): their number is the chains the call was written for."""
    import numpy as np

    shapes = getattr(getattr(problem, "space", None), "shapes", None)
    if not isinstance(init, Mapping) or not shapes:
        return False
    return any(np.ndim(v) > len(shapes[k]) for k, v in init.items() if k in shapes)


def sampler_of(sampler, kernel) -> Sampler:
    """The sampler object of `sample`'s ``sampler`` (an object or a name) and ``kernel``
    (``"nuts"`` or ``"hmc"``, the older spelling); ``ValueError`` naming the bad one."""
    if kernel is not None:
        if kernel not in ("nuts", "hmc"):
            raise ValueError(f"`kernel` must be 'nuts' or 'hmc', got {kernel!r}")
        if sampler is not None:
            raise ValueError("give either `sampler` or `kernel`, not both (`kernel` is the "
                             "older spelling of sampler='nuts' or 'hmc')")
        return _BY_NAME[kernel]()
    if sampler is None:
        return NUTS()
    if isinstance(sampler, str) and sampler in _BY_NAME:
        return _BY_NAME[sampler]()
    if not isinstance(sampler, Sampler) or type(sampler) is Sampler:
        raise ValueError(f"`sampler` must be one of {sorted(_BY_NAME)} or an "
                         f"inference.sampling sampler (NUTS(), HMC(), ChEES()), got "
                         f"{sampler!r}")
    return sampler
