"""`solve`: record then replay in one jittable call."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._checks import check_layout, check_throw, is_concrete
from ._controller import PIDController
from ._doses import DoseSchedule, as_schedule
from ._events import batch_events
from ._record import _MAX_STEPS, prepare, record_prepared
from ._replay import replay_prepared
from ._solution import Solution
from ._solver.diffrax_adapter import DiffraxSolver
from .drivers import AbstractDriver, Auto, Diffrax
from .drivers.auto import resolve
from .drivers.diffrax import solve_batched


def solve(f, t0, t1, y0, params, *, ts=None, solver=None, rtol: float = 1e-6,
          atol: float = 1e-9, dt0=None, max_steps: int | None = None,
          controller: PIDController | None = None, throw: bool | None = None,
          group_size: int | None = None, chunk_size: int = 8,
          driver: AbstractDriver | None = None, jumps=None, tstops=None,
          doses=None, ts_after=None) -> Solution:
    """Adaptive solve whose derivative is the discrete adjoint of its accepted steps.

    Records the mesh (no gradient flows through step-size selection, as in Diffrax's
    default ``RecursiveCheckpointAdjoint``) and replays it at the differentiable ``y0``,
    ``params`` and ``ts``.

    Args:
        f: vector field ``f(t, y, params) -> dy/dt`` for ONE trajectory (``y (d,)``);
            gradsolve batches it.
        t0, t1: scalars, ``t1 > t0``; the solution is differentiable w.r.t. both.
        y0: ``(d,)`` one trajectory or ``(n, d)`` an ensemble, and
        params: any pytree (with leading axis ``n`` on every leaf for an ensemble), as in
            `gradsolve.record` (one floating dtype; non-array leaves passed through).
        ts: save times ``(k,)`` shared or ``(n, k)`` per trajectory, sorted, in
            ``[t0, t1]``; default ``None`` saves at ``t1`` only.
        solver: a gradsolve solver (default `Tsit5`) or any ``diffrax`` solver.
        rtol, atol: tolerances of the error test ``|err| <= atol + rtol |y|`` (RMS).
        dt0: initial step, positive; ``None`` picks it per trajectory. Every solver with
            an error estimate (Diffrax's ``Heun`` and ``Midpoint`` included) records
            adaptively, so ``dt0`` only seeds the first step; only a Diffrax solver without
            one (e.g. ``diffrax.Euler()``) takes constant steps of ``dt0``.
        max_steps: capacity of the recorded mesh (accepted steps; each save time is one).
            Default ``None``: 4096, or fewer on an accelerator where the mesh of a large
            ensemble would not fit, as in `gradsolve.record`; with
            `gradsolve.drivers.Diffrax`, 4096.
        controller: `PIDController` (default: I-controller, as Diffrax).
        throw: failure policy, as in `gradsolve.record`.
        group_size, chunk_size: replay layout, as in `gradsolve.replay`.
        driver: how the solve runs (`gradsolve.drivers`). The default,
            `gradsolve.drivers.Auto`, records and replays with the fastest drivers that
            apply (they may differ: the compiled kernel records, the lanes replay
            replays); another gradsolve driver does both; `gradsolve.drivers.Diffrax` runs
            ``diffrax.diffeqsolve`` with its own adaptive steps (``Solution.mesh`` is then
            ``None``). An explicit driver that does not apply is a ``ValueError``.
        jumps, tstops: known-time events, as in `gradsolve.record` (a save time equal to a
            jump time reads the state before the jump; a jump at ``t0`` applies to ``y0``;
            ``y1`` is the state after every jump). Differentiable w.r.t. jump sizes and jump
            times (each jump's node moves with its time); tstops are not. Every driver
            applies them; `gradsolve.drivers.Diffrax` by one ``diffeqsolve`` per segment
            between event times (its own adaptive steps, restarted at each event).
        doses: a `gradsolve.DoseSchedule` (or a list of dose records: `gradsolve.Bolus`,
            `gradsolve.Infusion`, `gradsolve.SteadyState`, `gradsolve.Reset`, ...): doses
            as data, merged with ``jumps``; the solution has the model's ``d`` states.
            Differentiable w.r.t. every dose field (times, amounts, rates, durations, lag
            times, bioavailabilities, steady-state intervals) on every driver.
        ts_after: booleans of ``ts``'s shape, or ``None``: ``True`` where a save time
            reads the state just AFTER the jumps, doses and resets at its time (its right
            limit: a NONMEM observation record listed after a dose record at the same
            time, e.g. the peak of an IV bolus); the default reads the state before them.

    Returns:
        A `Solution`: ``ys (n, k, d)`` (``(k, d)`` for one trajectory), ``y1``,
        ``error_ratio (n,)``, ``stats``, ``mesh`` and ``route``. Differentiable with
        respect to ``y0``, ``params`` and ``ts``.

    A Diffrax solver without an error estimate (e.g. ``diffrax.Euler()``) runs on
    `gradsolve.drivers.Diffrax` with constant steps ``dt0`` and
    ``RecursiveCheckpointAdjoint``; ``Solution.route`` says which driver ran. Failures there follow the same policy: status codes
    in ``stats["status"]`` with NaN outputs inside ``jit`` (and with ``throw=False``), a
    ``RuntimeError`` outside it.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0.0, 10.0, 21))
        >>> sol.ys.shape  # (n, 21, d)
    """
    where = "gs.solve"
    check_layout(group_size, chunk_size, where)  # before the record, not after it
    check_throw(throw, where)
    if doses is not None or ts_after is not None:
        sched = DoseSchedule([]) if doses is None else as_schedule(doses, where)
        plan = sched.plan(f, t0, t1, y0, params, ts=ts, jumps=jumps, ts_after=ts_after,
                          options=dict(solver=solver, rtol=rtol, atol=atol, driver=driver))
        sol = solve(plan.f, t0, plan.t1, plan.y0, plan.params, ts=plan.ts, solver=solver,
                    rtol=rtol, atol=atol, dt0=dt0, max_steps=max_steps,
                    controller=controller, throw=throw, group_size=group_size,
                    chunk_size=chunk_size, driver=driver, jumps=plan.jumps, tstops=tstops)
        return DoseSchedule.finish(sol, plan)
    f, solver, controller, b = prepare(f, t0, t1, y0, params, ts, solver, rtol, atol,
                                       _MAX_STEPS if max_steps is None else max_steps,
                                       controller, where, dt0)
    events = batch_events(jumps, tstops, t0, t1, b.n, b.d, b.single, b.y0.dtype, where)
    fixed_steps = isinstance(solver, DiffraxSolver) and not solver.adaptive
    # diffrax.diffeqsolve runs when asked for, and for a solver without an error estimate
    # (no mesh to record), which only it can run.
    on_diffrax = isinstance(driver, Diffrax) or (
        fixed_steps and isinstance(driver, (type(None), Auto)))
    if fixed_steps and not on_diffrax:
        raise ValueError(
            f"{where}: `driver` {type(driver).__name__}() does not apply here: `solver` "
            f"{type(solver.solver).__name__} has no error estimate, so it records no mesh; "
            "only gs.drivers.Diffrax() runs it (constant steps dt0), which the default "
            "driver picks."
        )
    if on_diffrax:
        resolve(Diffrax(), "replay", f, solver, b.y0, b.params, where)  # refuses Vern7, ...
        return solve_batched(f, t0, t1, b, solver, rtol, atol, dt0,
                             _MAX_STEPS if max_steps is None else max_steps, controller, throw,
                             where, events)
    mesh = record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw,
                           where, driver, events)
    if b.single:
        mesh = mesh.unbatch()
    # The record stops gradients; the replay differentiates w.r.t. the interval's ends.
    mesh = eqx.tree_at(lambda m: (m.t0, m.t1), mesh,
                       (jnp.asarray(t0, mesh.t0.dtype), jnp.asarray(t1, mesh.t1.dtype)))
    # The record's inputs are already validated and batched, and its nodes sit at ``ts``:
    # replay them as they are. Concrete save times cannot carry a derivative, so there is
    # nothing to move: the plain replay (no node moves, no save-time adjoint) is exact.
    moving_ts = ts is not None and not is_concrete(ts)
    return replay_prepared(f, mesh, b, moving_ts, group_size, chunk_size,
                           check_moved=False, driver=driver, where=where, events=events)
