"""`record`: adaptive solve of an ensemble that keeps the accepted mesh.

Driver design (why it looks like this): one ``lax.while_loop`` over the *batch*, not a
``vmap`` of per-trajectory loops. Every iteration attempts one step for every unfinished
trajectory and scatters accepted step times into the mesh buffer ``(n, S + 1)``;
trajectories that are done (or rejected) scatter out of bounds, which is dropped. Under
``vmap`` a per-trajectory loop whose carry holds an ``(n, S)`` buffer copies it each
iteration; the scatter here is in place, so the cost follows the steps actually attempted
(the loop ends when the slowest trajectory does), not ``max_steps``. The buffer is the
mesh itself (no transpose or slice afterwards), and under ``jit`` its slots past
``n_steps`` are left as they are (`Mesh.times`): at ``max_steps = 4096`` every pass over it
is a pass over ``n * 4097`` numbers.

On CPU, for explicit Runge–Kutta solvers, the compiled kernel (`gradsolve._kernel`) runs the
same algorithm per trajectory (lanes refilled as trajectories finish) instead of the loop
below; `gradsolve.use_compiled_kernel` switches it off.

Save times are forced mesh points: a step that would pass the next save time (or ``t1``)
is shortened to land on it exactly, so the replay hits it as a node with no interpolation.
This costs at most one extra step per save time.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PyTree

from ._checks import (
    batch, check_dt0, check_interval, check_save_count, check_tolerances, check_vector_field,
    is_concrete, split_static,
)
from ._config import kernel_enabled
from ._controller import PIDController, check_controller, error_norm, initial_step
from ._kernel import kernel_record
from ._errors import error_if_failed, raise_if_failed
from ._misc import tree_where
from ._mesh import Mesh, Status
from ._solver import Tsit5
from ._solver.base import AbstractSolver
from ._solver.diffrax_adapter import DiffraxSolver, as_solver

_MAX_STEPS = 4096


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


def record_chunk(backend: str | None = None) -> int:
    """Attempts per iteration of the XLA record's ``while_loop``: 1 on CPU, 8 elsewhere.

    On a GPU every ``while_loop`` iteration copies its condition to the host before the
    next one launches; running the attempt loop in fixed chunks pays that sync once per
    chunk, for at most ``chunk - 1`` spare no-op attempts at the end. On CPU the condition
    costs nothing and the spare attempts would be pure overhead.
    """
    backend = jax.default_backend() if backend is None else backend
    return 1 if backend == "cpu" else 8


@eqx.filter_jit
def record_batched(
    f, solver: AbstractSolver, controller: PIDController, t0, t1, y0, params, ts, rtol, atol,
    dt0, max_steps: int, use_kernel: bool = False, fill: bool = True,
) -> Mesh:
    """The record driver on batched inputs ``y0 (n, d)``, ``ts (n, k)`` (no validation).

    With ``use_kernel`` the compiled CPU kernel runs the same algorithm where it applies
    (`gradsolve._kernel.kernel_record`); otherwise the ``while_loop`` below. ``fill=False``
    leaves the mesh slots past ``n_steps`` unspecified (both drivers).
    """
    n, d = y0.shape
    k = ts.shape[1]
    dtype = y0.dtype
    t0 = jnp.asarray(t0, dtype)
    t1 = jnp.asarray(t1, dtype)
    rtol = jnp.asarray(rtol, dtype)
    atol = jnp.asarray(atol, dtype)
    if use_kernel:
        out = kernel_record(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                            max_steps, fill)
        if out is not None:
            return Mesh(**out, ts=ts, t0=t0, t1=t1, y0=y0, params=params, solver=solver,
                        rtol=rtol, atol=atol, controller=controller)
    rows = jnp.arange(n)
    order = solver.error_order
    eps = jnp.finfo(dtype).eps
    attempts_cap = 4 * max_steps + 64

    vstep = jax.vmap(lambda t, h, y, p, s: solver.step(f, t, h, y, p, s))
    state0 = jax.vmap(lambda y, p: solver.init(f, t0, y, p))(y0, params)
    if dt0 is None:
        h0 = jax.vmap(lambda y, p: initial_step(f, t0, y, p, order, rtol, atol))(y0, params)
    else:
        h0 = jnp.broadcast_to(jnp.asarray(dt0, dtype), (n,))
    h0 = jnp.minimum(h0, t1 - t0)

    times = jnp.zeros((n, max_steps + 1), dtype).at[:, 0].set(t0)
    ptr0 = jnp.sum(ts <= t0, axis=1).astype(jnp.int32)
    init = _RecordState(
        t=jnp.full((n,), t0),
        y=y0,
        h=h0,
        solver_state=state0,
        err_prev=jnp.ones((n,), dtype),
        n_accepted=jnp.zeros((n,), jnp.int32),
        n_rejected=jnp.zeros((n,), jnp.int32),
        save_ptr=ptr0,
        status=jnp.zeros((n,), jnp.int32),
        done=jnp.zeros((n,), bool),
        times=times,
        save_index=jnp.zeros((n, k), jnp.int32),
        iters=jnp.zeros((), jnp.int32),
    )

    def cond(s: _RecordState):
        return (~jnp.all(s.done)) & (s.iters < attempts_cap)

    def body(s: _RecordState) -> _RecordState:
        nxt = jnp.minimum(s.save_ptr, k - 1)
        target = jnp.where(s.save_ptr < k, ts[rows, nxt], t1)
        t_try = s.t + s.h
        clipped = t_try >= target
        t_new = jnp.where(s.done, s.t, jnp.where(clipped, target, t_try))
        h_eff = t_new - s.t  # the replay recomputes h this way: bitwise the same step
        y1, y_err, st1 = vstep(s.t, h_eff, s.y, params, s.solver_state)
        err = error_norm(y_err, s.y, y1, rtol, atol)
        err = jnp.where(s.done, 0.0, err)
        accept = (err <= 1.0) & ~s.done
        fac = controller.factor(err, s.err_prev, accept, order)
        h_next = h_eff * fac
        h_next = jnp.where(accept & clipped, jnp.maximum(h_next, s.h), h_next)

        n_acc = s.n_accepted + accept
        n_rej = s.n_rejected + (~accept & ~s.done)
        col = jnp.where(accept, n_acc, max_steps + 1)  # out of bounds: dropped
        times = s.times.at[rows, col].set(t_new, mode="drop")
        reached = jnp.sum(ts <= t_new[:, None], axis=1).astype(jnp.int32)
        new_ptr = jnp.where(accept, reached, s.save_ptr)
        jj = jnp.arange(k)[None]
        newly = (jj >= s.save_ptr[:, None]) & (jj < new_ptr[:, None])
        save_index = jnp.where(newly, n_acc[:, None], s.save_index)

        finished = accept & (t_new >= t1)
        active = ~s.done & ~finished
        # underflow: the next step would no longer move the time (relative to the time
        # where it starts, not to t1: a long horizon must not forbid small early steps)
        tiny = 10 * eps * jnp.maximum(jnp.abs(t_new), jnp.abs(s.t))
        underflow = active & (h_next <= tiny)
        over = active & ((n_acc >= max_steps) | (n_acc + n_rej >= attempts_cap))
        finite = jnp.isfinite(err)
        status = jnp.where(
            underflow, jnp.where(finite, Status.STEP_UNDERFLOW, Status.NONFINITE), s.status
        )
        status = jnp.where(over & ~underflow, Status.MAX_STEPS, status)
        return _RecordState(
            t=jnp.where(accept, t_new, s.t),
            y=jnp.where(accept[:, None], y1, s.y),
            h=jnp.where(s.done, s.h, h_next),
            solver_state=tree_where(accept, st1, s.solver_state),
            err_prev=jnp.where(accept, jnp.maximum(err, 1e-4), s.err_prev),
            n_accepted=n_acc,
            n_rejected=n_rej,
            save_ptr=new_ptr,
            status=status.astype(jnp.int32),
            done=s.done | finished | underflow | over,
            times=times,
            save_index=save_index,
            iters=s.iters + 1,
        )

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
    return Mesh(
        times=times,
        n_steps=s.n_accepted,
        n_rejected=s.n_rejected,
        status=status,
        save_index=s.save_index,
        ts=ts,
        t0=t0,
        t1=t1,
        dt_next=s.h,
        y_last=s.y,
        y0=y0,
        params=params,
        solver=solver,
        rtol=rtol,
        atol=atol,
        controller=controller,
    )


def unbatch_mesh(mesh: Mesh) -> Mesh:
    """Drop the ensemble axis of size 1 (single-trajectory public form)."""
    sq = lambda x: x[0]
    return Mesh(
        times=sq(mesh.times), n_steps=sq(mesh.n_steps), n_rejected=sq(mesh.n_rejected),
        status=sq(mesh.status), save_index=sq(mesh.save_index), ts=sq(mesh.ts), t0=mesh.t0,
        t1=mesh.t1, dt_next=sq(mesh.dt_next), y_last=sq(mesh.y_last), y0=sq(mesh.y0),
        params=jax.tree_util.tree_map(sq, mesh.params), solver=mesh.solver, rtol=mesh.rtol,
        atol=mesh.atol, controller=mesh.controller,
    )


def record(
    f,
    t0,
    t1,
    y0,
    params,
    *,
    ts=None,
    solver=None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    dt0=None,
    max_steps: int = _MAX_STEPS,
    controller: PIDController | None = None,
    throw: bool | None = None,
) -> Mesh:
    """Adaptive solve that keeps each trajectory's accepted step times.

    Args:
        f: vector field ``f(t, y, params) -> dy/dt`` for ONE trajectory, ``y`` of shape
            ``(d,)`` (Diffrax's ``ODETerm`` convention); gradsolve batches it.
        t0, t1: scalars, ``t1 > t0``.
        y0: ``(d,)`` one trajectory or ``(n, d)`` an ensemble (then every leaf of
            ``params`` has leading axis ``n``). It is solved in one floating dtype with
            the floating leaves of ``params``: their ``jnp.result_type``, at least float32
            (float16/bfloat16 are promoted to float32).
        params: any pytree. Non-array leaves (an ``eqx.nn.MLP``'s activation, a string)
            are split off with ``eqx.partition`` and handed back to ``f`` unchanged (the
            mesh keeps the array part; `gradsolve.replay` takes arrays only).
        ts: save times ``(k,)`` shared or ``(n, k)`` per trajectory, sorted, in
            ``[t0, t1]``; default ``None`` saves at ``t1`` only. Save times become forced
            mesh points (the step before each is shortened to land on it).
        solver: a gradsolve solver (default `Tsit5`) or any ``diffrax`` solver with
            an error estimate (its own ``step`` is driven by this loop).
        rtol, atol: tolerances of the mixed error test ``|err| <= atol + rtol |y|`` (RMS).
        dt0: initial step, positive; ``None`` picks it per trajectory (Hairer's
            algorithm).
        max_steps: capacity of the mesh (accepted steps); attempts are capped at
            ``4 * max_steps + 64``. Memory is ``O(n * max_steps)``; time follows the steps
            taken. Each save time is a mesh point, so it must exceed ``len(ts)``.
        controller: `PIDController` (default: I-controller, as Diffrax).
        throw: ``None`` (default) raises ``RuntimeError`` for failed trajectories outside
            ``jit`` and returns status codes inside it; ``True`` also raises inside ``jit``
            (via ``equinox.error_if``); ``False`` never raises. Inputs that are traced
            under ``jit`` (``ts``, ``t0``/``t1``, ``rtol``/``atol``, ``dt0``) are checked on
            device: invalid ones give `Status.INVALID_INPUT` and NaN outputs (``throw=True``
            raises, naming the input).

    Returns:
        A `Mesh`. Outside ``jit`` its step axis is trimmed to the longest trajectory's
        step count rounded up to a power of two (`Mesh.trim`: meshes of similar length
        then share one compiled replay); inside ``jit`` it has ``max_steps + 1`` slots, those past ``n_steps``
        unspecified (`Mesh.padded` fills them). Not differentiable
        (step sizes carry no gradient, as in Diffrax's default).

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0, 10, 21))
        >>> sol = gs.replay(f, mesh, y0, params)
    """
    where = "gs.record"
    f, solver, controller, b = prepare(f, t0, t1, y0, params, ts, solver, rtol, atol, max_steps,
                                       controller, where, dt0)
    if not getattr(solver, "adaptive", True):
        raise ValueError(
            f"{where}: `solver` {type(solver.solver).__name__} has no embedded error estimate, "
            "so it cannot record an adaptive mesh; use gs.solve(..., dt0=...) for fixed steps."
        )
    mesh = record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw,
                           where)
    return unbatch_mesh(mesh) if b.single else mesh


def prepare(f, t0, t1, y0, params, ts, solver, rtol, atol, max_steps, controller, where,
            dt0=None):
    """Validate the arguments shared by record and solve; returns ``(f, solver, controller,
    batched)``. Non-array leaves of ``params`` move into ``f`` (`split_static`)."""
    solver = as_solver(Tsit5() if solver is None else solver, where)
    controller = check_controller(controller, where)
    check_interval(t0, t1, where)
    check_tolerances(rtol, atol, max_steps, where)
    check_dt0(dt0, where)
    if isinstance(solver, DiffraxSolver):
        solver = solver.with_tolerances(rtol, atol)
    if callable(f):
        f, params = split_static(f, params)
    b = batch(t0, t1, y0, params, ts, where)
    check_vector_field(f, t0, b.y0, b.params, where)
    return f, solver, controller, b


class RuntimeChecks(NamedTuple):
    """Checks of traced inputs (under ``jit``/``vmap``), which no trace-time ``ValueError``
    can make (SPEC §2.6): what failed, per trajectory, and inputs safe to record with."""

    failed: dict  # message -> (n,) bool
    invalid: Bool[Array, " n"]
    t0: Array
    t1: Array
    ts: Array
    rtol: Array
    atol: Array
    dt0: Array | None


def runtime_checks(t0, t1, ts, rtol, atol, dt0) -> RuntimeChecks | None:
    """``None`` when every input is concrete (then `batch` and the ``check_*`` functions
    have validated them at trace time). Otherwise the traced ones are checked on device:
    invalid trajectories get `Status.INVALID_INPUT` (NaN outputs), and the inputs are
    replaced by harmless ones for them (``ts`` at ``t1``, a unit interval, ``rtol = atol =
    1e-3``, ``dt0`` the whole interval), so their record is short and well defined."""
    if is_concrete(t0, t1, ts, rtol, atol, dt0):
        return None
    n = ts.shape[0]
    dtype = ts.dtype
    t0a, t1a = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
    each = lambda c: jnp.broadcast_to(c, (n,))
    failed = {}
    if not is_concrete(t0, t1):
        bad = ~(jnp.isfinite(t0a) & jnp.isfinite(t1a) & (t1a > t0a))
        failed["`t0` and `t1` must be finite with `t1` greater than `t0`"] = each(bad)
        t0a, t1a = jnp.where(bad, 0.0, t0a), jnp.where(bad, 1.0, t1a)
    tols = []
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not is_concrete(v):
            bad = ~(jnp.asarray(v, dtype) > 0)
            failed[f"`{name}` must be positive"] = each(bad)
            v = jnp.where(bad, 1e-3, jnp.asarray(v, dtype))
        tols.append(v)
    if dt0 is not None and not is_concrete(dt0):
        dv = jnp.asarray(dt0, dtype)
        bad = ~(jnp.isfinite(dv) & (dv > 0))
        failed["`dt0` must be positive and finite"] = each(bad)
        dt0 = jax.lax.stop_gradient(jnp.where(bad, t1a - t0a, dv))
    if not is_concrete(ts, t0, t1):
        failed["`ts` must be finite"] = ~jnp.all(jnp.isfinite(ts), axis=1)
        failed["`ts` must be sorted (non-decreasing)"] = jnp.any(jnp.diff(ts, axis=1) < 0, axis=1)
        failed["`ts` must lie inside [t0, t1]"] = jnp.any((ts < t0) | (ts > t1), axis=1)
    invalid = jnp.zeros((n,), bool)
    for bad in failed.values():
        invalid = invalid | bad
    ts = jnp.where(invalid[:, None], t1a, ts)
    return RuntimeChecks(failed, invalid, t0a, t1a, ts, tols[0], tols[1], dt0)


_FIRST_CAPACITY = 256


def record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw, where):
    """Record batched, validated inputs (no gradient flows into the mesh) and finalize.

    Outside ``jit`` the mesh buffer starts at ``min(max_steps, 256)`` slots and grows only if
    some trajectory needs more (re-recording with a capacity estimated from how far it got),
    so the common short solve never writes an ``n * max_steps`` buffer. The steps taken do
    not depend on the capacity, so the result equals a single record at ``max_steps``.
    """
    check_save_count(t0, t1, b.ts, max_steps, where)
    sg = jax.lax.stop_gradient
    rc = runtime_checks(t0, t1, b.ts, rtol, atol, dt0)
    rec_t0, rec_t1, rec_ts, rec_rtol, rec_atol, rec_dt0 = (
        (t0, t1, b.ts, rtol, atol, dt0) if rc is None
        else (rc.t0, rc.t1, rc.ts, sg(rc.rtol), sg(rc.atol), rc.dt0)
    )
    args = (sg(rec_t0), sg(rec_t1), sg(b.y0), jax.tree_util.tree_map(sg, b.params), sg(rec_ts))
    use_kernel = kernel_enabled()
    eager = is_concrete(args, rtol, atol, dt0)
    cap = max_steps
    if max_steps > _FIRST_CAPACITY and eager:
        cap = _FIRST_CAPACITY
    while True:
        # Under jit the padding slots stay unwritten (Mesh.times); eager meshes are filled.
        mesh = record_batched(f, solver, controller, *args, rec_rtol, rec_atol, rec_dt0, cap,
                              use_kernel, eager)
        if eager and not is_concrete(mesh.status):
            # Concrete arguments but traced results: `f` closes over tracers (e.g. a value
            # under jax.vmap). Behave as under jit: full capacity, no host round trip.
            eager = False
            if cap < max_steps:
                cap = max_steps
                continue
        if cap >= max_steps or not eager:
            break
        status = np.asarray(mesh.status)
        short = status == Status.MAX_STEPS
        if not short.any():
            break
        cap = _next_capacity(mesh, short, cap, max_steps)
    if rc is not None:
        # Invalid trajectories: the status says so; the mesh keeps the inputs as given.
        dtype = b.y0.dtype
        status = jnp.where(rc.invalid, Status.INVALID_INPUT, mesh.status).astype(jnp.int32)
        mesh = eqx.tree_at(
            lambda m: (m.status, m.ts, m.t0, m.t1, m.rtol, m.atol), mesh,
            (status, sg(b.ts), jnp.asarray(sg(t0), dtype), jnp.asarray(sg(t1), dtype),
             jnp.asarray(sg(rtol), dtype), jnp.asarray(sg(atol), dtype)),
        )
    return finalize(mesh, f, where, throw, None if rc is None else rc.failed)


def _next_capacity(mesh: Mesh, short, cap: int, max_steps: int) -> int:
    """Capacity for the retry: the steps the slowest trajectory would need at its pace so
    far, with 25 % headroom, rounded up to a power of two; at least 4x the last one."""
    t0, t1 = float(mesh.t0), float(mesh.t1)
    times = np.asarray(mesh.times)
    n_steps = np.asarray(mesh.n_steps)
    reached = times[np.arange(times.shape[0]), n_steps][short]
    frac = np.clip((reached - t0) / (t1 - t0), 1e-3, 1.0)
    need = int(np.max(n_steps[short] / frac) * 1.25) + 1
    return int(min(max_steps, max(4 * cap, 1 << (need - 1).bit_length())))


def finalize(mesh: Mesh, f, where: str, throw: bool | None, invalid: dict | None = None) -> Mesh:
    """Raise for failed trajectories where asked, and trim outside ``jit``.

    ``invalid`` (message -> ``(n,)`` bool, from `runtime_checks`) names the inputs found
    invalid on device; with ``throw=True`` under ``jit`` each raises its own message.
    """
    if is_concrete(mesh.status):
        if throw is None or throw:
            raise_if_failed(mesh, f, where)
        return mesh.trim()
    if throw:
        times = error_if_failed(
            mesh.times, mesh.status, invalid, where,
            "a trajectory failed (max_steps reached, non-finite state or step-size "
            "underflow); try a stiff solver such as gs.Rodas5P(), a looser rtol or a larger "
            "max_steps.",
        )
        mesh = eqx.tree_at(lambda m: m.times, mesh, times)
    return mesh
