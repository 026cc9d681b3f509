"""The kernels under ``jax.vmap``: the mapped axis folded into the ensemble.

``jax.vmap`` of a ``pallas_call`` adds a grid axis: each of ``C`` mapped calls lays out
its own ``n`` trajectories, padded to a whole ``(8, 128)`` tile (1,024 lanes), so ``C``
small ensembles (a population model's subjects, under a sampler's ``vmap`` over chains)
take ``C`` tiles of node times and node states where ``C * n`` trajectories fill
``ceil(C * n / 1024)``. Every kernel treats its lanes independently (per-lane step counts,
masks and meshes; a block only waits for its slowest lane), so the calls here reshape the
mapped inputs ``(C, n, ...) -> (C * n, ...)``, run one call on ``C * n`` trajectories and
reshape back: the same values, padded once.

`fold_vmap` does this for a function whose inputs and outputs all have the trajectory axis
first: the record's kernel call, and the replay's forward and adjoint calls (whose
residual, the node states, crosses from one to the other trajectory first, ``(n, S * d)``,
for this reason: a residual in the kernels' lanes layout has no per-call axis to split
back, and ``vmap`` must hand each call a residual of its unmapped shape).

Mapped inputs are folded; unmapped ones (a mesh shared by the chains, fixed save times)
are broadcast first, so any mix of mapped and unmapped arguments folds. Nested ``vmap``s
fold once per level (the rules call the folded function again).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap


def _fold(x, batched: bool, size: int):
    """``(C, n, ...) -> (C * n, ...)``; an unmapped ``(n, ...)`` broadcast to ``C`` first."""
    if not batched:
        x = jnp.broadcast_to(x, (size,) + x.shape)
    return x.reshape((size * x.shape[1],) + x.shape[2:])


def _unfold(y, size: int):
    """``(C * n, ...) -> (C, n, ...)``."""
    return y.reshape((size, y.shape[0] // size) + y.shape[1:])


def _fold_args(args, in_batched, size: int):
    return jax.tree_util.tree_map(lambda x, b: _fold(x, b, size), list(args), list(in_batched))


def fold_vmap(fn):
    """``fn`` (arrays with the trajectory axis first in, the same out), whose ``jax.vmap``
    folds the mapped axis into the trajectories: one call on ``C * n`` of them."""
    folded = custom_vmap(fn)

    def rule(size, in_batched, *args):
        outs = folded(*_fold_args(args, in_batched, size))
        outs = jax.tree_util.tree_map(lambda y: _unfold(y, size), outs)
        return outs, jax.tree_util.tree_map(lambda _: True, outs)

    folded.def_vmap(rule)
    return folded
