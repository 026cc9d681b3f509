"""`record`: adaptive solve of an ensemble that keeps the accepted mesh.

This module validates and batches the inputs, checks traced ones on device, lets the driver
(`gradsolve.drivers`) run the record, and finalises the mesh (errors outside ``jit``,
trimming). The record loops themselves live with their drivers: the XLA loop in
`gradsolve.drivers.batched`, the compiled one in `gradsolve.drivers.kernel`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import (
    batch, check_dt0, check_interval, check_save_count, check_throw, check_tolerance_precision,
    check_tolerances, check_vector_field, is_concrete, split_static,
)
from ._controller import PIDController, check_controller
from ._errors import error_if_failed, raise_if_failed
from ._doses import as_schedule
from ._events import Events, batch_events
from ._mesh import Mesh, Status
from ._solver import Tsit5
from ._solver.diffrax_adapter import DiffraxSolver, as_solver
from ._traced import runtime_checks
from .drivers import AbstractDriver
from .drivers.auto import resolve
from ._sharding import host

_MAX_STEPS = 4096
# Bytes a jitted solve and its gradient hold at their peak per trajectory and mesh slot, in
# units of the dtype's size: this many copies of the node times (the record's buffer, its
# transpose to the mesh, the replay's layout of it, ...) plus one stored state per component.
# Measured on a TPU v5e (XLA's reserved memory, float32, Pallas): Lotka-Volterra (d = 2)
# at 1,048,576 trajectories 1.54 / 2.88 / 5.56 / 10.9 GB at capacity 64 / 128 / 256 / 512,
# 21 bytes a slot (5.2 copies); Lorenz (d = 3) 25.6 bytes a slot (6.4 copies).
_SLOT_COPIES = 4
_MEMORY_SHARE = 4  # the default capacity's mesh takes at most a quarter of the device
_DEVICE_MEMORY: int | None = None  # the device's memory in bytes, where set (tests)


def device_memory() -> int | None:
    """The default device's memory in bytes (``bytes_limit``), or ``None`` where it reports
    none (a CPU: the host's memory is not the device's to size)."""
    if _DEVICE_MEMORY is not None:
        return _DEVICE_MEMORY
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without statistics
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _devices_of(x) -> int:
    """How many devices the ensemble ``x`` is split over (1 where unknown, e.g. traced)."""
    try:
        return max(1, len(x.sharding.device_set))
    except Exception:  # noqa: BLE001 - tracers, numpy arrays
        return 1


def mesh_capacity(max_steps: int | None, n: int, y0, forced: int, where: str) -> int:
    """The mesh capacity (accepted steps) a record of ``n`` trajectories uses: ``max_steps``
    where given, else `_MAX_STEPS` halved (powers of two) until what a solve's gradient
    holds per slot (node times and states, `_SLOT_COPIES`) fits a quarter of the device's
    memory, but above the ``forced`` nodes (save times, events).

    Raises ``ValueError`` before anything is allocated where the capacity cannot fit the
    device at all, saying how much it needs and what to change."""
    mem = device_memory()
    if mem is None:
        return _MAX_STEPS if max_steps is None else max_steps
    size = jnp.dtype(y0.dtype).itemsize
    copies = _SLOT_COPIES + y0.shape[-1]
    per_slot = copies * size * -(-n // _devices_of(y0))

    def need(c):
        return per_slot * (c + 1)

    cap = max_steps
    if max_steps is None:
        cap = _MAX_STEPS
        while need(cap) > mem // _MEMORY_SHARE and cap // 2 > forced:
            cap //= 2
    if need(cap) <= mem:
        return cap
    fit = mem // per_slot - 1
    fit_steps = 1 << (fit.bit_length() - 1) if fit > forced else None
    per_call = mem // (copies * size * (cap + 1))
    given = f"max_steps={cap:,}" if max_steps is not None else (
        f"the least capacity above its {forced} save times and event nodes ({cap:,} steps)")
    fix = (f"pass max_steps={fit_steps:,} or less (the mesh's capacity in accepted steps), or "
           if fit_steps else "pass ")
    raise ValueError(
        f"{where}: {given} for {n:,} trajectories needs about {need(cap) / 1e9:.1f} GB of "
        f"device memory for its mesh ({n:,} x {cap + 1:,} slots, {copies} values of {size} "
        f"bytes each: node times and states), more than the "
        f"device's {mem / 1e9:.1f} GB; {fix}at most {per_call:,} trajectories per call."
    )


@eqx.filter_jit
def record_batched(driver: AbstractDriver, f, solver, controller: PIDController, t0, t1, y0,
                   params, ts, rtol, atol, dt0, max_steps: int, fill: bool = True,
                   events: Events | None = None) -> Mesh:
    """``driver.record`` on batched inputs ``y0 (n, d)``, ``ts (n, k)`` (no validation),
    compiled, with the scalars in the state's dtype."""
    dtype = y0.dtype
    t0, t1, rtol, atol = (jnp.asarray(x, dtype) for x in (t0, t1, rtol, atol))
    if events is None:
        return driver.record(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                             max_steps, fill)
    return driver.record(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                         max_steps, fill, events=events)


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
    max_steps: int | None = None,
    controller: PIDController | None = None,
    throw: bool | None = None,
    driver: AbstractDriver | None = None,
    jumps=None,
    tstops=None,
    doses=None,
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
            taken. Each save time is a mesh point, so it must exceed ``len(ts)``. Default
            ``None``: 4096, or on an accelerator the largest power of two below it whose
            mesh (``n * (max_steps + 1)`` slots, each about ``4 + d`` values at the peak of
            a solve's gradient: node times and states) takes at most a quarter of the
            device's memory (128 for 1,048,576 two-state trajectories in float32 on a 16 GB
            chip); a trajectory that needs more
            fails with ``max_steps`` reached. A ``max_steps`` whose node times cannot fit
            the device at all is a ``ValueError``, raised before anything is allocated,
            that says what would fit.
        controller: `PIDController` (default: I-controller, as Diffrax).
        throw: ``None`` (default) raises ``RuntimeError`` for failed trajectories outside
            ``jit`` and returns status codes inside it; ``True`` also raises inside ``jit``
            (via ``equinox.error_if``); ``False`` never raises. Inputs that are traced
            under ``jit`` (``ts``, ``t0``/``t1``, ``rtol``/``atol``, ``dt0``) are checked on
            device: invalid ones give `Status.INVALID_INPUT` and NaN outputs (``throw=True``
            raises, naming the input).
        driver: how the record runs (`gradsolve.drivers`); default `gradsolve.drivers.Auto`
            (the compiled CPU kernel where it applies, else the XLA loop). Every driver
            records the same mesh; an explicit one that does not apply is a
            ``ValueError`` saying why.
        jumps: ``None`` or ``(times, sizes)``, known-time additive state jumps (a bolus
            dose): ``y(tau+) = y(tau-) + size``. ``times`` ``(J,)`` shared or ``(n, J)`` per
            trajectory, sorted, in ``[t0, t1]``, ragged schedules padded with ``+inf`` at
            the end (inert); ``sizes`` ``(J, d)`` or ``(n, J, d)``. Each jump time is a
            forced mesh node, and the jump gets a node of its own right after it, so a
            save time equal to a jump time reads the state *before* the jump (the
            pre-dose trough, as NONMEM orders an observation and a dose at one time); a
            jump at ``t0`` applies to ``y0`` after a save time at ``t0`` has read it.
            After each jump the solver's first-same-as-last stage is recomputed. Every
            driver records events (the compiled kernel and the XLA loop alike). Where
            ``f`` itself switches at a jump time (``jnp.where(t >= tau, ...)``), the last
            stage of the step landing there (``c = 1``) already sees the new branch, and a
            differentiated ``tau`` is wrong: carry the switch in a state that jumps there
            (an indicator, as `gradsolve.DoseSchedule` carries an input rate), so every
            stage of a step sees one side.
        tstops: ``None`` or times ``(L,)`` / ``(n, L)`` (sorted, in ``[t0, t1]``,
            ``+inf`` padding) where ``f`` is discontinuous (an infusion starts or stops):
            forced mesh nodes, never stepped across, with the carried stage recomputed
            after them. Not differentiable (kept in the mesh; a replay uses them).
        doses: a `gradsolve.DoseSchedule` (or a list of dose records: `gradsolve.Bolus`,
            `gradsolve.Infusion`, ...): doses as data. The record runs on the dosed
            system (each compartment with a zero-order input gets its rate as an extra
            state, each change of dose a jump; see `gradsolve.DoseSchedule`), so the mesh
            has ``d + m`` states; replay it with the same kinds of doses (their times and
            amounts may differ).

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
    check_throw(throw, where)
    if doses is not None:
        f, y0, jumps = as_schedule(doses, where).apply(f, y0, t1=t1, jumps=jumps)
    f, solver, controller, b = prepare(f, t0, t1, y0, params, ts, solver, rtol, atol,
                                       _MAX_STEPS if max_steps is None else max_steps,
                                       controller, where, dt0)
    events = batch_events(jumps, tstops, t0, t1, b.n, b.d, b.single, b.y0.dtype, where)
    if isinstance(solver, DiffraxSolver) and not solver.adaptive:
        raise ValueError(
            f"{where}: `solver` {type(solver.solver).__name__} has no embedded error estimate, "
            "so it cannot record an adaptive mesh; use gs.solve(..., dt0=...) for fixed steps."
        )
    mesh = record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw,
                           where, driver, events)
    return mesh.unbatch() if b.single else mesh


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
    check_tolerance_precision(rtol, b.y0.dtype, where)
    check_vector_field(f, t0, b.y0, b.params, where)
    return f, solver, controller, b


_FIRST_CAPACITY = 256


def record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw, where,
                    driver: AbstractDriver | None = None, events: Events | None = None):
    """Record batched, validated inputs (no gradient flows into the mesh) and finalize;
    ``max_steps`` ``None`` sizes the capacity to the device (`mesh_capacity`).

    Outside ``jit`` the mesh buffer starts at ``min(max_steps, 256)`` slots and grows only if
    some trajectory needs more (re-recording with a capacity estimated from how far it got),
    so the common short solve never writes an ``n * max_steps`` buffer. The steps taken do
    not depend on the capacity, so the result equals a single record at ``max_steps``.
    """
    n_events = 0 if events is None else 2 * events.n_jumps + events.tstops.shape[1]
    max_steps = mesh_capacity(max_steps, b.n, b.y0, b.ts.shape[-1] + n_events + 1, where)
    check_save_count(t0, t1, b.ts, max_steps, where, n_events)
    sg = jax.lax.stop_gradient
    rc = runtime_checks(t0, t1, b.ts, rtol, atol, dt0, events)
    rec_t0, rec_t1, rec_ts, rec_rtol, rec_atol, rec_dt0 = (
        (t0, t1, b.ts, rtol, atol, dt0) if rc is None
        else (rc.t0, rc.t1, rc.ts, sg(rc.rtol), sg(rc.atol), rc.dt0)
    )
    rec_events = events if rc is None else rc.events
    rec_events = None if rec_events is None else jax.tree_util.tree_map(sg, rec_events)
    args = (sg(rec_t0), sg(rec_t1), sg(b.y0), jax.tree_util.tree_map(sg, b.params), sg(rec_ts))
    driver = resolve(driver, "record", f, solver, b.y0, b.params, where, events is not None)
    eager = is_concrete(args, rtol, atol, dt0, rec_events)
    cap = max_steps
    if max_steps > _FIRST_CAPACITY and eager:
        cap = _FIRST_CAPACITY
    while True:
        # Under jit the padding slots stay unwritten (Mesh.times); eager meshes are filled.
        mesh = record_batched(driver, f, solver, controller, *args, rec_rtol, rec_atol,
                              rec_dt0, cap, eager, rec_events)
        if eager and not is_concrete(mesh.status):
            # Concrete arguments but traced results: `f` closes over tracers (e.g. a value
            # under jax.vmap). Behave as under jit: full capacity, no host round trip.
            eager = False
            if cap < max_steps:
                cap = max_steps
                continue
        if cap >= max_steps or not eager:
            break
        status = host(mesh.status)
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
        if events is not None:
            mesh = eqx.tree_at(lambda m: (m.jump_times, m.jump_sizes, m.tstops), mesh,
                               (sg(events.jump_times), sg(events.jump_sizes), sg(events.tstops)))
    return finalize(mesh, f, where, throw, None if rc is None else rc.failed)


def _next_capacity(mesh: Mesh, short, cap: int, max_steps: int) -> int:
    """Capacity for the retry: the steps the slowest trajectory would need at its pace so
    far, with 25 % headroom, rounded up to a power of two; at least 4x the last one."""
    t0, t1 = float(mesh.t0), float(mesh.t1)
    times = host(mesh.times)
    n_steps = host(mesh.n_steps)
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
