"""The replay and its exact discrete adjoint as two Pallas kernels.

Both kernels run on a grid ``(blocks, chunks)``: a block is ``rows * 128`` trajectories
(`gradsolve.drivers.pallas._layout`), a chunk ``C`` consecutive steps of the mesh. The
solver state (and the adjoint state) stays in VMEM scratch across a block's chunks; the node
times come in, and the node states go out, one chunk at a time, pipelined by Pallas. The
chunk axis runs only as far as the block's longest trajectory: its index maps clamp the chunk
at the block's last one (a scalar-prefetched count), so the chunks past it repeat the same
block index, which Pallas neither fetches nor writes again, and their body is skipped. A
mesh with spare capacity (recorded under ``jit``) therefore costs the steps taken, and a
block waits only for its own slowest lane.

- **Forward** (`forward`): the steps ``i`` of a chunk, masked per lane past its ``n_eff``
  (as the lanes replay, `gradsolve.drivers.lanes`); the state at each node is written out
  (the adjoint's checkpoints). After a chunk, each save slot whose nodes (over the block's
  lanes: a prefetched range) meet the chunk's takes the state at its node by masked selects
  over the chunk's rows: a per-lane index into the nodes would be a gather, which Mosaic
  does not lower, and doing it per chunk, for the slots in range, costs a few selects per
  step instead of ``k``. The adjoint injects the save slots' cotangents the same way.
- **Adjoint** (`backward`): the chunks in reverse, each step's VJP applied to the adjoint
  state, the step's stages recomputed from its stored node state (checkpointing at every
  node, as the compiled CPU kernel and the lanes replay do). With FSAL the carried first
  stage is recomputed as the previous step computed it (at ``t_prev + c_s (ta - t_prev)``),
  so the adjoint is the exact discrete adjoint of the forward's arithmetic. The VMEM
  scratch holds the adjoint state ``lambda`` and the parameter cotangents; node-time
  cotangents (moved save times) are finished one node behind the step (each step touches
  nodes ``i - 1``, ``i``, ``i + 1``), so every write stays in the current chunk.

Known-time events (``jumps=``, ``tstops=``, doses) follow the lanes replay's semantics in
its arithmetic (`gradsolve.drivers.pallas._events`): a step applies its start node's jump
and restarts the FSAL stage there before stepping (the node's stored state is the one
before the jump; the final node's jumps come after the last step); the adjoint recomputes
both from the stored state and hands each jump size the cotangent of the state after its
node. Jump times reach the node times by comparison (`_events.event_nodes`), and their
cotangents come back through that function's VJP.

`pallas_replay` pairs them through `gradsolve.drivers._adjoint.adjoint_replay` (as the
compiled CPU kernel and the lanes replay do): reverse mode runs the adjoint kernel
(``pallas_call`` itself has no reverse-mode rule; the pair is a ``custom_jvp`` whose
tangent is transposed into the adjoint, which keeps forward mode and second derivatives
working through the batched driver's JAX derivatives of the same steps, where a
``custom_vjp`` would forbid them). The XLA work around the kernels is layout (transposes
to and from ``(..., rows, 128)``) and, for moved save times, node times built by
comparison rather than a scatter (`moved_nodes`), and the node states handed from the
forward to the adjoint trajectory first (``(n, S * d)``: a transpose each way unless XLA
cancels the pair, where ``n`` fills its blocks; a residual
with a trajectory axis lets ``jax.vmap`` fold the mapped calls into one, `_fold`, and holds
``n`` trajectories rather than the padded lanes).

Measured on a TPU v5e (Lotka–Volterra, Tsit5, float32, 32,768 trajectories, ~67 steps;
``benchmarks/bench_accelerator.py``, ``benchmarks/results/tpu_v5e_pallas.log``): forward
kernel 1.0 ms, adjoint kernel 1.1 ms (32 rows; 16 rows 1.15/1.26, 8 rows 1.46/1.53; 16-step
chunks no faster); the replay gradient 1.6 ms against 38.5 ms for the lanes replay and
1,326 ms for Diffrax's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..._savetimes import save_groups
from .._adjoint import adjoint_replay
from ..base import ReplayLayout, ReplayNodes, ReplayOutput
from ..lanes import LaneArray, recomputed_step
from ._field import BlockField, kernel_solver
from ._events import KernelEvents, event_nodes, lane_events
from ._fold import fold_vmap
from ._layout import Blocks, blocks_for, from_lanes, loop, pad_rows, to_lanes

CHUNK = 8  # steps per grid step of the chunk axis
ROWS = 32  # sublanes per block (fewer where the ensemble or VMEM is smaller)
_VMEM_LIMIT = 64 * 1024 * 1024


def error_norm(y_err: LaneArray, y0: LaneArray, y1: LaneArray, rtol, atol):
    """`gradsolve._controller.error_norm` over blocks (the lanes replay's form, term by
    term in the same order, so it equals theirs)."""
    acc = 0.0
    finite = True
    for e, a, b in zip(y_err.rows, y0.rows, y1.rows):
        r = e / (atol + rtol * jnp.maximum(jnp.abs(a), jnp.abs(b)))
        acc = acc + r * r
        finite = finite & jnp.isfinite(b)
    err = jnp.sqrt(acc / len(y_err.rows))
    return jnp.where(finite & jnp.isfinite(err), err, jnp.inf)


def where(c, a: LaneArray, b: LaneArray) -> LaneArray:
    """``jnp.where`` component by component."""
    return LaneArray(jnp.where(c, x, y) for x, y in zip(a.rows, b.rows))


def read(ref, count: int, *index) -> LaneArray:
    """``count`` blocks ``ref[*index, q]`` as a `LaneArray`."""
    return LaneArray(ref[(*index, q)] for q in range(count))


def write(ref, x: LaneArray, *index) -> None:
    """The components of ``x`` into ``ref[*index, q]``."""
    for q, row in enumerate(x.rows):
        ref[(*index, q)] = row


def _node_after(t_cur, t_nxt, r, chunk: int):
    """The node time after step ``r`` of a chunk: the chunk's next row, or the next
    chunk's first."""
    return jax.lax.cond(r + 1 < chunk, lambda: t_cur[jnp.minimum(r + 1, chunk - 1)],
                        lambda: t_nxt[0])


def _node_before(t_prv, t_cur, r, c, chunk: int):
    """The node time before step ``r`` of chunk ``c`` (node ``max(i - 1, 0)``)."""
    return jax.lax.cond(r >= 1, lambda: t_cur[jnp.maximum(r - 1, 0)],
                        lambda: jax.lax.cond(c > 0, lambda: t_prv[chunk - 1],
                                             lambda: t_cur[0]))


def _rows_for(blocks: Blocks, d: int, p: int, k: int, dtype, chunk: int, jumps: int = 0,
              resets: int = 0) -> int:
    """The rows per block the replay uses: ``blocks.rows`` unless the per-block buffers
    (double-buffered save slots and their cotangents, parameters, chunks of node times and
    states, jump sizes and their cotangents) would take more than half the VMEM limit."""
    rows = blocks.rows
    row_bytes = 128 * jnp.dtype(dtype).itemsize
    while rows > 8:
        per_block_rows = (k * d * 2 + k + p * 2 + chunk * (d + 4) + 4 * d
                          + jumps * (2 * d + 1) + resets)
        if 2 * row_bytes * rows * per_block_rows <= _VMEM_LIMIT // 2:
            break
        rows //= 2
    return rows


class Shapes:
    """Static sizes of one replay: ``d`` states, ``p`` parameters (at least one row, a
    zero one where the field has none), ``k`` save slots, ``s1p`` node rows (a multiple of
    the chunk), the blocks and the chunk; with known-time events (``events``) ``J`` jumps
    and ``R`` reset nodes per lane (at least one each: inert padding), else zero."""

    def __init__(self, n: int, d: int, p: int, k: int, s1: int, dtype, chunk: int | None = None,
                 rows: int | None = None, events: tuple[int, int] | None = None):
        chunk = CHUNK if chunk is None else chunk
        rows = ROWS if rows is None else rows
        self.d, self.p, self.k, self.chunk = d, max(p, 1), k, chunk
        self.events = events is not None
        self.J, self.R = (max(events[0], 1), max(events[1], 1)) if self.events else (0, 0)
        self.n_chunks = max(1, math.ceil(s1 / chunk))
        self.s1p = self.n_chunks * chunk
        blocks = blocks_for(n, rows)
        r = _rows_for(blocks, d, self.p, k, dtype, chunk, self.J, self.R)
        self.blocks = blocks if r == blocks.rows else blocks_for(n, r)

    def spec(self, *lead: int, chunked: str | None = None):
        """A block of ``(*lead, rows, 128)`` at the grid's block (``chunked``: and, on the
        leading axis, at the chunk ``"fwd"`` or ``"bwd"`` (the forward or reverse order of
        the chunk axis, clamped at the block's last chunk), or the one after (``"-next"``)
        or before (``"-prev"``) it)."""
        rows, nc = self.blocks.rows, self.n_chunks
        if chunked is None:
            return pl.BlockSpec((*lead, rows, 128), lambda b, j, *_: (0,) * len(lead) + (b, 0))

        def at(b, j, last, *_):
            lb = jnp.maximum(last[b], 0)
            c = jnp.minimum(j, lb) if chunked.startswith("fwd") else jnp.maximum(lb - j, 0)
            if chunked.endswith("next"):
                c = jnp.minimum(c + 1, nc - 1)
            elif chunked.endswith("prev"):
                c = jnp.maximum(c - 1, 0)
            return (c,) + (0,) * (len(lead) - 1) + (b, 0)

        return pl.BlockSpec((*lead, rows, 128), at)

    def event_specs(self):
        """The specs of the event inputs: jump nodes, jump sizes, reset nodes."""
        return [self.spec(self.J), self.spec(self.J, self.d), self.spec(self.R)]


def _call(kernel, shapes: Shapes, in_specs, out_specs, out_shape, scratch, interpret: bool):
    """``kernel`` on the grid ``(blocks, chunks)`` with prefetched scalar arrays (the
    blocks' last chunks, the save slots' node ranges and, with events, the events' node
    ranges: `_prefetch`); blocks are independent ("parallel"), a block's chunks run in
    order ("arbitrary")."""
    return pl.pallas_call(
        kernel, out_shape=out_shape,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3 if shapes.events else 2,
            grid=(shapes.blocks.n_blocks, shapes.n_chunks),
            in_specs=in_specs, out_specs=out_specs, scratch_shapes=scratch),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_VMEM_LIMIT),
        interpret=interpret)


def _save_span(span_ref, b, slot: int, k: int):
    """The smallest and largest node of save slot ``slot`` over block ``b``'s lanes."""
    at = (b * k + slot) * 2
    return span_ref[at], span_ref[at + 1]


def _split(refs, s: Shapes, n_in: int, n_out: int, n_ev_out: int):
    """A kernel's refs as ``(prefetch, inputs, event inputs, outputs, event outputs,
    scratch)``: the event groups (3 inputs, ``n_ev_out`` outputs) are empty without events
    (`_call`'s order: prefetched scalars, inputs, outputs, scratch; the event ones last of
    their kind)."""
    refs = list(refs)
    n_pre = 3 if s.events else 2
    n_ev_in, n_ev_out = (3, n_ev_out) if s.events else (0, 0)
    pre, refs = refs[:n_pre], refs[n_pre:]
    ins, ev_ins, refs = refs[:n_in], refs[n_in:n_in + n_ev_in], refs[n_in + n_ev_in:]
    outs, ev_outs, scratch = refs[:n_out], refs[n_out:n_out + n_ev_out], refs[n_out + n_ev_out:]
    return pre, ins, ev_ins, outs, ev_outs, scratch


def _forward_kernel(field: BlockField, solver, s: Shapes):
    """The forward kernel's body (module docstring): at chunk 0 the state and the FSAL
    stage from ``y0``, then ``C`` masked steps per chunk (each applying its start node's
    events first, `gradsolve.drivers.pallas._events`), the node states out, the save slots
    in range filled; at the last grid step the final state (after its node's jumps) and
    largest error ratio."""
    d, P, k, chunk = s.d, s.p, s.k, s.chunk
    fsal = solver.fsal

    def kernel(*refs):
        pre, ins, ev_ins, outs, _, scratch = _split(refs, s, 7, 4, 0)
        last_ref, span_ref = pre[:2]
        t_cur, t_nxt, neff_ref, y0_ref, p_ref, save_ref, tol_ref = ins
        ys_ref, y1_ref, err_ref, states_ref = outs
        y_s, st_s, e_s = scratch
        b, j = pl.program_id(0), pl.program_id(1)
        ev = KernelEvents(pre[2], *ev_ins, b, s.J, s.R) if s.events else None
        p = read(p_ref, P)
        n_eff = neff_ref[...]
        rtol, atol = tol_ref[0], tol_ref[1]

        @pl.when(j == 0)
        def _start():
            y0 = read(y0_ref, d)
            write(y_s, y0)
            if fsal:
                write(st_s, solver.init(field, t_cur[0], y0, p))
            e_s[...] = jnp.zeros_like(e_s)
            ys_ref[...] = jnp.zeros_like(ys_ref)

        @pl.when(j <= last_ref[b])
        def _steps():
            def body(r, carry):
                y, st, emax = carry
                i = j * chunk + r
                ta = t_cur[r]
                tb = _node_after(t_cur, t_nxt, r, chunk)
                active = i < n_eff
                h = jnp.where(active, tb - ta, jnp.zeros_like(ta))
                write(states_ref, y, r)  # the node's state before its jump
                if ev is not None:
                    live = active & (i >= 1)
                    y = ev.jumped(y, i, live)
                    if fsal:
                        st = ev.restart(solver, field, st, ta, y, p, i, live)
                y1, y_err, st1 = solver.step(field, ta, h, y, p, st)
                err = error_norm(y_err, y, y1, rtol, atol)
                emax = jnp.maximum(emax, jnp.where(active, err, jnp.zeros_like(err)))
                y = where(active, y1, y)
                st = where(active, st1, st) if fsal else None
                return y, st, emax

            carry = (read(y_s, d), read(st_s, d) if fsal else None, e_s[...])
            y, st, emax = loop(chunk, body, carry)
            write(y_s, y)
            if fsal:
                write(st_s, st)
            e_s[...] = emax
            # The save slots whose node is one of this chunk's (rows of states_ref): only
            # slots some lane of the block has here.
            first = j * chunk

            def save_slot(slot, _):
                lo, hi = _save_span(span_ref, b, slot, k)

                @pl.when((lo < first + chunk) & (hi >= first))
                def _save():
                    def pick(r, acc):
                        hit = save_ref[slot] == first + r
                        return [jnp.where(hit, states_ref[r, q], a) for q, a in enumerate(acc)]

                    acc = loop(chunk, pick, [ys_ref[slot, q] for q in range(d)])
                    for q in range(d):
                        ys_ref[slot, q] = acc[q]

                return _

            loop(k, save_slot, None)

        @pl.when(j == pl.num_programs(1) - 1)
        def _finish():
            y = read(y_s, d)
            # Slots at the final node (the chunk holding it may not have run), before its
            # jumps.
            def final_slot(slot, _):
                hit = save_ref[slot] == n_eff
                for q in range(d):
                    ys_ref[slot, q] = jnp.where(hit, y.rows[q], ys_ref[slot, q])
                return _

            loop(k, final_slot, None)
            if ev is not None:
                y = ev.jumped(y, n_eff, n_eff >= 1, guarded=False)
            write(y1_ref, y)
            err_ref[...] = e_s[...]

    return kernel


def forward(field: BlockField, solver, s: Shapes, interpret: bool, last, span, t_l, neff_l,
            y0_l, p_l, save_l, tol_l, ev_l=None):
    """The forward kernel on lanes-layout inputs (``ev_l``: the events,
    `gradsolve.drivers.pallas._events.LaneEvents`); returns ``ys (k, d, R, 128)``, ``y1``,
    ``err`` and the node states ``(s1p, d, R, 128)`` (only the chunks a block ran are
    written; a node's state is the one before its jump)."""
    d, k, rows = s.d, s.k, s.blocks.rows
    dtype = y0_l.dtype
    nr = s.blocks.n_rows
    out_shape = (jax.ShapeDtypeStruct((k, d, nr, 128), dtype),
                 jax.ShapeDtypeStruct((d, nr, 128), dtype),
                 jax.ShapeDtypeStruct((nr, 128), dtype),
                 jax.ShapeDtypeStruct((s.s1p, d, nr, 128), dtype))
    in_specs = [s.spec(s.chunk, chunked="fwd"), s.spec(s.chunk, chunked="fwd-next"), s.spec(),
                s.spec(d), s.spec(s.p), s.spec(k), s.spec(2)]
    out_specs = (s.spec(k, d), s.spec(d), s.spec(), s.spec(s.chunk, d, chunked="fwd"))
    scratch = [pltpu.VMEM((d, rows, 128), dtype), pltpu.VMEM((d, rows, 128), dtype),
               pltpu.VMEM((rows, 128), dtype)]
    pre, ev_in = (last, span), ()
    if s.events:
        in_specs += s.event_specs()
        pre, ev_in = (last, span, ev_l.spans), (ev_l.jump_index, ev_l.jump_sizes,
                                                ev_l.reset_index)
    call = _call(_forward_kernel(field, solver, s), s, in_specs, out_specs, out_shape,
                 scratch, interpret)
    return call(*pre, t_l, t_l, neff_l, y0_l, p_l, save_l, tol_l, *ev_in)


def _backward_kernel(field: BlockField, solver, s: Shapes, with_times: bool):
    """The adjoint kernel's body (module docstring): ``lambda`` from the final state's
    cotangent, then per chunk (in reverse) the save slots' cotangents injected and ``C``
    step VJPs; ``with_times`` adds the node-time cotangents. With events, a step first
    hands ``lambda`` (the cotangent of the state after its end node) to the jumps there,
    and recomputes its start node's jump and reset as the forward applied them."""
    d, P, k, chunk = s.d, s.p, s.k, s.chunk
    unit = recomputed_step(field, solver)

    def kernel(*refs):
        pre, ins, ev_ins, outs, ev_outs, scratch = _split(refs, s, 9, 4, 1)
        last_ref, span_ref = pre[:2]
        t_prv, t_cur, t_nxt, neff_ref, p_ref, save_ref, states_ref, ctys_ref, cty1_ref = ins
        cty0_ref, ctp_ref, u_ref, p0_ref = outs
        lam_s, gp_s, pq_s, inj_s = scratch
        b, j = pl.program_id(0), pl.program_id(1)
        ev = KernelEvents(pre[2], *ev_ins, b, s.J, s.R) if s.events else None
        last = last_ref[b]
        c = jnp.maximum(last - j, 0)
        p = read(p_ref, P)
        n_eff = neff_ref[...]

        @pl.when(j == 0)
        def _start():
            for q in range(d):
                lam_s[q] = cty1_ref[q]
            gp_s[...] = jnp.zeros_like(gp_s)
            pq_s[...] = jnp.zeros_like(pq_s)
            if ev is not None:
                ev_outs[0][...] = jnp.zeros_like(ev_outs[0])

        @pl.when(j <= last)
        def _steps():
            first = c * chunk
            # The save slots' cotangents at this chunk's step ends (inj_s[r]: node
            # first + r + 1; equal save times add), from the slots some lane has here.
            inj_s[...] = jnp.zeros_like(inj_s)

            def inject_slot(slot, _):
                lo, hi = _save_span(span_ref, b, slot, k)

                @pl.when((lo <= first + chunk) & (hi > first))
                def _inject():
                    def add(r, _):
                        hit = save_ref[slot] == first + r + 1
                        for q in range(d):
                            inj_s[r, q] = inj_s[r, q] + jnp.where(
                                hit, ctys_ref[slot, q], jnp.zeros_like(ctys_ref[slot, q]))
                        return _

                    loop(chunk, add, None)

                return _

            loop(k, inject_slot, None)

            def body(rr, carry):
                lam, gp, pc, qc = carry  # lam: cotangent of the state after node i + 1
                r = chunk - 1 - rr
                i = first + r
                active = i < n_eff
                tp = _node_before(t_prv, t_cur, r, c, chunk)
                ta = t_cur[r]
                tb = _node_after(t_cur, t_nxt, r, chunk)
                y = read(states_ref, d, r)
                reset = None
                if ev is not None:
                    ev.take_cotangents(ev_outs[0], lam, i + 1, active)
                    y = ev.jumped(y, i, active)
                    reset = ev.reset(i, ta)
                _, vjp = jax.vjp(lambda *a: unit(*a, reset), y, p, tp, ta, tb)
                # The state at node i + 1 before its jump feeds the saves there and the
                # next step.
                dy, dp, dtp, dta, dtb = vjp(lam + read(inj_s, d, r))
                lam = where(active, dy, lam)
                gp = where(active, gp + dp, gp)
                if with_times:
                    zero = jnp.zeros_like(ta)
                    dtp, dta, dtb = (jnp.where(active, x, zero) for x in (dtp, dta, dtb))
                    # node i + 1 is finished: this step's dtb, the next step's dta and the
                    # one after's dt_prev (carried as pc)
                    u_ref[r] = dtb + pc
                    pc, qc = dta + qc, dtp
                return lam, gp, pc, qc

            carry = (read(lam_s, d), read(gp_s, P), pq_s[0], pq_s[1])
            lam, gp, pc, qc = loop(chunk, body, carry)
            write(lam_s, lam)
            write(gp_s, gp)
            pq_s[0] = pc
            pq_s[1] = qc

        @pl.when(j == pl.num_programs(1) - 1)
        def _finish():
            def at_zero(slot, acc):
                hit = save_ref[slot] == 0
                return [a + jnp.where(hit, ctys_ref[slot, q], jnp.zeros_like(a))
                        for q, a in enumerate(acc)]

            at0 = loop(k, at_zero, [lam_s[q] for q in range(d)])
            for q in range(d):
                cty0_ref[q] = at0[q]
            for q in range(P):
                ctp_ref[q] = gp_s[q]
            # node 0: the first step's dta and dt_prev (node max(i - 1, 0) = 0)
            p0_ref[...] = pq_s[0] + pq_s[1]

    return kernel


def backward(field: BlockField, solver, s: Shapes, interpret: bool, with_times: bool, last,
             span, t_l, neff_l, p_l, save_l, states_l, ctys_l, cty1_l, ev_l=None):
    """The adjoint kernel; returns ``ct_y0 (d, R, 128)``, ``ct_p (P, R, 128)``, the
    node-time cotangents one node behind (``u[i]`` is node ``i + 1``'s, ``(s1p, R, 128)``,
    written for the chunks a block ran), node 0's ``(R, 128)`` and, with events
    (``ev_l``), the jump sizes' cotangents ``(J, d, R, 128)``."""
    d, rows = s.d, s.blocks.rows
    dtype = p_l.dtype
    nr = s.blocks.n_rows
    out_shape = (jax.ShapeDtypeStruct((d, nr, 128), dtype),
                 jax.ShapeDtypeStruct((s.p, nr, 128), dtype),
                 jax.ShapeDtypeStruct((s.s1p if with_times else s.chunk, nr, 128), dtype),
                 jax.ShapeDtypeStruct((nr, 128), dtype))
    in_specs = [s.spec(s.chunk, chunked="bwd-prev"), s.spec(s.chunk, chunked="bwd"),
                s.spec(s.chunk, chunked="bwd-next"), s.spec(), s.spec(s.p), s.spec(s.k),
                s.spec(s.chunk, d, chunked="bwd"), s.spec(s.k, d), s.spec(d)]
    u_spec = s.spec(s.chunk, chunked="bwd") if with_times else s.spec(s.chunk)
    out_specs = (s.spec(d), s.spec(s.p), u_spec, s.spec())
    scratch = [pltpu.VMEM((d, rows, 128), dtype), pltpu.VMEM((s.p, rows, 128), dtype),
               pltpu.VMEM((2, rows, 128), dtype), pltpu.VMEM((s.chunk, d, rows, 128), dtype)]
    pre, ev_in = (last, span), ()
    if s.events:
        in_specs += s.event_specs()
        out_shape += (jax.ShapeDtypeStruct((s.J, d, nr, 128), dtype),)
        out_specs += (s.spec(s.J, d),)
        pre, ev_in = (last, span, ev_l.spans), (ev_l.jump_index, ev_l.jump_sizes,
                                                ev_l.reset_index)
    call = _call(_backward_kernel(field, solver, s, with_times), s, in_specs, out_specs,
                 out_shape, scratch, interpret)
    return call(*pre, t_l, t_l, t_l, neff_l, p_l, save_l, states_l, ctys_l, cty1_l, *ev_in)


def _prefetch(neff_l, save_l, s: Shapes):
    """The scalars the kernels prefetch: per block, the index of its last chunk with a step
    to take (-1: none), and per block and save slot the smallest and largest node over
    its lanes (flat, ``(blocks * k * 2,)``)."""
    nb = s.blocks.n_blocks
    nmax = jnp.max(neff_l.reshape(nb, -1), axis=1)
    last = jnp.where(nmax > 0, (nmax - 1) // s.chunk, -1).astype(jnp.int32)
    per_block = save_l.reshape(s.k, nb, -1)
    span = jnp.stack([jnp.min(per_block, axis=2), jnp.max(per_block, axis=2)], axis=-1)
    return last, jnp.swapaxes(span, 0, 1).reshape(-1).astype(jnp.int32)


def moved_nodes(times, save, tsave, subst):
    """`gradsolve._savetimes.node_times` without its scatter (a scatter of ``n * k``
    entries, slow on a TPU): ``(nodes (n, S1), owner (n, k))``, node ``m`` of each
    trajectory at the save time of the slot that owns it (moved, the first of equal save
    times), found by comparing every node with every slot (elementwise, fused)."""
    owner = subst.astype(bool) & (save_groups(save) == jnp.arange(save.shape[1]))
    moves = _one_hot(save, times.shape[1]) & owner[:, None, :]
    new = jnp.sum(jnp.where(moves, tsave[:, None, :].astype(times.dtype), 0.0), axis=2)
    return jnp.where(jnp.any(moves, axis=2), new, times), owner


def _one_hot(save, s1: int):
    """``(n, S1, k)``: is node ``m`` the node of save slot ``j``."""
    return save[:, None, :] == jnp.arange(s1)[None, :, None]


def pallas_replay(field: BlockField, f, solver, nodes: ReplayNodes, y0, params, rtol, atol,
                  moved: bool, layout: ReplayLayout, interpret: bool) -> ReplayOutput:
    """The Pallas replay of ``nodes`` (known-time events included), differentiable in
    every mode (`gradsolve.drivers._adjoint.adjoint_replay`)."""
    d = y0.shape[1]
    k, s1 = nodes.save_index.shape[1], nodes.times.shape[1]
    step = kernel_solver(solver)  # what the kernels step with (a Rosenbrock step on blocks)
    ev0 = nodes.events
    counts = None if ev0 is None else (ev0.jump_index.shape[1], ev0.reset_index.shape[1])

    def node_fn(times, save, tm, subst, ev):
        """The replayed node times: moved save times, then jump times (as the lanes
        replay's `node_times` and `jump_node_times`, by comparison)."""
        node_t = moved_nodes(times, save, tm, subst)[0] if moved else times
        return node_t if ev is None else event_nodes(node_t, ev)

    def prepare(times, n_eff, pf, save, tm, subst, ev):
        # n from the inputs: under jax.vmap the calls run on the folded trajectories
        s = Shapes(times.shape[0], d, pf.shape[1], k, s1, times.dtype, events=counts)
        bl = s.blocks
        t_l = to_lanes(pad_rows(node_fn(times, save, tm, subst, ev), s.chunk, axis=1), bl)
        neff_l = to_lanes(n_eff.astype(jnp.int32), bl, fill=0)
        pf = pf if pf.shape[1] else jnp.zeros((times.shape[0], 1), times.dtype)
        p_l = to_lanes(pf, bl)
        save_l = to_lanes(jnp.minimum(save, n_eff[:, None]).astype(jnp.int32), bl)
        ev_l = None if ev is None else lane_events(ev, bl, times.dtype)
        return s, t_l, neff_l, p_l, save_l, ev_l

    def fwd(times, n_eff, y, pf, save, tol, tm, subst, ev=None):
        s, t_l, neff_l, p_l, save_l, ev_l = prepare(times, n_eff, pf, save, tm, subst, ev)
        bl = s.blocks
        last, span = _prefetch(neff_l, save_l, s)
        ys, y1, err, states = forward(field, step, s, interpret, last, span, t_l, neff_l,
                                      to_lanes(y, bl), p_l, save_l, to_lanes(tol, bl), ev_l)
        ys = from_lanes(ys, bl)                                          # (n, k, d)
        per_block = (last + 1) * s.chunk
        cost = jnp.repeat(per_block, bl.rows * 128)[:bl.n].astype(jnp.int32)
        # The node states go to the adjoint trajectory first, (n, s1p * d): a residual
        # with a trajectory axis folds under jax.vmap (`_fold`) and holds n trajectories,
        # not the padded lanes. A transpose each way; where n fills its blocks and both
        # passes are one program, XLA cancels the pair (none left in the compiled gradient
        # of 1,024 trajectories on CPU; one each way for 1,000).
        states = from_lanes(states.reshape((s.s1p * d,) + states.shape[2:]), bl)
        return ys, from_lanes(y1, bl), from_lanes(err, bl), states, cost

    def bwd(times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst, with_times, ev=None):
        p_size = pf.shape[1]
        s, t_l, neff_l, p_l, save_l, ev_l = prepare(times, n_eff, pf, save, tm, subst, ev)
        bl = s.blocks
        states_l = to_lanes(states, bl).reshape((s.s1p, d, bl.n_rows, 128))
        last, span = _prefetch(neff_l, save_l, s)
        ctys_l = to_lanes(ct_ys, bl, fill=0)
        outs = backward(field, step, s, interpret, with_times, last, span, t_l, neff_l, p_l,
                        save_l, states_l, ctys_l, to_lanes(ct_y1, bl, fill=0), ev_l)
        ct_y0, ct_p, u, p0 = outs[:4]
        ct_y0 = from_lanes(ct_y0, bl)
        ct_pf = from_lanes(ct_p, bl)[:, :p_size]
        if with_times:
            u = from_lanes(u, bl)                                        # (n, s1p)
            ct_t = jnp.concatenate([from_lanes(p0, bl)[:, None], u[:, :s1 - 1]], axis=1)
            ct_t = jnp.where(jnp.arange(s1)[None] <= n_eff[:, None], ct_t, 0.0)
        if ev is None:
            if not with_times:
                return jnp.zeros(save.shape, ct_y1.dtype), ct_y0, ct_pf
            owner = moved_nodes(times, save, tm, subst)[1]
            # each owning slot takes its node's cotangent (one-hot over the nodes: no gather)
            at_slot = jnp.sum(jnp.where(_one_hot(save, s1), ct_t[:, :, None], 0.0), axis=1)
            return jnp.where(owner, at_slot, 0.0), ct_y0, ct_pf
        # A jump size's cotangent is that of the state after its node; padded jumps
        # (index 0) get none.
        n_jumps = ev.jump_index.shape[1]
        ct_js = from_lanes(outs[4], bl)[:, :n_jumps]                      # (n, J, d)
        ct_js = jnp.where((ev.jump_index > 0)[..., None], ct_js, 0.0)
        if with_times:
            # Node-time cotangents back to the save times and jump times that set them.
            _, back = jax.vjp(lambda a, t: node_fn(times, save, a, subst,
                                                   ev._replace(jump_times=t)),
                              tm, ev.jump_times)
            ct_tm, ct_jt = back(ct_t)
        else:
            ct_tm = jnp.zeros(save.shape, ct_y1.dtype)
            ct_jt = jnp.zeros(ev.jump_times.shape, ct_y1.dtype)
        return ct_tm, ct_y0, ct_pf, ct_jt, ct_js

    # Under jax.vmap each runs once on the C * n trajectories of the mapped calls (`_fold`).
    fwd_folded = fold_vmap(fwd)
    bwd_folded = {w: fold_vmap(lambda *a, w=w: bwd(*a[:9], w, *a[9:])) for w in (False, True)}

    def bwd_call(times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst, with_times, *ev):
        return bwd_folded[with_times](times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst,
                                      *ev)

    return adjoint_replay(fwd_folded, bwd_call, f, solver, nodes, y0, params, rtol, atol,
                          layout, moved)
