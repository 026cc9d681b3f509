"""The Diffrax driver: ``diffrax.diffeqsolve`` with ``RecursiveCheckpointAdjoint``.

Two uses. As a reference, it runs what a Diffrax user writes (``jax.vmap`` of
``diffeqsolve`` over the ensemble), so a user or a test can put gradsolve's drivers next to
Diffrax without leaving the API: `Diffrax.replay` steps through a recorded mesh with
``diffrax.StepTo`` (so on one mesh it gives the other drivers' values and gradients, to
rounding), and `solve_batched` runs Diffrax's own adaptive loop (``PIDController`` at the
same tolerances; known-time jumps and tstops split it into one ``diffeqsolve`` per
segment between event times, the jump added in between). As the fallback, it runs solvers without an error estimate (e.g.
``diffrax.Euler()``), which cannot record an adaptive mesh, in constant steps ``dt0``.

It records no mesh: Diffrax reaches save times by dense output rather than forcing them as
nodes, and reports no per-step error on a fixed mesh (its ``error_ratio`` is NaN).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import is_concrete
from .._errors import error_if_failed, raise_if_fallback_failed
from .._mesh import Status
from .._nan_rows import nan_rows
from .._savetimes import node_times
from .._solution import Solution
from .._solver.diffrax_adapter import DiffraxSolver
from .._traced import runtime_checks
from .base import AbstractDriver, ReplayOutput


def diffrax_twin(solver):
    """The ``diffrax`` solver that takes the same steps as ``solver``, or ``None``."""
    import diffrax

    from .._solver import Dopri5, Tsit5
    from .._solver.diffrax_adapter import _is_diffrax_solver

    if isinstance(solver, DiffraxSolver):
        return solver.solver
    if _is_diffrax_solver(solver):
        return solver
    twins = {Tsit5: diffrax.Tsit5, Dopri5: diffrax.Dopri5}
    make = twins.get(type(solver))
    return None if make is None else make()


def _status(result):
    """Diffrax's ``RESULTS`` as `gradsolve.Status` codes."""
    import diffrax

    R = diffrax.RESULTS
    return jnp.where(
        result == R.successful, Status.OK,
        jnp.where((result == R.max_steps_reached) | (result == R.max_steps_rejected),
                  Status.MAX_STEPS,
                  jnp.where(result == R.dt_min_reached, Status.STEP_UNDERFLOW,
                            Status.NONFINITE)),
    ).astype(jnp.int32)


EVENTS_REASON = (
    "its diffrax.StepTo replay of a recorded mesh does not apply known-time events (jumps= "
    "or tstops=); gs.drivers.Batched() does, and gs.drivers.Auto() picks it. "
    "gs.solve(..., driver=gs.drivers.Diffrax()) applies them (diffeqsolve between events)."
)


class Diffrax(AbstractDriver):
    """``jax.vmap(diffrax.diffeqsolve)`` with ``RecursiveCheckpointAdjoint``.

    Replays a mesh with ``diffrax.StepTo`` on its nodes; solves with Diffrax's adaptive loop
    (``gs.solve(..., driver=gs.drivers.Diffrax())``, ``Solution.mesh is None``) or, for a
    solver without an error estimate, in constant steps ``dt0``. The solve applies
    known-time events (``jumps=``, ``tstops=``, doses): ``jax.lax.scan`` over the segments
    between event times (per trajectory, ``+inf`` padding as zero-length segments at
    ``t1``) of ``jax.vmap(diffrax.diffeqsolve)``, each segment restarting the solver and
    its controller from the state plus the jump, saving the save times it holds by dense
    output (``SaveAt(ts=...)``); the replay of a recorded mesh refuses events. Applies to
    Diffrax solvers and to `gradsolve.Tsit5` and `gradsolve.Dopri5` (run as their Diffrax
    twins); records no mesh. ``Solution.route == "diffrax-diffeqsolve"``.

    Example:
        >>> ref = gs.solve(f, 0.0, 10.0, y0, p, ts=ts, driver=gs.drivers.Diffrax())
    """

    name: ClassVar[str] = "diffrax-diffeqsolve"

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return ("diffrax.diffeqsolve records no mesh (it reaches save times by dense output, "
                "not as forced nodes); record with gs.drivers.Auto() and replay with "
                "gs.drivers.Diffrax(), or solve with it directly.")

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        if events:
            return EVENTS_REASON
        if diffrax_twin(solver) is None:
            return (f"it runs Diffrax solvers and gs.Tsit5/gs.Dopri5 (their Diffrax twins), "
                    f"not {type(solver).__name__}.")
        return None

    def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        import diffrax

        dsolver = diffrax_twin(solver)
        term = diffrax.ODETerm(lambda t, y, args: f(t, y, args))
        times = node_times(nodes.times, nodes.save_index, nodes.tsave, nodes.subst)[0] \
            if moved else nodes.times
        n, s1 = times.shape
        n_eff = nodes.n_eff
        rows = jnp.arange(n)
        slots = jnp.arange(s1)[None]
        failed = n_eff == 0  # the caller sets these to NaN; replay them from 0 over [t0, t0+1]
        y0 = jnp.where(failed[:, None], 0.0, y0)
        t_first = times[:, 0]
        t_last = jnp.where(failed, t_first + 1.0, times[rows, n_eff])
        # StepTo needs strictly increasing nodes of one length for the whole ensemble: past
        # its last node a trajectory takes tiny steps whose states nobody reads.
        tiny = 1e-6 * jnp.maximum(jnp.abs(t_last), 1.0)
        extra = (slots - n_eff[:, None]) * tiny[:, None]
        steps = jnp.where(slots > n_eff[:, None], t_last[:, None] + extra, times)
        steps = jnp.where(failed[:, None] & (slots > 0), t_first[:, None] + 1.0 + extra, steps)

        def one(y0, p, steps):
            sol = diffrax.diffeqsolve(
                term, dsolver, steps[0], steps[-1], None, y0, args=p,
                saveat=diffrax.SaveAt(steps=True),
                stepsize_controller=diffrax.StepTo(ts=steps), max_steps=max(s1 - 1, 1),
                adjoint=diffrax.RecursiveCheckpointAdjoint(), throw=False)
            return sol.ys

        states = jax.vmap(one)(y0, params, steps)  # (n, S, d): node i + 1
        states = jnp.concatenate([y0[:, None], states], axis=1)
        node = jnp.minimum(nodes.save_index, n_eff[:, None])
        ys = states[rows[:, None], node]
        y1 = states[rows, n_eff]
        err = jnp.full((n,), jnp.nan, y0.dtype)
        return ReplayOutput(ys, y1, err, jnp.sum(n_eff).astype(y0.dtype))


def _segments(t0, t1, ts, events, n: int, d: int, dtype):
    """The solve's segments between known-time events, per trajectory: starts and ends
    ``(B + 1, n)``, the state jump after each ``(B + 1, n, d)`` (zero after a tstop and
    after the last) and the segment that reads each save time ``(n, k)``. ``B = J + L``:
    jump times and tstops merged in time order; ``+inf`` padding becomes a zero jump at
    ``t1`` (a zero-length segment, no steps). A save time equal to an event time is read
    by the segment that ends there, before the jump."""
    t0a, t1a = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
    if events is None:
        ends = jnp.zeros((n, 0), dtype)
        sizes = jnp.zeros((n, 0, d), dtype)
    else:
        ends = jnp.concatenate([events.jump_times, events.tstops], 1)
        sizes = jnp.concatenate(
            [events.jump_sizes, jnp.zeros(events.tstops.shape + (d,), dtype)], 1)
        order = jnp.argsort(jax.lax.stop_gradient(ends), axis=1, stable=True)
        ends = jnp.take_along_axis(ends, order, 1)
        sizes = jnp.take_along_axis(sizes, order[..., None], 1)
        live = jnp.isfinite(ends)
        ends = jnp.where(live, ends, t1a)
        sizes = jnp.where(live[..., None], sizes, 0.0)
    owner = jnp.sum(jax.lax.stop_gradient(ends)[:, None, :] < jax.lax.stop_gradient(ts)[..., None],
                    axis=-1)
    starts = jnp.concatenate([jnp.broadcast_to(t0a, (n, 1)), ends], 1)
    ends = jnp.concatenate([ends, jnp.broadcast_to(t1a, (n, 1))], 1)
    sizes = jnp.concatenate([sizes, jnp.zeros((n, 1, d), dtype)], 1)
    return starts.T, ends.T, jnp.swapaxes(sizes, 0, 1), owner


def _diffeqsolve_segments(term, dsolver, control, dt0, max_steps: int, y0, params, ts,
                          segments):
    """``jax.vmap(diffrax.diffeqsolve)`` over the ensemble, one segment after the other
    (``lax.scan``: one traced solve whatever the number of events): each segment from the
    state after the previous one's jump, saving (``SaveAt(ts=...)``, dense output) the
    save times it reads. ``(ys (n, k, d), y1 (n, d), accepted (n,), rejected (n,),
    status (n,))``; the first failure's status is kept."""
    import diffrax

    starts, ends, sizes, owner = segments

    def one(y0, p, a, c, ts):
        # save times of other segments are clamped into this one and not read
        inside = jnp.where(ts < a, a, jnp.where(ts > c, c, ts))
        sol = diffrax.diffeqsolve(
            term, dsolver, a, c, dt0, y0, args=p, saveat=diffrax.SaveAt(ts=inside, t1=True),
            stepsize_controller=control, max_steps=max_steps,
            adjoint=diffrax.RecursiveCheckpointAdjoint(), throw=False,
        )
        status = _status(sol.result)
        finite = jnp.all(jnp.isfinite(sol.ys))
        status = jnp.where((status == Status.OK) & ~finite, Status.NONFINITE, status)
        return (sol.ys[:-1], sol.ys[-1], sol.stats["num_accepted_steps"].astype(jnp.int32),
                sol.stats["num_rejected_steps"].astype(jnp.int32), status.astype(jnp.int32))

    def segment(carry, x):
        y, ys, nacc, nrej, status = carry
        a, c, size, m = x
        ys_m, y_end, acc, rej, st = jax.vmap(one)(y, params, a, c, ts)
        ys = jnp.where((owner == m)[..., None], ys_m, ys)
        status = jnp.where(status == Status.OK, st, status)
        return (y_end + size, ys, nacc + acc, nrej + rej, status), None

    if starts.shape[0] == 1:  # no events: one solve over [t0, t1]
        return jax.vmap(one)(y0, params, starts[0], ends[0], ts)
    n, k = ts.shape
    zero = jnp.zeros((n,), jnp.int32)
    init = (y0, jnp.zeros((n, k) + y0.shape[1:], y0.dtype), zero, zero, zero)
    xs = (starts, ends, sizes, jnp.arange(starts.shape[0]))
    (y1, ys, nacc, nrej, status), _ = jax.lax.scan(segment, init, xs)
    return ys, y1, nacc, nrej, status


def solve_batched(f, t0, t1, b, solver, rtol, atol, dt0, max_steps: int, controller, throw,
                  where: str, events=None) -> Solution:
    """``gs.solve`` by ``diffrax.diffeqsolve`` on batched inputs ``b`` (`gradsolve._checks.
    batch`): adaptive (``PIDController`` with ``controller``'s coefficients) where the
    solver has an error estimate, constant steps ``dt0`` otherwise. Known-time ``events``
    (`gradsolve._events.Events`) split the interval: one ``diffeqsolve`` per segment
    between event times, the jump added to the state in between (each segment restarts the
    solver and its step-size controller, as Diffrax does at ``jump_ts``); ``max_steps``
    bounds each segment. Failures follow the library's policy: Diffrax runs with
    ``throw=False`` and its result becomes ``stats["status"]`` with NaN outputs; outside
    ``jit`` (or with ``throw=True``) a failure raises."""
    import diffrax

    adaptive = not (isinstance(solver, DiffraxSolver) and not solver.adaptive)
    dsolver = diffrax_twin(solver)
    if not adaptive and dt0 is None:
        raise ValueError(
            f"{where}: `solver` {type(dsolver).__name__} has no error estimate; pass `dt0` "
            "for constant steps."
        )
    term = diffrax.ODETerm(lambda t, y, args: f(t, y, args))
    if not adaptive:
        try:  # constant steps: the step count is known, make room for it
            max_steps = max(max_steps, int(np.ceil((float(t1) - float(t0)) / float(dt0))) + 2)
        except (TypeError, jax.errors.ConcretizationTypeError):
            pass
    rc = runtime_checks(t0, t1, b.ts, rtol if adaptive else 1.0, atol if adaptive else 1.0,
                        dt0, events)
    ts_run = b.ts
    if rc is not None:
        t0, t1, ts_run, dt0, events = rc.t0, rc.t1, rc.ts, rc.dt0, rc.events
        if adaptive:
            rtol, atol = rc.rtol, rc.atol
    if adaptive:
        control = diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=controller.pcoeff,
                                        icoeff=controller.icoeff, safety=controller.safety,
                                        factormin=controller.factormin,
                                        factormax=controller.factormax)
    else:
        control = diffrax.ConstantStepSize()
    segments = _segments(t0, t1, ts_run, events, b.n, b.d, b.y0.dtype)
    ys, y1, nacc, nrej, status = _diffeqsolve_segments(term, dsolver, control, dt0, max_steps,
                                                       b.y0, b.params, ts_run, segments)
    if rc is not None:
        status = jnp.where(rc.invalid, Status.INVALID_INPUT, status).astype(jnp.int32)
    failed = status != Status.OK
    # NaN values and derivatives for failed trajectories (`gradsolve._nan_rows`)
    inputs = (b.y0, b.params, b.ts, () if events is None else events.jump_sizes, t0, t1)
    ys, y1 = nan_rows(failed, (ys, y1), inputs)
    if is_concrete(status):
        if throw is None or throw:
            raise_if_fallback_failed(status, where, dt0, max_steps)
    elif throw:
        ys = error_if_failed(
            ys, status, None if rc is None else rc.failed, where,
            "a trajectory failed on diffrax.diffeqsolve: max_steps="
            f"{max_steps} reached or a non-finite state; pass a larger `max_steps`"
            + (" or a smaller `dt0`, or use an adaptive solver." if not adaptive else "."),
        )
    err = jnp.full((b.n,), jnp.nan, b.y0.dtype)
    stats = {"num_accepted_steps": nacc, "num_rejected_steps": nrej, "status": status}
    out_ts = b.ts
    if b.single:
        ys, y1, err, out_ts = ys[0], y1[0], err[0], out_ts[0]
        stats = {k: v[0] for k, v in stats.items()}
    return Solution(ys=ys, y1=y1, ts=out_ts, mesh=None, stats=stats, error_ratio=err,
                    route=Diffrax.name)
