"""`replay`: a fixed-step pass over a recorded mesh, differentiable in every mode.

The replay calls the very ``solver.step`` the record accepted, over the recorded step
times, so at the recording ``y0``/``params`` it reproduces the record's states, and its
derivative is the exact discrete adjoint of those steps: the gradient Diffrax's default
``RecursiveCheckpointAdjoint`` returns (its controller also stops gradients through step
sizes), but from a fixed-length chain.

This module validates and batches the inputs, works out the nodes to replay (moved save
times, failed trajectories; `gradsolve._savetimes`), hands them to the driver
(`gradsolve.drivers`: compiled kernel, lanes, batched or Diffrax) and adds what every
driver shares: the Taylor terms that differentiate ``t0``, ``t1`` and save times that
cannot move a node, and NaN for failed trajectories.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import batch, check_layout, check_vector_field, is_concrete, split_static
from ._doses import DoseSchedule, as_schedule
from ._events import Events, batch_events, check_moved_events, events_out_of_order, replay_events
from ._mesh import Mesh, Status
from ._nan_rows import nan_rows
from ._savetimes import check_moved_ts, moved_out_of_order, pinned_moved, save_roles, taylor2
from ._solution import Solution
from ._solver.diffrax_adapter import DiffraxSolver
from .drivers import AbstractDriver
from .drivers.auto import resolve
from .drivers.base import ReplayLayout, ReplayNodes
from ._sharding import host, platform

_sg = jax.lax.stop_gradient


def replay(
    f,
    mesh: Mesh,
    y0,
    params,
    *,
    ts=None,
    group_size: int | None = None,
    chunk_size: int = 8,
    driver: AbstractDriver | None = None,
    jumps=None,
    doses=None,
) -> Solution:
    """Fixed-step replay of a recorded mesh at (possibly new) ``y0``, ``params`` and ``ts``.

    Args:
        f: the vector field ``f(t, y, params)`` (one trajectory), as given to ``record``.
        mesh: a `Mesh` from `gradsolve.record`.
        y0: ``(d,)`` or ``(n, d)``, matching the mesh.
        params: pytree; leaves with leading axis ``n`` for an ensemble.
        ts: save times of the same shape as ``mesh.ts``; default the recorded ones. They
            are mesh nodes: interior save times move their node (so the gradient w.r.t.
            ``ts`` is ``f(t, y)`` there, to the solver's accuracy); save times equal to
            ``t0`` or ``t1`` stay pinned and get their first-order derivative
            ``f(t, y)`` added (their value must stay the recorded one). A save time
            moved past a neighbouring mesh node, or one recorded at ``t0`` or ``t1``
            given as another time, is a ``ValueError``; under ``jit`` that trajectory
            gives NaN and ``stats["status"] == Status.INVALID_INPUT``.
        group_size: trajectories per length-sorted group (ragged ensembles; the lanes and
            batched drivers); ``None`` picks the driver's default for the backend (on CPU
            256 for the batched replay, 1,024 for the lanes replay; one group of up to
            131,072 on GPU/TPU).
        chunk_size: steps per skippable, rematerialised chunk (batched driver).
        driver: how the replay runs (`gradsolve.drivers`); default `gradsolve.drivers.Auto`:
            the compiled kernel, else the lanes replay, else the batched one, whichever
            applies first. An explicit driver that does not apply is a ``ValueError``
            saying why.
        jumps: ``(times, sizes)`` of the recorded shapes (times ``(J,)`` or ``(n, J)``,
            sizes ``(J, d)`` or ``(n, J, d)``, ``+inf`` padding where it was recorded),
            required exactly when the mesh was recorded with ``jumps`` (sizes are data a
            user differentiates, so they are never taken from the mesh silently). New
            sizes apply at the recorded jump nodes; a new jump time moves its node (and
            the landing node before it, unless that also holds a save time, a tstop,
            another jump or ``t0``), so gradients w.r.t. sizes and times are the exact
            discrete adjoint of the replayed steps. A jump time moved past a
            neighbouring node, or outside ``[t0, t1]``, is a ``ValueError`` (under
            ``jit``: NaN and ``Status.INVALID_INPUT``). Save times equal to a jump time
            read the state before the jump; the mesh's ``tstops`` are replayed as
            recorded (their stages recomputed). Every replay driver but
            `gradsolve.drivers.Diffrax` applies events (its solve does).
        doses: the dose records the mesh was recorded with (`gradsolve.DoseSchedule` or a
            list of records), at new times and amounts if wished; ``y0`` has the model's
            ``d`` states and so has the solution.

    Returns:
        `Solution` with ``ys (n, k, d)``, ``y1``, ``error_ratio (n,)``, ``stats``.
        Trajectories whose record failed give NaN, and so do their derivatives (where the
        differentiated output uses them; the other trajectories' are unaffected).

    Differentiable in reverse and forward mode w.r.t. ``y0``, every leaf of ``params`` and
    ``ts``; works under ``jit`` and ``vmap``. ``Solution.route`` names the driver that ran.

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, ts=ts)
        >>> loss = lambda p: jnp.sum(gs.replay(f, mesh, y0, p).ys ** 2)
        >>> g = jax.grad(loss)(params)
    """
    where = "gs.replay"
    if doses is not None:
        d = jnp.shape(y0)[-1]
        g, z0, jumps = as_schedule(doses, where).apply(f, y0, t1=mesh.t1, jumps=jumps)
        sol = replay(g, mesh, z0, params, ts=ts, group_size=group_size,
                     chunk_size=chunk_size, driver=driver, jumps=jumps)
        return DoseSchedule.solution(sol, d)
    if not isinstance(mesh, Mesh):
        raise ValueError(f"{where}: `mesh` must be a gs.Mesh from gs.record, got {type(mesh).__name__}.")
    bm = mesh.batch()
    f, params = split_static(f, params)
    b = batch(mesh.t0, mesh.t1, y0, params, ts if ts is not None else None, where)
    check_vector_field(f, mesh.t0, b.y0, b.params, where)
    if b.single == mesh.is_ensemble:
        raise ValueError(
            f"{where}: `y0` has shape {jnp.shape(y0)} but the mesh was recorded for "
            + ("an ensemble" if mesh.is_ensemble else "one trajectory") + "."
        )
    n_mesh = bm.n_steps.shape[0]
    if b.n != n_mesh:
        raise ValueError(f"{where}: `y0` has {b.n} trajectories but `mesh` has {n_mesh}.")
    if b.d != bm.y_last.shape[-1]:
        raise ValueError(f"{where}: `y0` has {b.d} states but `mesh` was recorded with {bm.y_last.shape[-1]}.")
    if ts is not None and b.ts.shape != bm.ts.shape:
        raise ValueError(
            f"{where}: `ts` must have the recorded save-time shape {tuple(mesh.ts.shape)}, got "
            f"{tuple(jnp.shape(ts))}. Save times are mesh points: re-record for other times."
        )
    events = _replay_jumps(mesh, bm, b, jumps, where)
    check_moved = True
    if ts is not None and is_concrete(ts, bm.times, bm.ts) and not mesh.has_events:
        # Concrete inputs may still sit inside a jit/vmap trace (a mesh and ts closed
        # over): evaluate the check now, on the host, rather than staging it out.
        # (batched inside a trace, b.ts is a tracer even for concrete ts: batch it here)
        ts_now = b.ts if is_concrete(b.ts) else np.broadcast_to(
            host(ts).astype(b.ts.dtype), b.ts.shape)
        with jax.ensure_compile_time_eval():
            check_moved_ts(bm, ts_now)
        check_moved = False
        if _at_recorded_nodes(bm, ts_now):
            # The recorded save times again (what a fit passes): nothing moves and nothing
            # can be differentiated, so the plain replay gives the same values, cheaper.
            ts = None
    if mesh.has_events and (ts is not None or events is not None) and \
            is_concrete(b.ts, bm.times, events):
        with jax.ensure_compile_time_eval():
            check_moved_events(bm, b.ts if ts is not None else None, events)
    return replay_prepared(f, mesh, b, ts is not None, group_size, chunk_size, check_moved,
                           driver=driver, events=events)


def _at_recorded_nodes(bm: Mesh, ts) -> bool:
    """Whether concrete ``ts (n, k)`` are the recorded save times of the batched mesh ``bm``
    and sit on their nodes exactly (so a replay given them moves nothing)."""
    ts = host(ts)
    rec = host(bm.ts).astype(ts.dtype)
    nodes = np.take_along_axis(host(bm.times).astype(ts.dtype), host(bm.save_index), axis=1)
    return bool(np.array_equal(ts, rec) and np.array_equal(ts, nodes))


def _replay_jumps(mesh: Mesh, bm: Mesh, b, jumps, where: str):
    """The batched jumps of a replay, checked against the mesh's (``None`` without any):
    a mesh recorded with jumps needs them again, of the recorded shape and padding."""
    if mesh.n_jumps and jumps is None:
        raise ValueError(
            f"{where}: the mesh was recorded with `jumps` ({mesh.n_jumps} per trajectory); pass "
            "them again, jumps=(times, sizes) (sizes are data you may differentiate, so they "
            "are not taken from the mesh), e.g. jumps=(mesh.jump_times, mesh.jump_sizes)."
        )
    if jumps is not None:
        if not mesh.n_jumps:
            raise ValueError(
                f"{where}: `jumps` given but the mesh was recorded without jumps; jump times "
                "are mesh nodes: record with gs.record(..., jumps=...)."
            )
        events = batch_events(jumps, None, mesh.t0, mesh.t1, b.n, b.d, b.single, b.y0.dtype,
                              where)
        if events.jump_times.shape != bm.jump_times.shape:
            raise ValueError(
                f"{where}: `jumps` times must have the recorded shape "
                f"{tuple(mesh.jump_times.shape)}, got {tuple(jnp.shape(jumps[0]))}. Jump "
                "times are mesh nodes: re-record for another schedule."
            )
        if is_concrete(events.jump_times, bm.jump_times):
            given = np.isfinite(host(events.jump_times))
            rows = np.flatnonzero(np.any(given != np.isfinite(host(bm.jump_times)), axis=1))
            if rows.size:
                raise ValueError(
                    f"{where}: `jumps` times of trajectory {int(rows[0])} are +inf (padding) "
                    "where the mesh has a jump or the other way round; the schedule must keep "
                    "its recorded padding."
                )
    return None if jumps is None else events


def replay_prepared(f, mesh: Mesh, b, ts_given: bool, group_size: int | None,
                    chunk_size: int, check_moved: bool = True,
                    driver: AbstractDriver | None = None, where: str = "gs.replay",
                    events: Events | None = None) -> Solution:
    """Replay validated, batched inputs ``b`` (see `gradsolve._checks.batch`).
    ``check_moved=False`` skips the on-device check of moved save times and jump times
    (`gradsolve.solve`, whose ``ts`` and jumps are the recorded nodes). ``events``: the
    validated jumps (`batch_events`) of a mesh recorded with them."""
    check_layout(group_size, chunk_size, where)
    driver = resolve(driver, "replay", f, mesh.solver, b.y0, b.params, where, mesh.has_events)
    layout = ReplayLayout(None if group_size is None else int(group_size), int(chunk_size),
                          platform())
    jumps = None if events is None else (events.jump_times, events.jump_sizes)
    # The Taylor terms that differentiate t0, t1 and save times that cannot move a node
    # evaluate f in forward mode (jax.jvp); only where those times are traced, so a vector
    # field that forward mode cannot enter (a jax.custom_vjp) still solves and replays.
    taylor = TaylorTerms(t0=not is_concrete(mesh.t0), t1=not is_concrete(mesh.t1),
                         ts=ts_given and not is_concrete(b.ts))
    ys, y1, err, work, out_ts, status = _replay_core(
        driver, f, mesh, b.y0, b.params, b.ts if ts_given else None, layout, check_moved, jumps,
        taylor)
    stats = {
        "num_accepted_steps": mesh.n_steps,
        "num_rejected_steps": mesh.n_rejected,
        "num_replayed_steps": jnp.asarray(mesh.capacity),
        "replay_work": work,
        "status": status,
    }
    if b.single:
        ys, y1, err, out_ts = ys[0], y1[0], err[0], out_ts[0]
        stats["status"] = status[0]
    route = driver.name
    if isinstance(mesh.solver, DiffraxSolver):
        route += f"/diffrax.{type(mesh.solver.solver).__name__}"
    return Solution(ys=ys, y1=y1, ts=out_ts, mesh=mesh, stats=stats, error_ratio=err,
                    route=route)


class TaylorTerms(NamedTuple):
    """Which of ``t0``, ``t1`` and the save times ``ts`` are traced (may carry derivatives),
    so `_replay_core` adds their Taylor terms; concrete ones get none (they would add zero
    and need ``f`` in forward mode)."""

    t0: bool = True
    t1: bool = True
    ts: bool = True


@eqx.filter_jit
def _replay_core(driver: AbstractDriver, f, mesh: Mesh, y0, params, ts, layout: ReplayLayout,
                 check_moved: bool = True, jumps=None, taylor: "TaylorTerms" = None):
    """Jitted body of `replay` on batched, validated inputs, ``driver`` concrete;
    ``jumps`` ``(times (n, J), sizes (n, J, d))`` for a mesh recorded with jumps;
    ``taylor`` which times are traced (their Taylor terms run; default all)."""
    taylor = TaylorTerms() if taylor is None else taylor
    bm = mesh.batch()
    dtype = y0.dtype
    failed = bm.status != Status.OK
    times = _sg(bm.times).astype(dtype)
    t0 = jnp.asarray(_sg(mesh.t0), dtype)
    t1 = jnp.asarray(_sg(mesh.t1), dtype)
    rec_ts = _sg(bm.ts).astype(dtype)
    rows = jnp.arange(times.shape[0])[:, None]
    first, dup, interior, moving = save_roles(rec_ts, t0, t1, bm.save_index)
    # Interior save times given as ``ts`` move their mesh node (differentiably); equal save
    # times share one node, moved by the first of them.
    subst = moving if ts is not None else jnp.zeros(rec_ts.shape, bool)
    tsave = ts if ts is not None else rec_ts
    status = bm.status
    events = None
    if mesh.has_events:
        # (`replay` always passes jumps for a mesh with them; internal callers may not.)
        jt, js = (jumps if jumps is not None else
                  (_sg(bm.jump_times).astype(dtype), _sg(bm.jump_sizes).astype(dtype)))
        events = replay_events(bm, times, jt, js)
    if ts is not None and check_moved:
        # A save time recorded at t0 or t1 cannot move (the interval's ends are fixed
        # nodes): given another time, the slot would read the end's state.
        invalid = pinned_moved(rec_ts, t0, t1, _sg(ts))
        status = jnp.where(invalid & ~failed, Status.INVALID_INPUT, status).astype(jnp.int32)
        failed = failed | invalid
    if ts is not None and check_moved and events is None:
        # Moved save times checked on device too (outside jit `replay` raises instead): a
        # save time moved past a neighbouring node leaves no valid mesh, so the trajectory
        # is neutralised like a failed one and reported INVALID_INPUT. (Separated equal
        # save times only lose their own slot, below.)
        invalid = moved_out_of_order(times, bm.save_index, _sg(ts), subst)
        status = jnp.where(invalid & ~failed, Status.INVALID_INPUT, status).astype(jnp.int32)
        failed = failed | invalid
    if events is not None and check_moved and (ts is not None or jumps is not None):
        # With events: every moved node (save times, jump times) checked at once.
        invalid = events_out_of_order(bm, times, tsave, subst, events, t0, t1, jumps)
        status = jnp.where(invalid & ~failed, Status.INVALID_INPUT, status).astype(jnp.int32)
        failed = failed | invalid
    if events is not None:
        # Failed or invalid trajectories replay no jumps (their outputs become NaN).
        events = events._replace(jump_sizes=jnp.where(failed[:, None, None], 0.0,
                                                      events.jump_sizes))
    n_eff = jnp.where(failed, 0, bm.n_steps).astype(jnp.int32)
    rtol, atol = jnp.asarray(mesh.rtol, dtype), jnp.asarray(mesh.atol, dtype)

    # Derivatives w.r.t. t0 (a traced mesh.t0, e.g. gs.solve differentiated w.r.t. t0):
    # y(t; t0 + s, y0) = y(t; t0, y0 - s f + s^2/2 f'), so replay from that y0.
    if taylor.t0:
        t0_live = jnp.asarray(mesh.t0, dtype)
        s0 = jnp.broadcast_to(t0_live - _sg(t0_live), y0.shape[:1])
        y0 = jax.vmap(lambda y, p, s: taylor2(f, t0[None], y[None], p, -s[None])[0])(
            y0, params, s0)

    nodes = ReplayNodes(times, n_eff, bm.save_index, tsave, subst, events)
    out = driver.replay(f, mesh.solver, nodes, y0, params, rtol, atol, moved=ts is not None,
                        layout=layout)
    ys, y1, err, work = out
    if ts is not None:
        # Save times that do not move a node get the solution's Taylor expansion around
        # their node: pinned ones (equal to t0 or t1) around their fixed time, duplicates
        # around the first equal save time (whose node they share).
        shared = dup & interior
        node_t = jnp.where(shared, ts[rows, first], _sg(ts))
        if taylor.ts:
            shift = jnp.where(subst, 0.0, ts - node_t)
            ys = jax.vmap(lambda t, y, p, s: taylor2(f, t, y, p, s))(node_t, ys, params, shift)
        # Replayed at new times, duplicates that no longer coincide have no node of their
        # own: NaN (outside jit, `replay` raises instead).
        ys = jnp.where((shared & (ts != node_t))[..., None], jnp.nan, ys)
    # Derivatives w.r.t. t1: y1 = y(t1) moves with t1.
    if taylor.t1:
        t1_live = jnp.asarray(mesh.t1, dtype)
        s1 = jnp.broadcast_to(t1_live - _sg(t1_live), y1.shape[:1])
        y1 = jax.vmap(lambda y, p, s: taylor2(f, t1[None], y[None], p, s[None])[0])(
            y1, params, s1)
    # NaN for failed trajectories, and a NaN derivative w.r.t. their inputs (not the
    # zero a constant NaN would give: an optimiser must not see a stationary point).
    inputs = (y0, params, tsave, jumps if jumps is not None else (), mesh.t0, mesh.t1)
    ys, y1 = nan_rows(failed, (ys, y1), inputs)
    err = jnp.where(failed, jnp.inf, _sg(err))
    out_ts = ts if ts is not None else rec_ts
    return ys, y1, err, _sg(work), out_ts, status

