"""Evaluate the jaxpr of a small vector field element by element (shared translator).

Both fast drivers see a user's vector field ``f(t, y, params)`` as straight-line scalar
code: every array element of every jaxpr variable becomes one backend scalar, structural
primitives (slice, stack, pad, broadcast, transpose, dot_general, ...) are resolved at
translation time on numpy object arrays of those scalars, and elementwise primitives are
left to a backend. The compiled CPU kernel's backend emits C++ expressions
(`gradsolve.drivers.kernel.codegen.Emitter`); the lanes replay's evaluates each entry as an
``(n,)`` JAX array over the ensemble (`gradsolve.drivers.lanes`).

Entries that are constants are folded at translation time (with JAX, so they hold the
values XLA computes), which keeps indices static: gathers and scatters with constant
indices (``y[jnp.array([1, 0])]``, ``.at[i].set``) are resolved by evaluating their index
map on integer positions with JAX itself (exactly JAX's semantics, out-of-bounds modes
included). Control flow is unrolled: ``scan`` (``fori_loop`` with concrete bounds) step by
step, ``cond``/``switch`` by evaluating every branch and choosing with ``select_n`` (what
``jax.vmap`` does to a ``cond`` with a batched predicate), and a traced index into a small
array (``jnp.interp``, ``searchsorted``) by choosing among the possible slices.

Only primitives with an exact scalar meaning are supported; anything else (``while``
loops, gathers with traced indices, complex numbers, ...) raises `Unsupported`, and the
caller uses a driver that does not translate. Vector fields of the systems gradsolve
targets (a few to a few dozen states) are small enough that full unrolling is the fast
choice.
"""

from __future__ import annotations

from functools import partial, partialmethod
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:  # jax >= 0.4.36
    from jax.extend.core import Literal
except ImportError:  # pragma: no cover
    from jax.core import Literal

from ._caches import cache


class Unsupported(Exception):
    """The vector field uses something the translator does not handle; the message names
    it as a noun phrase ("`while` (lax.while_loop)", "complex128 values"), for users."""


# What users wrote to get a primitive the translator refuses (for `Unsupported` messages).
_HINTS = {
    "while": "lax.while_loop, or fori_loop with traced bounds",
    "scatter": "an .at[] update at indices computed from the state or parameters",
    "sort": "jnp.sort, jnp.median, ...",
    "custom_jvp_call": "a function with a custom derivative rule, e.g. jax.nn.softplus",
    "custom_vjp_call": "a function with a custom derivative rule",
}


def unsupported_primitive(name: str) -> Unsupported:
    """`Unsupported` naming the primitive ``name`` (and, where known, the JAX function
    that produces it)."""
    hint = _HINTS.get(name.split("-")[0].removesuffix("_jaxpr"))  # scatter-mul: scatter
    return Unsupported(f"`{name}`" + (f" ({hint})" if hint else ""))


_MAX_ELEMENTS = 4096  # per variable: larger arrays are not "small systems"
_MAX_UNROLLED = 1 << 14  # equations of a scan body times its length
_MAX_SCATTER = 1 << 20  # update entries times operand entries


_INLINE_KEYS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_INLINE = {"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
           "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin", "name"}
# Primitives applied entry by entry (same output shape as the broadcast inputs).
ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "and",
    "asin", "asinh", "atan", "atan2", "atanh", "cbrt",
    "ceil", "copy", "copy_p", "cos", "cosh", "div",
    "eq", "erf", "erfc", "exp", "exp2", "expm1",
    "floor", "ge", "gt", "is_finite", "le", "lgamma",
    "log", "log1p", "logistic", "lt", "max", "min",
    "mul", "ne", "neg", "nextafter", "not", "or",
    "pow", "real", "rem", "rsqrt", "sign", "sin",
    "sinh", "sqrt", "square", "sub", "tan", "tanh",
    "xor", "integer_pow", "convert_element_type", "reduce_precision", "select_n", "clamp",
    "round", "stop_gradient", "erf_inv", "digamma", "lt_to", "le_to", "eq_to",
})
# The primitives behind `Scalarizer.binop`.
_BINOPS = {"add": lax.add, "mul": lax.mul, "max": lax.max, "min": lax.min,
           "and": lax.bitwise_and, "or": lax.bitwise_or}
_to_int32 = partial(lax.convert_element_type, new_dtype=np.int32)
# (lax function, input shapes and dtypes) -> its primitive, params and output aval
_equations = cache("translator equations")


def _equation(fn, spec):
    """The primitive, params and output aval of the one equation ``fn`` makes for inputs
    of ``spec`` (shapes and dtypes): each JAX version's own params for its primitives."""
    if (fn, spec) not in _equations:
        (eqn,) = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, dt) for s, dt in spec)).jaxpr.eqns
        _equations[fn, spec] = eqn.primitive, eqn.params, eqn.outvars[0].aval
    return _equations[fn, spec]


class _Var(NamedTuple):
    aval: object


class _Eqn(NamedTuple):
    """A stand-in for a jaxpr equation, for the elementwise operations the structural rules
    make themselves (`Scalarizer.apply`): what the backends read of an equation."""

    primitive: object
    params: dict
    invars: list
    outvars: list


def _scalar(entry) -> np.ndarray:
    """A 0-d object array holding ``entry`` as it is (``np.asarray`` would unpack an array
    entry of the lanes backend)."""
    out = np.empty((), dtype=object)
    out[()] = entry
    return out


def _check_dtype(dtype) -> None:
    """Entries are real scalars: a complex (or other non-real) value anywhere in the field
    is `Unsupported` rather than silently cut to its real part."""
    dt = np.dtype(dtype)
    if not (np.issubdtype(dt, np.floating) or np.issubdtype(dt, np.integer) or dt == np.bool_):
        raise Unsupported(f"{dt} values (the translator's entries are real scalars)")


class Scalarizer:
    """Evaluates a jaxpr element by element: every value is a numpy object array whose
    entries are one backend scalar each (a C++ expression here, a JAX array of one entry per
    trajectory in `gradsolve.drivers.lanes`). Structural primitives are resolved on those object
    arrays; subclasses say how elementwise ones are applied and how constants are made and
    recognised (operations on constants are folded, indices read, at translation time)."""

    # --- backend hooks -------------------------------------------------------------------
    def constant(self, value, dtype) -> np.ndarray:
        """An object array of entries holding the constant ``value`` (as ``dtype``)."""
        raise NotImplementedError

    def constant_value(self, entry):
        """The value of ``entry`` if it is a constant (a numpy scalar), else ``None``."""
        raise NotImplementedError

    def elementwise(self, eqn, ins: list[np.ndarray]) -> list[np.ndarray]:
        """``eqn`` (an elementwise primitive) applied entry by entry."""
        raise NotImplementedError

    # --- operations built on the hooks ---------------------------------------------------
    def apply(self, fn, ins: list, dtypes) -> np.ndarray:
        """``fn`` (a ``jax.lax`` function of one elementwise primitive, e.g. ``lax.add``)
        applied to object arrays ``ins`` (of ``dtypes``; broadcast together), for the
        structural rules that make elementwise operations of their own (constants folded
        as in `primitive`). An entry that is not an array stands for a 0-d array of itself."""
        ins = [a if isinstance(a, np.ndarray) else _scalar(a) for a in ins]
        shape = np.broadcast_shapes(*(a.shape for a in ins))
        ins = [np.broadcast_to(a, shape) for a in ins]
        prim, params, out = _equation(fn, tuple((shape, np.dtype(dt)) for dt in dtypes))
        eqn = _Eqn(prim, params, [_Var(jax.core.ShapedArray(shape, dt)) for dt in dtypes],
                   [_Var(out)])
        return self._elementwise(eqn, ins)[0]

    def binop(self, name: str, a, b, dtype):
        """One entry: ``add``, ``mul``, ``max``, ``min``, ``and`` or ``or`` of two
        (reductions, dot products, scatters)."""
        return self.apply(_BINOPS[name], [a, b], [dtype, dtype])[()]

    def select(self, which, cases: list, which_dtype, dtype) -> np.ndarray:
        """``cases[which]`` entry by entry (``select_n``; ``which`` boolean for two cases,
        else an integer in range)."""
        if np.dtype(which_dtype) not in (np.dtype(np.bool_), np.dtype(np.int32)):
            which, which_dtype = self.apply(_to_int32, [which], [which_dtype]), np.int32
        return self.apply(lax.select_n, [which, *cases], [which_dtype] + [dtype] * len(cases))

    def _pick(self, index, dtype, lo: int, hi: int, candidate, case_dtype):
        """``candidate(k)`` (an object array of ``case_dtype`` entries) for
        ``k = clamp(index, lo, hi)``: a dynamic index into a small array. Resolved now for
        a constant ``index`` (an entry of ``dtype``); else every candidate is made and one
        chosen entry by entry, exactly the value at the index."""
        value = self.constant_value(index)
        if value is not None or lo == hi:
            return candidate(lo if value is None else min(max(int(value), lo), hi))
        cases = [np.asarray(candidate(k), dtype=object) for k in range(lo, hi + 1)]
        k = self.apply(lax.clamp, [self.constant(lo, dtype), index, self.constant(hi, dtype)],
                       [dtype] * 3)
        if lo:
            k = self.apply(lax.sub, [k, self.constant(lo, dtype)], [dtype] * 2)
        return self.select(k, cases, dtype, case_dtype)

    # --- jaxpr evaluation -------------------------------------------------------------
    def run(self, closed, args: list[np.ndarray]) -> list[np.ndarray]:
        jaxpr = closed.jaxpr
        env: dict = {}
        for var in (*jaxpr.constvars, *jaxpr.invars):
            _check_dtype(var.aval.dtype)
        for var, c in zip(jaxpr.constvars, closed.consts):
            env[var] = self.constant(c, var.aval.dtype)
        for var, a in zip(jaxpr.invars, args):
            env[var] = a
        return self._eval(jaxpr, env)

    def _concrete(self, value) -> np.ndarray:
        try:
            arr = np.asarray(value)
        except Exception as e:  # a tracer closed over from an outer trace
            raise Unsupported("the vector field closes over traced values") from e
        if arr.size > _MAX_ELEMENTS:
            raise Unsupported(f"a constant of more than {_MAX_ELEMENTS} entries")
        return arr

    def _read(self, env, v) -> np.ndarray:
        if isinstance(v, Literal):
            return self.constant(v.val, v.aval.dtype)
        return env[v]

    def _eval(self, jaxpr, env) -> list[np.ndarray]:
        for eqn in jaxpr.eqns:
            for v in (*eqn.invars, *eqn.outvars):
                _check_dtype(v.aval.dtype)
            ins = [self._read(env, v) for v in eqn.invars]
            outs = self.primitive(eqn, ins)
            for var, val in zip(eqn.outvars, outs):
                shape = tuple(var.aval.shape)
                if int(np.prod(shape)) > _MAX_ELEMENTS:
                    raise Unsupported(f"an array of more than {_MAX_ELEMENTS} entries")
                env[var] = np.asarray(val, dtype=object).reshape(shape)
        return [self._read(env, v) for v in jaxpr.outvars]

    # --- primitives --------------------------------------------------------------------
    def primitive(self, eqn, ins):
        name = eqn.primitive.name
        p = eqn.params
        out_avals = [v.aval for v in eqn.outvars]
        if name in _INLINE:
            for key in _INLINE_KEYS:
                if key in p:
                    sub = p[key]
                    if hasattr(sub, "jaxpr"):  # ClosedJaxpr
                        return self.run(sub, ins[len(ins) - len(sub.jaxpr.invars):])
                    return self._eval(sub, dict(zip(sub.invars, ins[len(ins) - len(sub.invars):])))
            raise unsupported_primitive(name)
        if name in ELEMENTWISE:
            return self._elementwise(eqn, ins)
        rule = getattr(self, "_p_" + name.replace("-", "_"), None)
        if rule is None:
            raise unsupported_primitive(name)
        return rule(ins, p, out_avals, [v.aval for v in eqn.invars])

    def _elementwise(self, eqn, ins):
        """``eqn`` entry by entry; with every input a constant, evaluated now by JAX (so
        index arithmetic stays static, and constants hold XLA's values)."""
        values = [self._values(a, v.aval.dtype) for a, v in zip(ins, eqn.invars)]
        if any(v is None for v in values):
            return self.elementwise(eqn, ins)
        try:
            with jax.ensure_compile_time_eval():
                outs = eqn.primitive.bind(*map(jnp.asarray, values), **eqn.params)
        except Exception as e:  # noqa: BLE001 - refused, not a crash of the caller
            raise Unsupported(f"`{eqn.primitive.name}` of constants, which JAX could not "
                              f"evaluate ({type(e).__name__}: {e})") from e
        outs = outs if eqn.primitive.multiple_results else [outs]
        return [self.constant(np.asarray(o), v.aval.dtype) for o, v in zip(outs, eqn.outvars)]

    def _values(self, arr: np.ndarray, dtype) -> np.ndarray | None:
        """The numpy array of ``arr``'s values if every entry is a constant, else ``None``."""
        flat = []
        for entry in np.asarray(arr, dtype=object).reshape(-1):
            value = self.constant_value(entry)
            if value is None:
                return None
            flat.append(value)
        return np.array(flat, dtype=dtype).reshape(np.shape(arr))

    # structural primitives: resolved at translation time
    def _p_broadcast_in_dim(self, ins, p, avals, in_avals):
        shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
        x = ins[0]
        expanded = [1] * len(shape)
        for i, dmn in enumerate(dims):
            expanded[dmn] = x.shape[i]
        return [np.broadcast_to(x.reshape(expanded), shape).copy()]

    def _p_reshape(self, ins, p, avals, in_avals):
        return [ins[0].reshape(tuple(avals[0].shape))]

    _p_squeeze = _p_reshape
    _p_expand_dims = _p_reshape

    def _p_slice(self, ins, p, avals, in_avals):
        strides = p.get("strides") or (1,) * len(p["start_indices"])
        sl = tuple(slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"], strides))
        return [ins[0][sl]]

    def _dynamic(self, x, starts, sizes, dtypes, case_dtype, place, chosen=()):
        """``place(starts)`` for the starts of a dynamic (update) slice of ``x``, each
        clamped to ``[0, dim - size]`` as XLA does; a traced start chooses among every
        possible one (`_pick`)."""
        k = len(chosen)
        if k == len(starts):
            return place(chosen)
        return self._pick(starts[k].reshape(())[()], dtypes[k], 0, x.shape[k] - sizes[k],
                          lambda s: self._dynamic(x, starts, sizes, dtypes, case_dtype, place,
                                                  chosen + (s,)), case_dtype)

    def _p_dynamic_slice(self, ins, p, avals, in_avals):
        x, *idx = ins
        sizes = p["slice_sizes"]
        return [self._dynamic(x, idx, sizes, [a.dtype for a in in_avals[1:]], avals[0].dtype,
                              lambda st: x[tuple(slice(s, s + n) for s, n in zip(st, sizes))])]

    def _p_dynamic_update_slice(self, ins, p, avals, in_avals):
        x, upd, *idx = ins

        def place(starts):
            out = x.copy()
            out[tuple(slice(s, s + n) for s, n in zip(starts, upd.shape))] = upd
            return out

        return [self._dynamic(x, idx, upd.shape, [a.dtype for a in in_avals[2:]],
                              avals[0].dtype, place)]

    def _p_concatenate(self, ins, p, avals, in_avals):
        return [np.concatenate(ins, axis=p["dimension"])]

    def _p_stack(self, ins, p, avals, in_avals):
        return [np.stack(ins, axis=p.get("axis", 0))]

    def _p_unstack(self, ins, p, avals, in_avals):
        axis = p.get("axis", 0)
        return [np.take(ins[0], i, axis=axis) for i in range(ins[0].shape[axis])]

    def _p_split(self, ins, p, avals, in_avals):
        sizes, axis = p["sizes"], p["axis"]
        return list(np.split(ins[0], np.cumsum(sizes)[:-1], axis=axis))

    def _p_transpose(self, ins, p, avals, in_avals):
        return [np.transpose(ins[0], p["permutation"])]

    def _p_rev(self, ins, p, avals, in_avals):
        return [np.flip(ins[0], axis=tuple(p["dimensions"]))]

    def _p_pad(self, ins, p, avals, in_avals):
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

    def _p_iota(self, ins, p, avals, in_avals):
        shape, dim = tuple(p["shape"]), p["dimension"]
        ar = np.arange(shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(shape))])
        return [self.constant(np.broadcast_to(ar, shape), avals[0].dtype)]

    def _p_empty2(self, ins, p, avals, in_avals):
        """An uninitialised buffer (the unused residuals of a differentiated ``cond``
        branch): zeros."""
        return [self.constant(np.zeros(avals[0].shape), avals[0].dtype)]

    _p_empty = _p_empty2

    def _reduce(self, ins, p, avals, in_avals, op):
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
                acc = self.binop(op, acc, t, dtype)
            out[idx] = acc
        return [out]

    _p_reduce_sum = partialmethod(_reduce, op="add")
    _p_reduce_prod = partialmethod(_reduce, op="mul")
    _p_reduce_max = partialmethod(_reduce, op="max")
    _p_reduce_min = partialmethod(_reduce, op="min")
    _p_reduce_and = partialmethod(_reduce, op="and")
    _p_reduce_or = partialmethod(_reduce, op="or")

    def _p_dot_general(self, ins, p, avals, in_avals):
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
                        term = self.binop("mul", L[bi + li + (j,)], R[bi + (j,) + ri], dtype)
                        acc = term if acc is None else self.binop("add", acc, term, dtype)
                    out[bi + li + ri] = self.constant(0, dtype)[()] if acc is None else acc
        return [out]

    def _arg_best(self, ins, p, avals, in_avals, compare):
        """``argmax``/``argmin`` along one axis as a chain of comparisons: the first index
        of the extreme value, the first NaN if there is one (as `jax.numpy.argmax`)."""
        x, (axis,), dt = ins[0], p["axes"], in_avals[0].dtype
        index_dtype = p["index_dtype"]
        moved = np.moveaxis(x, axis, 0)
        best, where = moved[0, ...], np.broadcast_to(self.constant(0, index_dtype), moved.shape[1:])
        bool_ = np.dtype(np.bool_)
        for k in range(1, moved.shape[0]):
            xk = moved[k, ...]
            take = self.apply(compare, [xk, best], [dt, dt])
            if np.issubdtype(np.dtype(dt), np.inexact):  # a NaN wins unless one came first
                first_nan = self.apply(lax.bitwise_and, [
                    self.apply(lax.ne, [xk, xk], [dt, dt]),
                    self.apply(lax.eq, [best, best], [dt, dt])], [bool_, bool_])
                take = self.apply(lax.bitwise_or, [take, first_nan], [bool_, bool_])
            best = self.select(take, [best, xk], bool_, dt)
            where = self.select(take, [where, self.constant(k, index_dtype)], bool_, index_dtype)
        return [where]

    _p_argmax = partialmethod(_arg_best, compare=lax.gt)
    _p_argmin = partialmethod(_arg_best, compare=lax.lt)

    def _cumulative(self, ins, p, avals, in_avals, op):
        """``cumsum``/``cumprod``/``cummax``/``cummin`` along ``axis`` (``reverse``: from
        the end) as running `binop` ``op``, in order."""
        x = np.moveaxis(ins[0], p["axis"], 0).copy()
        order = range(x.shape[0] - 1, -1, -1) if p["reverse"] else range(x.shape[0])
        dt = avals[0].dtype
        prev = None
        for i in order:
            if prev is not None:
                x[i, ...] = self.apply(_BINOPS[op], [x[prev, ...], x[i, ...]], [dt, dt])
            prev = i
        return [np.moveaxis(x, 0, p["axis"])]

    _p_cumsum = partialmethod(_cumulative, op="add")
    _p_cumprod = partialmethod(_cumulative, op="mul")
    _p_cummax = partialmethod(_cumulative, op="max")
    _p_cummin = partialmethod(_cumulative, op="min")

    def _p_cond(self, ins, p, avals, in_avals):
        """``lax.cond``/``lax.switch`` (and ``jnp.piecewise``): a constant index runs its
        branch; a traced one runs every branch and chooses each output entry with
        ``select_n`` (what ``jax.vmap`` makes of a ``cond`` with a batched index)."""
        index, *ops = ins
        branches = p["branches"]
        value = self.constant_value(index.reshape(())[()])
        if value is not None:
            return self.run(branches[min(max(int(value), 0), len(branches) - 1)], ops)
        outs = [self.run(b, ops) for b in branches]
        return [self.select(index, [o[j] for o in outs], in_avals[0].dtype, aval.dtype)
                for j, aval in enumerate(avals)]

    def _p_scan(self, ins, p, avals, in_avals):
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
            out = self.run(body, [*consts, *carry, *[x[i, ...] for x in xs]])
            carry, ys[i] = out[:n_carry], out[n_carry:]
        stacked = [np.stack([ys[i][j] for i in range(length)]) if length else
                   np.empty(aval.shape, dtype=object) for j, aval in enumerate(avals[n_carry:])]
        return [*carry, *stacked]

    # Gathers and scatters: JAX's own index map evaluated on integer positions (so its
    # semantics, out-of-bounds modes included), for the constant indices and, for each
    # traced index entry, for every value it can usefully take (`_index_entries`).
    def _index_entries(self, idx, dtype, extents):
        """The constant index values (traced entries at 0) and, per traced entry, ``(k,
        entry, values)``: its flat position, the entry and the values that cover every
        outcome (``-1 .. extent``: below and above the operand dimension it indexes
        behave as any index out of bounds there)."""
        base = np.zeros(idx.shape, dtype=np.int64)
        traced = []
        lo = 0 if np.issubdtype(np.dtype(dtype), np.unsignedinteger) else -1
        for k, entry in enumerate(idx.reshape(-1)):
            value = self.constant_value(entry)
            if value is None:
                extent = extents[np.unravel_index(k, idx.shape)[-1]]  # index_vector_dim: last
                traced.append((k, entry, range(lo, extent + 1)))
            else:
                base.reshape(-1)[k] = int(value)
        return base, traced

    @staticmethod
    def _variants(base, k, values) -> np.ndarray:
        """``base`` with flat entry ``k`` set to each of ``values``: ``(len(values), ...)``."""
        out = np.repeat(base[None], len(values), axis=0)
        out.reshape(len(values), -1)[:, k] = list(values)
        return out

    def _p_gather(self, ins, p, avals, in_avals):
        """A gather: every output entry reads the operand entry that JAX's gather of the
        operand's positions puts there (or the fill value). An output entry that depends
        on a traced index (``jnp.interp``, ``y[i]`` with ``i`` computed) chooses among the
        entries every value of that index would read (`_pick`); entries that depend on
        several traced indices are `Unsupported`."""
        x, idx = ins
        dt = avals[0].dtype
        dims = p["dimension_numbers"]
        base, traced = self._index_entries(idx, in_avals[1].dtype,
                                           [x.shape[a] for a in dims.start_index_map])
        positions = np.arange(x.size, dtype=np.int32).reshape(x.shape)  # numpy: concrete

        def sources(indices):  # operand position read per output entry, -1: the fill
            with jax.ensure_compile_time_eval():
                return np.asarray(jax.vmap(lambda i: lax.gather_p.bind(
                    positions, i, **{**p, "fill_value": -1}))(jnp.asarray(indices)))

        with jax.ensure_compile_time_eval():  # the fill value, as JAX chooses it
            fill = np.asarray(lax.gather_p.bind(jnp.asarray(np.zeros(x.shape, in_avals[0].dtype)),
                                                jnp.asarray(base), **p))
        fills, flat = self.constant(fill, dt), x.reshape(-1)

        def read(source):
            out = np.empty(source.shape, dtype=object)
            for k in np.ndindex(source.shape):
                out[k] = flat[source[k]] if source[k] >= 0 else fills[k]
            return out

        out = read(sources(base[None])[0])
        owner = np.zeros(out.shape, dtype=bool)
        for k, entry, values in traced:
            maps = sources(self._variants(base, k, values))
            hit = np.any(maps != maps[:1], axis=0)
            if np.any(owner & hit):
                raise Unsupported("a gather whose entries depend on several traced indices")
            owner |= hit
            if np.any(hit):
                out[hit] = self._pick(entry, in_avals[1].dtype, values[0], values[-1],
                                      lambda v: read(maps[v - values[0]])[hit], dt)
        return [out]

    def _scatter(self, ins, p, avals, in_avals, combine):
        """A scatter: every operand entry combined (`binop` ``combine``, in update order)
        with the updates that JAX's scatter lands on it, or replaced by the last of them
        (``combine=None``: ``scatter``, ``.at[].set``); out-of-bounds updates are clipped or
        dropped by ``mode`` as in JAX. An update at a traced index (the transpose of such a
        gather) adds, to each entry it can land on, itself where it lands and 0 elsewhere
        (`_pick`): only for ``scatter-add``."""
        x, idx, upd = ins
        dt = avals[0].dtype
        dims = p["dimension_numbers"]
        base, traced = self._index_entries(idx, in_avals[1].dtype,
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
            m = lands(self._variants(base, k, values))
            hit = np.any(m != m[:1], axis=(0, 2))  # the updates this index moves
            if np.any(moving & hit):
                raise Unsupported("a scatter whose updates depend on several traced indices")
            moving |= hit
            maps.append((entry, values, m, hit))
        static = lands(base[None])[0]
        for u, i in zip(*np.nonzero(static & ~moving[:, None])):  # by update: in update order
            out[i] = updates[u] if combine is None else self.binop(combine, out[i], updates[u], dt)
        zero = self.constant(0, dt)[()]
        for entry, values, m, hit in maps:
            for u, i in zip(*np.nonzero(np.any(m, axis=0) & hit[:, None])):
                term = self._pick(entry, in_avals[1].dtype, values[0], values[-1],
                                  lambda v: _scalar(updates[u] if m[v - values[0], u, i] else zero),
                                  dt)[()]
                out[i] = self.binop("add", out[i], term, dt)
        return [out.reshape(x.shape)]

    _p_scatter = partialmethod(_scatter, combine=None)
    _p_scatter_add = partialmethod(_scatter, combine="add")
    _p_scatter_mul = partialmethod(_scatter, combine="mul")
    _p_scatter_min = partialmethod(_scatter, combine="min")
    _p_scatter_max = partialmethod(_scatter, combine="max")
