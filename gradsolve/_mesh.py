"""The recorded mesh: what an adaptive solve accepted, kept so it can be replayed.

`Mesh` also owns its row algebra (select, scatter, concatenate, pad/trim, batch/unbatch,
repeat, stacking per chain, union of step times): the fields that carry the ensemble axis
are declared once, in `Mesh.PER_TRAJECTORY`, and every operation on rows goes through that
list, so a new per-trajectory field cannot be forgotten by one of them.

Host meshes (NumPy leaves, from `Mesh.to_host`) stay NumPy under that algebra: drivers that
edit meshes between compiled steps (fitting, sampling) do it on the host, because eager JAX
ops on ever-changing shapes would each compile a program.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

from ._controller import PIDController
from ._solver.base import AbstractSolver
from ._sharding import host


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

    @property
    def _host(self) -> bool:
        """Whether this is a host mesh (NumPy ``times`` and ``n_steps``): its row algebra
        then stays in NumPy."""
        return _is_host(self.times) and _is_host(self.n_steps)

    def _map_rows(self, fn) -> "Mesh":
        """``fn`` applied to every per-trajectory array: the `PER_TRAJECTORY` fields and
        every leaf of ``params``."""
        changes = {k: fn(getattr(self, k)) for k in self.PER_TRAJECTORY}
        changes["params"] = jax.tree_util.tree_map(fn, self.params)
        return dataclasses.replace(self, **changes)

    def _need_ensemble(self, where: str) -> None:
        if not self.is_ensemble:
            raise ValueError(
                f"Mesh.{where}: needs an ensemble mesh (n_steps of shape (n,)), got a "
                "single-trajectory mesh; `mesh.repeat(1)` makes it an ensemble of one."
            )

    def _row_index(self, rows, where: str):
        """``rows`` (int indices or a ``(n,)`` bool mask) as a 1-d int index array,
        validated when concrete; a traced int array passes through unchecked."""
        n = self.n
        if isinstance(rows, jax.core.Tracer):
            if rows.ndim != 1 or not jnp.issubdtype(rows.dtype, jnp.integer):
                raise ValueError(
                    f"Mesh.{where}: a traced `rows` must be a 1-d int array (a bool mask "
                    f"has no static size under jit), got shape {rows.shape} {rows.dtype}."
                )
            return rows
        r = np.asarray(rows)
        if r.dtype == bool:
            if r.shape != (n,):
                raise ValueError(
                    f"Mesh.{where}: a boolean `rows` must have shape ({n},) (one entry per "
                    f"trajectory), got {r.shape}."
                )
            return np.flatnonzero(r)
        if r.size == 0 and r.ndim == 1:
            return r.astype(np.intp)
        if r.ndim != 1 or not np.issubdtype(r.dtype, np.integer):
            raise ValueError(
                f"Mesh.{where}: `rows` must be a 1-d int index array or a ({n},) bool mask, "
                f"got shape {r.shape} and dtype {r.dtype}."
            )
        if r.min() < -n or r.max() >= n:
            raise ValueError(
                f"Mesh.{where}: `rows` has indices outside [0, {n}) (e.g. "
                f"{int(r[(r < -n) | (r >= n)][0])}) for an ensemble of {n}."
            )
        return r

    def _check_compatible(self, other: "Mesh", where: str, name: str) -> None:
        """Raise if ``other``'s rows cannot join ``self``'s (both ensembles): same solver
        type, state size, number of save times and params structure, and (host meshes,
        where comparing is free) the same ``t0``/``t1``."""
        def fail(what):
            raise ValueError(f"{where}: `{name}` {what}.")

        if type(self.solver) is not type(other.solver):
            fail(f"mixes solvers {type(self.solver).__name__} and {type(other.solver).__name__}")
        if self.y0.shape[1:] != other.y0.shape[1:]:
            fail(f"mixes states of shape {self.y0.shape[1:]} and {other.y0.shape[1:]}")
        if self.ts.shape[1:] != other.ts.shape[1:]:
            fail(f"mixes {self.ts.shape[-1]} and {other.ts.shape[-1]} save times")
        for k in ("jump_times", "tstops"):
            if getattr(self, k).shape[1:] != getattr(other, k).shape[1:]:
                fail(f"mixes {getattr(self, k).shape[-1]} and {getattr(other, k).shape[-1]} "
                     f"`{k}` slots")
        a, b = jax.tree_util.tree_flatten(self.params), jax.tree_util.tree_flatten(other.params)
        if a[1] != b[1] or any(np.shape(x)[1:] != np.shape(y)[1:] for x, y in zip(a[0], b[0])):
            fail("mixes params of different structures or shapes")
        if self._host and other._host:
            for k in ("t0", "t1"):
                if not np.array_equal(getattr(self, k), getattr(other, k)):
                    fail(f"mixes meshes recorded with different `{k}`")

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
        if self.is_ensemble:
            return self

        def add(x):
            if x is None:
                return None
            return np.asarray(x)[None] if _is_host(x) else jnp.asarray(x)[None]

        changes = {k: add(getattr(self, k)) for k in self.PER_TRAJECTORY}
        return dataclasses.replace(self, **changes)

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
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"Mesh.row: `i` must be an int, got {i!r}.")
        n = self.n
        if not -n <= i < n:
            raise ValueError(f"Mesh.row: `i`={i} is out of range for {n} trajectories.")
        if not self.is_ensemble:
            return self
        i = int(i)
        if self._host:
            return self._map_rows(lambda x: np.asarray(np.asarray(x)[i]))
        return self._map_rows(lambda x: jnp.asarray(x)[i])

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
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"Mesh.repeat: `count` must be a positive int, got {count!r}.")
        if self.is_ensemble:
            raise ValueError(
                f"Mesh.repeat: needs a single-trajectory mesh, got an ensemble of {self.n}; "
                "use Mesh.concatenate or mesh.select to build ensembles from ensembles."
            )
        count = int(count)
        if self._host:
            return self._map_rows(
                lambda x: np.broadcast_to(np.asarray(x), (count,) + np.shape(x)).copy())
        return self._map_rows(lambda x: jnp.broadcast_to(jnp.asarray(x), (count,) + jnp.shape(x)))

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
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"Mesh.chains: `count` must be a positive int, got {count!r}.")
        count = int(count)
        if self.is_ensemble and self.n != count:
            raise ValueError(
                f"Mesh.chains: `count`={count} but the mesh is an ensemble of {self.n} "
                "(one row per chain, or a single mesh to broadcast)."
            )
        mesh = self if capacity is None else self.with_capacity(capacity)
        xp = np if mesh._host else jnp
        stack = lambda x: (xp.broadcast_to(xp.asarray(x), (count,) + np.shape(x))
                           if eqx.is_array(x) else x)
        rowwise = set(self.PER_TRAJECTORY) | {"params"} if mesh.is_ensemble else set()
        changes = {f.name: jax.tree_util.tree_map(stack, getattr(mesh, f.name))
                   for f in dataclasses.fields(mesh) if f.name not in rowwise}
        return dataclasses.replace(mesh, **changes).to_device()

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
        to_np = lambda x: host(x) if eqx.is_array(x) else x
        return jax.tree_util.tree_map(to_np, self).padded()

    def to_device(self) -> "Mesh":
        """The mesh with every NumPy leaf as a JAX array (``jnp.asarray``); others kept.

        Example:
            >>> mesh_d = mesh.to_host().select(rows).to_device()
        """
        to_jnp = lambda x: jnp.asarray(x) if _is_host(x) else x
        return jax.tree_util.tree_map(to_jnp, self)

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
        self._need_ensemble("select")
        idx = self._row_index(rows, "select")
        if self._host:
            return self._map_rows(lambda x: np.asarray(x)[idx])
        return self._map_rows(lambda x: jnp.asarray(x)[idx])

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
        self._need_ensemble("scatter")
        idx = self._row_index(rows, "scatter")
        other = other if other.is_ensemble else other.repeat(1)
        if len(idx) != other.n:
            raise ValueError(
                f"Mesh.scatter: `rows` names {len(idx)} rows but `other` has {other.n}."
            )
        traced = isinstance(idx, jax.core.Tracer)
        distinct = traced or len(np.unique(idx % max(self.n, 1))) == len(idx)
        if not distinct:
            raise ValueError("Mesh.scatter: `rows` repeats a row; each row can be replaced once.")
        self._check_compatible(other, "Mesh.scatter", "other")
        host = self._host
        other = other.to_host() if host else other.to_device()
        cap = max(self.capacity, other.capacity)
        old, new = self.with_capacity(cap), other.with_capacity(cap)
        if host:
            def put(a, b):
                a = np.array(a, copy=True)
                a[idx] = b
                return a
        else:
            def put(a, b):
                a = jnp.asarray(a)
                return a.at[idx].set(jnp.asarray(b).astype(a.dtype))
        changes = {k: put(getattr(old, k), getattr(new, k)) for k in self.PER_TRAJECTORY}
        changes["params"] = jax.tree_util.tree_map(put, old.params, new.params)
        return dataclasses.replace(old, **changes)

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
        self._check_compatible(other, "Mesh.where", "other")
        if other.capacity != self.capacity:
            raise ValueError(
                f"Mesh.where: `other` has capacity {other.capacity} but this mesh has "
                f"{self.capacity}; make them agree with with_capacity.")
        if jnp.shape(other.n_steps) != jnp.shape(self.n_steps):
            raise ValueError(
                f"Mesh.where: `other` has rows {jnp.shape(other.n_steps)} but this mesh has "
                f"{jnp.shape(self.n_steps)}.")
        mask = jnp.asarray(mask, bool)
        lead = (self.n,) if self.is_ensemble else ()
        if mask.shape != lead:
            raise ValueError(f"Mesh.where: `mask` must have shape {lead}, got {mask.shape}.")

        def pick(a, b):
            a, b = jnp.asarray(a), jnp.asarray(b)
            m = mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim))
            return jnp.where(m, b.astype(a.dtype), a)

        changes = {k: pick(getattr(self, k), getattr(other, k)) for k in self.PER_TRAJECTORY}
        changes["params"] = jax.tree_util.tree_map(pick, self.params, other.params)
        return dataclasses.replace(self, **changes)

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
        meshes = [m if m.is_ensemble else m.repeat(1) for m in meshes]
        if not meshes:
            raise ValueError("Mesh.concatenate: `meshes` is empty.")
        for m in meshes[1:]:
            meshes[0]._check_compatible(m, "Mesh.concatenate", "meshes")
        host = all(m._host for m in meshes)
        meshes = [m.to_host() if host else m.to_device() for m in meshes]
        cap = max(m.capacity for m in meshes)
        meshes = [m.with_capacity(cap) for m in meshes]
        xp = np if host else jnp
        cat = lambda *xs: xp.concatenate([xp.asarray(x) for x in xs], axis=0)
        changes = {k: cat(*(getattr(m, k) for m in meshes)) for k in Mesh.PER_TRAJECTORY}
        changes["params"] = jax.tree_util.tree_map(cat, *(m.params for m in meshes))
        return dataclasses.replace(meshes[0], **changes)

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
        return _combined(meshes, "union", thin=False)

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
        return _combined(meshes, "merge", thin=True)

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
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
            raise ValueError(f"Mesh.with_capacity: `cap` must be a positive int, got {cap!r}.")
        cap = int(cap)
        extra = cap - self.capacity
        if extra == 0:
            return self
        if extra > 0:
            xp = np if self._host else jnp
            t = self.times
            times = xp.concatenate([t, xp.repeat(t[..., -1:], extra, axis=-1)], axis=-1)
            return dataclasses.replace(self, times=pad_times(times, self.n_steps))
        if isinstance(self.n_steps, jax.core.Tracer):
            raise ValueError(
                f"Mesh.with_capacity: cutting to `cap`={cap} needs concrete `n_steps`; call "
                "it outside jax.jit."
            )
        used = int(np.max(host(self.n_steps))) if np.size(self.n_steps) else 0
        if cap < used:
            raise ValueError(
                f"Mesh.with_capacity: `cap`={cap} is below the longest trajectory's {used} "
                "accepted steps."
            )
        return dataclasses.replace(self, times=self.times[..., : cap + 1])

    def trim(self, exact: bool = False) -> "Mesh":
        """Drop unused trailing step slots (needs concrete values; not under ``jit``).

        By default the capacity is rounded up to a power of two (at least 16), so that
        meshes of similar length share one compiled replay; ``exact=True`` cuts to the
        longest trajectory. Never grows the mesh. `gradsolve.record` trims automatically
        outside ``jit``; host meshes stay NumPy.

        Example:
            >>> mesh.scatter(rows, new).trim().capacity     # a power of two >= 16
        """
        if isinstance(self.n_steps, jax.core.Tracer):
            raise ValueError("Mesh.trim() needs concrete `n_steps`; call it outside jax.jit.")
        used = int(np.max(host(self.n_steps))) if np.size(self.n_steps) else 0
        used = max(used, 1)
        if not exact:
            used = max(16, 1 << (used - 1).bit_length())
        if used >= self.capacity:
            return self
        return self.with_capacity(used)

    def padded(self) -> "Mesh":
        """The same mesh with the slots past ``n_steps`` filled with the last time.

        Meshes recorded inside ``jit`` leave those slots unspecified (see ``times``); this is
        for code that reads whole rows of ``times``. Works under ``jit`` and on host (NumPy)
        meshes.

        Example:
            >>> mesh = jax.jit(lambda p: gs.record(f, 0.0, 1.0, y0, p))(p).padded()
        """
        return dataclasses.replace(self, times=pad_times(self.times, self.n_steps))


def _combined(meshes, where: str, thin: bool) -> "Mesh":
    """`Mesh.union` (``thin=False``) or `Mesh.merge` (``thin=True``)."""
    parts = [m.to_host() for m in meshes]
    if not parts:
        raise ValueError(f"Mesh.{where}: `meshes` is empty.")
    if any(m.n_jumps for m in parts):
        raise ValueError(
            f"Mesh.{where}: meshes recorded with `jumps` are not supported (each jump owns a "
            "node of its own that a union of times would merge); re-record instead."
        )
    times = []
    for m in parts:
        b = m.batch()
        for t, k, s in zip(b.times, b.n_steps, b.status):
            if s == Status.OK:
                times.append(t[: int(k) + 1])
    if not times:
        raise ValueError(f"Mesh.{where}: no trajectory of `meshes` was recorded successfully.")
    first = parts[0].row(0)
    union = np.unique(np.concatenate(times))
    if thin:
        forced = np.concatenate([np.ravel(np.asarray(first.ts)),
                                 np.ravel(np.asarray(first.tstops))])
        union = _thinned(union, [np.unique(t) for t in times], forced)
    ts = np.asarray(first.ts)
    save_index = np.searchsorted(union, ts).astype(np.asarray(first.save_index).dtype)
    if not np.array_equal(union[np.minimum(save_index, len(union) - 1)], ts):
        raise RuntimeError(
            f"Mesh.{where}: save times missing from the union mesh (the parts were recorded "
            "with different save times)."
        )
    return dataclasses.replace(
        first,
        times=union,
        n_steps=np.asarray(len(union) - 1, np.asarray(first.n_steps).dtype),
        n_rejected=np.zeros_like(np.asarray(first.n_rejected)),
        status=np.zeros_like(np.asarray(first.status)),
        save_index=save_index,
        tstop_index=np.where(np.isfinite(first.tstops),
                             np.searchsorted(union, np.asarray(first.tstops)), 0).astype(
            np.asarray(first.tstop_index).dtype),
    )


def _thinned(nodes: np.ndarray, parts: list[np.ndarray], forced: np.ndarray) -> np.ndarray:
    """The nodes of a greedy walk over sorted ``nodes``: from each node, the farthest one
    within the smallest step any of ``parts`` (sorted node arrays) takes there, never
    passing a ``forced`` node (save times, tstops) or the last node."""
    cap = np.full(nodes.shape, np.inf)
    for x in parts:
        if x.size < 2:
            continue
        i = np.clip(np.searchsorted(x, nodes, side="right") - 1, 0, x.size - 2)
        h = np.where(nodes < x[-1], x[i + 1] - x[i], np.inf)
        cap = np.minimum(cap, h)
    forced = np.unique(np.concatenate([forced[np.isfinite(forced)], nodes[-1:]]))
    out, i, last = [0], 0, nodes.size - 1
    tol = 1e-12 * max(1.0, float(np.max(np.abs(nodes))))
    while i < last:
        nxt = forced[np.searchsorted(forced, nodes[i] + tol, side="left"):][:1]
        limit = min(nodes[i] + cap[i] + tol, nxt[0] if nxt.size else np.inf)
        j = int(np.searchsorted(nodes, limit, side="right")) - 1
        i = max(j, i + 1)
        out.append(i)
    return nodes[np.asarray(out)]


def _is_host(x) -> bool:
    """Whether ``x`` is a NumPy array or scalar (a host leaf)."""
    return isinstance(x, (np.ndarray, np.generic))


def pad_times(times, n_steps):
    """``times (..., S + 1)`` with the slots past ``n_steps (...)`` set to ``times[n_steps]``.

    NumPy in, NumPy out (host meshes, no compiled program per shape); otherwise ``jnp``.
    """
    xp = np if _is_host(times) and _is_host(n_steps) else jnp
    n = xp.clip(xp.asarray(n_steps), 0, times.shape[-1] - 1)[..., None]
    last = xp.take_along_axis(times, n, axis=-1)
    return xp.where(xp.arange(times.shape[-1]) > n, last, times)
