"""The recorded mesh: what an adaptive solve accepted, kept so it can be replayed.

`Mesh` also owns its row algebra (select, scatter, concatenate, pad/trim, batch/unbatch,
repeat, stacking per chain, union of step times): the fields that carry the ensemble axis
are declared once, in `Mesh.PER_TRAJECTORY`, and every operation on rows goes through that
list, so a new per-trajectory field cannot be forgotten by one of them.

Host meshes (NumPy leaves, from `Mesh.to_host`) stay NumPy under that algebra: drivers that
edit meshes between compiled steps (fitting, sampling) do it on the host, because eager JAX
ops on ever-changing shapes would each compile a program.

This module says what each operation means (the methods' signatures, docstrings and
examples, which the API reference renders); how it is done (row validation, host/device
branches, capacity reconciliation, the union/merge walk) is in `gradsolve._mesh_rows`, one
function per method.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
from jaxtyping import Array, Float, Int, PyTree

from . import _mesh_rows as _rows
from ._controller import PIDController
from ._solver.base import AbstractSolver


class Status(enum.IntEnum):
    """Per-trajectory outcome of `gradsolve.record` (``Mesh.status``).

    An ``IntEnum``: ``Mesh.status`` holds these codes as ``int32`` arrays of shape ``(n,)``.

    Attributes:
        OK: 0, the solve reached ``t1``.
        MAX_STEPS: 1, the mesh capacity ``max_steps`` (or the attempt cap) was reached
            before ``t1``; raise ``max_steps`` or, for a stiff problem, use
            `Rodas5P`.
        NONFINITE: 2, a NaN or inf appeared in ``f`` or the state.
        STEP_UNDERFLOW: 3, the step size became too small to advance the time.
        INVALID_INPUT: 4, an input that could only be checked at run time (a traced value
            under ``jax.jit``/``vmap``) was invalid: ``ts`` unsorted, outside ``[t0, t1]``
            or non-finite; ``t1 <= t0``; ``rtol``/``atol`` not positive; ``dt0`` not
            positive and finite; ``jumps`` times or ``tstops`` unsorted or outside
            ``[t0, t1]``, ``jumps`` sizes not finite; in a replay, save or jump times
            moved past a neighbouring mesh node. Outside ``jit`` the same inputs raise
            ``ValueError``.

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, throw=False)
        >>> failed = mesh.status != gs.Status.OK          # (n,) bool
    """

    OK = 0
    MAX_STEPS = 1
    NONFINITE = 2
    STEP_UNDERFLOW = 3
    INVALID_INPUT = 4


class Mesh(eqx.Module):
    """Accepted step times of an adaptive solve, per trajectory (a pytree).

    Shapes use ``n`` for the ensemble axis (absent for a single trajectory), ``S`` for the
    step capacity and ``k`` for the number of save times.

    Attributes:
        times: ``(n, S + 1)`` accepted step end points; ``times[..., 0] == t0``. Slots past
            ``n_steps`` are padding: `gradsolve.record` called outside ``jit`` fills them
            with the last time (zero-length steps); inside ``jit`` their values are
            unspecified, because the compiled record leaves them unwritten so that its cost
            follows the steps taken, not ``max_steps``. Readers mask with ``n_steps``;
            `Mesh.padded` fills them.
        n_steps: ``(n,)`` accepted steps (with jumps: each jump's own node counts as one,
            a zero-length step).
        n_rejected: ``(n,)`` rejected step attempts.
        status: ``(n,)`` `Status` codes (0 = ok).
        save_index: ``(n, k)`` index into ``times`` of each save time. Save times are
            forced mesh points, so values there are exact nodes of the replay.
        ts: ``(n, k)`` save times the mesh was recorded with.
        t0, t1: integration interval.
        dt_next: ``(n,)`` the step size the controller would try next (diagnostics).
        y_last: ``(n, d)`` state at the last accepted time (diagnostics).
        y0, params: the initial state and parameters the mesh was recorded at.
        jump_times, jump_sizes: ``(n, J)``, ``(n, J, d)`` the jumps (``jumps=``) it was
            recorded with (``+inf`` times pad ragged schedules); ``J = 0`` without jumps.
        jump_index: ``(n, J)`` the node of each jump: every jump has a node of its own,
            after the node (at the same time) that a save time equal to it reads, so a
            save time reads the state before the jump. ``0`` for a padded (inert) jump.
        tstops, tstop_index: ``(n, L)`` the ``tstops=`` it was recorded with and their
            nodes; ``L = 0`` without them. See `gradsolve._events` for the semantics.
        solver, rtol, atol, controller: how it was recorded.
        PER_TRAJECTORY: (class variable) names of the fields with the leading ensemble
            axis; every leaf of ``params`` has it too. All other fields (``t0``, ``t1``,
            ``solver``, ``rtol``, ``atol``, ``controller``) are shared by the ensemble.

    Row algebra (methods; host meshes stay NumPy, device meshes use ``jnp``): `n`,
    `batch`/`unbatch`, `to_host`/`to_device`, `select`, `scatter`, `where`,
    `with_capacity`, `trim`, `padded`, `concatenate`, `repeat`, `row`, `chains`, `union`.

    Why one class: a mesh is one checkpointed pytree (its fields cannot move), and its row
    operations are its documented public face, so they stay methods here; their bodies are
    functions in `gradsolve._mesh_rows`, and what remains is mostly their docstrings.

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0.0, 10.0, 21))
        >>> mesh.times.shape                # (n, S + 1): trimmed outside jit
        >>> mesh.n_steps, mesh.status       # (n,) each
        >>> sol = gs.replay(f, mesh, y0, 1.1 * params)   # reuse the mesh
    """

    times: Float[Array, "*n S1"]
    n_steps: Int[Array, "*n"]
    n_rejected: Int[Array, "*n"]
    status: Int[Array, "*n"]
    save_index: Int[Array, "*n k"]
    ts: Float[Array, "*n k"]
    t0: Float[Array, ""]
    t1: Float[Array, ""]
    dt_next: Float[Array, "*n"]
    y_last: Float[Array, "*n d"]
    y0: Float[Array, "*n d"]
    jump_times: Float[Array, "*n J"]
    jump_sizes: Float[Array, "*n J d"]
    jump_index: Int[Array, "*n J"]
    tstops: Float[Array, "*n L"]
    tstop_index: Int[Array, "*n L"]
    params: PyTree
    solver: AbstractSolver
    rtol: Any
    atol: Any
    controller: PIDController

    PER_TRAJECTORY: ClassVar[tuple[str, ...]] = (
        "times", "n_steps", "n_rejected", "status", "save_index", "ts", "dt_next", "y_last",
        "y0", "jump_times", "jump_sizes", "jump_index", "tstops", "tstop_index",
    )

    @property
    def n_jumps(self) -> int:
        """``J``, the number of jump slots per trajectory it was recorded with (0: none)."""
        return self.jump_times.shape[-1]

    @property
    def has_events(self) -> bool:
        """Whether it was recorded with jumps or tstops."""
        return self.jump_times.shape[-1] > 0 or self.tstops.shape[-1] > 0

    # ------------------------------------------------------------------ shape and kind

    @property
    def is_ensemble(self) -> bool:
        """Whether this mesh belongs to an ensemble ``(n, d)`` rather than one trajectory."""
        return self.n_steps.ndim == 1

    @property
    def n(self) -> int:
        """Number of trajectories: ``n`` for an ensemble, 1 for a single mesh."""
        return int(self.n_steps.shape[0]) if self.is_ensemble else 1

    @property
    def capacity(self) -> int:
        """Static number of step slots (``S``) the replay loops over."""
        return self.times.shape[-1] - 1

    @property
    def ok(self) -> Array:
        """Boolean mask of trajectories whose record succeeded."""
        return self.status == Status.OK

    # ------------------------------------------------------------------ axes

    def batch(self) -> "Mesh":
        """The same mesh with a leading ensemble axis of size 1 if it is a single trajectory;
        an ensemble is returned as is.

        Only the `PER_TRAJECTORY` fields get the axis; ``params`` is left as it is. This is
        the view `gradsolve.replay` takes of any mesh to read its per-trajectory arrays as
        ``(n, ...)``; it never reads ``params`` from it, and leaving them alone keeps that
        path free of one eager op per parameter leaf. So ``mesh.batch()`` of a single mesh
        is not a full ensemble for the row algebra (``select``, ``scatter``,
        ``concatenate``, ``unbatch`` index ``params`` too): use ``mesh.repeat(1)`` for
        that. Keeps NumPy leaves NumPy; works under ``jit``.

        Example:
            >>> single = gs.record(f, 0.0, 1.0, y0[0], p[0])
            >>> single.batch().times.shape      # (1, S + 1)
        """
        return _rows.batch(self)

    def unbatch(self) -> "Mesh":
        """An ensemble of one trajectory as a single mesh (``params`` included); a single
        mesh is returned as is.

        Raises ``ValueError`` for an ensemble of more than one (use `Mesh.row`).

        Example:
            >>> mesh = gs.record(f, 0.0, 1.0, y0[:1], p[:1])    # n = 1
            >>> mesh.unbatch().times.shape                       # (S + 1,)
        """
        if not self.is_ensemble:
            return self
        if self.n != 1:
            raise ValueError(
                f"Mesh.unbatch: the ensemble has {self.n} trajectories, only an ensemble of "
                "one can be unbatched; use mesh.row(i) for one of them."
            )
        return self.row(0)

    def row(self, i: int) -> "Mesh":
        """Trajectory ``i`` of an ensemble as a single mesh (``params`` included); a single
        mesh is returned as is (``i`` must then be 0).

        Host meshes stay NumPy (0-d arrays, not NumPy scalars, for the ``(n,)`` fields).

        Example:
            >>> mesh.row(2).n_steps == mesh.n_steps[2]
            >>> gs.replay(f, mesh.row(2), y0[2], p[2])      # = row 2 of the ensemble replay
        """
        return _rows.row(self, i)

    def repeat(self, count: int) -> "Mesh":
        """A single-trajectory mesh as an ensemble of ``count`` identical rows (``params``
        broadcast too): every `PER_TRAJECTORY` field and ``params`` leaf gets a leading
        axis of ``count``.

        For instance to scatter per-trajectory re-records into one shared mesh. Host meshes
        stay NumPy (copies, writable).

        Example:
            >>> ens = single.repeat(4)           # ens.n == 4, ens.times.shape == (4, S + 1)
            >>> p4 = jax.tree.map(lambda x: jnp.stack([x] * 4), p)
            >>> gs.replay(f, ens, jnp.tile(y0, (4, 1)), p4)
        """
        return _rows.repeat(self, count)

    def chains(self, count: int, capacity: int | None = None) -> "Mesh":
        """One single-trajectory mesh per chain, stacked: EVERY array leaf (the shared
        ``t0``, ``t1``, ``rtol``, ``atol`` too) gets a leading axis of ``count``, on device.

        ``jax.vmap`` over that axis then hands each chain a single-trajectory mesh (vmap
        needs the axis on every leaf it maps). From a single mesh every chain gets the same
        mesh (broadcast); from an ensemble of ``count`` rows chain ``i`` gets row ``i``.
        With ``capacity`` the step axis is first set to exactly that many slots
        (`with_capacity`), so the vmapped replay keeps one compiled shape while the meshes
        change. The result is a stack, not a mesh to replay outside ``vmap``.

        Example:
            >>> stack = mesh.chains(4, capacity=64)      # stack.times.shape == (4, 65)
            >>> ys = jax.vmap(lambda m, p: gs.replay(f, m, y0, p).ys)(stack, p4)
        """
        return _rows.chains(self, count, capacity)

    # ------------------------------------------------------------------ host and device

    def to_host(self) -> "Mesh":
        """The mesh on the host: every array leaf (``params``, solver and controller
        included) as a NumPy array, its padding slots filled (`padded`). Leaves may be
        read-only views of JAX's buffers; the row algebra never writes into them.

        The row algebra then runs in NumPy: a mesh recorded under ``jit`` leaves its padding
        slots unspecified, and eager JAX ops on changing shapes would each compile a
        program. Outside ``jit`` only.

        Example:
            >>> host = mesh.to_host()         # type(host.times) is np.ndarray
            >>> gs.replay(f, host.to_device(), y0, p)
        """
        return _rows.to_host(self)

    def to_device(self) -> "Mesh":
        """The mesh with every NumPy leaf as a JAX array (``jnp.asarray``); others kept.

        Example:
            >>> mesh_d = mesh.to_host().select(rows).to_device()
        """
        return _rows.to_device(self)

    # ------------------------------------------------------------------ rows

    def select(self, rows) -> "Mesh":
        """The ensemble restricted to ``rows`` (``params`` included), in that order.

        Args:
            rows: a 1-d int index array (``(m,)``, any order, repeats allowed; under
                ``jit`` it may be traced) or a bool mask of shape ``(n,)``.

        Returns an ensemble of ``m`` trajectories with the same capacity: replaying it with
        ``y0[rows]``, ``params[rows]`` gives rows ``rows`` of the full replay, because each
        trajectory's mesh depends on that trajectory alone. Host meshes stay NumPy.

        Example:
            >>> sub = mesh.select(mesh.ok)                 # the successful records
            >>> gs.replay(f, sub, y0[mesh.ok], p[mesh.ok])
        """
        return _rows.select(self, rows)

    def scatter(self, rows, other: "Mesh") -> "Mesh":
        """A copy of this ensemble whose rows ``rows`` are replaced by all rows of ``other``.

        Args:
            rows: ``(other.n,)`` distinct int row indices (or a ``(n,)`` bool mask with
                ``other.n`` entries set), in the order of ``other``'s rows.
            other: the replacing ensemble (a single mesh counts as one row), recorded the
                same way (solver, state size, save times, params structure).

        Capacities are reconciled first (the smaller padded to the larger, `with_capacity`);
        trim the result if it should shrink again. For instance re-recording only the
        trajectories whose mesh went stale and putting them back. The result is a host mesh
        if this one is (``other`` converted), otherwise a device mesh.

        Example:
            >>> stale = np.flatnonzero(needs_record)
            >>> new = gs.record(f, t0, t1, y0[stale], p[stale], ts=ts).to_host()
            >>> mesh = mesh.scatter(stale, new).trim()
        """
        return _rows.scatter(self, rows, other)

    def where(self, mask, other: "Mesh") -> "Mesh":
        """Row ``i`` from ``other`` where ``mask[i]``, else from this mesh (jittable).

        Args:
            mask: ``(n,)`` bool (``()`` for a single trajectory), possibly traced.
            other: a mesh of the same rows, recorded the same way and with the same step
                capacity (shapes must agree, so that this works under ``jit``: see
                `with_capacity`).

        Unlike `scatter` (rows named by index, capacities reconciled on the host), this keeps
        every shape, so a loop can swap re-recorded rows in without leaving ``jit``.

        Example:
            >>> fresh = gs.record(f, t0, t1, y0, p, ts=ts, max_steps=mesh.capacity)
            >>> mesh = mesh.where(sol.error_ratio > 1, fresh)
        """
        return _rows.where(self, mask, other)

    @staticmethod
    def concatenate(meshes: Sequence["Mesh"]) -> "Mesh":
        """Ensembles joined along the ensemble axis (a single mesh counts as one row).

        Args:
            meshes: non-empty sequence of meshes recorded the same way (solver, state
                size, number of save times, params structure; ``t0``/``t1`` checked on
                host meshes). Shared fields (``t0``, ``t1``, ``solver``, ``rtol``, ``atol``,
                ``controller``) are taken from the first.

        Capacities are reconciled by padding to the largest. A host mesh if all parts are,
        otherwise a device mesh. Row ``i`` of the result replays exactly as the row it came
        from.

        Example:
            >>> a = gs.record(f, t0, t1, y0[:2], p[:2], ts=ts)
            >>> b = gs.record(f, t0, t1, y0[2:], p[2:], ts=ts)
            >>> both = gs.Mesh.concatenate([a, b])        # both.n == n
        """
        return _rows.concatenate(meshes)

    @staticmethod
    def union(meshes: Sequence["Mesh"]) -> "Mesh":
        """One single-trajectory host mesh whose step times are the union of those of the
        successful (status OK) rows of ``meshes`` (single meshes or ensembles).

        Args:
            meshes: non-empty sequence of meshes over the same interval and save times.

        A mesh that holds at several parameter points (e.g. chains in different modes):
        every node of every part is a node of the union, so the union is at least as fine
        as each part everywhere. Save times are nodes of every part, hence of the union.
        The fields other than ``times``, ``n_steps``, ``n_rejected`` (0), ``status`` (OK)
        and ``save_index`` come from row 0 of the first part. The capacity is exactly the
        number of union steps (`trim` rounds it up). Raises ``ValueError`` when no row
        succeeded and ``RuntimeError`` when a save time of the first part's row 0 is missing
        from the union (parts recorded with different save times).

        Example:
            >>> fine = gs.Mesh.union([mesh_at_mean, mesh_per_chain])
            >>> gs.replay(f, fine.to_device(), y0, p_mean)
        """
        return _rows.combined(meshes, "union", thin=False)

    @staticmethod
    def merge(meshes: Sequence["Mesh"]) -> "Mesh":
        """One single-trajectory host mesh whose every step is no longer than the step any
        successful row of ``meshes`` takes at that time: as fine as the finest part
        everywhere, with about as many steps as the finest part (a `union` of many meshes
        recorded at different points has nearly the sum of their steps, since their nodes
        rarely coincide).

        Built from the union's nodes by a greedy walk: from each node, the farthest node
        within the smallest step any part takes there, never stepping past a save time or
        a tstop. Same arguments, fields and errors as `union`. For instance the one
        sampling mesh of many chains and warmup draws.

        Example:
            >>> fine = gs.Mesh.merge([mesh_at_mean, mesh_at_draws])
            >>> fine.n_steps <= gs.Mesh.union([mesh_at_mean, mesh_at_draws]).n_steps
        """
        return _rows.combined(meshes, "merge", thin=True)

    # ------------------------------------------------------------------ step slots

    def with_capacity(self, cap: int) -> "Mesh":
        """The same mesh with exactly ``cap`` step slots (``times`` of ``cap + 1`` columns).

        Growing pads with the last accepted time (zero-length steps; all padding slots
        filled, as `padded`); shrinking cuts trailing padding. Replay values are unchanged
        either way. Growing works under ``jit``; shrinking needs concrete ``n_steps`` and
        raises ``ValueError`` below the longest trajectory's ``n_steps``. Use it to give
        meshes one capacity (one compiled replay) or to make capacities agree.

        Example:
            >>> mesh.with_capacity(128).capacity        # 128
        """
        return _rows.with_capacity(self, cap)

    def trim(self, exact: bool = False) -> "Mesh":
        """Drop unused trailing step slots (needs concrete values; not under ``jit``).

        By default the capacity is rounded up to a power of two (at least 16), so that
        meshes of similar length share one compiled replay; ``exact=True`` cuts to the
        longest trajectory. Never grows the mesh. `gradsolve.record` trims automatically
        outside ``jit``; host meshes stay NumPy.

        Example:
            >>> mesh.scatter(rows, new).trim().capacity     # a power of two >= 16
        """
        return _rows.trim(self, exact)

    @staticmethod
    def trimmed_capacity(n_steps, capacity: int, exact: bool = False) -> int:
        """The capacity `trim` would give a mesh of ``capacity`` slots whose rows take
        ``n_steps`` steps (host numbers), without building it: e.g. to tell whether rows
        merged into a mesh keep its compiled capacity."""
        return _rows.trimmed_capacity(n_steps, capacity, exact)

    def padded(self) -> "Mesh":
        """The same mesh with the slots past ``n_steps`` filled with the last time.

        Meshes recorded inside ``jit`` leave those slots unspecified (see ``times``); this is
        for code that reads whole rows of ``times``. Works under ``jit`` and on host (NumPy)
        meshes.

        Example:
            >>> mesh = jax.jit(lambda p: gs.record(f, 0.0, 1.0, y0, p))(p).padded()
        """
        return dataclasses.replace(self, times=_rows.pad_times(self.times, self.n_steps))
