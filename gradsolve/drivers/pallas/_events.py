"""Known-time events in the Pallas replay and its adjoint: jumps and tstops as per-lane node
indices (`gradsolve._events.ReplayEvents`, the form every replay driver gets).

Semantics are the lanes replay's (`gradsolve.drivers.lanes`), in the same arithmetic: after
the step into a jump's node the state jumps (a save at that node reads the state before
it), and after a jump or tstop node an FSAL solver's carried first stage is recomputed at
the node. The kernels apply a node's events at the start of the step out of it (the state
written to the node rows is the one before the jump; the jumps at the final node are added
after the last step), which is the same sequence of operations.

Inside a kernel a lane's jumps are ``J`` blocks of node indices and ``J * d`` blocks of
sizes, its reset nodes ``R`` blocks (jumps and tstops). A step compares its node with them
only within reach of the event: per block and per event the smallest and largest node over
its lanes are prefetched scalars (`event_spans`), so steps outside every event's span pay a
few scalar comparisons, and the stage is re-evaluated (one field evaluation more) only at
steps inside a reset's span. (Lanes of a block whose schedules are alike but whose meshes
differ reach an event at different nodes: the span is the range of those nodes.)

Node times are moved to the jump times by comparisons (`event_nodes`), not by the scatter
of `gradsolve._events.jump_node_times` (slow on a TPU); the values are equal.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from ..lanes import LaneArray
from ._layout import Blocks, loop, to_lanes

_NONE = np.int32(2**30)  # a span's low end where no lane of the block has the event


def event_nodes(nodes, ev):
    """`gradsolve._events.jump_node_times` by comparison: ``nodes (n, S1)`` with each live
    jump's node, and its free landing node, at its jump time."""
    m = jnp.arange(nodes.shape[1])[None, :, None]
    live = ev.jump_index > 0
    hit = (((ev.jump_index[:, None, :] == m) & live[:, None, :])
           | (ev.land_index[:, None, :] == m))                              # (n, S1, J)
    jt = jnp.where(live, ev.jump_times, 0.0).astype(nodes.dtype)
    new = jnp.sum(jnp.where(hit, jt[:, None, :], 0.0), axis=2)
    return jnp.where(jnp.any(hit, axis=2), new, nodes)


class LaneEvents(NamedTuple):
    """A replay's events on lanes: ``jump_index (J, R, 128)``, ``jump_sizes (J, d, R,
    128)``, ``reset_index (Rr, R, 128)`` (int32 node indices, ``0``: none), each count at
    least one (padded with inert entries), and the flat per-block ``spans``."""

    jump_index: jax.Array
    jump_sizes: jax.Array
    reset_index: jax.Array
    spans: jax.Array


def _at_least_one(x, axis: int = 1):
    if x.shape[axis]:
        return x
    shape = list(x.shape)
    shape[axis] = 1
    return jnp.zeros(shape, x.dtype)


def lane_events(ev, blocks: Blocks, dtype) -> LaneEvents:
    """``ev`` (`gradsolve._events.ReplayEvents`, batched) on lanes, with its spans."""
    jidx = to_lanes(_at_least_one(ev.jump_index.astype(jnp.int32)), blocks, fill=0)
    js = to_lanes(_at_least_one(ev.jump_sizes.astype(dtype)), blocks, fill=0)
    ridx = to_lanes(_at_least_one(ev.reset_index.astype(jnp.int32)), blocks, fill=0)
    return LaneEvents(jidx, js, ridx, event_spans(jidx, ridx, blocks))


def event_spans(jidx, ridx, blocks: Blocks):
    """Per block, for each jump and then each reset node: the smallest and largest node
    over its lanes that have it (``(2**30, -1)`` where none does), flat
    ``(blocks * (J + R) * 2,)`` int32."""
    nb = blocks.n_blocks
    idx = jnp.concatenate([jidx, ridx], axis=0)
    idx = idx.reshape(idx.shape[0], nb, -1)
    live = idx > 0
    lo = jnp.min(jnp.where(live, idx, _NONE), axis=2)
    hi = jnp.max(jnp.where(live, idx, -1), axis=2)
    return jnp.swapaxes(jnp.stack([lo, hi], axis=-1), 0, 1).reshape(-1).astype(jnp.int32)


class KernelEvents:
    """The event refs of one kernel invocation (block ``b``): ``J`` jumps and ``R`` reset
    nodes per lane, their prefetched spans."""

    def __init__(self, span_ref, jidx_ref, js_ref, ridx_ref, b, n_jumps: int, n_resets: int):
        self.span_ref, self.jidx_ref, self.js_ref = span_ref, jidx_ref, js_ref
        self.ridx_ref = ridx_ref
        self.b, self.J, self.R = b, n_jumps, n_resets

    def _in_reach(self, q, node):
        """A scalar: is ``node`` inside the span of event ``q`` (a jump for ``q < J``, else
        reset ``q - J``) over the block's lanes?"""
        at = (self.b * (self.J + self.R) + q) * 2
        return (self.span_ref[at] <= node) & (self.span_ref[at + 1] >= node)

    def jumped(self, y: LaneArray, node, live, guarded: bool = True) -> LaneArray:
        """``y`` after the jumps at ``node`` on ``live`` lanes (one jump per node, so
        ``y + size`` is the lanes replay's ``y + sum``)."""
        def one(jj, y):
            def add(y):
                hit = (self.jidx_ref[jj] == node) & live
                return LaneArray(jnp.where(hit, r + self.js_ref[jj, q], r)
                                 for q, r in enumerate(y.rows))

            if not guarded:
                return add(y)
            return jax.lax.cond(self._in_reach(jj, node), add, lambda y: y, y)

        return loop(self.J, one, y)

    def resets_near(self, node):
        """A scalar: does some lane of the block reset at ``node``?"""
        near = lambda q, acc: acc | self._in_reach(self.J + q, node).astype(jnp.int32)
        return loop(self.R, near, np.int32(0)) > 0

    def reset(self, node, like):
        """A bool block of ``like``'s shape: is ``node`` one of the lane's reset nodes (a
        jump or tstop node; padding entries are node 0, as in the lanes replay)."""
        hits = loop(self.R, lambda q, acc: jnp.where(self.ridx_ref[q] == node, 1, acc),
                    jnp.zeros(like.shape, jnp.int32))
        return hits > 0

    def restart(self, solver, field, st, t, y: LaneArray, p, node, live):
        """The carried stage recomputed at ``(t, y)`` on ``live`` lanes resetting at
        ``node``; the field is evaluated only where some lane of the block resets there."""
        def fresh(st):
            hit = self.reset(node, t) & live
            new = solver.init(field, t, y, p)
            return LaneArray(jnp.where(hit, a, b) for a, b in zip(new.rows, st.rows))

        return jax.lax.cond(self.resets_near(node), fresh, lambda st: st, st)

    def take_cotangents(self, ct_ref, lam: LaneArray, node, live) -> None:
        """The jump sizes' cotangents: a jump at ``node`` takes ``lam``, the cotangent of
        the state after it."""
        def one(jj, _):
            @pl.when(self._in_reach(jj, node))
            def _take():
                hit = (self.jidx_ref[jj] == node) & live
                for q, row in enumerate(lam.rows):
                    ct_ref[jj, q] = jnp.where(hit, row, ct_ref[jj, q])

            return _

        loop(self.J, one, None)
