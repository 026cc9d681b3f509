"""Small helpers shared by the drivers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


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
