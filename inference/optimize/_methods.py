"""The one table from `inference.fit`'s ``method=`` names to optimiser objects.

Each entry says how to build the optimiser from `fit`'s arguments (`FitArgs`), which
keyword options of `fit` it takes beyond `fit`'s own, and whether it reads the Optax fit's
arguments (``rerecord``, ``callback``, ...) and ``checkpoint`` / ``max_time``. Adding an
optimiser is a file with its `AbstractOptimizer` subclass and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ._optimizer import AbstractOptimizer

__all__ = ["FitArgs", "Method", "METHODS", "OPTAX_ONLY", "method_names"]


class FitArgs(NamedTuple):
    """`inference.fit`'s arguments an optimiser is built from (``options``: the keyword
    options its entry takes, already checked)."""

    steps: int
    seed: int
    n_starts: int
    init: Any
    optimizer: Any
    max_time: float | None
    checkpoint: Any
    checkpoint_every: int
    optax: dict
    options: dict


class Method(NamedTuple):
    """One ``method=`` name: ``build(FitArgs) -> AbstractOptimizer``; ``options``: the
    keyword options of `fit` it takes; ``optax``: it reads the Optax fit's arguments
    (`OPTAX_ONLY`); ``checkpoint``, ``max_time``: it takes them."""

    build: Callable[[FitArgs], AbstractOptimizer]
    options: tuple[str, ...] = ()
    optax: bool = False
    checkpoint: bool = False
    max_time: bool = False


OPTAX_ONLY = ("optimizer", "callback", "rerecord", "drift_tol", "error_ratio_max",
              "record_tol_factor", "jacobian", "max_redraws")
"""`fit`'s arguments of the Optax fit, which the other optimisers do not read."""


def _optax(a: FitArgs) -> AbstractOptimizer:
    from .. import _checkpoint
    from ._optax import Optax

    # what a resumed fit must share with the saved one beyond the problem and optimiser
    tags = dict(seed=a.seed, n_starts=a.n_starts,
                init=_checkpoint.digest(None if a.init is None else dict(a.init)))
    return Optax(a.optimizer, a.steps, seed=a.seed, checkpoint=a.checkpoint,
                 checkpoint_every=a.checkpoint_every, checkpoint_tags=tags, **a.optax)


def _lm(a: FitArgs) -> AbstractOptimizer:
    from ._lm import LevenbergMarquardt

    return LevenbergMarquardt(a.steps)


def _lbfgs(a: FitArgs) -> AbstractOptimizer:
    from ._scipy import LBFGSB

    return LBFGSB(a.steps)


def _bfgs(a: FitArgs) -> AbstractOptimizer:
    from ._scipy import BFGS

    return BFGS(a.steps)


def _global(a: FitArgs) -> AbstractOptimizer:
    from ._global import GlobalSearch

    local = a.options.get("local", "auto")
    if local not in ("auto", "lm", "lbfgs"):
        raise ValueError(f"`local` must be 'auto', 'lm' or 'lbfgs', got {local!r}")
    # `max_generations` is another name for `steps` here; with a time limit the
    # generations are unlimited unless the user counts them (1000: `steps`' default)
    gens = a.options.get("max_generations")
    if gens is None:
        gens = None if a.steps == 1000 else a.steps
    elif a.steps not in (1000, gens):
        raise ValueError(f"`steps`={a.steps!r} and `max_generations`={gens!r}: both count "
                         "the global search's generations; pass one")
    elif not isinstance(gens, (int, np.integer)) or isinstance(gens, bool) or gens < 1:
        raise ValueError(f"`max_generations` must be an int >= 1, got {gens!r}")
    return GlobalSearch(seed=a.seed, max_time=a.max_time, max_iter=gens,
                        local=None if local == "auto" else METHODS[local].build(
                            a._replace(steps=1000)),
                        checkpoint=a.checkpoint, checkpoint_every=a.checkpoint_every)


METHODS: dict[str, Method] = {
    "optax": Method(_optax, optax=True, checkpoint=True),
    "lm": Method(_lm),
    "lbfgs": Method(_lbfgs),
    "bfgs": Method(_bfgs),
    "global": Method(_global, options=("max_generations", "local"), checkpoint=True,
                     max_time=True),
}
"""``method=`` name -> `Method` (``"auto"`` is the problem's own choice)."""


def method_names() -> str:
    """The names ``method=`` takes, for messages: ``'auto', 'optax', 'lm', ...``."""
    return ", ".join(repr(m) for m in ("auto", *METHODS))
