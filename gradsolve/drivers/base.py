"""What a driver is: how a record, a replay or a solve runs, as data.

`gradsolve.record`, `gradsolve.replay` and `gradsolve.solve` validate their inputs, batch
them (``y0 (n, d)``, every ``params`` leaf with leading axis ``n``) and hand the work to a
driver, the way ``diffrax.diffeqsolve`` hands its loop to its ``adjoint=``. Every driver
runs the same solver ``step`` over the same nodes, so on one mesh they all give the same
values and gradients (to rounding); they differ in how the ensemble is laid out and how
the adjoint is formed, hence in speed and in where they apply.

A driver says where it applies by returning ``None`` from `AbstractDriver.record_reason`
/ `AbstractDriver.replay_reason`, and otherwise a sentence saying why not; an explicit
``driver=`` that does not apply is a ``ValueError`` giving that sentence, and
`gradsolve.drivers.Auto` asks each driver in turn. Adding a driver (a fused GPU kernel,
say) is one new module with one final subclass.
"""

from __future__ import annotations

import abc

from typing import Any, ClassVar, NamedTuple

import equinox as eqx
from jaxtyping import Array, Bool, Float, Int, PyTree


class ReplayNodes(NamedTuple):
    """The nodes every replay driver replays (batched, validated, no gradient but
    ``tsave``).

    Attributes:
        times: ``(n, S + 1)`` recorded node times; slots past ``n_eff`` may hold anything.
        n_eff: ``(n,)`` steps to replay (0 for a trajectory that failed or is invalid).
        save_index: ``(n, k)`` node of each save slot.
        tsave: ``(n, k)`` save times, differentiable.
        subst: ``(n, k)`` save slots whose node moves to ``tsave`` (interior, first of equal
            save times, and ``ts`` given); `gradsolve._savetimes.node_times` applies it.
        events: ``None`` (no known-time events), or the jumps and tstops to apply
            (`gradsolve._events.ReplayEvents`; differentiable w.r.t. jump times and sizes).
            Only drivers whose ``replay_reason(..., events=True)`` is ``None`` get them.
    """

    times: Float[Array, "n S1"]
    n_eff: Int[Array, " n"]
    save_index: Int[Array, "n k"]
    tsave: Float[Array, "n k"]
    subst: Bool[Array, "n k"]
    events: Any = None


class ReplayOutput(NamedTuple):
    """What a replay driver returns, batched.

    Attributes:
        ys: ``(n, k, d)`` states at the save nodes.
        y1: ``(n, d)`` final states.
        err: ``(n,)`` largest embedded-error norm met (``<= 1``: the mesh still holds).
        work: ``()`` trajectory-steps computed, padding included.
    """

    ys: Float[Array, "n k d"]
    y1: Float[Array, "n d"]
    err: Float[Array, " n"]
    work: Float[Array, ""]


class ReplayLayout(NamedTuple):
    """How the XLA replays lay out the ensemble: ``group_size`` trajectories per
    length-sorted group (``None``: the driver's default for ``backend``, the JAX backend the
    replay was traced for) and ``chunk_size`` steps per skippable, rematerialised chunk."""

    group_size: int | None
    chunk_size: int
    backend: str


class AbstractDriver(eqx.Module):
    """How a record, a replay or a solve runs (`gradsolve.drivers`).

    Subclasses are final and give `name` (what ``Solution.route`` reports) and the methods
    below; ``None`` from a ``*_reason`` method means the driver applies. Drivers hold no
    arrays (they are static arguments of compiled functions and compare by type).

    Attributes:
        name: class-level string, what ``Solution.route`` reports when this driver ran.
        ragged: class-level bool, whether a replay costs each trajectory's own step count
            (the mesh's unused step slots are free), so a caller that keeps one compiled
            program across meshes of different lengths may give the mesh room to grow.
            ``False`` (the XLA replays run every slot under ``vmap``) unless a driver says
            otherwise.

    Example:
        A driver that only replays, through the batched replay (a real one computes its
        own `ReplayOutput` here):

        >>> from typing import ClassVar
        >>> from gradsolve.drivers.batched import replay_nodes
        >>> class Mine(gs.drivers.AbstractDriver):
        ...     name: ClassVar[str] = "mine"
        ...     def replay_reason(self, f, solver, y0, params):
        ...         return None
        ...     def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        ...         return replay_nodes(f, solver, nodes, y0, params, rtol, atol, moved, layout)
        >>> gs.replay(f, mesh, y0, params, driver=Mine()).route
        'mine'
    """

    name: ClassVar[str]
    ragged: ClassVar[bool] = False

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        """``None`` if this driver can record ``f`` with ``solver`` on batched ``y0 (n, d)``
        and ``params`` (abstract values are enough), else why not. ``events=True``: the
        record has known-time events (``jumps=`` or ``tstops=``); the keyword is passed
        only then, so a driver that never handles events may leave it out."""
        return f"{self.name} does not record a mesh."

    @abc.abstractmethod
    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        """``None`` if this driver can replay a mesh of ``solver`` for ``f`` on batched
        ``y0 (n, d)`` and ``params``, else why not. ``events`` as in `record_reason`.
        Abstract: every driver says where it applies (so the base class, which runs
        nothing, cannot be instantiated)."""

    def record(self, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
               max_steps: int, fill: bool, events=None):
        """The adaptive record of batched inputs as a `gradsolve.Mesh` (no validation):
        ``y0 (n, d)``, ``ts (n, k)``, scalars ``t0``, ``t1``, ``rtol``, ``atol``;
        ``dt0`` ``None`` or a scalar; ``max_steps`` the mesh capacity. ``fill=False``
        leaves the slots past each trajectory's ``n_steps`` unspecified. ``events``:
        ``None`` or the validated `gradsolve._events.Events` (forced nodes, jumps)."""
        raise ValueError(self.record_reason(None, solver, None, None))

    def replay(self, f, solver, nodes: ReplayNodes, y0: Float[Array, "n d"], params: PyTree,
               rtol, atol, *, moved: bool, layout: ReplayLayout) -> ReplayOutput:
        """Replay ``nodes`` from ``y0`` at ``params`` (batched), differentiable w.r.t.
        ``y0``, ``params`` and ``nodes.tsave``. ``moved`` (static) says whether save
        nodes move (``ts`` given), so a driver may skip node-time cotangents otherwise."""
        raise ValueError(self.replay_reason(f, solver, y0, params))


def refuse(driver: AbstractDriver, reason: str, where: str) -> ValueError:
    """The error for an explicit ``driver=`` that does not apply."""
    return ValueError(
        f"{where}: `driver` {type(driver).__name__}() does not apply here: {reason} "
        "Pass driver=gs.drivers.Auto() (the default) to use the fastest one that does."
    )
