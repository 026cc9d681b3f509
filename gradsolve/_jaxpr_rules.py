"""The structural rules of the jaxpr translator: one function per primitive, in `RULES`.

`gradsolve._jaxpr.Scalarizer.primitive` looks a primitive up here when it is neither inlined
(a call) nor elementwise (left to the backend). A rule is resolved at translation time on
numpy object arrays of backend scalars::

    rule(sc, ins, params, out_avals, in_avals) -> list of object arrays (one per output)

``sc`` is the `Scalarizer` doing the translation: a rule makes elementwise work of its own
only through its operations (`Scalarizer.apply`, ``binop``, ``select``, ``pick``,
``constant``, ``constant_value``, ``run``), so every backend (C++ emitter, lanes, Pallas
blocks) gets the same rules. Keys are primitive names with ``-`` written ``_``
(``scatter-add`` is ``scatter_add``); a primitive without a rule is `Unsupported`.

Adding a primitive is one decorated function here (``@rule("name")``); nothing in the
class changes.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._jaxpr import (
    _BINOPS, _MAX_SCATTER, _MAX_UNROLLED, RULES, Unsupported, _scalar, rule,
    unsupported_primitive,
)

# ---------------------------------------------------------------------- shapes and slices


@rule("broadcast_in_dim")
def _broadcast_in_dim(sc, ins, p, avals, in_avals):
    shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
    x = ins[0]
    expanded = [1] * len(shape)
    for i, dmn in enumerate(dims):
        expanded[dmn] = x.shape[i]
    return [np.broadcast_to(x.reshape(expanded), shape).copy()]


@rule("reshape", "squeeze", "expand_dims")
def _reshape(sc, ins, p, avals, in_avals):
    return [ins[0].reshape(tuple(avals[0].shape))]


@rule("slice")
def _slice(sc, ins, p, avals, in_avals):
    strides = p.get("strides") or (1,) * len(p["start_indices"])
    sl = tuple(slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"], strides))
    return [ins[0][sl]]


def _dynamic(sc, x, starts, sizes, dtypes, case_dtype, place, chosen=()):
    """``place(starts)`` for the starts of a dynamic (update) slice of ``x``, each
    clamped to ``[0, dim - size]`` as XLA does; a traced start chooses among every
    possible one (`Scalarizer.pick`)."""
    k = len(chosen)
    if k == len(starts):
        return place(chosen)
    return sc.pick(starts[k].reshape(())[()], dtypes[k], 0, x.shape[k] - sizes[k],
                   lambda s: _dynamic(sc, x, starts, sizes, dtypes, case_dtype, place,
                                      chosen + (s,)), case_dtype)


@rule("dynamic_slice")
def _dynamic_slice(sc, ins, p, avals, in_avals):
    x, *idx = ins
    sizes = p["slice_sizes"]
    return [_dynamic(sc, x, idx, sizes, [a.dtype for a in in_avals[1:]], avals[0].dtype,
                     lambda st: x[tuple(slice(s, s + n) for s, n in zip(st, sizes))])]


@rule("dynamic_update_slice")
def _dynamic_update_slice(sc, ins, p, avals, in_avals):
    x, upd, *idx = ins

    def place(starts):
        out = x.copy()
        out[tuple(slice(s, s + n) for s, n in zip(starts, upd.shape))] = upd
        return out

    return [_dynamic(sc, x, idx, upd.shape, [a.dtype for a in in_avals[2:]],
                     avals[0].dtype, place)]


@rule("concatenate")
def _concatenate(sc, ins, p, avals, in_avals):
    return [np.concatenate(ins, axis=p["dimension"])]


@rule("stack")
def _stack(sc, ins, p, avals, in_avals):
    return [np.stack(ins, axis=p.get("axis", 0))]


@rule("unstack")
def _unstack(sc, ins, p, avals, in_avals):
    axis = p.get("axis", 0)
    return [np.take(ins[0], i, axis=axis) for i in range(ins[0].shape[axis])]


@rule("split")
def _split(sc, ins, p, avals, in_avals):
    sizes, axis = p["sizes"], p["axis"]
    return list(np.split(ins[0], np.cumsum(sizes)[:-1], axis=axis))


@rule("transpose")
def _transpose(sc, ins, p, avals, in_avals):
    return [np.transpose(ins[0], p["permutation"])]


@rule("rev")
def _rev(sc, ins, p, avals, in_avals):
    return [np.flip(ins[0], axis=tuple(p["dimensions"]))]


@rule("pad")
def _pad(sc, ins, p, avals, in_avals):
    x, val = ins
    val = np.asarray(val).reshape(-1)[0]
    cur = x
    for axis, (lo, hi, interior) in enumerate(p["padding_config"]):
        lo, hi, interior = int(lo), int(hi), int(interior)
        n = cur.shape[axis]
        size = lo + hi + n + max(n - 1, 0) * interior
        shape = list(cur.shape)
        shape[axis] = max(size, 0)
        out = np.full(shape, val, dtype=object)
        for i in range(n):
            j = lo + i * (interior + 1)
            if 0 <= j < size:
                src = [slice(None)] * cur.ndim
                dst = [slice(None)] * cur.ndim
                src[axis], dst[axis] = i, j
                out[tuple(dst)] = cur[tuple(src)]
        cur = out
    return [cur]


# ---------------------------------------------------------------------- values


@rule("iota")
def _iota(sc, ins, p, avals, in_avals):
    shape, dim = tuple(p["shape"]), p["dimension"]
    ar = np.arange(shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(shape))])
    return [sc.constant(np.broadcast_to(ar, shape), avals[0].dtype)]


@rule("empty2", "empty")
def _empty2(sc, ins, p, avals, in_avals):
    """An uninitialised buffer (the unused residuals of a differentiated ``cond``
    branch): zeros."""
    return [sc.constant(np.zeros(avals[0].shape), avals[0].dtype)]


# ---------------------------------------------------------------------- reductions


def _reduce(sc, ins, p, avals, in_avals, op):
    x = ins[0]
    axes = tuple(p["axes"])
    keep = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, keep + list(axes)).reshape(
        tuple(x.shape[i] for i in keep) + (-1,))
    dtype = avals[0].dtype
    out = np.empty(moved.shape[:-1], dtype=object)
    for idx in np.ndindex(out.shape):
        terms = list(moved[idx])
        acc = terms[0]
        for t in terms[1:]:
            acc = sc.binop(op, acc, t, dtype)
        out[idx] = acc
    return [out]


RULES.update({
    "reduce_sum": partial(_reduce, op="add"),
    "reduce_prod": partial(_reduce, op="mul"),
    "reduce_max": partial(_reduce, op="max"),
    "reduce_min": partial(_reduce, op="min"),
    "reduce_and": partial(_reduce, op="and"),
    "reduce_or": partial(_reduce, op="or"),
})


@rule("dot_general")
def _dot_general(sc, ins, p, avals, in_avals):
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    lhs, rhs = ins
    lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    L = np.transpose(lhs, list(lb) + lf + list(lc))
    R = np.transpose(rhs, list(rb) + list(rc) + rf)
    nb = len(lb)
    bshape = L.shape[:nb]
    lfs = L.shape[nb:nb + len(lf)]
    rfs = R.shape[nb + len(rc):]
    k = int(np.prod(L.shape[nb + len(lf):]))
    L = L.reshape(bshape + lfs + (k,))
    R = R.reshape(bshape + (k,) + rfs)
    out = np.empty(bshape + lfs + rfs, dtype=object)
    dtype = avals[0].dtype
    for bi in np.ndindex(bshape):
        for li in np.ndindex(lfs):
            for ri in np.ndindex(rfs):
                acc = None
                for j in range(k):
                    term = sc.binop("mul", L[bi + li + (j,)], R[bi + (j,) + ri], dtype)
                    acc = term if acc is None else sc.binop("add", acc, term, dtype)
                out[bi + li + ri] = sc.constant(0, dtype)[()] if acc is None else acc
    return [out]


def _arg_best(sc, ins, p, avals, in_avals, compare):
    """``argmax``/``argmin`` along one axis as a chain of comparisons: the first index
    of the extreme value, the first NaN if there is one (as `jax.numpy.argmax`)."""
    x, (axis,), dt = ins[0], p["axes"], in_avals[0].dtype
    index_dtype = p["index_dtype"]
    moved = np.moveaxis(x, axis, 0)
    best, where = moved[0, ...], np.broadcast_to(sc.constant(0, index_dtype), moved.shape[1:])
    bool_ = np.dtype(np.bool_)
    for k in range(1, moved.shape[0]):
        xk = moved[k, ...]
        take = sc.apply(compare, [xk, best], [dt, dt])
        if np.issubdtype(np.dtype(dt), np.inexact):  # a NaN wins unless one came first
            first_nan = sc.apply(lax.bitwise_and, [
                sc.apply(lax.ne, [xk, xk], [dt, dt]),
                sc.apply(lax.eq, [best, best], [dt, dt])], [bool_, bool_])
            take = sc.apply(lax.bitwise_or, [take, first_nan], [bool_, bool_])
        best = sc.select(take, [best, xk], bool_, dt)
        where = sc.select(take, [where, sc.constant(k, index_dtype)], bool_, index_dtype)
    return [where]


RULES.update({
    "argmax": partial(_arg_best, compare=lax.gt),
    "argmin": partial(_arg_best, compare=lax.lt),
})


def _cumulative(sc, ins, p, avals, in_avals, op):
    """``cumsum``/``cumprod``/``cummax``/``cummin`` along ``axis`` (``reverse``: from
    the end) as running `binop` ``op``, in order."""
    x = np.moveaxis(ins[0], p["axis"], 0).copy()
    order = range(x.shape[0] - 1, -1, -1) if p["reverse"] else range(x.shape[0])
    dt = avals[0].dtype
    prev = None
    for i in order:
        if prev is not None:
            x[i, ...] = sc.apply(_BINOPS[op], [x[prev, ...], x[i, ...]], [dt, dt])
        prev = i
    return [np.moveaxis(x, 0, p["axis"])]


RULES.update({
    "cumsum": partial(_cumulative, op="add"),
    "cumprod": partial(_cumulative, op="mul"),
    "cummax": partial(_cumulative, op="max"),
    "cummin": partial(_cumulative, op="min"),
})


# ---------------------------------------------------------------------- control flow


@rule("cond")
def _cond(sc, ins, p, avals, in_avals):
    """``lax.cond``/``lax.switch`` (and ``jnp.piecewise``): a constant index runs its
    branch; a traced one runs every branch and chooses each output entry with
    ``select_n`` (what ``jax.vmap`` makes of a ``cond`` with a batched index)."""
    index, *ops = ins
    branches = p["branches"]
    value = sc.constant_value(index.reshape(())[()])
    if value is not None:
        return sc.run(branches[min(max(int(value), 0), len(branches) - 1)], ops)
    outs = [sc.run(b, ops) for b in branches]
    return [sc.select(index, [o[j] for o in outs], in_avals[0].dtype, aval.dtype)
            for j, aval in enumerate(avals)]


@rule("scan")
def _scan(sc, ins, p, avals, in_avals):
    """``lax.scan`` (``fori_loop`` with concrete bounds) unrolled step by step; long
    loops are `Unsupported` (the straight-line code would be too large)."""
    body, length, n_const, n_carry = p["jaxpr"], p["length"], p["num_consts"], p["num_carry"]
    if length * max(len(body.jaxpr.eqns), 1) > _MAX_UNROLLED:
        raise Unsupported(f"a loop of {length} steps (lax.scan or fori_loop), too long to "
                          "unroll")
    consts, carry, xs = ins[:n_const], ins[n_const:n_const + n_carry], ins[n_const + n_carry:]
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    ys = {}
    for i in steps:
        out = sc.run(body, [*consts, *carry, *[x[i, ...] for x in xs]])
        carry, ys[i] = out[:n_carry], out[n_carry:]
    stacked = [np.stack([ys[i][j] for i in range(length)]) if length else
               np.empty(aval.shape, dtype=object) for j, aval in enumerate(avals[n_carry:])]
    return [*carry, *stacked]


# ---------------------------------------------------------------------- gathers and scatters


# Gathers and scatters: JAX's own index map evaluated on integer positions (so its
# semantics, out-of-bounds modes included), for the constant indices and, for each traced
# index entry, for every value it can usefully take (`_index_entries`).
def _index_entries(sc, idx, dtype, extents):
    """The constant index values (traced entries at 0) and, per traced entry, ``(k,
    entry, values)``: its flat position, the entry and the values that cover every
    outcome (``-1 .. extent``: below and above the operand dimension it indexes
    behave as any index out of bounds there)."""
    base = np.zeros(idx.shape, dtype=np.int64)
    traced = []
    lo = 0 if np.issubdtype(np.dtype(dtype), np.unsignedinteger) else -1
    for k, entry in enumerate(idx.reshape(-1)):
        value = sc.constant_value(entry)
        if value is None:
            extent = extents[np.unravel_index(k, idx.shape)[-1]]  # index_vector_dim: last
            traced.append((k, entry, range(lo, extent + 1)))
        else:
            base.reshape(-1)[k] = int(value)
    return base, traced


def _variants(base, k, values) -> np.ndarray:
    """``base`` with flat entry ``k`` set to each of ``values``: ``(len(values), ...)``."""
    out = np.repeat(base[None], len(values), axis=0)
    out.reshape(len(values), -1)[:, k] = list(values)
    return out


@rule("gather")
def _gather(sc, ins, p, avals, in_avals):
    """A gather: every output entry reads the operand entry that JAX's gather of the
    operand's positions puts there (or the fill value). An output entry that depends
    on a traced index (``jnp.interp``, ``y[i]`` with ``i`` computed) chooses among the
    entries every value of that index would read (`Scalarizer.pick`); entries that
    depend on several traced indices are `Unsupported`."""
    x, idx = ins
    dt = avals[0].dtype
    dims = p["dimension_numbers"]
    base, traced = _index_entries(sc, idx, in_avals[1].dtype,
                                  [x.shape[a] for a in dims.start_index_map])
    positions = np.arange(x.size, dtype=np.int32).reshape(x.shape)  # numpy: concrete

    def sources(indices):  # operand position read per output entry, -1: the fill
        with jax.ensure_compile_time_eval():
            return np.asarray(jax.vmap(lambda i: lax.gather_p.bind(
                positions, i, **{**p, "fill_value": -1}))(jnp.asarray(indices)))

    with jax.ensure_compile_time_eval():  # the fill value, as JAX chooses it
        fill = np.asarray(lax.gather_p.bind(jnp.asarray(np.zeros(x.shape, in_avals[0].dtype)),
                                            jnp.asarray(base), **p))
    fills, flat = sc.constant(fill, dt), x.reshape(-1)

    def read(source):
        out = np.empty(source.shape, dtype=object)
        for k in np.ndindex(source.shape):
            out[k] = flat[source[k]] if source[k] >= 0 else fills[k]
        return out

    out = read(sources(base[None])[0])
    owner = np.zeros(out.shape, dtype=bool)
    for k, entry, values in traced:
        maps = sources(_variants(base, k, values))
        hit = np.any(maps != maps[:1], axis=0)
        if np.any(owner & hit):
            raise Unsupported("a gather whose entries depend on several traced indices")
        owner |= hit
        if np.any(hit):
            out[hit] = sc.pick(entry, in_avals[1].dtype, values[0], values[-1],
                               lambda v: read(maps[v - values[0]])[hit], dt)
    return [out]


def _scatter(sc, ins, p, avals, in_avals, combine):
    """A scatter: every operand entry combined (`binop` ``combine``, in update order)
    with the updates that JAX's scatter lands on it, or replaced by the last of them
    (``combine=None``: ``scatter``, ``.at[].set``); out-of-bounds updates are clipped or
    dropped by ``mode`` as in JAX. An update at a traced index (the transpose of such a
    gather) adds, to each entry it can land on, itself where it lands and 0 elsewhere
    (`Scalarizer.pick`): only for ``scatter-add``."""
    x, idx, upd = ins
    dt = avals[0].dtype
    dims = p["dimension_numbers"]
    base, traced = _index_entries(sc, idx, in_avals[1].dtype,
                                  [x.shape[a] for a in dims.scatter_dims_to_operand_dims])
    n_variants = 1 + sum(len(v) for _, _, v in traced)
    if n_variants * upd.size * x.size > _MAX_SCATTER:
        raise Unsupported("a large scatter")
    if traced and combine != "add":
        raise unsupported_primitive(f"scatter{'-' + combine if combine else ''}")
    kw = dict(dimension_numbers=dims, mode=p["mode"],
              indices_are_sorted=p["indices_are_sorted"], unique_indices=p["unique_indices"])
    zeros = np.zeros(x.shape, np.int32)  # numpy: concrete under any trace
    one_hot = np.eye(upd.size, dtype=np.int32).reshape((upd.size, *upd.shape))

    def lands(indices):  # [variant, u, i]: update u lands on operand entry i
        with jax.ensure_compile_time_eval():
            per_update = jax.vmap(lambda ind, u: lax.scatter_add(zeros, ind, u, **kw),
                                  in_axes=(None, 0))
            hits = jax.vmap(per_update, in_axes=(0, None))(jnp.asarray(indices), one_hot)
        return np.asarray(hits).reshape(len(indices), upd.size, x.size) > 0

    out, updates = x.reshape(-1).copy(), upd.reshape(-1)
    moving = np.zeros(upd.size, dtype=bool)
    maps = []
    for k, entry, values in traced:
        m = lands(_variants(base, k, values))
        hit = np.any(m != m[:1], axis=(0, 2))  # the updates this index moves
        if np.any(moving & hit):
            raise Unsupported("a scatter whose updates depend on several traced indices")
        moving |= hit
        maps.append((entry, values, m, hit))
    static = lands(base[None])[0]
    for u, i in zip(*np.nonzero(static & ~moving[:, None])):  # by update: in update order
        out[i] = updates[u] if combine is None else sc.binop(combine, out[i], updates[u], dt)
    zero = sc.constant(0, dt)[()]
    for entry, values, m, hit in maps:
        for u, i in zip(*np.nonzero(np.any(m, axis=0) & hit[:, None])):
            term = sc.pick(entry, in_avals[1].dtype, values[0], values[-1],
                           lambda v: _scalar(updates[u] if m[v - values[0], u, i] else zero),
                           dt)[()]
            out[i] = sc.binop("add", out[i], term, dt)
    return [out.reshape(x.shape)]


RULES.update({
    "scatter": partial(_scatter, combine=None),
    "scatter_add": partial(_scatter, combine="add"),
    "scatter_mul": partial(_scatter, combine="mul"),
    "scatter_min": partial(_scatter, combine="min"),
    "scatter_max": partial(_scatter, combine="max"),
})
