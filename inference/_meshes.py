"""Row algebra on recorded meshes (`gradsolve.Mesh`), on host (NumPy) copies.

Fits and samplers re-record some trajectories of an ensemble and merge them back, give
every chain its own mesh, or take the union of several meshes. These operations need
concrete values (their shapes follow the data), so they run on NumPy copies of a mesh and
never as eager JAX ops (each new shape would compile a program).

Every function here mirrors a `gradsolve.Mesh` method of the same name (``to_host``,
``select``, ``scatter``, ``repeat``, ``row``, ``chains``, ``union``); this module is the
one place inference manipulates meshes, so moving onto the core's methods touches nothing
else.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

__all__ = ["to_host", "to_device", "scatter", "repeat", "row", "chains", "union", "trim"]

# The fields with one entry per trajectory (a leading ensemble axis); the others (t0, t1,
# solver, tolerances, controller) are shared by every trajectory of a mesh.
PER_TRAJECTORY = ("times", "n_steps", "n_rejected", "status", "save_index", "ts", "dt_next",
                  "y_last", "y0")


def _map_rows(mesh: gs.Mesh, fn, params_fn=None) -> gs.Mesh:
    """``mesh`` with ``fn`` applied to every per-trajectory leaf (and ``params_fn``, default
    ``fn``, to every leaf of ``params``)."""
    vals = tuple(fn(np.asarray(getattr(mesh, k))) for k in PER_TRAJECTORY)
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in PER_TRAJECTORY), mesh, vals)
    params = jax.tree_util.tree_map(lambda x: (params_fn or fn)(np.asarray(x)), mesh.params)
    return eqx.tree_at(lambda m: m.params, out, params)


def to_host(mesh: gs.Mesh) -> gs.Mesh:
    """A NumPy copy of ``mesh`` with its padding slots filled (a mesh recorded under
    ``jit`` leaves them unspecified), ready for the row operations below."""
    return jax.tree_util.tree_map(np.asarray, mesh).padded()


def to_device(mesh: gs.Mesh) -> gs.Mesh:
    """The host mesh as JAX arrays (the argument of a compiled replay)."""
    return jax.tree_util.tree_map(jnp.asarray, mesh)


def trim(mesh: gs.Mesh) -> gs.Mesh:
    """``Mesh.trim()`` of a host mesh: capacity cut to a power of two >= the longest row."""
    return mesh.trim()


def with_capacity(mesh: gs.Mesh, cap: int) -> gs.Mesh:
    """A host mesh with at least ``cap`` step slots (extra slots repeat the last time)."""
    extra = cap - mesh.capacity
    if extra <= 0:
        return mesh
    t = mesh.times
    times = np.concatenate([t, np.repeat(t[..., -1:], extra, axis=-1)], axis=-1)
    return eqx.tree_at(lambda m: m.times, mesh, times)


def scatter(mesh: gs.Mesh, rows: np.ndarray, other: gs.Mesh) -> gs.Mesh:
    """Host ensemble ``mesh`` with its rows ``rows`` replaced by the rows of ``other``
    (``len(rows)`` trajectories), trimmed."""
    cap = max(mesh.capacity, other.capacity)
    mesh, other = with_capacity(mesh, cap), with_capacity(other, cap)
    merged = {}
    for k in PER_TRAJECTORY:
        a = np.array(getattr(mesh, k), copy=True)
        a[rows] = np.asarray(getattr(other, k))
        merged[k] = a
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in PER_TRAJECTORY), mesh,
                      tuple(merged[k] for k in PER_TRAJECTORY))

    def put(a, b):
        a = np.array(a, copy=True)
        a[rows] = b
        return a

    params = jax.tree_util.tree_map(put, mesh.params, other.params)
    return trim(eqx.tree_at(lambda m: m.params, out, params))


def select(mesh: gs.Mesh, rows: np.ndarray) -> gs.Mesh:
    """The host ensemble's trajectories ``rows`` (an index array or a bool mask)."""
    return _map_rows(mesh, lambda x: x[rows])


def repeat(mesh: gs.Mesh, count: int) -> gs.Mesh:
    """A single-trajectory host mesh as an ensemble of ``count`` identical rows."""
    return _map_rows(mesh, lambda x: np.repeat(x[None], count, axis=0))


def row(mesh: gs.Mesh, i: int) -> gs.Mesh:
    """Trajectory ``i`` of a host ensemble as a single-trajectory mesh (a single mesh is
    returned as it is)."""
    if not mesh.is_ensemble:
        return mesh
    return _map_rows(mesh, lambda x: x[i])


def chains(mesh: gs.Mesh, count: int, capacity: int) -> gs.Mesh:
    """One mesh per chain, every leaf with a leading axis ``count`` (for ``jax.vmap`` over
    chains), padded to ``capacity`` step slots, on device.

    ``mesh`` is either an ensemble of ``count`` trajectories (chain ``c`` gets row ``c``) or
    a single trajectory (every chain gets it).
    """
    mesh = with_capacity(mesh, capacity)
    if not mesh.is_ensemble:
        mesh = repeat(mesh, count)
    shared = ("t0", "t1", "rtol", "atol")
    vals = tuple(np.broadcast_to(np.asarray(getattr(mesh, k)),
                                 (count,) + np.shape(getattr(mesh, k))) for k in shared)
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in shared), mesh, vals)
    return to_device(out)


def union(meshes: Sequence[gs.Mesh]) -> gs.Mesh:
    """One single-trajectory host mesh whose step times are the union of those of the
    successful trajectories of ``meshes`` (single meshes or ensembles). Every save time is
    a node of each of them, hence of the union."""
    times = []
    for m in meshes:
        t = np.atleast_2d(np.asarray(m.times))
        n = np.atleast_1d(np.asarray(m.n_steps))
        st = np.atleast_1d(np.asarray(m.status))
        times.extend(r[: nn + 1] for r, nn, s in zip(t, n, st) if s == 0)
    first = row(meshes[0], 0)
    grid = np.unique(np.concatenate(times))
    ts = np.asarray(first.ts)
    save_index = np.searchsorted(grid, ts).astype(np.asarray(first.save_index).dtype)
    if not np.array_equal(grid[save_index], ts):
        raise AssertionError("the union of meshes lost a save time")
    return eqx.tree_at(
        lambda m: (m.times, m.n_steps, m.n_rejected, m.status, m.save_index),
        first,
        (grid, np.asarray(len(grid) - 1, np.asarray(first.n_steps).dtype),
         np.zeros_like(np.asarray(first.n_rejected)), np.zeros_like(np.asarray(first.status)),
         save_index),
    )
