"""Translate the jaxpr of a small vector field into straight-line C++ for one trajectory.

The compiled kernel (`gradsolve.drivers.kernel`) runs the same Runge–Kutta chain as the XLA
replay, but as one loop over blocks of trajectories in which every stage of every step stays
in registers. The vector field's jaxpr (and the jaxpr of its VJP) is evaluated entry by
entry by the shared translator (`gradsolve._jaxpr.Scalarizer`); `Emitter` is its C++
backend: each entry is a C++ expression, each elementwise primitive a C++ operator or
``std::`` call.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ..._jaxpr import Scalarizer, Unsupported

def _ctype(dtype) -> str:
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return "real"
    if dtype == np.bool_:
        return "int"
    if np.issubdtype(dtype, np.integer):
        return "long long"
    raise Unsupported(f"{dtype} values")


class CppLiteral(str):
    """A C++ literal that keeps the numpy value it spells (``value``): the translator folds
    operations on constants and reads static indices from it."""

    value: np.generic


def _literal(value, dtype) -> CppLiteral:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        text = "1" if bool(value) else "0"
    elif np.issubdtype(dtype, np.integer):
        text = f"{int(value)}LL"
    else:
        v = float(value)
        if math.isnan(v):
            text = "(real)NAN"
        elif math.isinf(v):
            text = "(real)INFINITY" if v > 0 else "(-(real)INFINITY)"
        else:
            text = f"(real){v!r}"
    lit = CppLiteral(text)
    lit.value = np.asarray(value, dtype)[()]
    return lit


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
    "digamma": "gs_digamma({0})",
    "erf_inv": "gs_erfinv({0})",
    "stop_gradient": "{0}",  # the value; the kernel's VJP is JAX's VJP of the field, translated
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
    "lt_to": "((int)(gs_total_key({0}) < gs_total_key({1})))",
    "le_to": "((int)(gs_total_key({0}) <= gs_total_key({1})))",
    "eq_to": "((int)(gs_total_key({0}) == gs_total_key({1})))",
    "and": "({0} & {1})",
    "or": "({0} | {1})",
    "xor": "({0} ^ {1})",
}


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

    def constant_value(self, entry):
        return entry.value if isinstance(entry, CppLiteral) else None

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


def translate(fn, example_args, input_exprs, emitter=Emitter):
    """Trace ``fn(*example_args)`` and emit C++ computing its outputs.

    Args:
        fn: a JAX function of arrays (one trajectory).
        example_args: arrays (or ShapeDtypeStructs) fixing shapes and dtypes.
        input_exprs: per argument, a numpy object array (same shape) of C++ expressions.
        emitter: the `Emitter` class (`gradsolve.drivers.kernel.linalg.RosenbrockEmitter`
            for a Rosenbrock step: its linear algebra, constants folded).

    Returns:
        ``(lines, outputs)``: C++ statements and, per output, a flat list of expressions.
    """
    try:
        closed = jax.make_jaxpr(fn)(*example_args)
    except Exception as e:  # noqa: BLE001 - anything untraceable falls back
        raise Unsupported(f"tracing failed: {e}") from e
    em = emitter()
    outs = em.run(closed, list(input_exprs))
    return em.lines, [list(np.asarray(o, dtype=object).reshape(-1)) for o in outs]
