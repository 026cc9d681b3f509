"""Save times on a recorded mesh: which node each save slot owns, moving nodes to new
save times, checking that a move keeps the nodes in order, and the Taylor terms that
differentiate save times which cannot move a node.

Save times are forced mesh nodes (`gradsolve.record` lands a step on each). A replay at
new ``ts`` moves each interior save time's node to it (so ``d ys / d ts = f``, to the
solver's accuracy); equal save times share one node, moved by the first of them; save
times equal to ``t0`` or ``t1`` stay pinned and take the solution's Taylor expansion.
Every replay driver replays the node times these functions produce.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int
from ._sharding import host

_sg = jax.lax.stop_gradient


def check_moved_ts(bm, ts) -> None:
    """On concrete save times: `_replay_core`'s on-device checks of moved save times, as
    errors (under ``jit`` with traced ``ts`` the replay flags them per trajectory instead)."""
    idx = host(bm.save_index)
    ts_host = host(ts)
    shared = idx[:, 1:] == idx[:, :-1]
    if np.any(shared & (ts_host[:, 1:] != ts_host[:, :-1])):
        raise ValueError(
            "gs.replay: `ts` separates save times that were equal when the mesh was recorded "
            "(they share one mesh point); re-record the mesh for these save times."
        )
    subst = save_roles(bm.ts, bm.t0, bm.t1, bm.save_index)[3]
    times = jnp.asarray(bm.times).astype(ts.dtype)
    if np.any(host(moved_out_of_order(times, bm.save_index, jnp.asarray(ts), subst))):
        raise ValueError(
            "gs.replay: `ts` moved past neighbouring mesh points; re-record the mesh for "
            "these save times."
        )


def taylor2(f, t, y, params, s):
    """``y + s f(t, y) + s^2/2 (f_t + J f)(t, y)``: the solution through ``(t, y)`` moved
    by ``s``, to second order, for one trajectory (``t (k,)``, ``y (k, d)``, ``s (k,)``).

    With ``s`` a zero that carries derivatives (e.g. ``ts - stop_gradient(ts)``) it adds
    nothing to the value and gives the exact first and second derivatives ``y'``, ``y''``
    of the solution, so gradients and Hessians w.r.t. times that cannot move a mesh node
    (pinned save times, duplicates, ``t0``, ``t1``) are right.
    """
    def one(t, y, s):
        fy = f(t, y, params)
        # y'' enters as a value only (its own derivatives would be third order), so it is
        # evaluated on stopped inputs: a Jacobian that is not finite at the node (sqrt at
        # 0) then cannot turn a zero cotangent into NaN.
        ts_, ys_, ps_ = _sg(t), _sg(y), jax.tree_util.tree_map(_sg, params)
        g = lambda t, y: f(t, y, ps_)
        _, fdot = jax.jvp(g, (ts_, ys_), (jnp.ones_like(ts_), g(ts_, ys_)))
        fy = jnp.where(jnp.isfinite(fy), fy, 0.0)
        fdot = jnp.where(jnp.isfinite(fdot), fdot, 0.0)
        return y + s * fy + 0.5 * s * s * fdot

    return jax.vmap(one)(t, y, s)


def node_times(times: Float[Array, "n S1"], save_index: Int[Array, "n k"], tsave, subst):
    """Mesh node times with the nodes of moved save slots (``subst``) at ``tsave``, and which
    slots own their node (equal save times share one node; only the first moves it)."""
    rows = jnp.arange(times.shape[0])[:, None]
    current = times[rows, save_index]
    dup = save_groups(save_index) != jnp.arange(save_index.shape[1])
    subst = subst.astype(bool)
    slot = jnp.where(dup, times.shape[1], save_index)  # no colliding scatter
    nodes = times.at[rows, slot].set(jnp.where(subst, tsave, current), mode="drop")
    return nodes, subst & ~dup


def moved_out_of_order(times, save_index, tsave, subst) -> Bool[Array, " n"]:
    """Per trajectory: does a moved save node (``subst``) pass a neighbouring node? Reads
    only the neighbours of the ``k`` save nodes (a neighbour is itself moved when the save
    time owning it moved), so it costs ``O(n k)``, not ``O(n S)``."""
    s1, k = times.shape[1], save_index.shape[1]
    rows = jnp.arange(times.shape[0])[:, None]
    subst = subst.astype(bool)
    owner = save_groups(save_index)  # first slot of each group of equal save times
    search = jax.vmap(lambda a, side: jnp.searchsorted(a, a, side=side), in_axes=(0, None))

    def neighbour(shift, slot):
        idx = jnp.clip(save_index + shift, 0, s1 - 1)
        slot = jnp.clip(slot, 0, k - 1)
        first = owner[rows, slot]
        moved = subst[rows, first] & (save_index[rows, first] == save_index + shift)
        return jnp.where(moved, tsave[rows, first], times[rows, idx])

    left = neighbour(-1, search(save_index, "left") - 1)   # last slot of the previous node
    right = neighbour(1, search(save_index, "right"))      # first slot of the next node
    return jnp.any(subst & ((tsave < left) | (tsave > right)), axis=1)


def save_roles(rec_ts, t0, t1, save_index):
    """``(first, dup, interior, moving)`` per save slot: the first slot sharing its node,
    whether it is a later one of equal save times, whether it lies strictly inside
    ``(t0, t1)``, and whether a given ``ts`` moves its node (interior, not a duplicate)."""
    first = save_groups(save_index)
    dup = first != jnp.arange(first.shape[1])
    interior = (rec_ts > t0) & (rec_ts < t1)
    return first, dup, interior, interior & ~dup


def save_groups(save_index: Int[Array, "n k"]) -> Int[Array, "n k"]:
    """For each save time, the position of the first save time sharing its mesh node
    (equal save times are recorded as one node)."""
    k = save_index.shape[-1]
    pos = jnp.broadcast_to(jnp.arange(k), save_index.shape)
    dup = jnp.concatenate(
        [jnp.zeros_like(save_index[:, :1], bool), save_index[:, 1:] == save_index[:, :-1]], axis=1
    )
    return jax.lax.cummax(jnp.where(dup, 0, pos), axis=1)
