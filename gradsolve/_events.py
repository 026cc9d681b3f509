"""Known-time events: additive state jumps (``jumps=(times, sizes)``, a bolus
dose) and discontinuities of ``f`` (``tstops=``), their validation, and their place on a
recorded mesh.

Semantics (the same in every call that takes them):

- Every jump gets a mesh node of its own. The record lands a step on the jump time (as on a
  save time), then adds a node at the same time (a zero-length step) where ``y`` jumps:
  ``y(tau+) = y(tau-) + size``. So a save time equal to a jump time reads the state
  *before* the jump (the pre-dose trough: an observation listed before a dose at the same
  time, as NONMEM and Torsten order them), and a jump at ``t0`` applies to the initial
  state, after a save time at ``t0`` has read ``y0``. Equal jump times are applied one
  after the other (each its own node; their sum is what counts). ``Solution.y1`` is the
  state after every jump in ``[t0, t1]``, one at ``t1`` included.
- After a jump node or a tstop node the solver's carried state (the first-same-as-last
  stage) is recomputed at the new state and the node's exact time, in the record and
  identically in the replay (as Diffrax does after ``jump_ts``).
- In a replay the jump's node (and the landing node before it, unless that node also holds
  a save time, a tstop, another jump or ``t0``) moves to the given jump time, so the
  gradient w.r.t. a jump time is the exact discrete adjoint of the replayed steps, as for
  a moved save time. A jump time moved past a neighbouring node is invalid (re-record).
- Ragged schedules: ``times`` padded with ``+inf`` at the end of a row; a padded jump is
  inert (its size, even NaN, is ignored and gets a zero gradient).
- tstops are forced nodes the record never steps across; they carry no gradient (they are
  kept in the mesh, a replay uses the recorded ones).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._checks import is_concrete
from ._misc import shared_any, tree_where
from ._savetimes import node_times, pinned_moved, save_roles
from ._sharding import host

_sg = jax.lax.stop_gradient


class Events(NamedTuple):
    """Validated, batched known-time events.

    Attributes:
        jump_times: ``(n, J)`` sorted per row, ``+inf`` padding at the end.
        jump_sizes: ``(n, J, d)``; zero where the time is ``+inf``.
        tstops: ``(n, L)`` sorted per row, ``+inf`` padding at the end.
    """

    jump_times: Float[Array, "n J"]
    jump_sizes: Float[Array, "n J d"]
    tstops: Float[Array, "n L"]

    @property
    def n_jumps(self) -> int:
        return self.jump_times.shape[1]


def empty_events(n: int, d: int, dtype) -> Events:
    """No events: zero-width arrays (what a mesh recorded without events holds)."""
    return Events(jnp.zeros((n, 0), dtype), jnp.zeros((n, 0, d), dtype), jnp.zeros((n, 0), dtype))


def _times(name: str, x, n: int, single: bool, dtype, where: str):
    try:
        x = jnp.asarray(x, dtype)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {name} must be an array of times, got {type(x).__name__}.") from e
    if single and x.ndim != 1:
        raise ValueError(f"{where}: {name} must have shape (J,) for one trajectory, got {x.shape}.")
    if x.ndim == 1:
        return jnp.broadcast_to(x, (n,) + x.shape), False
    if x.ndim != 2 or x.shape[0] != n:
        raise ValueError(f"{where}: {name} must have shape (J,) or (n, J) with n={n}, got {x.shape}.")
    return x, True


def _check_times_host(name: str, tv: np.ndarray, t0: float, t1: float, per_row: bool,
                      where: str) -> None:
    """Sorted (``+inf`` padding at the end), no NaN or ``-inf``, finite ones in ``[t0, t1]``."""
    def fail(row, what):
        who = f"{name} of trajectory {row}" if per_row else name
        raise ValueError(f"{where}: {who} {what}.")

    for what, bad in (
        ("contain NaN or -inf", np.isnan(tv) | (tv == -np.inf)),
        (f"must lie inside [t0, t1] = [{t0}, {t1}] (+inf pads ragged schedules)",
         np.isfinite(tv) & ((tv < t0) | (tv > t1))),
        ("must be sorted (non-decreasing; +inf padding only at the end)",
         np.concatenate([np.zeros_like(tv[:, :1], bool), tv[:, 1:] < tv[:, :-1]], axis=1)),
    ):
        rows = np.flatnonzero(bad.any(axis=1))
        if rows.size:
            fail(int(rows[0]), what)


def batch_events(jumps, tstops, t0, t1, n: int, d: int, single: bool, dtype,
                 where: str) -> Events | None:
    """Validate ``jumps=(times, sizes)`` and ``tstops`` and batch them (see `Events`);
    ``None`` when both are ``None``. Concrete values are checked here (``ValueError`` naming
    the argument and, for per-trajectory input, the trajectory); traced ones on device
    (`runtime_event_checks`)."""
    if jumps is None and tstops is None:
        return None
    if jumps is None:
        jt, js = jnp.zeros((n, 0), dtype), jnp.zeros((n, 0, d), dtype)
        jt_rows = js_rows = False
    else:
        if not (isinstance(jumps, (tuple, list)) and len(jumps) == 2):
            raise ValueError(
                f"{where}: `jumps` must be a pair (times, sizes), times (J,) or (n, J) and "
                f"sizes (J, d) or (n, J, d); got {type(jumps).__name__}."
            )
        jt, jt_rows = _times("`jumps` times", jumps[0], n, single, dtype, where)
        J = jt.shape[1]
        js_rows = jnp.ndim(jumps[1]) == 3
        try:
            js = jnp.asarray(jumps[1], dtype)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: `jumps` sizes must be an array, got "
                             f"{type(jumps[1]).__name__}.") from e
        want = f"({J}, {d})" + ("" if single else f" or ({n}, {J}, {d})")
        if js.ndim == 2 and js.shape == (J, d):
            js = jnp.broadcast_to(js, (n, J, d))
        elif single or js.shape != (n, J, d):
            raise ValueError(
                f"{where}: `jumps` sizes must have shape {want} (one size vector per jump "
                f"time, d={d} states), got {js.shape}."
            )
    if tstops is None:
        ts_, ts_rows = jnp.zeros((n, 0), dtype), False
    else:
        ts_, ts_rows = _times("`tstops`", tstops, n, single, dtype, where)
    if is_concrete(jt, ts_, t0, t1):
        t0v, t1v = float(t0), float(t1)
        _check_times_host("`jumps` times", host(jt), t0v, t1v, jt_rows, where)
        _check_times_host("`tstops`", host(ts_), t0v, t1v, ts_rows, where)
    live = jnp.isfinite(jt)
    if is_concrete(js, jt):
        sv = host(js)
        # on the host: under jit, jnp operations on concrete inputs give tracers
        bad = (~np.isfinite(sv)).any(axis=2) & np.isfinite(host(jt))
        rows = np.flatnonzero(bad.any(axis=1))
        if rows.size:
            who = (f"`jumps` sizes of trajectory {int(rows[0])}" if js_rows or jt_rows
                   else "`jumps` sizes")
            raise ValueError(f"{where}: {who} must be finite (at finite jump times).")
    js = jnp.where(live[..., None], js, 0.0)
    return Events(jt, js, ts_)


def runtime_event_checks(ev: Events, t0, t1) -> tuple[dict, Events]:
    """On-device checks of traced events (under ``jit``/``vmap``): ``(failed, events)``,
    ``failed`` message -> ``(n,)`` bool as in `gradsolve._record.runtime_checks`; the
    returned events are inert (``+inf`` times, zero sizes) on failed rows."""
    failed = {}
    if is_concrete(ev, t0, t1):
        return failed, ev
    for name, tv in (("`jumps` times", ev.jump_times), ("`tstops`", ev.tstops)):
        if tv.shape[1] == 0:
            continue
        failed[f"{name} must not contain NaN or -inf"] = jnp.any(
            jnp.isnan(tv) | (tv == -jnp.inf), axis=1)
        failed[f"{name} must be sorted (+inf padding only at the end)"] = jnp.any(
            tv[:, 1:] < tv[:, :-1], axis=1)
        failed[f"{name} must lie inside [t0, t1]"] = jnp.any(
            jnp.isfinite(tv) & ((tv < t0) | (tv > t1)), axis=1)
    if ev.n_jumps:
        live = jnp.isfinite(ev.jump_times)
        failed["`jumps` sizes must be finite"] = jnp.any(
            live[..., None] & ~jnp.isfinite(ev.jump_sizes), axis=(1, 2))
    bad = jnp.zeros(ev.jump_times.shape[:1], bool)
    for b in failed.values():
        bad = bad | b
    ev = Events(jnp.where(bad[:, None], jnp.inf, ev.jump_times),
                jnp.where(bad[:, None, None], 0.0, ev.jump_sizes),
                jnp.where(bad[:, None], jnp.inf, ev.tstops))
    return failed, ev


class ReplayEvents(NamedTuple):
    """The events a replay driver applies (batched; only ``jump_times`` and ``jump_sizes``
    carry gradients).

    Attributes:
        jump_index: ``(n, J)`` node of each jump (``0``: inert; jump nodes are never 0).
        land_index: ``(n, J)`` the landing node that moves with the jump (the node before
            its own at the same recorded time, when nothing else sits there); ``-1``: none.
        jump_times: ``(n, J)`` the jumps' times; their nodes move there.
        jump_sizes: ``(n, J, d)`` added to the state at the jump's node.
        reset_index: ``(n, J + L)`` nodes after which the solver's carried state is
            recomputed (jump and tstop nodes; ``0``: none).
    """

    jump_index: Int[Array, "n J"]
    land_index: Int[Array, "n J"]
    jump_times: Float[Array, "n J"]
    jump_sizes: Float[Array, "n J d"]
    reset_index: Int[Array, "n R"]


def replay_events(bm, times, jump_times, jump_sizes) -> ReplayEvents:
    """`ReplayEvents` of a batched mesh ``bm`` with node ``times`` for the given jumps."""
    rows = jnp.arange(times.shape[0])[:, None]
    jidx = bm.jump_index
    land = jidx - 1
    rec = _sg(bm.jump_times).astype(times.dtype)
    at = times[rows, jnp.clip(land, 0, times.shape[1] - 1)]
    taken = jnp.concatenate([bm.save_index, bm.tstop_index, jidx], axis=1)
    shared = jnp.any(land[..., None] == taken[:, None, :], axis=-1)
    free = (jidx > 0) & (land >= 1) & (at == rec) & ~shared
    land = jnp.where(free, land, -1)
    reset = jnp.concatenate([jidx, bm.tstop_index], axis=1)
    return ReplayEvents(jidx.astype(jnp.int32), land.astype(jnp.int32), jump_times, jump_sizes,
                        reset.astype(jnp.int32))


def jump_node_times(times: Float[Array, "n S1"], ev: ReplayEvents):
    """Node ``times`` with each live jump's node (and its free landing node) at its jump
    time, differentiably."""
    rows = jnp.arange(times.shape[0])[:, None]
    s1 = times.shape[1]
    live = ev.jump_index > 0
    jt = jnp.where(live, ev.jump_times, 0.0)
    times = times.at[rows, jnp.where(live, ev.jump_index, s1)].set(jt, mode="drop")
    times = times.at[rows, jnp.where(ev.land_index >= 0, ev.land_index, s1)].set(jt, mode="drop")
    return times


def nodes_out_of_order(nodes: Float[Array, "n S1"], n_steps, t0, t1, ev: ReplayEvents):
    """Per trajectory: are the (moved) nodes out of order within ``[0, n_steps]``, or a
    live jump time outside ``[t0, t1]``? ``O(n S)``, done only when events are present."""
    slot = jnp.arange(1, nodes.shape[1])[None]
    down = (nodes[:, 1:] < nodes[:, :-1]) & (slot <= n_steps[:, None])
    live = ev.jump_index > 0
    out = live & ((ev.jump_times < t0) | (ev.jump_times > t1) | ~jnp.isfinite(ev.jump_times))
    return jnp.any(down, axis=1) | jnp.any(out, axis=1)


def apply_jumps(y, node, active, jump_index, jump_sizes):
    """``y (g, d)`` after the jumps at ``node`` (a scalar step index + 1) for ``active``
    rows: one jump per node, so the sum adds exact zeros besides it."""
    hit = (jump_index == node) & active[:, None]
    add = jnp.sum(jnp.where(hit[..., None], jump_sizes, 0.0), axis=1)
    return jnp.where(jnp.any(hit, axis=1)[:, None], y + add, y)


def reset_state(solver, f, t, y, params, st, mask):
    """The carried solver state recomputed at ``(t, y)`` on rows ``mask`` (``(g,)``), via
    ``lax.cond`` so a step with no event pays nothing; solvers that carry no state skip."""
    if not jax.tree_util.tree_leaves(st):
        return st
    fresh = lambda: tree_where(mask, jax.vmap(lambda t, y, p: solver.init(f, t, y, p))(
        t, y, params), st)
    return jax.lax.cond(shared_any(mask), fresh, lambda: st)


def events_out_of_order(bm, times, tsave, subst, events, t0, t1, jumps):
    """Per trajectory, on a mesh with events: do the moved nodes (save times, jump times)
    leave the nodes out of order, or a jump time outside ``[t0, t1]``, or its ``+inf``
    padding where the mesh has a jump (or the other way round)?"""
    nodes = node_times(times, bm.save_index, _sg(tsave), subst)[0]
    ev = events._replace(jump_times=_sg(events.jump_times))
    nodes = jump_node_times(nodes, ev)
    bad = nodes_out_of_order(nodes, bm.n_steps, t0, t1, ev)
    if jumps is not None:
        given = jnp.isfinite(_sg(jumps[0]))
        bad = bad | jnp.any(given != jnp.isfinite(bm.jump_times), axis=1)
    return bad


def check_moved_events(bm, ts, events) -> None:
    """On concrete inputs: `events_out_of_order` as a ``ValueError`` (a mesh with events,
    given new save times or jumps)."""
    dtype = bm.times.dtype if events is None else events.jump_times.dtype
    times = jnp.asarray(bm.times).astype(dtype)
    rec_ts = jnp.asarray(bm.ts).astype(dtype)
    moving = save_roles(rec_ts, jnp.asarray(bm.t0, dtype), jnp.asarray(bm.t1, dtype),
                        bm.save_index)[3]
    subst = moving if ts is not None else jnp.zeros(rec_ts.shape, bool)
    tsave = ts if ts is not None else rec_ts
    if ts is not None:
        idx, ts_host = host(bm.save_index), host(ts)
        shared = idx[:, 1:] == idx[:, :-1]
        if np.any(shared & (ts_host[:, 1:] != ts_host[:, :-1])):
            raise ValueError(
                "gs.replay: `ts` separates save times that were equal when the mesh was "
                "recorded (they share one mesh point); re-record the mesh for these save times."
            )
        if np.any(host(pinned_moved(rec_ts, jnp.asarray(bm.t0, dtype),
                                    jnp.asarray(bm.t1, dtype), jnp.asarray(ts, dtype)))):
            raise ValueError(
                "gs.replay: `ts` moves a save time recorded at the mesh's t0 or t1; the ends "
                "of the recorded interval do not move. Re-record the mesh for these save "
                "times."
            )
    jt = events.jump_times if events is not None else jnp.asarray(bm.jump_times, dtype)
    js = events.jump_sizes if events is not None else jnp.asarray(bm.jump_sizes, dtype)
    ev = replay_events(bm, times, jt, js)
    jumps = None if events is None else (jt, js)
    bad = host(events_out_of_order(bm, times, tsave, subst, ev, bm.t0, bm.t1, jumps))
    rows = np.flatnonzero(bad)
    if rows.size:
        raise ValueError(
            f"gs.replay: `ts` or `jumps` times of trajectory {int(rows[0])} moved past "
            "neighbouring mesh points (or out of [t0, t1]); a jump time stays between the "
            "nodes around it, and a save time equal to a jump time stays before it. "
            "Re-record the mesh for these times."
        )
