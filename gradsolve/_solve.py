"""`solve`: record then replay in one jittable call."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import is_concrete
from ._controller import PIDController
from ._errors import error_if_failed, raise_if_fallback_failed
from ._mesh import Status
from ._record import _MAX_STEPS, prepare, record_prepared, runtime_checks, unbatch_mesh
from ._replay import replay_prepared
from ._solution import Solution
from ._solver.diffrax_adapter import DiffraxSolver


def solve(
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
    group_size: int | None = None,
    chunk_size: int = 8,
) -> Solution:
    """Adaptive solve whose derivative is the discrete adjoint of its accepted steps.

    Records the mesh (no gradient flows through step-size selection, as in Diffrax's
    default ``RecursiveCheckpointAdjoint``) and replays it at the differentiable ``y0``,
    ``params`` and ``ts``.

    Args:
        f: vector field ``f(t, y, params) -> dy/dt`` for ONE trajectory, ``y`` of shape
            ``(d,)``; gradsolve batches it.
        t0, t1: scalars, ``t1 > t0``.
        y0: ``(d,)`` one trajectory or ``(n, d)`` an ensemble (then every leaf of
            ``params`` has leading axis ``n``). It is solved in one floating dtype with
            the floating leaves of ``params``: their ``jnp.result_type``, at least float32
            (float16/bfloat16 are promoted to float32).
        params: any pytree. Non-array leaves (an ``eqx.nn.MLP``'s activation, a string)
            are split off with ``eqx.partition`` and handed back to ``f`` unchanged.
        ts: save times ``(k,)`` shared or ``(n, k)`` per trajectory, sorted, in
            ``[t0, t1]``; default ``None`` saves at ``t1`` only.
        solver: a gradsolve solver (default `Tsit5`) or any ``diffrax`` solver.
        rtol, atol: tolerances of the error test ``|err| <= atol + rtol |y|`` (RMS).
        dt0: initial step, positive; ``None`` picks it per trajectory. Every solver with
            an error estimate (Diffrax's ``Heun`` and ``Midpoint`` included) records
            adaptively, so ``dt0`` only seeds the first step; only a Diffrax solver without
            one (e.g. ``diffrax.Euler()``) takes constant steps of ``dt0``.
        max_steps: capacity of the recorded mesh (accepted steps; each save time is one).
        controller: `PIDController` (default: I-controller, as Diffrax).
        throw: failure policy, as in `gradsolve.record`.
        group_size, chunk_size: replay layout, as in `gradsolve.replay`.

    Returns:
        A `Solution`: ``ys (n, k, d)`` (``(k, d)`` for one trajectory), ``y1``,
        ``error_ratio (n,)``, ``stats``, ``mesh`` and ``route``. Differentiable with
        respect to ``y0``, ``params`` and ``ts``.

    A Diffrax solver without an error estimate (e.g. ``diffrax.Euler()``) falls back to
    ``diffrax.diffeqsolve`` with constant steps ``dt0`` and ``RecursiveCheckpointAdjoint``;
    ``Solution.route`` says which ran. Failures there follow the same policy: status codes
    in ``stats["status"]`` with NaN outputs inside ``jit`` (and with ``throw=False``), a
    ``RuntimeError`` outside it.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0.0, 10.0, 21))
        >>> sol.ys.shape  # (n, 21, d)
    """
    where = "gs.solve"
    f, solver, controller, b = prepare(f, t0, t1, y0, params, ts, solver, rtol, atol, max_steps,
                                       controller, where, dt0)
    if isinstance(solver, DiffraxSolver) and not solver.adaptive:
        return _diffrax_fallback(f, t0, t1, b, solver.solver, dt0, max_steps, throw, where)
    mesh = record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw,
                           where)
    if b.single:
        mesh = unbatch_mesh(mesh)
    # The record stops gradients; the replay differentiates w.r.t. the interval's ends.
    mesh = eqx.tree_at(lambda m: (m.t0, m.t1), mesh,
                       (jnp.asarray(t0, mesh.t0.dtype), jnp.asarray(t1, mesh.t1.dtype)))
    # The record's inputs are already validated and batched, and its nodes sit at ``ts``:
    # replay them as they are.
    return replay_prepared(f, mesh, b, ts is not None, group_size, chunk_size,
                           check_moved=False)


def _diffrax_fallback(f, t0, t1, b, dsolver, dt0, max_steps, throw, where) -> Solution:
    """``diffrax.diffeqsolve`` with constant steps ``dt0`` for each trajectory. Failures
    follow SPEC §2.6 as on the other routes: Diffrax runs with ``throw=False`` and its
    result becomes ``stats["status"]`` (`Status` codes) with NaN outputs; outside ``jit``
    (or with ``throw=True``) a failure raises."""
    import diffrax

    if dt0 is None:
        raise ValueError(
            f"{where}: `solver` {type(dsolver).__name__} has no error estimate; pass `dt0` "
            "for constant steps."
        )
    term = diffrax.ODETerm(lambda t, y, args: f(t, y, args))
    try:  # constant steps: the step count is known, make room for it
        max_steps = max(max_steps, int(np.ceil((float(t1) - float(t0)) / float(dt0))) + 2)
    except (TypeError, jax.errors.ConcretizationTypeError):
        pass
    rc = runtime_checks(t0, t1, b.ts, 1.0, 1.0, dt0)
    if rc is not None:
        t0, t1, ts_run, dt0 = rc.t0, rc.t1, rc.ts, rc.dt0
    else:
        ts_run = b.ts
    R = diffrax.RESULTS

    def one(y0, p, ts):
        sol = diffrax.diffeqsolve(
            term, dsolver, t0, t1, dt0, y0, args=p, saveat=diffrax.SaveAt(ts=ts, t1=True),
            stepsize_controller=diffrax.ConstantStepSize(), max_steps=max_steps,
            adjoint=diffrax.RecursiveCheckpointAdjoint(), throw=False,
        )
        r = sol.result
        status = jnp.where(
            r == R.successful, Status.OK,
            jnp.where((r == R.max_steps_reached) | (r == R.max_steps_rejected), Status.MAX_STEPS,
                      jnp.where(r == R.dt_min_reached, Status.STEP_UNDERFLOW, Status.NONFINITE)),
        )
        finite = jnp.all(jnp.isfinite(sol.ys))
        status = jnp.where((status == Status.OK) & ~finite, Status.NONFINITE, status)
        return sol.ys[:-1], sol.ys[-1], sol.stats["num_accepted_steps"], status.astype(jnp.int32)

    ys, y1, nacc, status = jax.vmap(one)(b.y0, b.params, ts_run)
    if rc is not None:
        status = jnp.where(rc.invalid, Status.INVALID_INPUT, status).astype(jnp.int32)
    failed = status != Status.OK
    nan = jnp.asarray(jnp.nan, b.y0.dtype)
    ys = jnp.where(failed[:, None, None], nan, ys)
    y1 = jnp.where(failed[:, None], nan, y1)
    if is_concrete(status):
        if throw is None or throw:
            raise_if_fallback_failed(status, where, dt0, max_steps)
    elif throw:
        ys = error_if_failed(
            ys, status, None if rc is None else rc.failed, where,
            "a trajectory failed on the diffrax.diffeqsolve fallback (constant steps "
            f"dt0): max_steps={max_steps} reached or a non-finite state; pass a larger "
            "`max_steps` or a smaller `dt0`, or use an adaptive solver.",
        )
    err = jnp.full((b.n,), jnp.nan, b.y0.dtype)
    stats = {"num_accepted_steps": nacc, "num_rejected_steps": jnp.zeros_like(nacc),
             "status": status}
    out_ts = b.ts
    if b.single:
        ys, y1, err, out_ts = ys[0], y1[0], err[0], out_ts[0]
        stats = {k: v[0] for k, v in stats.items()}
    return Solution(ys=ys, y1=y1, ts=out_ts, mesh=None, stats=stats, error_ratio=err,
                    route="diffrax-diffeqsolve")
