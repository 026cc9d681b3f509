"""The batched driver: the XLA record loop and the replay of vmapped solver steps.

It applies to every solver (explicit, Rosenbrock, Diffrax solvers driven through their own
``step``) and every vector field JAX can trace, and it is built from plain
``while_loop``/``scan``/``cond``/``checkpoint``, so reverse mode, forward mode (``jvp``,
``jacfwd``, ``hessian``) and ``vmap`` all work with no custom rules. The faster drivers
(`gradsolve.drivers.Kernel`, `gradsolve.drivers.Lanes`) define their forward-mode and
second derivatives through `replay_nodes` below.

Record design: one ``lax.while_loop`` over the *batch*, not a ``vmap`` of per-trajectory
loops. Every iteration attempts one step for every unfinished trajectory and scatters
accepted step times into the mesh buffer ``(n, S + 1)``; trajectories that are done (or
rejected) scatter out of bounds, which is dropped. Under ``vmap`` a per-trajectory loop
whose carry holds an ``(n, S)`` buffer copies it each iteration; the scatter here is in
place, so the cost follows the steps actually attempted (the loop ends when the slowest
trajectory does), not ``max_steps``. The buffer is the mesh itself (no transpose or slice
afterwards), and under ``jit`` its slots past ``n_steps`` are left as they are
(`gradsolve.Mesh.times`). Save times are forced mesh points: a step that would pass the
next save time (or ``t1``) is shortened to land on it exactly, so the replay hits it as a
node with no interpolation, for at most one extra step per save time.

Replay design:

- Steps are grouped in chunks of ``chunk_size`` and chunks in blocks of about
  ``sqrt(chunks)``; two nested ``lax.scan``s run over blocks and their chunks, and each
  block and each chunk is a ``lax.cond`` that skips it when every trajectory of the group is
  already past its last step. So under ``jit`` (mesh capacity ``max_steps``, say 4,096
  steps) the cost follows the steps taken: the unused capacity costs one skipped ``cond``
  per block (~23 of them), not one per chunk (512), which on a GPU is one host
  synchronisation each.
- Each chunk is wrapped in ``jax.checkpoint``: reverse mode stores only the state at chunk
  boundaries and recomputes stages inside a chunk, so memory is ``O(n * S / chunk * d)``
  instead of ``O(n * S * stages * d)``. The states at save times are gathered block by
  block into the loop carry, and each block reads its own node times, so no array over
  all ``S`` steps is built or transposed: spare capacity costs no memory traffic (on CPU,
  a jitted ``gs.solve`` of 1,000 LV trajectories at ``max_steps=4096``, this change alone:
  forward 85 -> 36 ms, gradient 186 -> 106 ms).
- Ragged ensembles: trajectories are sorted by step count and replayed in groups of
  ``group_size`` (``lax.map`` over groups); a group runs only as many chunks as its longest
  member needs. Padding steps have ``h = 0`` and are exact identities in value and
  gradient. The default group size depends on the backend (`default_group_size`).
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PyTree

from .._controller import PIDController, error_norm, initial_step
from .._events import Events, apply_jumps, empty_events, jump_node_times, reset_state
from .._mesh import Mesh, Status
from .._sharding import platform
from .._misc import length_groups, shared_max, tree_where
from .._savetimes import node_times
from .._solver.base import AbstractSolver
from .base import AbstractDriver, ReplayLayout, ReplayNodes, ReplayOutput

_sg = jax.lax.stop_gradient

class _RecordState(NamedTuple):
    t: Float[Array, " n"]
    y: Float[Array, "n d"]
    h: Float[Array, " n"]
    solver_state: PyTree
    err_prev: Float[Array, " n"]
    n_accepted: Int[Array, " n"]
    n_rejected: Int[Array, " n"]
    save_ptr: Int[Array, " n"]
    status: Int[Array, " n"]
    done: Bool[Array, " n"]
    times: Float[Array, "n S1"]
    save_index: Int[Array, "n k"]
    iters: Int[Array, ""]
    jump_ptr: Int[Array, " n"]
    jump_index: Int[Array, "n J"]
    stop_ptr: Int[Array, " n"]
    tstop_index: Int[Array, "n L"]


def record_chunk(backend: str | None = None) -> int:
    """Attempts per iteration of the XLA record's ``while_loop``: 1 on CPU, 8 elsewhere.

    On a GPU every ``while_loop`` iteration copies its condition to the host before the
    next one launches; running the attempt loop in fixed chunks pays that sync once per
    chunk, for at most ``chunk - 1`` spare no-op attempts at the end. On CPU the condition
    costs nothing and the spare attempts would be pure overhead.
    """
    backend = platform() if backend is None else backend
    return 1 if backend == "cpu" else 8


class _RecordOut(NamedTuple):
    """The per-trajectory arrays the record loop computes (the rest of a `Mesh` is its
    inputs)."""

    times: Float[Array, "n S1"]
    n_steps: Int[Array, " n"]
    n_rejected: Int[Array, " n"]
    status: Int[Array, " n"]
    save_index: Int[Array, "n k"]
    dt_next: Float[Array, " n"]
    y_last: Float[Array, "n d"]
    jump_index: Int[Array, "n J"]
    tstop_index: Int[Array, "n L"]


def record_loop(
    f, solver: AbstractSolver, controller: PIDController, t0, t1, y0, params, ts, rtol, atol,
    dt0, max_steps: int, fill: bool = True, events: Events | None = None,
) -> Mesh:
    """The XLA record of batched inputs ``y0 (n, d)``, ``ts (n, k)`` (no validation), as
    described in the module docstring. ``fill=False`` leaves the mesh slots past
    ``n_steps`` unspecified.

    ``events`` (`gradsolve._events.Events`): jump times and tstops are forced nodes like
    save times; an iteration that finds a jump pending at its current time takes no step
    but adds a node at that time (the jump's own), applies the jump there and recomputes
    the solver's carried state, as it does after landing on a tstop. Without events the
    loop is the one above, unchanged.

    Under ``jax.vmap`` (vectorised chains, a vmapped ``gs.solve``) the mapped axis is folded
    into the ensemble axis: ``B`` calls of ``n`` trajectories run as one record of
    ``B * n``. A vmapped ``while_loop`` whose predicate is batched would instead select its
    whole carry, the ``(n, max_steps + 1)`` mesh buffer included, on every iteration (a
    200-subject record under 4 chains spent ~1 s there). The fold applies when only
    per-trajectory inputs (``y0``, ``params``, ``ts``, events, arrays ``f`` closes over
    that are not mapped) carry the mapped axis; otherwise the loop is vmapped as is. No
    gradient flows through the record (its inputs are ``stop_gradient``-ed here), so the
    fold needs no derivative rule."""
    n, d = y0.shape
    has_events = events is not None
    ev = events if has_events else empty_events(n, d, y0.dtype)
    out = _folded_record(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                         max_steps, fill, ev, has_events)
    return Mesh(
        times=out.times,
        n_steps=out.n_steps,
        n_rejected=out.n_rejected,
        status=out.status,
        save_index=out.save_index,
        ts=ts,
        t0=t0,
        t1=t1,
        dt_next=out.dt_next,
        y_last=out.y_last,
        y0=y0,
        jump_times=ev.jump_times,
        jump_sizes=ev.jump_sizes,
        jump_index=out.jump_index,
        tstops=ev.tstops,
        tstop_index=out.tstop_index,
        params=params,
        solver=solver,
        rtol=rtol,
        atol=atol,
        controller=controller,
    )


def _folded_record(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                   max_steps: int, fill: bool, ev: Events, has_events: bool) -> _RecordOut:
    """`_record_arrays` behind a ``custom_vmap`` that folds a mapped axis into ``n`` (see
    `record_loop`)."""
    sg = jax.lax.stop_gradient
    one = (t0, y0[0], jax.tree_util.tree_map(lambda x: x[0], params))
    # Values traced in f's closure must become explicit inputs, so that the rule below
    # sees whether they are mapped; a closure of constants is kept as given.
    f_conv = eqx.filter_closure_convert(f, *one)
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(f_conv)):
        f_conv = f
    closure, f_static = eqx.partition(f_conv, eqx.is_array)
    arrays, static = eqx.partition((solver, controller), eqx.is_array)

    def plain(t0, t1, y0, params, ts, rtol, atol, dt0, ev, closure, arrays):
        solver_, controller_ = eqx.combine(arrays, static)
        return _record_arrays(eqx.combine(closure, f_static), solver_, controller_, t0, t1,
                              y0, params, ts, rtol, atol, dt0, max_steps, fill, ev, has_events)

    folded = jax.custom_batching.custom_vmap(plain)

    @folded.def_vmap
    def _rule(axis_size, in_batched, *args):
        b = [any(jax.tree_util.tree_leaves(x)) for x in in_batched]
        # t0, t1, rtol, atol, dt0, f's closure, the solver's and controller's arrays: shared
        # by the whole ensemble inside the loop, so a mapped one cannot fold.
        if any(b[i] for i in (0, 1, 5, 6, 7, 9, 10)):
            axes = jax.tree_util.tree_map(lambda m: 0 if m else None, in_batched)
            out = jax.vmap(plain, in_axes=tuple(axes))(*args)
        else:
            t0_, t1_, y0_, params_, ts_, rtol_, atol_, dt0_, ev_, closure_, arrays_ = args
            n_ = y0_.shape[1] if b[2] else y0_.shape[0]

            def fold(x, mapped):
                if not mapped:
                    x = jnp.broadcast_to(x, (axis_size,) + x.shape)
                return x.reshape((axis_size * n_,) + x.shape[2:])

            y0_, params_, ts_, ev_ = (
                jax.tree_util.tree_map(fold, x, m)
                for x, m in zip((y0_, params_, ts_, ev_), in_batched[2:5] + in_batched[8:9])
            )
            out = folded(t0_, t1_, y0_, params_, ts_, rtol_, atol_, dt0_, ev_, closure_,
                         arrays_)
            out = jax.tree_util.tree_map(
                lambda x: x.reshape((axis_size, n_) + x.shape[1:]), out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    args = (t0, t1, y0, params, ts, rtol, atol, dt0, ev, closure, arrays)
    return folded(*jax.tree_util.tree_map(sg, args))


class _Record(NamedTuple):
    """What every iteration of the record loop reads (one ensemble of ``n`` trajectories,
    ``k`` save times, ``J`` jumps, ``L`` tstops)."""

    f: object
    solver: AbstractSolver
    controller: PIDController
    params: PyTree
    ts: Array
    t1: Array
    rtol: Array
    atol: Array
    ev: Events
    has_events: bool
    max_steps: int
    attempts_cap: int
    dtype: object

    @property
    def n(self) -> int:
        return self.ts.shape[0]

    def next_of(self, x, ptr):
        """``x[row, ptr]``, ``+inf`` past the end of the row."""
        if x.shape[1] == 0:
            return jnp.full((self.n,), jnp.inf, self.dtype)
        return jnp.where(ptr < x.shape[1], x[jnp.arange(self.n), jnp.minimum(ptr, x.shape[1] - 1)],
                         jnp.inf)


def _record_init(c: _Record, t0, y0, dt0) -> _RecordState:
    """The loop's first state: the initial step size, empty buffers."""
    f, solver, params, ev = c.f, c.solver, c.params, c.ev
    n, dtype = y0.shape[0], y0.dtype
    J, L, k = ev.jump_times.shape[1], ev.tstops.shape[1], c.ts.shape[1]
    state0 = jax.vmap(lambda y, p: solver.init(f, t0, y, p))(y0, params)
    # With jumps at t0 the first step is taken from the jumped state: pick h0 there.
    y_start = y0 if not J else y0 + jnp.sum(
        jnp.where((ev.jump_times <= t0)[..., None], ev.jump_sizes, 0.0), axis=1)
    if dt0 is None:
        h0 = jax.vmap(lambda y, p: initial_step(f, t0, y, p, solver.error_order, c.rtol,
                                                c.atol))(y_start, params)
    else:
        h0 = jnp.broadcast_to(jnp.asarray(dt0, dtype), (n,))
    h0 = jnp.minimum(h0, c.t1 - t0)
    # The barrier keeps XLA from constant-folding the buffer when t0 is a constant: it would
    # embed an (n, max_steps + 1) literal in the program (seconds of compile, its size in RAM).
    times = jnp.zeros((n, c.max_steps + 1), dtype).at[:, 0].set(
        jax.lax.optimization_barrier(t0))
    zeros = lambda *shape: jnp.zeros(shape, jnp.int32)
    return _RecordState(
        t=jnp.full((n,), t0), y=y0, h=h0, solver_state=state0,
        err_prev=jnp.ones((n,), dtype), n_accepted=zeros(n), n_rejected=zeros(n),
        save_ptr=jnp.sum(c.ts <= t0, axis=1).astype(jnp.int32),
        status=zeros(n), done=jnp.zeros((n,), bool), times=times, save_index=zeros(n, k),
        iters=jnp.zeros((), jnp.int32), jump_ptr=zeros(n), jump_index=zeros(n, J),
        stop_ptr=jnp.sum(ev.tstops <= t0, axis=1).astype(jnp.int32),
        tstop_index=zeros(n, L),
    )


def _record_events(c: _Record, s: _RecordState, t_new, y_new, st_new, h_next, node, accept,
                   is_jump, n_acc):
    """A loop iteration's known-time events: the jump applied at its node, the tstops
    passed, the carried stage reset after either; and whether the trajectory is done."""
    ev, rows = c.ev, jnp.arange(c.n)
    J, L = ev.jump_times.shape[1], ev.tstops.shape[1]
    jump_ptr, jump_index = s.jump_ptr, s.jump_index
    stop_ptr, tstop_index = s.stop_ptr, s.tstop_index
    if J:
        jslot = jnp.minimum(s.jump_ptr, J - 1)
        y_new = jnp.where(is_jump[:, None], s.y + ev.jump_sizes[rows, jslot], y_new)
        jump_index = s.jump_index.at[rows, jnp.where(is_jump, s.jump_ptr, J)].set(
            n_acc, mode="drop")
        jump_ptr = s.jump_ptr + is_jump
    if L:
        stop_reached = jnp.sum(ev.tstops <= t_new[:, None], axis=1).astype(jnp.int32)
        stop_ptr = jnp.where(accept, stop_reached, s.stop_ptr)
        ll = jnp.arange(L)[None]
        hit = (ll >= s.stop_ptr[:, None]) & (ll < stop_ptr[:, None])
        tstop_index = jnp.where(hit, n_acc[:, None], s.tstop_index)
        reset = is_jump | (stop_ptr > s.stop_ptr)
    else:
        reset = is_jump
    # After a jump or a tstop: the carried stage at the new state and exact time.
    st_new = reset_state(c.solver, c.f, t_new, y_new, c.params, st_new, reset)
    h_next = jnp.where(is_jump, s.h, h_next)
    pending = c.next_of(ev.jump_times, jump_ptr) <= t_new
    finished = node & (t_new >= c.t1) & ~pending
    return y_new, st_new, h_next, finished, (jump_ptr, jump_index, stop_ptr, tstop_index)


def _record_step(c: _Record, s: _RecordState) -> _RecordState:
    """One iteration of the record loop: every trajectory tries a step (or takes the node
    of a pending jump), the controller accepts or rejects it, the buffers grow."""
    ts, t1, ev = c.ts, c.t1, c.ev
    n, k = ts.shape
    rows = jnp.arange(n)
    order = c.solver.error_order
    nxt = jnp.minimum(s.save_ptr, k - 1)
    target = jnp.where(s.save_ptr < k, ts[rows, nxt], t1)
    is_jump = None
    if c.has_events:
        # A jump pending at the current time: this iteration is its node, not a step.
        jump_next = c.next_of(ev.jump_times, s.jump_ptr)
        is_jump = ~s.done & (jump_next <= s.t)
        target = jnp.minimum(target, jnp.minimum(jump_next, c.next_of(ev.tstops, s.stop_ptr)))
        idle = s.done | is_jump
    else:
        idle = s.done
    t_try = s.t + s.h
    clipped = t_try >= target
    t_new = jnp.where(idle, s.t, jnp.where(clipped, target, t_try))
    h_eff = t_new - s.t  # the replay recomputes h this way: bitwise the same step
    y1, y_err, st1 = jax.vmap(lambda t, h, y, p, st: c.solver.step(c.f, t, h, y, p, st))(
        s.t, h_eff, s.y, c.params, s.solver_state)
    err = error_norm(y_err, s.y, y1, c.rtol, c.atol)
    err = jnp.where(idle, 0.0, err)
    accept = (err <= 1.0) & ~idle
    h_next = h_eff * c.controller.factor(err, s.err_prev, accept, order)
    h_next = jnp.where(accept & clipped, jnp.maximum(h_next, s.h), h_next)

    node = (accept | is_jump) if c.has_events else accept  # a new mesh node
    n_acc = s.n_accepted + node
    n_rej = s.n_rejected + (~accept & ~idle)
    col = jnp.where(node, n_acc, c.max_steps + 1)  # out of bounds: dropped
    times = s.times.at[rows, col].set(t_new, mode="drop")
    reached = jnp.sum(ts <= t_new[:, None], axis=1).astype(jnp.int32)
    new_ptr = jnp.where(accept, reached, s.save_ptr)
    jj = jnp.arange(k)[None]
    newly = (jj >= s.save_ptr[:, None]) & (jj < new_ptr[:, None])
    save_index = jnp.where(newly, n_acc[:, None], s.save_index)

    y_new = jnp.where(accept[:, None], y1, s.y)
    st_new = tree_where(accept, st1, s.solver_state)
    pointers = (s.jump_ptr, s.jump_index, s.stop_ptr, s.tstop_index)
    if c.has_events:
        y_new, st_new, h_next, finished, pointers = _record_events(
            c, s, t_new, y_new, st_new, h_next, node, accept, is_jump, n_acc)
    else:
        finished = accept & (t_new >= t1)
    active = ~s.done & ~finished
    # underflow: the next step would no longer move the time (relative to the time
    # where it starts, not to t1: a long horizon must not forbid small early steps)
    tiny = 10 * jnp.finfo(c.dtype).eps * jnp.maximum(jnp.abs(t_new), jnp.abs(s.t))
    underflow = active & (h_next <= tiny)
    over = active & ((n_acc >= c.max_steps) | (n_acc + n_rej >= c.attempts_cap))
    status = jnp.where(
        underflow, jnp.where(jnp.isfinite(err), Status.STEP_UNDERFLOW, Status.NONFINITE),
        s.status)
    status = jnp.where(over & ~underflow, Status.MAX_STEPS, status)
    jump_ptr, jump_index, stop_ptr, tstop_index = pointers
    return _RecordState(
        t=jnp.where(accept, t_new, s.t), y=y_new, h=jnp.where(s.done, s.h, h_next),
        solver_state=st_new, err_prev=jnp.where(accept, jnp.maximum(err, 1e-4), s.err_prev),
        n_accepted=n_acc, n_rejected=n_rej, save_ptr=new_ptr,
        status=status.astype(jnp.int32), done=s.done | finished | underflow | over,
        times=times, save_index=save_index, iters=s.iters + 1, jump_ptr=jump_ptr,
        jump_index=jump_index, stop_ptr=stop_ptr, tstop_index=tstop_index,
    )


def _record_arrays(f, solver: AbstractSolver, controller: PIDController, t0, t1, y0, params,
                   ts, rtol, atol, dt0, max_steps: int, fill: bool, ev: Events,
                   has_events: bool) -> _RecordOut:
    """The record loop itself (`record_loop`), on one ensemble."""
    c = _Record(f, solver, controller, params, ts, t1, rtol, atol, ev, has_events, max_steps,
                4 * max_steps + 64, y0.dtype)
    cond = lambda s: (~jnp.all(s.done)) & (s.iters < c.attempts_cap)
    body = lambda s: _record_step(c, s)
    init = _record_init(c, t0, y0, dt0)
    chunk = record_chunk()
    if chunk == 1:
        s = jax.lax.while_loop(cond, body, init)
    else:
        # Once every trajectory is done, `body` changes nothing but `iters`, so running it
        # in fixed chunks gives the same mesh bitwise.
        s = jax.lax.while_loop(
            cond, lambda s: jax.lax.fori_loop(0, chunk, lambda _, c: body(c), s), init)
    status = jnp.where(~s.done, Status.MAX_STEPS, s.status).astype(jnp.int32)
    times = s.times
    if fill:
        slots = jnp.arange(max_steps + 1)[None]
        times = jnp.where(slots > s.n_accepted[:, None], s.t[:, None], times)
    return _RecordOut(times, s.n_accepted, s.n_rejected, status, s.save_index, s.h, s.y,
                      s.jump_index, s.tstop_index)


_GROUP_SIZE_CPU = 256
_GROUP_SIZE_ACCELERATOR = 1 << 17


def default_group_size(backend: str | None = None) -> int:
    """Trajectories per length-sorted group of the batched replay on ``backend`` (default:
    the default device's platform, `gradsolve._sharding.platform`).

    Groups run one after another (``lax.map``). On CPU that is what we want: a group keeps
    a step's working set in cache, and a ragged ensemble replays only as many steps as each
    group's longest member. 256 is the measured compromise (kernel off, replay gradient):
    within 10 % of the best width on uniform ensembles (LV, Lorenz at 1,000 and 10,000,
    Robertson), where 64 is 1.3-1.5x slower, and as fast as 64 on 1,000 lynx-hare prior
        draws (22-311 steps each), where 1,024 is 1.7x slower. On GPU and TPU one step of a
    group is a few kernel launches whose time hardly depends on the group's width until the
    device is full (~10^5 small states), so narrow groups would only multiply launches:
    there the default is 131,072, a single group for most ensembles. (The lanes replay has
    its own, `gradsolve.drivers.lanes.default_group_size`.)
    """
    backend = platform() if backend is None else backend
    return _GROUP_SIZE_CPU if backend == "cpu" else _GROUP_SIZE_ACCELERATOR


def _replay_block(
    f, solver, times: Float[Array, "g S1"], n_eff: Int[Array, " g"], y0: Float[Array, "g d"],
    params: PyTree, save_index: Int[Array, "g k"], rtol, atol, chunk: int, events=None,
):
    """Replay one group of trajectories. Returns ``(ys (g,k,d), y1 (g,d), err (g,), work)``.

    ``events``: ``None`` or ``(jump_index (g, J), jump_sizes (g, J, d), reset_index (g, R))``
    (`gradsolve._events.ReplayEvents`): after the step into a jump's node the state jumps
    (the saved state there is the one before), and after a jump or tstop node the carried
    solver state is recomputed, as in the record."""
    g, d = y0.shape
    k = save_index.shape[1]
    s1 = times.shape[1]
    n_chunks = max(1, math.ceil((s1 - 1) / chunk))
    per_block = math.isqrt(n_chunks - 1) + 1  # ceil(sqrt(n_chunks))
    n_blocks = math.ceil(n_chunks / per_block)
    span = per_block * chunk  # steps per block
    n_steps = n_blocks * span
    n_max = shared_max(n_eff)
    rows = jnp.arange(g)[:, None]
    # Nodes past n_eff repeat node n_eff (zero-length steps), and every node up to n_max is
    # replayed, so each save slot is met in some block.
    save = jnp.minimum(save_index, n_eff[:, None])
    # Slots past n_eff may hold anything (`Mesh.times` under jit); each block reads them as
    # the last node's time, i.e. zero-length steps, exact identities. Failed trajectories
    # (n_eff = 0) stay at t0 and finite everywhere; the caller sets them to NaN.
    t_last = times[jnp.arange(g), n_eff]

    vstep = jax.vmap(lambda t, h, y, p, s: solver.step(f, t, h, y, p, s))
    state0 = jax.vmap(lambda t, y, p: solver.init(f, t, y, p))(times[:, 0], y0, params)

    def one_step(carry, x):
        y, st, emax = carry
        ta, tb, i = x
        y1, y_err, st1 = vstep(ta, tb - ta, y, params, st)
        active = i < n_eff
        err = error_norm(_sg(y_err), _sg(y), _sg(y1), rtol, atol)
        emax = jnp.maximum(emax, jnp.where(active, err, 0.0))
        y = jnp.where(active[:, None], y1, y)
        st = tree_where(active, st1, st)
        out = y
        if events is not None:
            jump_index, jump_sizes, reset_index = events
            y = apply_jumps(y, i + 1, active, jump_index, jump_sizes)
            reset = jnp.any(reset_index == i + 1, axis=1) & active
            st = reset_state(solver, f, tb, y, params, st, reset)
        return (y, st, emax), out

    @jax.checkpoint
    def one_chunk(carry, xs):
        run = lambda c, x: jax.lax.scan(one_step, c, x)
        skip = lambda c, x: (c, jnp.broadcast_to(c[0], (chunk, g, d)))
        return jax.lax.cond(xs[2][0] < n_max, run, skip, carry, xs)

    def run_block(carry, b):
        y, st, emax, ys = carry
        first = b * span
        # This block's node times, (g, span + 1); columns past the mesh repeat its last time.
        cols = first + jnp.arange(span + 1)
        tt = jnp.take(times, jnp.minimum(cols, s1 - 1), axis=1)
        tt = jnp.where(cols[None] > n_eff[:, None], t_last[:, None], tt).T
        shape = (per_block, chunk, g)
        xs = (tt[:-1].reshape(shape), tt[1:].reshape(shape),
              (first + jnp.arange(span, dtype=jnp.int32)).reshape(per_block, chunk))
        (y, st, emax), states = jax.lax.scan(one_chunk, (y, st, emax), xs)
        # states[j] is node first + j + 1: keep the save slots that fall in this block.
        local = save - (first + 1)
        hit = (local >= 0) & (local < span)
        picked = states.reshape(span, g, d)[jnp.clip(local, 0, span - 1), rows]
        return y, st, emax, jnp.where(hit[..., None], picked, ys)

    def one_block(carry, b):
        return jax.lax.cond(b * span < n_max, run_block, lambda c, _: c, carry, b), None

    # The saved states are gathered block by block into the carry, so nothing of size
    # (steps x g x d) is built: a mesh with spare capacity (recorded under jit) costs no
    # memory traffic for it.
    ys0 = jnp.where((save == 0)[..., None], y0[:, None, :], jnp.zeros((g, k, d), y0.dtype))
    carry0 = (y0, state0, jnp.zeros((g,), y0.dtype), ys0)
    (y1, _, emax, ys), _ = jax.lax.scan(one_block, carry0, jnp.arange(n_blocks, dtype=jnp.int32))
    work = jnp.minimum(jnp.ceil(n_max / chunk) * chunk, n_steps) * g
    return ys, y1, emax, work


def replay_batched(
    f, solver, times, n_eff, y0, params, save_index, rtol, atol, *, group_size: int,
    chunk_size: int, events=None,
):
    """Replay batched inputs over the node ``times`` as they are, grouping trajectories of
    similar length. ``events`` as in `_replay_block`. Returns ``(ys, y1, err, work)``."""
    n = y0.shape[0]
    if n <= group_size:
        return _replay_block(f, solver, times, n_eff, y0, params, save_index, rtol, atol,
                             chunk_size, events)
    group, ungroup, n_pad = length_groups(n_eff, group_size)
    args = jax.tree_util.tree_map(group, (times, n_eff, y0, params, save_index, events))

    def body(a):
        *a, ev = a
        return _replay_block(f, solver, *a, rtol, atol, chunk_size, ev)

    ys, y1, emax, work = jax.lax.map(body, args)
    return ungroup(ys), ungroup(y1), ungroup(emax), jnp.sum(work) * n / n_pad


def replay_nodes(f, solver, nodes: ReplayNodes, y0, params, rtol, atol, moved: bool,
                 layout: ReplayLayout) -> ReplayOutput:
    """The batched replay of ``nodes`` (moved save nodes applied when ``moved``)."""
    times = node_times(nodes.times, nodes.save_index, nodes.tsave, nodes.subst)[0] \
        if moved else nodes.times
    ev = nodes.events
    if ev is not None:
        times = jump_node_times(times, ev)
        ev = (ev.jump_index, ev.jump_sizes, ev.reset_index)
    group_size = layout.group_size or default_group_size(layout.backend)
    return ReplayOutput(*replay_batched(
        f, solver, times, nodes.n_eff, y0, params, nodes.save_index, rtol, atol,
        group_size=group_size, chunk_size=layout.chunk_size, events=ev))


class Batched(AbstractDriver):
    """The XLA record loop and the replay of vmapped solver steps (``lax.scan`` in
    rematerialised chunks), differentiated by JAX.

    Applies to every solver and vector field, known-time events included (``jumps=``,
    ``tstops=``; it records every mesh that has them); the slowest of the replays for explicit
    solvers on CPU, and the only one for stiff (Rosenbrock) and Diffrax solvers, for
    forward mode and for second derivatives. ``Solution.route == "gradsolve-batched"``.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, p, solver=gs.Rodas5P(), driver=gs.drivers.Batched())
    """

    name: ClassVar[str] = "gradsolve-batched"

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return None

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return None

    def record(self, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
               max_steps: int, fill: bool, events=None) -> Mesh:
        return record_loop(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                           max_steps, fill, events)

    def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        return replay_nodes(f, solver, nodes, y0, params, rtol, atol, moved, layout)
