"""NaN outputs for failed trajectories, with NaN derivatives.

A failed trajectory's outputs are NaN. A plain ``jnp.where(failed, nan, y)`` would give
them a zero derivative (the NaN is a constant), so a loss built on them would be NaN while
its gradient said "stationary point". `nan_rows` makes the derivative NaN too, with
respect to every input of the failed row, and only where it is used:

- reverse mode: a failed row's inputs get a NaN cotangent when any cotangent reaching its
  outputs is non-zero (a loss that reads the row, e.g. a sum over the ensemble), and zero
  when none is (a loss that leaves the row out, by indexing or a ``jnp.where`` mask: the
  other rows' gradients stay finite);
- forward mode: a failed row's outputs get a NaN tangent when any tangent of its inputs
  is non-zero.

The rows of successful trajectories keep their values and derivatives unchanged. (The NaN
of a failed row's first derivative is a constant: its second derivatives, a Hessian's
block, are zero, not NaN; the value and gradient already say the row failed.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._linear import linear_apply


def nan_rows(failed, outputs, inputs):
    """``outputs`` with the rows where ``failed`` NaN, their derivatives NaN too.

    Args:
        failed: ``(n,)`` booleans.
        outputs: a tuple of floating arrays, each with leading axis ``n``.
        inputs: a pytree of what the outputs depend on: arrays with leading axis ``n``
            (one row per trajectory) or scalars (shared by every row, e.g. ``t0``);
            non-floating leaves are ignored.

    Returns:
        The tuple of outputs, NaN in the failed rows.
    """
    n = failed.shape[0]
    dtype = jnp.result_type(*outputs)
    cols = []
    for x in jax.tree_util.tree_leaves(inputs):
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            continue
        x = jnp.broadcast_to(x, (n,)) if x.ndim == 0 else x
        cols.append(jnp.reshape(x, (n, -1)).astype(dtype))
    rows = jnp.concatenate(cols, axis=1) if cols else jnp.zeros((n, 0), dtype)
    return tuple(_poison(failed, y, rows) for y in outputs)


def _row_mask(hit, like):
    return jnp.reshape(hit, hit.shape + (1,) * (like.ndim - 1))


@jax.custom_jvp
def _poison(failed, y, rows):
    """``y (n, ...)`` NaN in the rows ``failed (n,)``; ``rows (n, m)`` carries the failed
    rows' inputs (their values are not used, only their derivatives)."""
    return jnp.where(_row_mask(failed, y), jnp.nan, y)


@_poison.defjvp
def _poison_jvp(primals, tangents):
    failed, y, rows = primals
    _, dy, drows = tangents
    out = _poison(failed, y, rows)
    dy = jnp.where(_row_mask(failed, y), 0.0, dy)
    shape = jax.ShapeDtypeStruct(y.shape, y.dtype)
    in_shape = jax.ShapeDtypeStruct(rows.shape, rows.dtype)  # (no tracer in the closures)

    def spread(res, lin):
        # the failed rows whose input tangents are not all zero: NaN
        (failed,), (d,) = res, lin
        hit = failed & jnp.any(d != 0, axis=1)
        zero = jnp.zeros(shape.shape, shape.dtype)
        return (jnp.where(_row_mask(hit, zero), jnp.nan, zero),)

    def gather(res, ct):
        # the failed rows whose output cotangents are not all zero: NaN for their inputs
        (failed,), (c,) = res, ct
        hit = failed & jnp.any(jnp.reshape(c != 0, (c.shape[0], -1)), axis=1)
        zero = jnp.zeros(in_shape.shape, in_shape.dtype)
        return (jnp.where(hit[:, None], jnp.nan, zero),)

    (dnan,) = linear_apply(spread, gather, (failed,), (drows,), out_shapes=(shape,))
    return out, dy + dnan
