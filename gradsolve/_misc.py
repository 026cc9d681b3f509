"""Small helpers shared by the drivers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _across_vmap(reduce, name: str, doc: str):
    """``reduce`` over all of ``x``'s axes and, under ``jax.vmap``, over the mapped axes too,
    returning an unmapped value (nested vmaps reduce at each level)."""

    @jax.custom_batching.custom_vmap
    def shared(x):
        return reduce(x)

    @shared.def_vmap
    def _rule(axis_size, in_batched, x):
        return shared(reduce(x, axis=0) if in_batched[0] else x), False

    shared.__name__ = shared.__qualname__ = name
    shared.__doc__ = doc
    return shared


shared_max = _across_vmap(jnp.max, "shared_max", """``jnp.max(x)``, and under ``jax.vmap`` the
    max over the mapped axis too (an unmapped scalar).

    The replay loops run to the longest trajectory's step count. Under ``vmap`` (a batch of
    meshes, e.g. NumPyro's vectorised chains) a per-member count would make the loop's
    predicate mapped, and a mapped ``while_loop`` selects between its old and new carry at
    every step: the node-state buffer, whose size is the mesh capacity, would be copied per
    step. One shared count keeps the loop and its ``cond`` skips unmapped; members past their
    own count take masked no-op steps, which every replay body already is past ``n_eff``.""")

shared_any = _across_vmap(jnp.any, "shared_any", """``jnp.any(x)``, and under ``jax.vmap`` any
    over the mapped axis too (an unmapped bool): keeps a ``lax.cond`` a branch (not a
    ``select`` of both) when its predicate depends on per-member data and its true branch
    is exact for every member (a masked update).""")


def tree_where(mask, new, old):
    """Per-trajectory select over pytrees whose leaves have leading (batch) axis like ``mask``."""

    def sel(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree_util.tree_map(sel, new, old)


def length_groups(n_eff, group_size: int):
    """``(group, ungroup, n_pad)`` for replaying trajectories in groups of similar length:
    ``group`` sorts them by ``n_eff`` into ``(groups, g, ...)`` (padded to ``n_pad`` by
    repeating the longest), ``ungroup`` maps ``(groups, g, ...)`` back to the original
    order. One group (no sort) when ``n <= group_size``."""
    n = n_eff.shape[0]
    if n <= group_size:
        return (lambda x: x[None]), (lambda x: x[0]), n
    n_groups = math.ceil(n / group_size)
    g = math.ceil(n / n_groups)
    n_pad = n_groups * g
    perm = jnp.argsort(n_eff, stable=True)
    perm = jnp.concatenate([perm, jnp.repeat(perm[-1:], n_pad - n)])
    inv = jnp.argsort(perm[:n])

    def group(x):
        return x[perm].reshape((n_groups, g) + x.shape[1:])

    def ungroup(x):
        return x.reshape((n_pad,) + x.shape[2:])[:n][inv]

    return group, ungroup, n_pad
