"""`solve`: record then replay in one jittable call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._controller import PIDController
from ._record import _MAX_STEPS, prepare, record_prepared, unbatch_mesh
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
            ``params`` has leading axis ``n``).
        params: any pytree of arrays.
        ts: save times ``(k,)`` shared or ``(n, k)`` per trajectory, sorted, in
            ``[t0, t1]``; default ``None`` saves at ``t1`` only.
        solver: a gradsolve solver (default `Tsit5`) or any ``diffrax`` solver.
        rtol, atol: tolerances of the error test ``|err| <= atol + rtol |y|`` (RMS).
        dt0: initial step; ``None`` picks it per trajectory.
        max_steps: capacity of the recorded mesh (accepted steps).
        controller: `PIDController` (default: I-controller, as Diffrax).
        throw: failure policy, as in `gradsolve.record`.
        group_size, chunk_size: replay layout, as in `gradsolve.replay`.

    Returns:
        A `Solution`: ``ys (n, k, d)`` (``(k, d)`` for one trajectory), ``y1``,
        ``error_ratio (n,)``, ``stats``, ``mesh`` and ``route``. Differentiable with
        respect to ``y0``, ``params`` and ``ts``.

    A Diffrax solver without an error estimate (e.g. ``diffrax.Euler()``) falls back to
    ``diffrax.diffeqsolve`` with constant steps ``dt0`` and ``RecursiveCheckpointAdjoint``;
    ``Solution.route`` says which ran.

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0.0, 10.0, 21))
        >>> sol.ys.shape  # (n, 21, d)
    """
    where = "gs.solve"
    solver, controller, b = prepare(f, t0, t1, y0, params, ts, solver, rtol, atol, max_steps,
                                    controller, where)
    if isinstance(solver, DiffraxSolver) and not solver.adaptive:
        return _diffrax_fallback(f, t0, t1, b, solver.solver, dt0, max_steps)
    mesh = record_prepared(f, solver, controller, t0, t1, b, rtol, atol, dt0, max_steps, throw,
                           where)
    if b.single:
        mesh = unbatch_mesh(mesh)
    # The record's inputs are already validated and batched: replay them as they are.
    return replay_prepared(f, mesh, b, ts is not None, group_size, chunk_size)


def _diffrax_fallback(f, t0, t1, b, dsolver, dt0, max_steps) -> Solution:
    import diffrax

    if dt0 is None:
        raise ValueError(
            f"gs.solve: `solver` {type(dsolver).__name__} has no error estimate; pass `dt0` "
            "for constant steps."
        )
    term = diffrax.ODETerm(lambda t, y, args: f(t, y, args))
    try:  # constant steps: the step count is known, make room for it
        max_steps = max(max_steps, int(np.ceil((float(t1) - float(t0)) / float(dt0))) + 2)
    except (TypeError, jax.errors.ConcretizationTypeError):
        pass

    def one(y0, p, ts):
        sol = diffrax.diffeqsolve(
            term, dsolver, t0, t1, dt0, y0, args=p, saveat=diffrax.SaveAt(ts=ts, t1=True),
            stepsize_controller=diffrax.ConstantStepSize(), max_steps=max_steps,
            adjoint=diffrax.RecursiveCheckpointAdjoint(),
        )
        return sol.ys[:-1], sol.ys[-1], sol.stats["num_accepted_steps"]

    ys, y1, nacc = jax.vmap(one)(b.y0, b.params, b.ts)
    err = jnp.full((b.n,), jnp.nan, b.y0.dtype)
    stats = {"num_accepted_steps": nacc, "num_rejected_steps": jnp.zeros_like(nacc)}
    out_ts = b.ts
    if b.single:
        ys, y1, err, out_ts = ys[0], y1[0], err[0], out_ts[0]
        stats = {k: v[0] for k, v in stats.items()}
    return Solution(ys=ys, y1=y1, ts=out_ts, mesh=None, stats=stats, error_ratio=err,
                    route="diffrax-diffeqsolve")
