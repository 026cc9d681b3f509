"""`replay`: a fixed-step pass over a recorded mesh, differentiable in every mode.

The replay calls the very ``solver.step`` the record accepted, over the recorded step
times, so at the recording ``y0``/``params`` it reproduces the record's states, and its
derivative is the exact discrete adjoint of those steps: the gradient Diffrax's default
``RecursiveCheckpointAdjoint`` returns (its controller also stops gradients through step
sizes), but from a fixed-length chain.

Two drivers run the same steps:

- On CPU, for explicit Runge–Kutta solvers, the **compiled kernel** (`gradsolve._kernel`):
  the vector field is translated to C++ and the replay and its exact discrete adjoint run
  through ``jax.ffi`` (several times faster, see ``benchmarks/README.md``). It falls back to
  the XLA driver wherever it does not apply, and forward-mode and second derivatives are
  defined through the XLA driver, so every transform works either way.
  `gradsolve.use_compiled_kernel` switches it off.
- The **XLA driver** below, used on GPU, for stiff and Diffrax solvers, and as the fallback.
  Its reverse mode for explicit Runge–Kutta solvers is the **lanes replay**
  (`gradsolve._lanes`: structure-of-arrays steps and a hand-written adjoint, ~2x faster on
  CPU and a few fusions per step instead of ~100); forward-mode and second derivatives,
  and solvers or vector fields the lanes replay does not handle, use the batched driver
  below. ``GRADSOLVE_LANES=0`` switches the lanes replay off.

XLA driver design:

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
  gradient. The default group size depends on the backend (`default_group_size`): groups
  run one after another, which pays on CPU (cache-sized groups) and costs on an
  accelerator (each group is a sequence of kernel launches).
- Plain ``scan``/``cond``/``checkpoint`` means reverse mode, forward mode (``jvp``,
  ``jacfwd``, ``hessian``) and ``vmap`` all work with no custom rules.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PyTree

from ._checks import batch, check_vector_field, is_concrete, split_static
from ._config import kernel_enabled, lanes_enabled
from ._controller import error_norm
from ._misc import length_groups, tree_where
from ._mesh import Mesh, Status, _as_batched
from ._solution import Solution
from ._kernel import kernel_replay, kernel_target
from ._lanes import lane_field, lanes_replay
from ._solver.diffrax_adapter import DiffraxSolver

_sg = jax.lax.stop_gradient

_GROUP_SIZE_CPU = 256
_GROUP_SIZE_LANES_CPU = 1024
_GROUP_SIZE_ACCELERATOR = 1 << 17


def default_group_size(backend: str | None = None, *, lanes: bool = False) -> int:
    """Trajectories per length-sorted group of the XLA replay on ``backend`` (default:
    ``jax.default_backend()``).

    Groups run one after another (``lax.map``). On CPU that is what we want: a group keeps
    a step's working set in cache, and a ragged ensemble replays only as many steps as each
    group's longest member. 256 is the measured compromise (kernel off, replay gradient):
    within 10 % of the best width on uniform ensembles (LV, Lorenz at 1,000 and 10,000,
    Robertson), where 64 is 1.3-1.5x slower, and as fast as 64 on 1,000 lynx-hare prior
    draws (22-311 steps each), where 1,024 is 1.7x slower. On GPU and TPU one step of a group is a few
    kernel launches whose time hardly depends on the group's width until the device is
    full (~10^5 small states), so narrow groups would only multiply launches: there the
    default is 131,072, a single group for most ensembles. ``lanes=True``: the lanes replay
    of explicit solvers (`gradsolve._lanes`), whose steps are a few large fusions, prefers
    wider groups on CPU: 1,024 (LV n = 1,000 gradient: 18 ms against 24 ms at 256).
    """
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu":
        return _GROUP_SIZE_ACCELERATOR
    return _GROUP_SIZE_LANES_CPU if lanes else _GROUP_SIZE_CPU


def _replay_block(
    f, solver, times: Float[Array, "g S1"], n_eff: Int[Array, " g"], y0: Float[Array, "g d"],
    params: PyTree, save_index: Int[Array, "g k"], rtol, atol, chunk: int,
):
    """Replay one group of trajectories. Returns ``(ys (g,k,d), y1 (g,d), err (g,), work)``."""
    g, d = y0.shape
    k = save_index.shape[1]
    s1 = times.shape[1]
    n_chunks = max(1, math.ceil((s1 - 1) / chunk))
    per_block = math.isqrt(n_chunks - 1) + 1  # ceil(sqrt(n_chunks))
    n_blocks = math.ceil(n_chunks / per_block)
    span = per_block * chunk  # steps per block
    n_steps = n_blocks * span
    n_max = jnp.max(n_eff)
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
        return (y, st, emax), y

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
    chunk_size: int,
):
    """Replay batched inputs, grouping trajectories of similar length."""
    n = y0.shape[0]
    if n <= group_size:
        return _replay_block(f, solver, times, n_eff, y0, params, save_index, rtol, atol,
                             chunk_size)
    group, ungroup, n_pad = length_groups(n_eff, group_size)
    args = jax.tree_util.tree_map(group, (times, n_eff, y0, params, save_index))

    def body(a):
        return _replay_block(f, solver, *a, rtol, atol, chunk_size)

    ys, y1, emax, work = jax.lax.map(body, args)
    return ungroup(ys), ungroup(y1), ungroup(emax), jnp.sum(work) * n / n_pad


def replay(
    f,
    mesh: Mesh,
    y0,
    params,
    *,
    ts=None,
    group_size: int | None = None,
    chunk_size: int = 8,
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
            ``f(t, y)`` added. A save time moved past a neighbouring mesh node is a
            ``ValueError``; under ``jit`` that trajectory gives NaN and
            ``stats["status"] == Status.INVALID_INPUT``.
        group_size: trajectories per length-sorted group (ragged ensembles; XLA driver);
            ``None`` picks `default_group_size` for the backend (on CPU 256, or 1,024
            for the lanes replay of explicit solvers; one group of up to 131,072 on
            GPU/TPU).
        chunk_size: steps per skippable, rematerialised chunk (XLA driver).

    Returns:
        `Solution` with ``ys (n, k, d)``, ``y1``, ``error_ratio (n,)``, ``stats``.
        Trajectories whose record failed give NaN.

    Differentiable in reverse and forward mode w.r.t. ``y0``, every leaf of ``params`` and
    ``ts``; works under ``jit`` and ``vmap``. On CPU with an explicit solver it runs the
    compiled kernel (``Solution.route == "gradsolve-kernel"``; see
    `use_compiled_kernel`), elsewhere the XLA driver (``"gradsolve-replay"``).

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, ts=ts)
        >>> loss = lambda p: jnp.sum(gs.replay(f, mesh, y0, p).ys ** 2)
        >>> g = jax.grad(loss)(params)
    """
    where = "gs.replay"
    if not isinstance(mesh, Mesh):
        raise ValueError(f"{where}: `mesh` must be a gs.Mesh from gs.record, got {type(mesh).__name__}.")
    bm = _as_batched(mesh)
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
    if ts is not None and is_concrete(b.ts, bm.times):
        # Concrete inputs may still sit inside a jit/vmap trace (a mesh and ts closed
        # over): evaluate the check now, on the host, rather than staging it out.
        with jax.ensure_compile_time_eval():
            _check_moved_ts(bm, b.ts)
    return replay_prepared(f, mesh, b, ts is not None, group_size, chunk_size)


def replay_prepared(f, mesh: Mesh, b, ts_given: bool, group_size: int, chunk_size: int,
                    check_moved: bool = True) -> Solution:
    """Replay validated, batched inputs ``b`` (see `gradsolve._checks.batch`).
    ``check_moved=False`` skips the on-device check of moved save times (`gradsolve.solve`,
    whose ``ts`` are the recorded nodes)."""
    use_kernel = kernel_enabled() and kernel_target(f, mesh.solver, b.y0, b.params) is not None
    if not (group_size is None or isinstance(group_size, (int, np.integer)) and group_size >= 1):
        raise ValueError(f"`group_size` must be a positive int or None, got {group_size!r}.")
    if not (isinstance(chunk_size, (int, np.integer)) and chunk_size >= 1):
        raise ValueError(f"`chunk_size` must be a positive int, got {chunk_size!r}.")
    lanes_group = None
    if lanes_enabled():
        lanes_group = default_group_size(lanes=True) if group_size is None else group_size
    group_size = default_group_size() if group_size is None else group_size
    ys, y1, err, work, out_ts, status = _replay_core(
        f, mesh, b.y0, b.params, b.ts if ts_given else None, group_size, chunk_size, use_kernel,
        lanes_group, check_moved,
    )
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
    route = "gradsolve-kernel" if use_kernel else "gradsolve-replay"
    if isinstance(mesh.solver, DiffraxSolver):
        route += f"/diffrax.{type(mesh.solver.solver).__name__}"
    return Solution(ys=ys, y1=y1, ts=out_ts, mesh=mesh, stats=stats, error_ratio=err,
                    route=route)


def _check_moved_ts(bm: Mesh, ts) -> None:
    """On concrete save times: `_replay_core`'s on-device checks of moved save times, as
    errors (under ``jit`` with traced ``ts`` the replay flags them per trajectory instead)."""
    idx = np.asarray(bm.save_index)
    ts = np.asarray(ts)
    shared = idx[:, 1:] == idx[:, :-1]
    if np.any(shared & (ts[:, 1:] != ts[:, :-1])):
        raise ValueError(
            "gs.replay: `ts` separates save times that were equal when the mesh was recorded "
            "(they share one mesh point); re-record the mesh for these save times."
        )
    subst = _save_roles(bm.ts, bm.t0, bm.t1, bm.save_index)[3]
    times = jnp.asarray(bm.times).astype(ts.dtype)
    if np.any(np.asarray(_moved_out_of_order(times, bm.save_index, jnp.asarray(ts), subst))):
        raise ValueError(
            "gs.replay: `ts` moved past neighbouring mesh points; re-record the mesh for "
            "these save times."
        )


def _taylor2(f, t, y, params, s):
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


def _node_times(times: Float[Array, "n S1"], save_index: Int[Array, "n k"], tsave, subst):
    """Mesh node times with the nodes of moved save slots (``subst``) at ``tsave``, and which
    slots own their node (equal save times share one node; only the first moves it)."""
    rows = jnp.arange(times.shape[0])[:, None]
    current = times[rows, save_index]
    dup = _save_groups(save_index) != jnp.arange(save_index.shape[1])
    subst = subst.astype(bool)
    slot = jnp.where(dup, times.shape[1], save_index)  # no colliding scatter
    nodes = times.at[rows, slot].set(jnp.where(subst, tsave, current), mode="drop")
    return nodes, subst & ~dup


def _moved_out_of_order(times, save_index, tsave, subst) -> Bool[Array, " n"]:
    """Per trajectory: does a moved save node (``subst``) pass a neighbouring node? Reads
    only the neighbours of the ``k`` save nodes (a neighbour is itself moved when the save
    time owning it moved), so it costs ``O(n k)``, not ``O(n S)``."""
    s1, k = times.shape[1], save_index.shape[1]
    rows = jnp.arange(times.shape[0])[:, None]
    subst = subst.astype(bool)
    owner = _save_groups(save_index)  # first slot of each group of equal save times
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


def _save_roles(rec_ts, t0, t1, save_index):
    """``(first, dup, interior, moving)`` per save slot: the first slot sharing its node,
    whether it is a later one of equal save times, whether it lies strictly inside
    ``(t0, t1)``, and whether a given ``ts`` moves its node (interior, not a duplicate)."""
    first = _save_groups(save_index)
    dup = first != jnp.arange(first.shape[1])
    interior = (rec_ts > t0) & (rec_ts < t1)
    return first, dup, interior, interior & ~dup


def _save_groups(save_index: Int[Array, "n k"]) -> Int[Array, "n k"]:
    """For each save time, the position of the first save time sharing its mesh node
    (equal save times are recorded as one node)."""
    k = save_index.shape[-1]
    pos = jnp.broadcast_to(jnp.arange(k), save_index.shape)
    dup = jnp.concatenate(
        [jnp.zeros_like(save_index[:, :1], bool), save_index[:, 1:] == save_index[:, :-1]], axis=1
    )
    return jax.lax.cummax(jnp.where(dup, 0, pos), axis=1)


@eqx.filter_jit
def _replay_core(f, mesh: Mesh, y0, params, ts, group_size: int, chunk_size: int,
                 use_kernel: bool, lanes_group: int | None, check_moved: bool = True):
    """Jitted body of `replay` on batched, validated inputs (``lanes_group``: group size of
    the lanes replay, ``None`` to use the batched one)."""
    bm = _as_batched(mesh)
    dtype = y0.dtype
    failed = bm.status != Status.OK
    times = _sg(bm.times).astype(dtype)
    t0 = jnp.asarray(_sg(mesh.t0), dtype)
    t1 = jnp.asarray(_sg(mesh.t1), dtype)
    rec_ts = _sg(bm.ts).astype(dtype)
    rows = jnp.arange(times.shape[0])[:, None]  # (not closed over by xla_replay below)
    first, dup, interior, moving = _save_roles(rec_ts, t0, t1, bm.save_index)
    # Interior save times given as ``ts`` move their mesh node (differentiably); equal save
    # times share one node, moved by the first of them.
    subst = moving if ts is not None else jnp.zeros(rec_ts.shape, bool)
    tsave = ts if ts is not None else rec_ts
    status = bm.status
    if ts is not None and check_moved:
        # Moved save times checked on device too (outside jit `replay` raises instead): a
        # save time moved past a neighbouring node leaves no valid mesh, so the trajectory
        # is neutralised like a failed one and reported INVALID_INPUT. (Separated equal
        # save times only lose their own slot, below.)
        invalid = _moved_out_of_order(times, bm.save_index, _sg(ts), subst)
        status = jnp.where(invalid & ~failed, Status.INVALID_INPUT, status).astype(jnp.int32)
        failed = failed | invalid
    n_eff = jnp.where(failed, 0, bm.n_steps).astype(jnp.int32)
    rtol, atol = jnp.asarray(mesh.rtol, dtype), jnp.asarray(mesh.atol, dtype)

    # Derivatives w.r.t. t0 (a traced mesh.t0, e.g. gs.solve differentiated w.r.t. t0):
    # y(t; t0 + s, y0) = y(t; t0, y0 - s f + s^2/2 f'), so replay from that y0.
    t0_live = jnp.asarray(mesh.t0, dtype)
    s0 = jnp.broadcast_to(t0_live - _sg(t0_live), y0.shape[:1])
    y0 = jax.vmap(lambda y, p, s: _taylor2(f, t0[None], y[None], p, -s[None])[0])(y0, params, s0)

    def xla_replay(tsave, y, p, times, n_eff, save_index, tol, subst):
        tm = _node_times(times, save_index, tsave, subst)[0] if ts is not None else times
        # Slots past n_eff (unspecified under jit, see Mesh.times) are read as zero-length
        # steps by `_replay_block`.
        return replay_batched(f, mesh.solver, tm, n_eff, y, p, save_index, tol[0, 0],
                              tol[0, 1], group_size=group_size, chunk_size=chunk_size)

    out = None
    if use_kernel:
        out = kernel_replay(f, mesh.solver, times, n_eff, y0, params, bm.save_index, rtol,
                            atol, tsave, subst, xla_replay, ts is not None)
    elif lanes_group is not None:
        field = lane_field(f, mesh.solver, y0, params)
        if field is not None:
            out = lanes_replay(field, mesh.solver, times, n_eff, y0, params, bm.save_index,
                               rtol, atol, tsave, subst, xla_replay, _node_times,
                               ts is not None, lanes_group)
    if out is None:
        tol = jnp.stack([rtol, atol])[None]
        out = xla_replay(tsave, y0, params, times, n_eff, bm.save_index, tol, subst)
    ys, y1, err, work = out
    if ts is not None:
        # Save times that do not move a node get the solution's Taylor expansion around
        # their node: pinned ones (equal to t0 or t1) around their fixed time, duplicates
        # around the first equal save time (whose node they share).
        shared = dup & interior
        node_t = jnp.where(shared, ts[rows, first], _sg(ts))
        shift = jnp.where(subst, 0.0, ts - node_t)
        ys = jax.vmap(lambda t, y, p, s: _taylor2(f, t, y, p, s))(node_t, ys, params, shift)
        # Replayed at new times, duplicates that no longer coincide have no node of their
        # own: NaN (outside jit, `replay` raises instead).
        ys = jnp.where((shared & (ts != node_t))[..., None], jnp.nan, ys)
    # Derivatives w.r.t. t1: y1 = y(t1) moves with t1.
    t1_live = jnp.asarray(mesh.t1, dtype)
    s1 = jnp.broadcast_to(t1_live - _sg(t1_live), y1.shape[:1])
    y1 = jax.vmap(lambda y, p, s: _taylor2(f, t1[None], y[None], p, s[None])[0])(y1, params, s1)
    nan = jnp.asarray(jnp.nan, dtype)
    ys = jnp.where(failed[:, None, None], nan, ys)
    y1 = jnp.where(failed[:, None], nan, y1)
    err = jnp.where(failed, jnp.inf, _sg(err))
    out_ts = ts if ts is not None else rec_ts
    return ys, y1, err, _sg(work), out_ts, status
