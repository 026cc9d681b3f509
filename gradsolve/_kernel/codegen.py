"""Translate the jaxpr of a small vector field into straight-line C++ for one trajectory.

The compiled replay kernel (`gradsolve._kernel`) runs the same Runge–Kutta chain as the XLA
replay, but as one loop over blocks of trajectories in which every stage of every step stays
in registers. The vector field is the user's JAX function, so its jaxpr (and the jaxpr of its
VJP) is translated here into scalar C++: every array element of every jaxpr variable becomes
one local scalar, structural primitives (slice, stack, pad, broadcast, transpose, ...) are
resolved at translation time, and elementwise primitives become C++ expressions.

Only primitives with an exact scalar meaning are supported; anything else (loops, gathers
with traced indices, complex numbers, ...) raises `Unsupported`, and the caller falls back
to the XLA replay. Vector fields of the ODE systems gradsolve targets (a few to a few dozen
states) are small enough that full unrolling is the fast choice.
"""

from __future__ import annotations

import math

import jax
import numpy as np

try:  # jax >= 0.4.36
    from jax.extend.core import Literal
except ImportError:  # pragma: no cover
    from jax.core import Literal


class Unsupported(Exception):
    """The vector field uses something the kernel translator does not handle."""


_MAX_ELEMENTS = 4096  # per variable: larger arrays are not "small systems"


def _ctype(dtype) -> str:
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return "real"
    if dtype == np.bool_:
        return "int"
    if np.issubdtype(dtype, np.integer):
        return "long long"
    raise Unsupported(f"dtype {dtype}")


def _literal(value, dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "1" if bool(value) else "0"
    if np.issubdtype(dtype, np.integer):
        return f"{int(value)}LL"
    v = float(value)
    if math.isnan(v):
        return "(real)NAN"
    if math.isinf(v):
        return "(real)INFINITY" if v > 0 else "(-(real)INFINITY)"
    return f"(real){v!r}"


_UNARY = {
    "neg": "(-{0})",
    "exp": "std::exp({0})",
    "exp2": "std::exp2({0})",
    "log": "std::log({0})",
    "log1p": "std::log1p({0})",
    "expm1": "std::expm1({0})",
    "sqrt": "std::sqrt({0})",
    "rsqrt": "((real)1 / std::sqrt({0}))",
    "cbrt": "std::cbrt({0})",
    "sin": "std::sin({0})",
    "cos": "std::cos({0})",
    "tan": "std::tan({0})",
    "asin": "std::asin({0})",
    "acos": "std::acos({0})",
    "atan": "std::atan({0})",
    "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})",
    "tanh": "std::tanh({0})",
    "asinh": "std::asinh({0})",
    "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})",
    "abs": "std::abs({0})",
    "floor": "std::floor({0})",
    "ceil": "std::ceil({0})",
    "erf": "std::erf({0})",
    "erfc": "std::erfc({0})",
    "lgamma": "std::lgamma({0})",
    "logistic": "((real)1 / ((real)1 + std::exp(-({0}))))",
    "square": "({0} * {0})",
    "not": "(!{0})",
    "is_finite": "((int)std::isfinite({0}))",
    "copy": "{0}",
    "copy_p": "{0}",
    "real": "{0}",
    "sign": "(({0}) != ({0}) ? ({0}) : (real)((({0}) > 0) - (({0}) < 0)))",
}

_BINARY = {
    "add": "({0} + {1})",
    "add_any": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "pow": "std::pow({0}, {1})",
    "atan2": "std::atan2({0}, {1})",
    "rem": "std::fmod({0}, {1})",
    "nextafter": "std::nextafter({0}, {1})",
    "max": "((({0}) > ({1}) || ({0}) != ({0})) ? ({0}) : ({1}))",
    "min": "((({0}) < ({1}) || ({0}) != ({0})) ? ({0}) : ({1}))",
    "lt": "((int)(({0}) < ({1})))",
    "le": "((int)(({0}) <= ({1})))",
    "gt": "((int)(({0}) > ({1})))",
    "ge": "((int)(({0}) >= ({1})))",
    "eq": "((int)(({0}) == ({1})))",
    "ne": "((int)(({0}) != ({1})))",
    "and": "({0} & {1})",
    "or": "({0} | {1})",
    "xor": "({0} ^ {1})",
}

_INLINE_KEYS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_INLINE = {"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
           "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin", "name"}
# Primitives applied entry by entry (same output shape as the broadcast inputs).
ELEMENTWISE = frozenset(_UNARY) | frozenset(_BINARY) | {
    "integer_pow", "convert_element_type", "reduce_precision", "select_n", "clamp", "round"}


class Scalarizer:
    """Evaluates a jaxpr element by element: every value is a numpy object array whose
    entries are one backend scalar each (a C++ expression here, a JAX array of one entry per
    trajectory in `gradsolve._lanes`). Structural primitives are resolved on those object
    arrays; subclasses say how elementwise ones, constants and static indices are made."""

    # --- backend hooks -------------------------------------------------------------------
    def constant(self, value, dtype) -> np.ndarray:
        raise NotImplementedError

    def elementwise(self, eqn, ins: list[np.ndarray]) -> list[np.ndarray]:
        """``eqn`` (an elementwise primitive) applied entry by entry."""
        raise NotImplementedError

    def binop(self, name: str, a, b, dtype):
        """One backend scalar: ``add``, ``mul``, ``max`` or ``min`` of two (reductions)."""
        raise NotImplementedError

    def static_int(self, entry) -> int:
        """The value of an integer entry known at translation time, else `Unsupported`."""
        raise NotImplementedError

    # --- jaxpr evaluation -------------------------------------------------------------
    def run(self, closed, args: list[np.ndarray]) -> list[np.ndarray]:
        jaxpr = closed.jaxpr
        env: dict = {}
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
            raise Unsupported("large constant")
        return arr

    def _read(self, env, v) -> np.ndarray:
        if isinstance(v, Literal):
            return self.constant(v.val, v.aval.dtype)
        return env[v]

    def _eval(self, jaxpr, env) -> list[np.ndarray]:
        for eqn in jaxpr.eqns:
            ins = [self._read(env, v) for v in eqn.invars]
            outs = self.primitive(eqn, ins)
            for var, val in zip(eqn.outvars, outs):
                shape = tuple(var.aval.shape)
                if int(np.prod(shape)) > _MAX_ELEMENTS:
                    raise Unsupported("large intermediate")
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
            raise Unsupported(name)
        if name in ELEMENTWISE:
            return self.elementwise(eqn, ins)
        rule = getattr(self, "_p_" + name, None)
        if rule is None:
            raise Unsupported(name)
        return rule(ins, p, out_avals)

    # structural primitives: resolved at translation time
    def _p_broadcast_in_dim(self, ins, p, avals):
        shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
        x = ins[0]
        expanded = [1] * len(shape)
        for i, dmn in enumerate(dims):
            expanded[dmn] = x.shape[i]
        return [np.broadcast_to(x.reshape(expanded), shape).copy()]

    def _p_reshape(self, ins, p, avals):
        return [ins[0].reshape(tuple(avals[0].shape))]

    _p_squeeze = _p_reshape
    _p_expand_dims = _p_reshape

    def _p_slice(self, ins, p, avals):
        strides = p.get("strides") or (1,) * len(p["start_indices"])
        sl = tuple(slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"], strides))
        return [ins[0][sl]]

    def _static_ints(self, arrays) -> list[int]:
        return [self.static_int(np.asarray(a).reshape(-1)[0]) for a in arrays]

    def _p_dynamic_slice(self, ins, p, avals):
        x, *idx = ins
        starts = self._static_ints(idx)
        sizes = p["slice_sizes"]
        starts = [min(max(s, 0), dim - sz) for s, dim, sz in zip(starts, x.shape, sizes)]
        return [x[tuple(slice(s, s + sz) for s, sz in zip(starts, sizes))]]

    def _p_dynamic_update_slice(self, ins, p, avals):
        x, upd, *idx = ins
        starts = self._static_ints(idx)
        starts = [min(max(s, 0), dim - sz) for s, dim, sz in zip(starts, x.shape, upd.shape)]
        out = x.copy()
        out[tuple(slice(s, s + sz) for s, sz in zip(starts, upd.shape))] = upd
        return [out]

    def _p_concatenate(self, ins, p, avals):
        return [np.concatenate(ins, axis=p["dimension"])]

    def _p_stack(self, ins, p, avals):
        return [np.stack(ins, axis=p.get("axis", 0))]

    def _p_unstack(self, ins, p, avals):
        axis = p.get("axis", 0)
        return [np.take(ins[0], i, axis=axis) for i in range(ins[0].shape[axis])]

    def _p_split(self, ins, p, avals):
        sizes, axis = p["sizes"], p["axis"]
        return list(np.split(ins[0], np.cumsum(sizes)[:-1], axis=axis))

    def _p_transpose(self, ins, p, avals):
        return [np.transpose(ins[0], p["permutation"])]

    def _p_rev(self, ins, p, avals):
        return [np.flip(ins[0], axis=tuple(p["dimensions"]))]

    def _p_pad(self, ins, p, avals):
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

    def _p_iota(self, ins, p, avals):
        shape, dim = tuple(p["shape"]), p["dimension"]
        ar = np.arange(shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(shape))])
        return [self.constant(np.broadcast_to(ar, shape), avals[0].dtype)]

    def _reduce(self, ins, p, avals, op):
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

    def _p_reduce_sum(self, ins, p, avals):
        return self._reduce(ins, p, avals, "add")

    def _p_reduce_prod(self, ins, p, avals):
        return self._reduce(ins, p, avals, "mul")

    def _p_reduce_max(self, ins, p, avals):
        return self._reduce(ins, p, avals, "max")

    def _p_reduce_min(self, ins, p, avals):
        return self._reduce(ins, p, avals, "min")

    def _p_dot_general(self, ins, p, avals):
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


class Emitter(Scalarizer):
    """Accumulates C++ statements; values are numpy object arrays of C++ expressions."""

    def __init__(self):
        self.lines: list[str] = []
        self._count = 0

    def fresh(self, ctype: str, expr: str) -> str:
        name = f"v{self._count}"
        self._count += 1
        self.lines.append(f"const {ctype} {name} = {expr};")
        return name

    def constant(self, value, dtype) -> np.ndarray:
        arr = self._concrete(value)
        out = np.empty(arr.shape, dtype=object)
        for idx in np.ndindex(arr.shape):
            out[idx] = _literal(arr[idx], dtype)
        return out

    def static_int(self, entry) -> int:
        s = str(entry).replace("(real)", "").replace("LL", "")
        try:
            return int(float(s))
        except ValueError as e:
            raise Unsupported("traced index") from e

    def binop(self, name, a, b, dtype):
        return self.fresh(_ctype(dtype), _BINARY[name].format(a, b))

    def elementwise(self, eqn, ins):
        name = eqn.primitive.name
        out_avals = [v.aval for v in eqn.outvars]
        if name in _UNARY:
            ct = _ctype(out_avals[0].dtype)
            fmt = "(~{0})" if name == "not" and ct != "int" else _UNARY[name]  # ints: bitwise
            return [self._map(ct, fmt, ins)]
        if name in _BINARY:
            ct = _ctype(out_avals[0].dtype)
            fmt = _BINARY[name]
            if name in ("and", "or", "xor") and ct == "int":  # booleans: logical
                fmt = fmt.replace("&", "&&").replace("|", "||").replace("^", "!=")
            return [self._map(ct, fmt, ins, shape=out_avals[0].shape)]
        return getattr(self, "_p_" + name)(ins, eqn.params, out_avals)

    def _map(self, ctype, fmt, ins, shape=None):
        shape = tuple(ins[0].shape) if shape is None else tuple(shape)
        ins = [np.broadcast_to(a, shape) for a in ins]
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = self.fresh(ctype, fmt.format(*[a[idx] for a in ins]))
        return out

    def _p_integer_pow(self, ins, p, avals):
        y = int(p["y"])
        out = np.empty(ins[0].shape, dtype=object)
        for idx in np.ndindex(ins[0].shape):
            x = ins[0][idx]
            if y == 0:
                out[idx] = "(real)1"
                continue
            acc, base, e = None, x, abs(y)
            while e:  # square-and-multiply, as XLA lowers integer_pow
                if e & 1:
                    acc = base if acc is None else self.fresh("real", f"({acc} * {base})")
                e >>= 1
                if e:
                    base = self.fresh("real", f"({base} * {base})")
            out[idx] = acc if y > 0 else self.fresh("real", f"((real)1 / {acc})")
        return [out]

    def _p_convert_element_type(self, ins, p, avals):
        ct = _ctype(avals[0].dtype)
        if np.dtype(avals[0].dtype) == np.bool_:  # nonzero is true, as in XLA
            return [self._map(ct, "((int)(({0}) != 0))", ins)]
        return [self._map(ct, f"(({ct})" + "{0})", ins)]

    def _p_reduce_precision(self, ins, p, avals):
        return [ins[0]]

    def _p_select_n(self, ins, p, avals):
        pred, *cases = ins
        shape = tuple(avals[0].shape)
        pred = np.broadcast_to(pred, shape)
        cases = [np.broadcast_to(c, shape) for c in cases]
        ct = _ctype(avals[0].dtype)
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            expr = cases[-1][idx]
            for k in range(len(cases) - 2, -1, -1):
                expr = f"(({pred[idx]}) == {k} ? ({cases[k][idx]}) : ({expr}))"
            out[idx] = self.fresh(ct, expr)
        return [out]

    def _p_clamp(self, ins, p, avals):
        lo, x, hi = (np.broadcast_to(a, avals[0].shape) for a in ins)
        ct = _ctype(avals[0].dtype)
        out = np.empty(avals[0].shape, dtype=object)
        for idx in np.ndindex(avals[0].shape):
            m = f"(({x[idx]}) < ({lo[idx]}) ? ({lo[idx]}) : ({x[idx]}))"
            out[idx] = self.fresh(ct, f"(({m}) > ({hi[idx]}) ? ({hi[idx]}) : ({m}))")
        return [out]

    def _p_round(self, ins, p, avals):
        method = int(p.get("rounding_method", 0))
        fmt = "std::round({0})" if method == 0 else "std::nearbyint({0})"
        return [self._map("real", fmt, ins)]


def translate(fn, example_args, input_exprs):
    """Trace ``fn(*example_args)`` and emit C++ computing its outputs.

    Args:
        fn: a JAX function of arrays (one trajectory).
        example_args: arrays (or ShapeDtypeStructs) fixing shapes and dtypes.
        input_exprs: per argument, a numpy object array (same shape) of C++ expressions.

    Returns:
        ``(lines, outputs)``: C++ statements and, per output, a flat list of expressions.
    """
    try:
        closed = jax.make_jaxpr(fn)(*example_args)
    except Exception as e:  # noqa: BLE001 - anything untraceable falls back
        raise Unsupported(f"tracing failed: {e}") from e
    em = Emitter()
    outs = em.run(closed, list(input_exprs))
    return em.lines, [list(np.asarray(o, dtype=object).reshape(-1)) for o in outs]
