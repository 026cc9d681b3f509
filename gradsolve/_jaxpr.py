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

from collections.abc import Callable
from functools import partial
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
_INLINE = {"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
           "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin", "name"}
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


# Structural primitive name (``-`` written ``_``) -> its rule
# ``rule(scalarizer, ins, params, out_avals, in_avals) -> outputs``; the rules are in
# `gradsolve._jaxpr_rules`, which fills this table when it is imported (end of this module).
RULES: dict[str, Callable] = {}


def rule(*names: str):
    """Decorator: register a function as the structural rule of the primitives ``names``."""
    def register(fn):
        for name in names:
            RULES[name] = fn
        return fn
    return register


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
    recognised (operations on constants are folded, indices read, at translation time).

    The class is the evaluation loop and the operations rules build on (`apply`, `binop`,
    `select`, `pick`); the per-primitive structural rules are a table, `RULES`, filled by
    `gradsolve._jaxpr_rules`."""

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

    def pick(self, index, dtype, lo: int, hi: int, candidate, case_dtype):
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
        rule = RULES.get(name.replace("-", "_"))
        if rule is None:
            raise unsupported_primitive(name)
        return rule(self, ins, p, out_avals, [v.aval for v in eqn.invars])

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


# The structural rules import this module's names (RULES, rule, Unsupported, ...) and
# register themselves in RULES, so they are imported last.
from . import _jaxpr_rules  # noqa: E402, F401
