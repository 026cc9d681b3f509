"""Per-trajectory parameters as flat rows, and hashable cache keys.

The hand-written adjoints (`gradsolve.drivers._adjoint`) and the drivers that run them (the
compiled kernel, the lanes replay) take every trajectory's parameters as one flat ``(P,)``
row of the state dtype; these helpers make and undo those rows. They sit below both, so
neither imports the other for them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def flatten_spec(params):
    """Leaves, treedef, per-trajectory leaf shapes and dtypes of batched ``params``."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    shapes = tuple(tuple(leaf.shape[1:]) for leaf in leaves)
    dtypes = tuple(jnp.result_type(leaf) for leaf in leaves)
    return leaves, treedef, shapes, dtypes


def flat_params(leaves, n: int, dtype):
    """Per-trajectory parameters as one ``(n, P)`` matrix of the state dtype."""
    if not leaves:
        return jnp.zeros((n, 0), dtype)
    return jnp.concatenate([leaf.reshape(n, -1).astype(dtype) for leaf in leaves], axis=1)


def per_trajectory(values, n: int, dtype):
    """Scalars (or a vector) repeated as one ``(n, len(values))`` row per trajectory: every
    kernel operand leads with the ensemble axis, so it shards and vmaps like the others."""
    row = jnp.stack([jnp.asarray(v, dtype) for v in values])
    return jnp.broadcast_to(row, (n,) + row.shape)


def unflatten_one(pflat, treedef, shapes, dtypes):
    """One trajectory's parameter pytree from its flat ``(P,)`` row."""
    out, i = [], 0
    for shape, dt in zip(shapes, dtypes):
        size = int(np.prod(shape))
        out.append(pflat[i:i + size].reshape(shape).astype(dt))
        i += size
    return jax.tree_util.tree_unflatten(treedef, out)


def cache_key(*parts):
    """``parts`` as a dict key, or ``None`` where one is unhashable (e.g. a vector field
    that is an unhashable callable object)."""
    try:
        hash(parts)
    except TypeError:
        return None
    return parts


def flat_field(f, treedef, shapes, dtypes):
    """``(f_flat, P)``: ``f`` taking one trajectory's parameters as a flat ``(P,)`` row."""
    p_size = int(sum(int(np.prod(s)) for s in shapes))

    def f_flat(t, y, pflat):
        return f(t, y, unflatten_one(pflat, treedef, shapes, dtypes))

    return f_flat, p_size
