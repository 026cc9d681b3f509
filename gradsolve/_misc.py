"""Small helpers shared by the drivers."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def tree_where(mask, new, old):
    """Per-trajectory select over pytrees whose leaves have leading (batch) axis like ``mask``."""

    def sel(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree_util.tree_map(sel, new, old)
