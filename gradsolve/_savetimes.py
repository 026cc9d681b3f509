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

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array, Bool, Float, Int
from ._sharding import host

_sg = jax.lax.stop_gradient
_COUNT_MAX_SLOTS = 64


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
    rec_ts = jnp.asarray(bm.ts).astype(ts.dtype)
    if np.any(host(pinned_moved(rec_ts, bm.t0, bm.t1, jnp.asarray(ts)))):
        raise ValueError(
            "gs.replay: `ts` moves a save time recorded at the mesh's t0 or t1; the ends of "
            "the recorded interval do not move. Re-record the mesh for these save times."
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

    ``s`` is a zero that carries derivatives (e.g. ``ts - stop_gradient(ts)``), so the value
    is ``y`` and the derivatives are the exact first and second derivatives ``y'``, ``y''``
    of the solution: gradients and Hessians w.r.t. times that cannot move a mesh node
    (pinned save times, duplicates, ``t0``, ``t1``) are right. Written as a ``custom_jvp``
    whose value is ``y``: ``f`` is evaluated only where ``s`` carries a tangent, so save
    times that are traced but not differentiated cost nothing here.
    """
    return _shifted(f, t, y, params, s)


def _expansion(f, t, y, params, s):
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


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _shifted(f, t, y, params, s):
    return y  # s is zero in value


def _shifted_jvp(f, primals, tangents):
    t, y, params, s = primals
    _, dy, _, ds = tangents
    if isinstance(ds, SymbolicZero):  # the times carry no derivative: y's own tangent
        return y, (jnp.zeros_like(y) if isinstance(dy, SymbolicZero) else dy)
    full = jax.tree_util.tree_map(
        lambda tan: np.zeros(tan.aval.shape, tan.aval.dtype) if isinstance(tan, SymbolicZero)
        else tan, tangents, is_leaf=lambda x: isinstance(x, SymbolicZero))
    # the tangent of the expansion itself, so that differentiating this rule again gives
    # the second-order term
    return y, jax.jvp(lambda *a: _expansion(f, *a), primals, tuple(full))[1]


_shifted.defjvp(_shifted_jvp, symbolic_zeros=True)


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
    """Per trajectory: does a moved save node (``subst``) pass a neighbouring node? The
    nodes are moved first (`node_times`), so a neighbour that is itself a moved save node is
    compared at its new time; costs ``O(n (S + k))``."""
    s1 = times.shape[1]
    rows = jnp.arange(times.shape[0])[:, None]
    subst = subst.astype(bool)
    moved, _ = node_times(times, save_index, tsave.astype(times.dtype), subst)
    left = moved[rows, jnp.clip(save_index - 1, 0, s1 - 1)]
    right = moved[rows, jnp.clip(save_index + 1, 0, s1 - 1)]
    return jnp.any(subst & ((tsave < left) | (tsave > right)), axis=1)


def pinned_moved(rec_ts, t0, t1, tsave) -> Bool[Array, " n"]:
    """Per trajectory: is a save time recorded at ``t0`` or ``t1`` given as another time?
    Those nodes are the interval's ends and never move (a save there takes the Taylor
    expansion's derivative only), so such a ``ts`` would read the end's state at a time
    it does not belong to."""
    pinned = (rec_ts <= t0) | (rec_ts >= t1)
    return jnp.any(pinned & (tsave.astype(rec_ts.dtype) != rec_ts), axis=1)


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
    if k <= _COUNT_MAX_SLOTS:
        # Save indices are sorted: the first slot of a node is the number of slots before
        # it (k^2 comparisons beat XLA's cumulative max on CPU for few save times).
        return jnp.sum(save_index[..., None, :] < save_index[..., :, None], axis=-1,
                       dtype=save_index.dtype)
    pos = jnp.broadcast_to(jnp.arange(k), save_index.shape)
    dup = jnp.concatenate(
        [jnp.zeros_like(save_index[:, :1], bool), save_index[:, 1:] == save_index[:, :-1]], axis=1
    )
    return jax.lax.cummax(jnp.where(dup, 0, pos), axis=1)
