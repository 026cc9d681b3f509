"""Evaluate the jaxpr of a small vector field element by element (shared translator).

Both fast drivers see a user's vector field ``f(t, y, params)`` as straight-line scalar
code: every array element of every jaxpr variable becomes one backend scalar, structural
primitives (slice, stack, pad, broadcast, transpose, dot_general, ...) are resolved at
translation time on numpy object arrays of those scalars, and elementwise primitives are
left to a backend. The compiled CPU kernel's backend emits C++ expressions
(`gradsolve.drivers.kernel.codegen.Emitter`); the lanes replay's evaluates each entry as an
``(n,)`` JAX array over the ensemble (`gradsolve.drivers.lanes`).

Only primitives with an exact scalar meaning are supported; anything else (loops, gathers
with traced indices, complex numbers, ...) raises `Unsupported`, and the caller uses a
driver that does not translate. Vector fields of the systems gradsolve targets (a few to a
few dozen states) are small enough that full unrolling is the fast choice.
"""

from __future__ import annotations


import numpy as np

try:  # jax >= 0.4.36
    from jax.extend.core import Literal
except ImportError:  # pragma: no cover
    from jax.core import Literal

class Unsupported(Exception):
    """The vector field uses something the kernel translator does not handle."""


_MAX_ELEMENTS = 4096  # per variable: larger arrays are not "small systems"


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
    "round",
})


class Scalarizer:
    """Evaluates a jaxpr element by element: every value is a numpy object array whose
    entries are one backend scalar each (a C++ expression here, a JAX array of one entry per
    trajectory in `gradsolve.drivers.lanes`). Structural primitives are resolved on those object
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
