"""The adaptive record as one Pallas kernel: a per-lane step loop with masked updates.

Each block of ``rows * 128`` trajectories (`gradsolve.drivers.pallas._layout`) runs one
``while`` loop; every iteration attempts one step on every lane that is not done and the
controller accepts or rejects it per lane, exactly as an iteration of the XLA record loop
(`gradsolve.drivers.batched`, ``_record_step``) does for the whole ensemble: the same target
(next save time or ``t1``, landed on exactly), the same error norm, the same
`gradsolve.PIDController.factor`, the same status rules, ``GROUP`` attempts per check of
the loop condition (attempts on finished lanes change nothing). So it accepts the same
steps: in float64 (interpreted) the same accepted and rejected steps and save nodes, at
node times within a few 1e-9 (relative) of the XLA record's (the field is the translated
one, compiled apart from the XLA record's, so last bits may differ; each step's error
estimate cancels digits, so a first difference near 1e-12 reaches the next step sizes). In float32 those last bits matter more, and on the chip Mosaic's
``exp``/``log`` (in ``pow``, the controller's fractional power) differ from XLA's by a few
ulp: a step accepted with an error ratio near 1 may go the other way (on a v5e, 67 % of
4,096 Lotka–Volterra trajectories took the XLA record's step count; every mesh holds, its
replay's error ratio <= 1).

Known-time events (``jumps=``, ``tstops=``) are the XLA loop's (`_record_events` there):
jump times and tstops are targets like save times; an attempt that finds a lane's next
jump due at its time takes no step there but a node of its own (a zero-length step) where
the state jumps; after a jump or a tstop node the carried stage is recomputed (a field
evaluation, only in attempts where some lane of the block needs it). In float64 it takes
the XLA record's steps, jumps and tstops (``tests/test_pallas.py``).

Masked updates replace what Mosaic does not lower: a lane's next save time is the last
``ts[j]`` with ``j >= ptr`` over the ``k`` save slots (no gather with a vector index), and
an accepted node is written to the mesh rows between the block's lowest and highest node
count of that iteration, each row taking the lanes whose count it is (no scatter).

The mesh rows of a block live in VMEM while it runs, so their size sets the layout
(`record_window`): a block's buffers must stay within half the VMEM limit, and a capacity
of ``max_steps + 1`` node rows takes ``8 * (max_steps + 1)`` bytes a lane in float32,
double-buffered (16,385 rows of 1,024 lanes: 134 MB, more than the chip's VMEM). The rows
per block shrink from 16 to 8 first; past that the node rows split into chunks, a grid
axis run in order: chunk ``j`` holds rows ``[j * chunk, (j + 1) * chunk)``, goes back to
HBM when the block moves on to the next, and a lane whose next node falls past it waits
(idle attempts, as a finished lane's) until the block's other lanes have filled it too.
The loop state crosses chunks in VMEM scratch; every lane takes the same attempts in the
same order as with one window, so the mesh is the same (``tests/test_pallas.py``).
Streaming chunks rather than shrinking further keeps the kernel's blocks whole (a
``(8, 128)`` register tile is the smallest) and needs no DMA of its own. Under ``jax.vmap``
the mapped calls' trajectories are folded into one call (`gradsolve.drivers.pallas._fold`). Each chunk goes back
whole, used or not, and an XLA transpose takes the buffer to the mesh's ``(n, S + 1)``: a
capacity far beyond the steps taken costs those writes. A chunk's loop stops when each lane
of the block is done or waits.

Measured on a TPU v5e (Lotka–Volterra, Tsit5, float32, 32,768 trajectories, ~67 steps,
capacity 1,024, under ``jit``): 2.6 ms, against 190 ms for the XLA record loop
(``benchmarks/results/tpu_v5e_pallas.log``); 8, 16 or 32 rows per block within 10 %.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..._controller import initial_step
from ..._events import empty_events
from ..._flat import flat_params, flatten_spec
from ..._mesh import Mesh, Status
from ..lanes import LaneArray
from ._field import BlockField, kernel_solver
from ._fold import fold_vmap
from ._layout import blocks_for, from_lanes, loop, to_lanes
from ._replay import error_norm, read, where, write

ROWS = 16  # sublanes per block; fewer where the mesh capacity would crowd VMEM
GROUP = 4  # attempts per check of the block's loop condition
_VMEM_LIMIT = 64 * 1024 * 1024
_VMEM_BUDGET = _VMEM_LIMIT // 2  # what one block's buffers may take (the rest: Mosaic's own)
_STATE_INTS = 7  # int32 rows of the loop state: n_acc, n_rej, ptr, status, done, jptr, sptr


class Window(NamedTuple):
    """How the record kernel holds a block's mesh: ``rows`` sublanes per block, the node
    rows in ``n_chunks`` chunks of ``chunk`` rows (one chunk in VMEM at a time)."""

    rows: int
    chunk: int
    n_chunks: int

    @property
    def s1p(self) -> int:
        return self.chunk * self.n_chunks


def record_window(s1: int, d: int, P: int, k: int, itemsize: int,
                  events: tuple[int, int] | None = None, budget: int | None = None) -> Window:
    """The record's VMEM layout for ``s1`` node slots, ``d`` states, ``P`` parameters, ``k``
    save slots (and ``events``: ``(J, L)`` jumps and tstops per lane), within ``budget``
    bytes (default half the VMEM limit) per block.

    Every pipelined block is double-buffered; the loop state carried from one chunk to the
    next is single. The mesh window is what grows with the capacity: ``rows`` shrinks from
    `ROWS` to 8 first (one chunk, as fast), then the node rows split into the fewest
    chunks that fit (lanes that fill a chunk wait for the block's others there, see
    `pallas_record`). Raises ``ValueError`` where even 8 node rows do not fit (thousands
    of save times or jumps per trajectory)."""
    budget = _VMEM_BUDGET if budget is None else budget
    J, L = events if events is not None else (0, 0)
    piped = (5 + d + P + k + J + J * d + L) + (k + 5 + d + J + L)  # inputs + outputs
    state = 3 + 2 * d + _STATE_INTS
    s1p = -(-s1 // 8) * 8
    rows = ROWS
    while True:
        lane = rows * 128 * max(itemsize, 4)
        room = (budget - lane * (2 * piped + state)) // (2 * lane)  # node rows that fit
        if room >= s1p:
            return Window(rows, s1p, 1)
        if rows == 8:
            break
        rows //= 2
    if room < 8:
        raise ValueError(
            f"the Pallas record holds each block's save times, jumps and tstops in VMEM: "
            f"{k} save times, {J} jumps and {L} tstops per trajectory need "
            f"{lane * (2 * piped + state + 16) / 2**20:.1f} MiB, more than the "
            f"{budget / 2**20:.0f} MiB it may use; split the save times over several calls "
            "or use gs.drivers.Lanes()."
        )
    n_chunks = -(-s1p // (room // 8 * 8))
    chunk = -(-s1p // n_chunks)
    chunk = -(-chunk // 8) * 8
    return Window(8, chunk, n_chunks)


def _reduce(op, x, dtype):
    """``op`` (``jnp.min``/``jnp.max``) of an int32 block as an int32 scalar, reduced in
    ``dtype`` (floating-point reductions are what Mosaic lowers everywhere)."""
    return op(x.astype(dtype)).astype(jnp.int32)


def _next_of(ref, count: int, ptr, end):
    """Per lane ``ref[ptr]`` (``end`` past the last of ``count`` rows): the last row ``j``
    with ``j >= ptr``, by masked selects (no gather with a vector index)."""
    return loop(count, lambda jj, tg: jnp.where(count - 1 - jj >= ptr, ref[count - 1 - jj], tg),
                end)


def _count_reached(ref, count: int, t, zeros_i):
    """Per lane: how many of the ``count`` sorted rows of ``ref`` are ``<= t``."""
    return loop(count, lambda j, acc: acc + (ref[j] <= t).astype(jnp.int32), zeros_i)


def _record_kernel(field: BlockField, solver, controller, d: int, P: int, k: int,
                   max_steps: int, cap: int, window: Window,
                   events: tuple[int, int] | None = None):
    """The record kernel's body for one block and one chunk of its mesh rows (module
    docstring); ``cap`` attempts at most, as the XLA loop. ``events``: ``(J, L)`` jumps and
    tstops per lane (each at least one, padded with ``+inf`` times), as the XLA loop's
    `_record_events`: a lane whose next jump is due at its time takes no step in that
    attempt but a node of its own, where its state jumps; a jump or tstop node restarts
    the carried stage.

    Grid step ``(b, j)`` writes the nodes of rows ``[j * chunk, (j + 1) * chunk)``: a lane
    whose next node falls past them waits (its attempts are idle, as a finished lane's)
    until the next chunk, where the loop state comes back from VMEM scratch. Each lane
    takes the same attempts in the same order as with one chunk."""
    fsal = solver.fsal
    order = solver.error_order
    J, L = events if events is not None else (0, 0)
    chunk, n_chunks = window.chunk, window.n_chunks

    def kernel(*refs):
        scal_ref, h0_ref, y0_ref, p_ref, ts_ref = refs[:5]
        refs = refs[5:]
        jt_ref, js_ref, stop_ref = refs[:3] if events else (None,) * 3
        refs = refs[3:] if events else refs
        times_ref, save_ref, nacc_ref, nrej_ref, status_ref, h_ref, y_ref, t_ref = refs[:8]
        jidx_ref, sidx_ref = refs[8:10] if events else (None, None)
        fs_ref, is_ref = refs[-2:]  # the loop state between chunks: floats, int32
        dtype = y0_ref.dtype
        j = pl.program_id(1)
        base = j * chunk  # this chunk's first mesh row
        end = base + chunk
        t0, t1, rtol, atol = scal_ref[0], scal_ref[1], scal_ref[2], scal_ref[3]
        p = read(p_ref, P)
        zeros_i = jnp.zeros(t0.shape, jnp.int32)
        one = jnp.ones_like(t0)
        inf = jnp.full_like(t0, jnp.inf)
        eps = float(jnp.finfo(dtype).eps)

        def store(c):
            t, y, h, st, err_prev = c[:5]
            fs_ref[0], fs_ref[1], fs_ref[2] = t, h, err_prev
            for q in range(d):
                fs_ref[3 + q] = y.rows[q]
                if fsal:
                    fs_ref[3 + d + q] = st.rows[q]
            for i, x in enumerate(c[5:10] + c[11:13]):
                is_ref[i] = x

        def load():
            y = LaneArray(fs_ref[3 + q] for q in range(d))
            st = LaneArray(fs_ref[3 + d + q] for q in range(d)) if fsal else None
            ints = [is_ref[i] for i in range(_STATE_INTS)]
            return (fs_ref[0], y, fs_ref[1], st, fs_ref[2], *ints[:5], np.int32(0), *ints[5:])

        @pl.when(j == 0)
        def _start():
            y0 = read(y0_ref, d)
            times_ref[0] = t0
            save_ref[...] = jnp.zeros_like(save_ref)
            if events:
                jidx_ref[...] = jnp.zeros_like(jidx_ref)
                sidx_ref[...] = jnp.zeros_like(sidx_ref)
            st0 = solver.init(field, t0, y0, p) if fsal else None
            h0 = jnp.minimum(h0_ref[...], t1 - t0)
            store((t0, y0, h0, st0, one, zeros_i, zeros_i, _count_reached(ts_ref, k, t0, zeros_i),
                   zeros_i, zeros_i, np.int32(0), zeros_i,
                   _count_reached(stop_ref, L, t0, zeros_i) if events else zeros_i))

        def any_lane(x):
            return _reduce(jnp.max, x.astype(jnp.int32), dtype) > 0

        def waits(done, n_acc):
            # done, or its next node is past this chunk's rows
            return (done != 0) | (n_acc + 1 >= end)

        def cond(c):
            n_acc, done, iters = c[5], c[9], c[10]
            return (_reduce(jnp.min, waits(done, n_acc).astype(jnp.int32), dtype) == 0) & (
                iters < cap)

        def attempts(c):
            # GROUP attempts per check of the loop condition (a reduction over the block);
            # attempts on lanes that are done or waiting change nothing, so the mesh is
            # the same.
            return loop(GROUP, lambda _, x: body(x), c)

        def body(c):
            t, y, h, st, err_prev, n_acc, n_rej, ptr, status, done, iters, jptr, sptr = c
            idle = waits(done, n_acc)
            held = idle
            # next save time (ts[ptr]; t1 past the last)
            target = _next_of(ts_ref, k, ptr, t1)
            is_jump = None
            if events:
                # a jump due at the lane's time: this attempt is its node, not a step
                jump_next = _next_of(jt_ref, J, jptr, inf)
                is_jump = ~idle & (jump_next <= t)
                target = jnp.minimum(target, jnp.minimum(jump_next, _next_of(stop_ref, L, sptr,
                                                                             inf)))
                idle = idle | is_jump
            t_try = t + h
            clipped = t_try >= target
            t_new = jnp.where(idle, t, jnp.where(clipped, target, t_try))
            h_eff = t_new - t  # the replay recomputes h this way: bitwise the same step
            y1, y_err, st1 = solver.step(field, t, h_eff, y, p, st)
            err = error_norm(y_err, y, y1, rtol, atol)
            err = jnp.where(idle, jnp.zeros_like(err), err)
            accept = (err <= 1.0) & ~idle
            h_next = h_eff * controller.factor(err, err_prev, accept, order)
            h_next = jnp.where(accept & clipped, jnp.maximum(h_next, h), h_next)
            node = accept | is_jump if events else accept  # a new mesh node
            n_acc1 = n_acc + node.astype(jnp.int32)
            n_rej1 = n_rej + (~accept & ~idle).astype(jnp.int32)
            # the new node at row n_acc1 of each lane: rows lo..hi of the block, all in
            # this chunk
            lo = _reduce(jnp.min, jnp.where(node, n_acc1, max_steps + 1), dtype)
            hi = _reduce(jnp.max, jnp.where(node, n_acc1, -1), dtype)

            def put(m, _):
                row = lo + m
                times_ref[row - base] = jnp.where(node & (n_acc1 == row), t_new,
                                                  times_ref[row - base])
                return _

            loop(hi - lo + 1, put, None)
            reached = _count_reached(ts_ref, k, t_new, zeros_i)
            new_ptr = jnp.where(accept, reached, ptr)

            @pl.when(_reduce(jnp.max, new_ptr - ptr, dtype) > 0)
            def _saves():
                def mark(jj, _):
                    newly = (jj >= ptr) & (jj < new_ptr)
                    save_ref[jj] = jnp.where(newly, n_acc1, save_ref[jj])
                    return _

                loop(k, mark, None)

            y_old, y = y, where(accept, y1, y)
            st = where(accept, st1, st) if fsal else None
            if events:
                y, st, h_next, jptr, sptr, finished = _events(
                    is_jump, accept, node, y_old, y, st, h, h_next, t_new, n_acc1, jptr, sptr)
            else:
                finished = accept & (t_new >= t1)
            active = ~held & ~finished
            tiny = 10 * eps * jnp.maximum(jnp.abs(t_new), jnp.abs(t))
            underflow = active & (h_next <= tiny)
            over = active & ((n_acc1 >= max_steps) | (n_acc1 + n_rej1 >= cap))
            status = jnp.where(underflow, jnp.where(jnp.isfinite(err), int(Status.STEP_UNDERFLOW),
                                                    int(Status.NONFINITE)), status)
            status = jnp.where(over & ~underflow, int(Status.MAX_STEPS), status)
            return (jnp.where(accept, t_new, t), y, jnp.where(held, h, h_next), st,
                    jnp.where(accept, jnp.maximum(err, 1e-4), err_prev), n_acc1, n_rej1,
                    new_ptr, status.astype(jnp.int32),
                    ((done != 0) | finished | underflow | over).astype(jnp.int32), iters + 1,
                    jptr, sptr)

        def _events(is_jump, accept, node, y_old, y, st, h, h_next, t_new, n_acc1, jptr, sptr):
            """`gradsolve.drivers.batched._record_events` on a block: the jump applied at
            its node, the tstops passed, the carried stage restarted after either."""
            size = [loop(J, lambda jj, acc, q=q: jnp.where(jptr == jj, js_ref[jj, q], acc),
                         jnp.zeros_like(t_new)) for q in range(d)]
            y = LaneArray(jnp.where(is_jump, a + s_, b)
                          for a, s_, b in zip(y_old.rows, size, y.rows))

            @pl.when(any_lane(is_jump))
            def _jump_nodes():
                def mark(jj, _):
                    jidx_ref[jj] = jnp.where(is_jump & (jptr == jj), n_acc1, jidx_ref[jj])
                    return _

                loop(J, mark, None)

            jptr = jptr + is_jump.astype(jnp.int32)
            sptr1 = jnp.where(accept, _count_reached(stop_ref, L, t_new, jnp.zeros_like(sptr)),
                              sptr)

            @pl.when(any_lane(sptr1 > sptr))
            def _stop_nodes():
                def mark(ll, _):
                    newly = (ll >= sptr) & (ll < sptr1)
                    sidx_ref[ll] = jnp.where(newly, n_acc1, sidx_ref[ll])
                    return _

                loop(L, mark, None)

            reset = is_jump | (sptr1 > sptr)
            if fsal:
                def restart(st):
                    return where(reset, solver.init(field, t_new, y, p), st)

                st = jax.lax.cond(any_lane(reset), restart, lambda st: st, st)
            h_next = jnp.where(is_jump, h, h_next)
            pending = _next_of(jt_ref, J, jptr, jnp.full_like(t_new, jnp.inf)) <= t_new
            finished = node & (t_new >= t1) & ~pending
            return y, st, h_next, jptr, sptr1, finished

        out = jax.lax.while_loop(cond, attempts, load())
        store(out)

        @pl.when(j == n_chunks - 1)
        def _finish():
            t, y, h, _, _, n_acc, n_rej, _, status, done = out[:10]
            nacc_ref[...] = n_acc
            nrej_ref[...] = n_rej
            status_ref[...] = jnp.where(done == 0, int(Status.MAX_STEPS), status)
            h_ref[...] = h
            write(y_ref, y)
            t_ref[...] = t

    return kernel


def _at_least_one(x, fill):
    """``x (n, m, ...)`` with ``m`` at least one (a padded, inert entry)."""
    if x.shape[1]:
        return x
    return jnp.full((x.shape[0], 1) + x.shape[2:], fill, x.dtype)


def _record_call(kernel, window: Window, d: int, P: int, k_in: int, counts, interpret: bool):
    """The record kernel as a function of per-trajectory inputs ``scal (n, 4)``, ``h0
    (n,)``, ``y0 (n, d)``, ``params (n, P)``, ``ts (n, k_in)`` (and the padded events: jump
    times ``(n, J)``, sizes ``(n, J, d)``, tstops ``(n, L)``) to per-trajectory outputs
    (node times ``(n, S1p)``, save nodes, counts, status, next step, final state and time;
    jump and tstop nodes). Under ``jax.vmap`` it runs once on the folded trajectories
    (`gradsolve.drivers.pallas._fold`): each lane keeps its own step loop, so the meshes are
    the per-call ones."""
    rows = window.rows

    def call(scal, h0, y0, pf, ts_in, *ev_in):
        n = y0.shape[0]
        dtype = y0.dtype
        blocks = blocks_for(n, rows)
        nr = blocks.n_rows

        def spec(*lead):
            return pl.BlockSpec((*lead, rows, 128), lambda b, j: (0,) * len(lead) + (b, 0))

        i32 = jnp.int32
        out_shape = (jax.ShapeDtypeStruct((window.s1p, nr, 128), dtype),
                     jax.ShapeDtypeStruct((k_in, nr, 128), i32),
                     jax.ShapeDtypeStruct((nr, 128), i32), jax.ShapeDtypeStruct((nr, 128), i32),
                     jax.ShapeDtypeStruct((nr, 128), i32), jax.ShapeDtypeStruct((nr, 128), dtype),
                     jax.ShapeDtypeStruct((d, nr, 128), dtype),
                     jax.ShapeDtypeStruct((nr, 128), dtype))
        in_specs = [spec(4), spec(), spec(d), spec(P), spec(k_in)]
        times_spec = pl.BlockSpec((window.chunk, rows, 128), lambda b, j: (j, b, 0))
        out_specs = [times_spec, spec(k_in), spec(), spec(), spec(), spec(), spec(d), spec()]
        args = [to_lanes(scal, blocks), to_lanes(h0, blocks), to_lanes(y0, blocks),
                to_lanes(pf, blocks), to_lanes(ts_in, blocks)]
        if ev_in:
            jt, js, stops = ev_in
            in_specs += [spec(counts[0]), spec(counts[0], d), spec(counts[1])]
            out_specs += [spec(counts[0]), spec(counts[1])]
            out_shape += (jax.ShapeDtypeStruct((counts[0], nr, 128), i32),
                          jax.ShapeDtypeStruct((counts[1], nr, 128), i32))
            args += [to_lanes(jt, blocks, fill=jnp.inf), to_lanes(js, blocks, fill=0.0),
                     to_lanes(stops, blocks, fill=jnp.inf)]
        scratch = [pltpu.VMEM((3 + 2 * d, rows, 128), dtype),
                   pltpu.VMEM((_STATE_INTS, rows, 128), i32)]
        run = pl.pallas_call(
            kernel, out_shape=out_shape,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0, grid=(blocks.n_blocks, window.n_chunks),
                in_specs=in_specs, out_specs=tuple(out_specs), scratch_shapes=scratch),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                                 vmem_limit_bytes=_VMEM_LIMIT),
            interpret=interpret)
        return tuple(from_lanes(o, blocks) for o in run(*args))

    return fold_vmap(call)


def pallas_record(field: BlockField, f, solver, controller, t0, t1, y0, params, ts, rtol, atol,
                  dt0, max_steps: int, fill: bool, interpret: bool, events=None,
                  vmem_budget: int | None = None) -> Mesh:
    """The record of batched inputs ``y0 (n, d)``, ``ts (n, k)`` (no validation) by the
    record kernel, as a `gradsolve.Mesh` like the XLA record's; ``events``: ``None`` or
    the validated `gradsolve._events.Events`; ``vmem_budget``: the bytes of VMEM a block may
    take (`record_window`; default half the VMEM limit)."""
    sg = jax.lax.stop_gradient
    t0, t1, y0, params, ts, events = jax.tree_util.tree_map(sg, (t0, t1, y0, params, ts,
                                                                 events))
    n, d = y0.shape
    k = ts.shape[1]
    dtype = y0.dtype
    s1 = max_steps + 1
    leaves = flatten_spec(params)[0]
    pf = flat_params(leaves, n, dtype)
    P = max(pf.shape[1], 1)
    if not pf.shape[1]:
        pf = jnp.zeros((n, 1), dtype)
    ev = events if events is not None else empty_events(n, d, dtype)
    k_in = max(k, 1)
    counts = None
    if events is not None:
        counts = (max(ev.n_jumps, 1), max(ev.tstops.shape[1], 1))
    window = record_window(s1, d, P, k_in, jnp.dtype(dtype).itemsize, counts, vmem_budget)
    y_start = y0
    if ev.n_jumps:
        # With jumps at t0 the first step is taken from the jumped state: pick h0 there.
        y_start = y0 + jnp.sum(jnp.where((ev.jump_times <= t0)[..., None], ev.jump_sizes, 0.0),
                               axis=1)
    if dt0 is None:
        h0 = jax.vmap(lambda y, q: initial_step(f, t0, y, q, solver.error_order, rtol, atol))(
            y_start, params)
    else:
        h0 = jnp.broadcast_to(jnp.asarray(dt0, dtype), (n,))
    scal = jnp.broadcast_to(jnp.stack([jnp.asarray(x, dtype) for x in (t0, t1, rtol, atol)]),
                            (n, 4))
    ts_in = ts if k else jnp.broadcast_to(jnp.asarray(t1, dtype), (n, 1))
    kernel = _record_kernel(field, kernel_solver(solver), controller, d, P, k_in if k else 0,
                            max_steps, 4 * max_steps + 64, window, counts)
    call = _record_call(kernel, window, d, P, k_in, counts, interpret)
    ev_in = ()
    if events is not None:
        ev_in = (_at_least_one(ev.jump_times.astype(dtype), jnp.inf),
                 _at_least_one(ev.jump_sizes.astype(dtype), 0.0),
                 _at_least_one(ev.tstops.astype(dtype), jnp.inf))
    outs = call(scal, h0.astype(dtype), y0, pf, ts_in.astype(dtype), *ev_in)
    times, save, n_steps, n_rej, status, dt_next, y_last, t_last = outs[:8]
    if events is not None:
        jump_index = outs[8][:, :ev.n_jumps]
        tstop_index = outs[9][:, :ev.tstops.shape[1]]
    else:
        jump_index = tstop_index = jnp.zeros((n, 0), jnp.int32)
    times = times[:, :s1]
    if fill:
        times = jnp.where(jnp.arange(s1)[None] > n_steps[:, None], t_last[:, None], times)
    return Mesh(
        times=times, n_steps=n_steps, n_rejected=n_rej, status=status,
        save_index=save[:, :k], ts=ts, t0=t0, t1=t1, dt_next=dt_next, y_last=y_last, y0=y0,
        jump_times=ev.jump_times, jump_sizes=ev.jump_sizes, jump_index=jump_index,
        tstops=ev.tstops, tstop_index=tstop_index, params=params, solver=solver, rtol=rtol,
        atol=atol, controller=controller)
