"""How `Mesh`'s row algebra is done: the bodies behind its documented methods.

`gradsolve._mesh.Mesh` keeps its fields, properties and the public face of every row
operation (signature, docstring, example); each of those methods calls the function of the
same name here. What lives here is the mechanics a reader of the mesh's *meaning* can skip:
which fields carry the ensemble axis get the same treatment (through
`Mesh.PER_TRAJECTORY`, via `map_rows`), host meshes (NumPy leaves) stay NumPy, rows are
validated (`row_index`, `check_compatible`), capacities are reconciled before rows of
different meshes meet, and `union`/`merge` build one mesh from the nodes of many
(`combined`, `thinned`).

Every function takes and returns meshes; none keeps state. Host meshes stay NumPy because
drivers that edit meshes between compiled steps (fitting, sampling) do it on the host, where
eager JAX ops on ever-changing shapes would each compile a program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._sharding import device, host

if TYPE_CHECKING:
    from ._mesh import Mesh


def is_host(x) -> bool:
    """Whether ``x`` is a NumPy array or scalar (a host leaf)."""
    return isinstance(x, (np.ndarray, np.generic))


def on_host(mesh: "Mesh") -> bool:
    """Whether ``mesh`` is a host mesh (NumPy ``times`` and ``n_steps``): its row algebra
    then stays in NumPy."""
    return is_host(mesh.times) and is_host(mesh.n_steps)


def pad_times(times, n_steps):
    """``times (..., S + 1)`` with the slots past ``n_steps (...)`` set to ``times[n_steps]``.

    NumPy in, NumPy out (host meshes, no compiled program per shape); otherwise ``jnp``.
    """
    xp = np if is_host(times) and is_host(n_steps) else jnp
    n = xp.clip(xp.asarray(n_steps), 0, times.shape[-1] - 1)[..., None]
    last = xp.take_along_axis(times, n, axis=-1)
    return xp.where(xp.arange(times.shape[-1]) > n, last, times)


# ---------------------------------------------------------------------- shared checks


def map_rows(mesh: "Mesh", fn) -> "Mesh":
    """``fn`` applied to every per-trajectory array: the `PER_TRAJECTORY` fields and every
    leaf of ``params``."""
    changes = {k: fn(getattr(mesh, k)) for k in mesh.PER_TRAJECTORY}
    changes["params"] = jax.tree_util.tree_map(fn, mesh.params)
    return dataclasses.replace(mesh, **changes)


def need_ensemble(mesh: "Mesh", where: str) -> None:
    """Raise unless ``mesh`` is an ensemble (``Mesh.{where}`` needs rows)."""
    if not mesh.is_ensemble:
        raise ValueError(
            f"Mesh.{where}: needs an ensemble mesh (n_steps of shape (n,)), got a "
            "single-trajectory mesh; `mesh.repeat(1)` makes it an ensemble of one."
        )


def positive_int(value, where: str, name: str) -> int:
    """``value`` as an int, or ``ValueError`` unless it is a positive int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"Mesh.{where}: `{name}` must be a positive int, got {value!r}.")
    return int(value)


def row_index(mesh: "Mesh", rows, where: str):
    """``rows`` (int indices or a ``(n,)`` bool mask) as a 1-d int index array, validated
    when concrete; a traced int array passes through unchecked."""
    n = mesh.n
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


def check_compatible(mesh: "Mesh", other: "Mesh", where: str, name: str) -> None:
    """Raise if ``other``'s rows cannot join ``mesh``'s (both ensembles): same solver type,
    state size, number of save times and params structure, and (host meshes, where
    comparing is free) the same ``t0``/``t1``."""
    def fail(what):
        raise ValueError(f"{where}: `{name}` {what}.")

    if type(mesh.solver) is not type(other.solver):
        fail(f"mixes solvers {type(mesh.solver).__name__} and {type(other.solver).__name__}")
    if mesh.y0.shape[1:] != other.y0.shape[1:]:
        fail(f"mixes states of shape {mesh.y0.shape[1:]} and {other.y0.shape[1:]}")
    if mesh.ts.shape[1:] != other.ts.shape[1:]:
        fail(f"mixes {mesh.ts.shape[-1]} and {other.ts.shape[-1]} save times")
    for k in ("jump_times", "tstops"):
        if getattr(mesh, k).shape[1:] != getattr(other, k).shape[1:]:
            fail(f"mixes {getattr(mesh, k).shape[-1]} and {getattr(other, k).shape[-1]} "
                 f"`{k}` slots")
    a, b = jax.tree_util.tree_flatten(mesh.params), jax.tree_util.tree_flatten(other.params)
    if a[1] != b[1] or any(np.shape(x)[1:] != np.shape(y)[1:] for x, y in zip(a[0], b[0])):
        fail("mixes params of different structures or shapes")
    if on_host(mesh) and on_host(other):
        for k in ("t0", "t1"):
            if not np.array_equal(getattr(mesh, k), getattr(other, k)):
                fail(f"mixes meshes recorded with different `{k}`")


# ---------------------------------------------------------------------- axes


def batch(mesh: "Mesh") -> "Mesh":
    """`Mesh.batch`: a leading axis of 1 on the `PER_TRAJECTORY` fields (not ``params``)."""
    if mesh.is_ensemble:
        return mesh

    def add(x):
        if x is None:
            return None
        return np.asarray(x)[None] if is_host(x) else jnp.asarray(x)[None]

    changes = {k: add(getattr(mesh, k)) for k in mesh.PER_TRAJECTORY}
    return dataclasses.replace(mesh, **changes)


def row(mesh: "Mesh", i) -> "Mesh":
    """`Mesh.row`: trajectory ``i`` as a single mesh."""
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
        raise ValueError(f"Mesh.row: `i` must be an int, got {i!r}.")
    n = mesh.n
    if not -n <= i < n:
        raise ValueError(f"Mesh.row: `i`={i} is out of range for {n} trajectories.")
    if not mesh.is_ensemble:
        return mesh
    i = int(i)
    if on_host(mesh):
        return map_rows(mesh, lambda x: np.asarray(np.asarray(x)[i]))
    # one compiled program per mesh structure (eager indexing would compile one per leaf)
    return _device_row(mesh, np.asarray(i % n, np.int32))


@eqx.filter_jit
def _device_row(mesh: "Mesh", i) -> "Mesh":
    return map_rows(mesh, lambda x: jnp.asarray(x)[i])


def repeat(mesh: "Mesh", count) -> "Mesh":
    """`Mesh.repeat`: a single mesh as ``count`` identical rows."""
    count = positive_int(count, "repeat", "count")
    if mesh.is_ensemble:
        raise ValueError(
            f"Mesh.repeat: needs a single-trajectory mesh, got an ensemble of {mesh.n}; "
            "use Mesh.concatenate or mesh.select to build ensembles from ensembles."
        )
    if on_host(mesh):
        return map_rows(
            mesh, lambda x: np.broadcast_to(np.asarray(x), (count,) + np.shape(x)).copy())
    return map_rows(mesh, lambda x: jnp.broadcast_to(jnp.asarray(x), (count,) + jnp.shape(x)))


def chains(mesh: "Mesh", count, capacity) -> "Mesh":
    """`Mesh.chains`: every array leaf stacked ``count`` times (rows of an ensemble kept),
    on device."""
    count = positive_int(count, "chains", "count")
    if mesh.is_ensemble and mesh.n != count:
        raise ValueError(
            f"Mesh.chains: `count`={count} but the mesh is an ensemble of {mesh.n} "
            "(one row per chain, or a single mesh to broadcast)."
        )
    src = mesh if capacity is None else mesh.with_capacity(capacity)
    xp = np if on_host(src) else jnp
    stack = lambda x: (xp.broadcast_to(xp.asarray(x), (count,) + np.shape(x))
                       if eqx.is_array(x) else x)
    rowwise = set(mesh.PER_TRAJECTORY) | {"params"} if src.is_ensemble else set()
    changes = {f.name: jax.tree_util.tree_map(stack, getattr(src, f.name))
               for f in dataclasses.fields(src) if f.name not in rowwise}
    return dataclasses.replace(src, **changes).to_device()


# ---------------------------------------------------------------------- host and device


def to_host(mesh: "Mesh") -> "Mesh":
    """`Mesh.to_host`: every array leaf as NumPy, padding slots filled."""
    to_np = lambda x: host(x) if eqx.is_array(x) else x
    return jax.tree_util.tree_map(to_np, mesh).padded()


def to_device(mesh: "Mesh") -> "Mesh":
    """`Mesh.to_device`: every NumPy leaf as a JAX array."""
    return jax.tree_util.tree_map(device, mesh)


# ---------------------------------------------------------------------- rows


def select(mesh: "Mesh", rows) -> "Mesh":
    """`Mesh.select`: the ensemble restricted to ``rows``."""
    need_ensemble(mesh, "select")
    idx = row_index(mesh, rows, "select")
    if on_host(mesh):
        return map_rows(mesh, lambda x: np.asarray(x)[idx])
    return map_rows(mesh, lambda x: jnp.asarray(x)[idx])


def scatter(mesh: "Mesh", rows, other: "Mesh") -> "Mesh":
    """`Mesh.scatter`: rows ``rows`` of ``mesh`` replaced by all rows of ``other``."""
    need_ensemble(mesh, "scatter")
    idx = row_index(mesh, rows, "scatter")
    other = other if other.is_ensemble else other.repeat(1)
    if len(idx) != other.n:
        raise ValueError(
            f"Mesh.scatter: `rows` names {len(idx)} rows but `other` has {other.n}."
        )
    traced = isinstance(idx, jax.core.Tracer)
    distinct = traced or len(np.unique(idx % max(mesh.n, 1))) == len(idx)
    if not distinct:
        raise ValueError("Mesh.scatter: `rows` repeats a row; each row can be replaced once.")
    check_compatible(mesh, other, "Mesh.scatter", "other")
    on = on_host(mesh)
    other = other.to_host() if on else other.to_device()
    cap = max(mesh.capacity, other.capacity)
    old, new = mesh.with_capacity(cap), other.with_capacity(cap)
    if on:
        def put(a, b):
            a = np.array(a, copy=True)
            a[idx] = b
            return a
    else:
        def put(a, b):
            a = jnp.asarray(a)
            return a.at[idx].set(jnp.asarray(b).astype(a.dtype))
    changes = {k: put(getattr(old, k), getattr(new, k)) for k in mesh.PER_TRAJECTORY}
    changes["params"] = jax.tree_util.tree_map(put, old.params, new.params)
    return dataclasses.replace(old, **changes)


def where(mesh: "Mesh", mask, other: "Mesh") -> "Mesh":
    """`Mesh.where`: row ``i`` from ``other`` where ``mask[i]`` (shapes kept; jittable)."""
    check_compatible(mesh, other, "Mesh.where", "other")
    if other.capacity != mesh.capacity:
        raise ValueError(
            f"Mesh.where: `other` has capacity {other.capacity} but this mesh has "
            f"{mesh.capacity}; make them agree with with_capacity.")
    if jnp.shape(other.n_steps) != jnp.shape(mesh.n_steps):
        raise ValueError(
            f"Mesh.where: `other` has rows {jnp.shape(other.n_steps)} but this mesh has "
            f"{jnp.shape(mesh.n_steps)}.")
    mask = jnp.asarray(mask, bool)
    lead = (mesh.n,) if mesh.is_ensemble else ()
    if mask.shape != lead:
        raise ValueError(f"Mesh.where: `mask` must have shape {lead}, got {mask.shape}.")

    def pick(a, b):
        a, b = jnp.asarray(a), jnp.asarray(b)
        m = mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim))
        return jnp.where(m, b.astype(a.dtype), a)

    changes = {k: pick(getattr(mesh, k), getattr(other, k)) for k in mesh.PER_TRAJECTORY}
    changes["params"] = jax.tree_util.tree_map(pick, mesh.params, other.params)
    return dataclasses.replace(mesh, **changes)


def concatenate(meshes: Sequence["Mesh"]) -> "Mesh":
    """`Mesh.concatenate`: ensembles joined along the ensemble axis."""
    meshes = [m if m.is_ensemble else m.repeat(1) for m in meshes]
    if not meshes:
        raise ValueError("Mesh.concatenate: `meshes` is empty.")
    for m in meshes[1:]:
        check_compatible(meshes[0], m, "Mesh.concatenate", "meshes")
    on = all(on_host(m) for m in meshes)
    meshes = [m.to_host() if on else m.to_device() for m in meshes]
    cap = max(m.capacity for m in meshes)
    meshes = [m.with_capacity(cap) for m in meshes]
    xp = np if on else jnp
    cat = lambda *xs: xp.concatenate([xp.asarray(x) for x in xs], axis=0)
    changes = {k: cat(*(getattr(m, k) for m in meshes)) for k in meshes[0].PER_TRAJECTORY}
    changes["params"] = jax.tree_util.tree_map(cat, *(m.params for m in meshes))
    return dataclasses.replace(meshes[0], **changes)


def combined(meshes: Sequence["Mesh"], where: str, thin: bool) -> "Mesh":
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
        for t, k, ok in zip(b.times, b.n_steps, b.ok):
            if ok:
                times.append(t[: int(k) + 1])
    if not times:
        raise ValueError(f"Mesh.{where}: no trajectory of `meshes` was recorded successfully.")
    first = parts[0].row(0)
    union = np.unique(np.concatenate(times))
    if thin:
        forced = np.concatenate([np.ravel(np.asarray(first.ts)),
                                 np.ravel(np.asarray(first.tstops))])
        union = thinned(union, [np.unique(t) for t in times], forced)
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


def thinned(nodes: np.ndarray, parts: list[np.ndarray], forced: np.ndarray) -> np.ndarray:
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


# ---------------------------------------------------------------------- step slots


def with_capacity(mesh: "Mesh", cap) -> "Mesh":
    """`Mesh.with_capacity`: exactly ``cap`` step slots (grown with padding, or cut)."""
    cap = positive_int(cap, "with_capacity", "cap")
    extra = cap - mesh.capacity
    if extra == 0:
        return mesh
    if extra > 0:
        xp = np if on_host(mesh) else jnp
        t = mesh.times
        times = xp.concatenate([t, xp.repeat(t[..., -1:], extra, axis=-1)], axis=-1)
        return dataclasses.replace(mesh, times=pad_times(times, mesh.n_steps))
    if isinstance(mesh.n_steps, jax.core.Tracer):
        raise ValueError(
            f"Mesh.with_capacity: cutting to `cap`={cap} needs concrete `n_steps`; call "
            "it outside jax.jit."
        )
    used = int(np.max(host(mesh.n_steps))) if np.size(mesh.n_steps) else 0
    if cap < used:
        raise ValueError(
            f"Mesh.with_capacity: `cap`={cap} is below the longest trajectory's {used} "
            "accepted steps."
        )
    return dataclasses.replace(mesh, times=mesh.times[..., : cap + 1])


def trim(mesh: "Mesh", exact: bool) -> "Mesh":
    """`Mesh.trim`: unused trailing slots dropped (capacity a power of two >= 16 unless
    ``exact``)."""
    if isinstance(mesh.n_steps, jax.core.Tracer):
        raise ValueError("Mesh.trim() needs concrete `n_steps`; call it outside jax.jit.")
    used = trimmed_capacity(host(mesh.n_steps), mesh.capacity, exact)
    if used >= mesh.capacity:
        return mesh
    return mesh.with_capacity(used)


def trimmed_capacity(n_steps, capacity: int, exact: bool = False) -> int:
    """The capacity `Mesh.trim` gives a mesh of ``capacity`` slots whose rows take
    ``n_steps`` (host) steps: the longest row, rounded up to a power of two >= 16 unless
    ``exact``, never more than ``capacity``."""
    used = max(int(np.max(n_steps, initial=0)), 1)
    if not exact:
        used = max(16, 1 << (used - 1).bit_length())
    return min(used, int(capacity))
