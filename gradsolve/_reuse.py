"""Mesh reuse in a user's own loop: replay a kept mesh, re-record the trajectories it no
longer fits, all inside ``jit`` (no host round trip).

`gradsolve.solve` records at every call. A fitting loop moves its parameters a little per
step, so one recorded mesh stays good for several steps, and its replay costs less than a
record plus a replay. `MeshReuse` keeps that mesh in a state (`ReuseState`, as Optax keeps
an optimiser state) and re-records a trajectory when

- its ``y0`` or floating parameters drifted more than ``drift_tol`` (relative, largest over
  entries) from where its mesh was recorded, or
- the replay's own embedded error estimate, in units of the requested tolerances, exceeds
  ``max_error_ratio`` (or the replay failed).

Meshes are recorded ``record_tol_factor`` times tighter than requested, so that a
neighbourhood of the recording point meets the requested tolerances. The gradient is the
replay's: the exact discrete adjoint of the steps of the mesh in use, as with
`gradsolve.solve` (whose mesh is recorded at the current point).

When the error estimate is read is the ``check`` setting. ``"after"`` (the default, the
policy of `inference.fit`) reads it from the call's own replay and re-records those rows at
the next call: a call costs one differentiated replay plus the re-records, and a result may
exceed the tolerance by what ``sol.error_ratio`` reports, once, before its mesh is
refreshed. ``"before"`` replays forward first and re-records before the differentiated
replay, so every result meets ``max_error_ratio``; it costs a forward replay more per call.
Re-records run under a ``lax.switch``: a few stale trajectories are recorded as a small
batch of their own (an eighth, a quarter or half of the ensemble), none when none is stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ._checks import rtol_floor
from ._mesh import Mesh
from ._record import _MAX_STEPS, record
from ._replay import replay
from ._sharding import host
from ._solution import Solution
from .drivers import AbstractDriver

__all__ = ["MeshReuse", "ReuseState"]

_sg = jax.lax.stop_gradient


class ReuseState(NamedTuple):
    """What `MeshReuse.solve` carries from call to call.

    Attributes:
        mesh: the kept mesh (its ``y0`` and ``params`` say where each row was recorded),
            at a fixed step capacity so that every call has the same shapes.
        stale: ``(n,)`` (``()`` for one trajectory) rows whose last replay exceeded
            ``max_error_ratio``: the next call re-records them first.
        n_records: ``()`` calls that re-recorded at least one trajectory (``init`` counts).
        n_rows_recorded: ``()`` trajectories recorded in all.

    Example:
        >>> state = reuse.init(y0, params)
        >>> sol, state = reuse.solve(state, y0, params * 1.01)
        >>> int(state.n_records), int(state.n_rows_recorded)    # (1, n): nothing stale yet
    """

    mesh: Mesh
    stale: Bool[Array, "*n"]
    n_records: Int[Array, ""]
    n_rows_recorded: Int[Array, ""]


class MeshReuse(eqx.Module):
    """Solve with a kept, re-recorded-when-stale mesh: `gradsolve.solve` for loops that call
    it many times at slowly moving parameters (an Optax fit, a parameter scan).

    Args:
        f, t0, t1: the vector field and interval, as in `gradsolve.solve`.
        ts: save times ``(k,)`` or ``(n, k)``, fixed for the life of the state (they are
            mesh nodes); ``None``: only ``t1``.
        solver, rtol, atol, driver: as in `gradsolve.solve` (requested tolerances).
        max_steps: step capacity of the kept mesh; ``None``: twice the steps the first
            record needed plus 32 (at most 16,384), fixed from then on. A re-record that
            needs more fails like `gradsolve.solve` at ``max_steps`` (status and NaN); pass
            a larger ``max_steps`` then.
        drift_tol: re-record a trajectory whose ``y0`` or floating parameters moved more
            than this (relative) from its recording point.
        max_error_ratio: re-record where the replay's error estimate, in requested units,
            exceeds this.
        record_tol_factor: meshes are recorded this much tighter than ``rtol``/``atol``.
        check: ``"after"`` or ``"before"``: when the error estimate is read (module
            docstring).

    Example:
        >>> reuse = gs.MeshReuse(f, 0.0, 10.0, ts=ts, rtol=1e-6, atol=1e-9)
        >>> state = reuse.init(y0, params)
        >>> @jax.jit
        ... def step(params, opt_state, state):
        ...     def loss(p):
        ...         sol, new = reuse.solve(state, y0, p)
        ...         return jnp.sum((sol.ys - data) ** 2), new
        ...     (l, state), g = jax.value_and_grad(loss, has_aux=True)(params)
        ...     updates, opt_state = opt.update(g, opt_state)
        ...     return optax.apply_updates(params, updates), opt_state, state
    """

    f: Callable = eqx.field(static=True)
    t0: float = eqx.field(static=True)
    t1: float = eqx.field(static=True)
    ts: Any = None
    solver: Any = eqx.field(static=True, default=None)
    rtol: float = eqx.field(static=True, default=1e-6)
    atol: float = eqx.field(static=True, default=1e-9)
    max_steps: int | None = eqx.field(static=True, default=None)
    drift_tol: float = eqx.field(static=True, default=0.1)
    max_error_ratio: float = eqx.field(static=True, default=1.0)
    record_tol_factor: float = eqx.field(static=True, default=0.5)
    driver: AbstractDriver | None = eqx.field(static=True, default=None)
    check: str = eqx.field(static=True, default="after")

    def __check_init__(self):
        if self.check not in ("after", "before"):
            raise ValueError(f"gs.MeshReuse: `check` must be 'after' or 'before', got {self.check!r}.")
        for name in ("drift_tol", "max_error_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not v > 0:
                raise ValueError(f"gs.MeshReuse: `{name}` must be a positive number, got {v!r}.")
        v = self.record_tol_factor
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not 0 < v <= 1:
            raise ValueError(f"gs.MeshReuse: `record_tol_factor` must lie in (0, 1], got {v!r}.")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(
                self.max_steps, (int, np.integer)) or self.max_steps < 1):
            raise ValueError(
                f"gs.MeshReuse: `max_steps` must be a positive int or None, got {self.max_steps!r}.")

    def _record(self, y0, params, max_steps: int) -> Mesh:
        fac = self.record_tol_factor
        # tighter than requested, but never under what the state's precision can meet
        # (4 epsilons; `record` refuses less)
        rtol = max(self.rtol * fac, rtol_floor(jnp.result_type(y0)))
        return record(self.f, self.t0, self.t1, _sg(y0), jax.tree_util.tree_map(_sg, params),
                      ts=self.ts, solver=self.solver, rtol=rtol,
                      atol=self.atol * fac, max_steps=max_steps, throw=False,
                      driver=self.driver)

    def init(self, y0, params) -> ReuseState:
        """Record the first mesh at ``y0``, ``params`` (shapes as in `gradsolve.solve`).

        Call it outside ``jit`` when ``max_steps`` is ``None`` (the capacity is read from
        this record's step counts).
        """
        if self.max_steps is None:
            mesh = self._record(y0, params, _MAX_STEPS)
            if isinstance(mesh.n_steps, jax.core.Tracer):
                raise ValueError(
                    "gs.MeshReuse.init: with max_steps=None the capacity is read from the "
                    "first record; call init outside jax.jit or pass max_steps.")
            need = int(np.max(host(mesh.n_steps))) if np.size(mesh.n_steps) else 1
            cap = min(2 * need + 32, 16384)
            mesh = mesh.with_capacity(max(cap, need))
        else:
            mesh = self._record(y0, params, int(self.max_steps)).padded()
        rows = mesh.n if mesh.is_ensemble else 1
        stale = jnp.zeros(mesh.n_steps.shape, bool)
        return ReuseState(mesh, stale, jnp.asarray(1, jnp.int32), jnp.asarray(rows, jnp.int32))

    @staticmethod
    def relative_drift(now, then, ensemble: bool = True) -> Array:
        """The drift that decides a re-record: the largest relative change
        ``|now - then| / |then|`` over the floating leaves of the pytree ``now`` against
        ``then``, per trajectory (leading axis ``n`` when ``ensemble``). The fitters and
        samplers of `inference` measure their parameters' drift with this same rule.

        Example:
            >>> gs.MeshReuse.relative_drift(jnp.array([[1.1, 2.0]]), jnp.array([[1.0, 2.0]]))
            Array([0.1], dtype=float64)  # up to rounding
        """
        return _drift(now, then, ensemble)

    def drifted(self, mesh: Mesh, y0, params) -> Array:
        """``(n,)`` (``()`` for one trajectory) rows whose ``y0`` or floating parameters
        moved more than ``drift_tol`` from where ``mesh`` recorded them."""
        arrays = eqx.filter(params, eqx.is_array_like)  # the mesh keeps only these
        return _drift((y0, arrays), (mesh.y0, mesh.params), mesh.is_ensemble) > self.drift_tol

    def too_coarse(self, sol: Solution) -> Array:
        """Rows of the replay ``sol`` whose error estimate, in requested units, exceeds
        ``max_error_ratio`` (or that failed)."""
        return ~(_sg(sol.error_ratio) * self.record_tol_factor <= self.max_error_ratio)

    def solve(self, state: ReuseState, y0, params) -> tuple[Solution, ReuseState]:
        """The solution at ``y0``, ``params`` on the kept mesh, after re-recording the rows
        that drifted or that the last replay found too coarse (with ``check="before"``,
        also those this point's forward replay finds too coarse).

        Jittable and differentiable w.r.t. ``y0`` and ``params`` (the record stops
        gradients, as in `gradsolve.solve`). Returns the `gradsolve.Solution` (``sol.mesh``
        is the mesh replayed; ``sol.error_ratio`` its error estimate in the mesh's own,
        ``record_tol_factor`` tighter, units) and the new state.
        """
        mesh = state.mesh
        y0_c, p_c = _sg(y0), jax.tree_util.tree_map(_sg, params)
        due = state.stale | self.drifted(mesh, y0_c, p_c)
        if self.check == "before":
            # a forward replay on stopped inputs: no derivative, no residuals kept
            due = due | self.too_coarse(replay(self.f, mesh, y0_c, p_c, driver=self.driver))
        count = jnp.sum(due).astype(jnp.int32)
        mesh = self._refresh(mesh, due, count, y0_c, p_c)
        sol = replay(self.f, mesh, y0, params, driver=self.driver)
        state = ReuseState(mesh, self.too_coarse(sol),
                           state.n_records + (count > 0).astype(jnp.int32),
                           state.n_rows_recorded + count)
        return sol, state

    def _refresh(self, mesh: Mesh, due, count, y0, params) -> Mesh:
        """``mesh`` with rows ``due`` re-recorded at ``y0``, ``params`` (stopped)."""
        sizes = _batch_sizes(mesh)

        def batch_of(m):
            def few(_):
                # The due rows alone, as a batch of m rows (padding repeats one due row:
                # equal inputs, equal rows, one value written).
                idx = jnp.nonzero(due, size=m, fill_value=jnp.argmax(due))[0]
                take = lambda x: x[idx] if eqx.is_array_like(x) and jnp.ndim(x) else x
                new = self._record(take(y0), jax.tree_util.tree_map(take, params), mesh.capacity)
                return mesh.scatter(idx, new)
            return few

        def every(_):
            return mesh.where(due, self._record(y0, params, mesh.capacity))

        branches = (lambda _: mesh, *map(batch_of, sizes), every)
        # 0 when nothing is due, else the smallest batch that holds the due rows
        branch = jnp.where(count == 0, 0, 1 + jnp.sum(count > jnp.asarray(sizes, jnp.int32))
                           if sizes else 1)
        return jax.lax.switch(branch, branches, None)


def _batch_sizes(mesh: Mesh) -> tuple[int, ...]:
    """Static batch sizes for re-recording a few stale rows alone: an eighth, a quarter and
    half of the ensemble (a record and replay of a batch cost about its share of the
    whole). None below 16 trajectories, where the whole ensemble costs about the same."""
    if not mesh.is_ensemble or mesh.n < 16:
        return ()
    return tuple(-(-mesh.n // d) for d in (8, 4, 2))


def _drift(now, then, ensemble: bool) -> Array:
    """Largest relative change per trajectory over the floating leaves of ``now`` against
    ``then`` (same structure; leading axis ``n`` when ``ensemble``)."""
    parts = []
    for a, b in zip(jax.tree_util.tree_leaves(now), jax.tree_util.tree_leaves(then)):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if not jnp.issubdtype(a.dtype, jnp.floating) or a.size == 0:
            continue
        rel = jnp.abs(_sg(a) - b) / jnp.maximum(jnp.abs(b), 1e-12)
        axes = tuple(range(1 if ensemble else 0, rel.ndim))
        parts.append(jnp.max(rel, axis=axes) if axes else rel)
    if not parts:
        return jnp.zeros(jnp.shape(then[0])[:1] if ensemble else ())
    return jnp.max(jnp.stack(parts), axis=0)
