"""How the Pallas kernels lay out an ensemble: trajectories on sublanes and lanes.

A TPU vector register holds ``(8, 128)`` 32-bit values; the kernels keep every state
component, parameter and node time of ``rows * 128`` trajectories as one ``(rows, 128)``
block, so each arithmetic operation of a Runge–Kutta step is ``rows / 8`` full-register
operations with no cross-lane traffic. Trajectory ``i`` sits at row ``i // 128``, lane
``i % 128`` of the whole array; block ``b`` of the grid owns rows ``[b * rows, (b + 1) *
rows)``. An ``(n, *rest)`` array becomes ``(*rest, n_rows, 128)`` (`to_lanes`), the ensemble
padded by repeating its last trajectory (finite values; padded trajectories replay no step).

32 rows per block was the fastest for a two-state system in the prototype (Lotka–Volterra,
Dopri5, float32): fewer rows leave the vector units idle between dependent operations,
more spill the stages out of the 64 vector registers.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LANES = 128
SUBLANES = 8


class Blocks(NamedTuple):
    """``n`` trajectories in ``n_blocks`` blocks of ``rows`` sublanes of 128 lanes."""

    n: int
    rows: int
    n_blocks: int

    @property
    def n_rows(self) -> int:
        return self.rows * self.n_blocks

    @property
    def n_pad(self) -> int:
        return self.n_rows * LANES


def blocks_for(n: int, rows: int = 32) -> Blocks:
    """The blocks for ``n`` trajectories: ``rows`` sublanes each (fewer, a multiple of 8,
    where the whole ensemble fits in less)."""
    need = max(1, math.ceil(n / LANES))
    rows = max(SUBLANES, min(rows, SUBLANES * math.ceil(need / SUBLANES)))
    return Blocks(n, rows, math.ceil(need / rows))


def to_lanes(x, blocks: Blocks, fill=None):
    """``(n, *rest) -> (*rest, n_rows, 128)``: the ensemble axis onto sublanes and lanes,
    padded with copies of the last trajectory (``fill``: with that value instead)."""
    pad = blocks.n_pad - x.shape[0]
    if pad:
        extra = (jnp.broadcast_to(x[-1:], (pad,) + x.shape[1:]) if fill is None
                 else jnp.full((pad,) + x.shape[1:], fill, x.dtype))
        x = jnp.concatenate([x, extra], axis=0)
    x = x.reshape((blocks.n_rows, LANES) + x.shape[1:])
    return jnp.moveaxis(jnp.moveaxis(x, 0, -1), 0, -1)


def from_lanes(x, blocks: Blocks):
    """``(*rest, n_rows, 128) -> (n, *rest)``: back to the ensemble axis first."""
    x = jnp.moveaxis(jnp.moveaxis(x, -1, 0), -1, 0)  # (n_rows, 128, *rest)
    return x.reshape((blocks.n_pad,) + x.shape[2:])[:blocks.n]


def pad_rows(x, multiple: int, axis: int = 0):
    """``x`` with ``axis`` padded (by repeating its last entry) to a multiple of
    ``multiple``."""
    size = x.shape[axis]
    pad = (-size) % multiple
    if not pad:
        return x
    last = jnp.take(x, jnp.array([size - 1]), axis=axis)
    reps = [1] * x.ndim
    reps[axis] = pad
    return jnp.concatenate([x, jnp.tile(last, reps)], axis=axis)


def loop(n, body, carry):
    """``body(i, carry)`` for ``i`` in ``[0, n)`` with an int32 counter (``n`` an int or an
    int32 scalar), the loop every kernel uses. ``lax.fori_loop`` counts in int64 when x64
    is enabled, which Mosaic cannot lower."""
    def step(c):
        i, x = c
        return i + np.int32(1), body(i, x)

    return jax.lax.while_loop(lambda c: c[0] < n, step, (np.int32(0), carry))[1]
