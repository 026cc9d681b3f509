"""Dense linear algebra for the translator, and a constant-folding C++ emitter: what a
Rosenbrock step's jaxpr needs on top of the vector field's.

A linearly implicit step (`gradsolve._solver.rosenbrock`) factorises ``W = I / gamma - h J``
with `jax.scipy.linalg.lu_factor` and solves with it (``lax.custom_linear_solve`` around
`jax.scipy.linalg.lu_solve`). Its jaxpr, and the jaxpr of its VJP, hold five primitives the
shared translator (`gradsolve._jaxpr`) has no rule for; `RosenbrockEmitter` handles them
entry by entry, through its own one-entry operation (`RosenbrockEmitter.entry`: constants
folded, else one C++ statement):

- ``lu``: LU with partial pivoting (the row of largest magnitude, the first on ties, as
  LAPACK's ``getrf``), right-looking, the multipliers by the pivot's reciprocal (as
  ``getf2``). Pivot rows are traced, so the row swaps are branchless: each candidate row
  is chosen with ``select_n``; a lane's whole factorisation stays straight-line code that
  vectorises across lanes.
- ``lu_pivots_to_permutation``: the swaps replayed on ``0..m-1`` the same way.
- ``triangular_solve``: forward or back substitution, every option of the primitive.
- ``custom_linear_solve``: its ``solve`` jaxpr (what the primitive's implementation runs).
- ``sort`` on integer keys (the inverse permutation of a transposed ``lu_solve``): an
  odd-even transposition network of compare-exchanges, stable.

`RosenbrockEmitter` also folds multiplications by 0 and 1 and additions of 0 with a
constant entry: the Jacobian ``jacobians`` builds is ``d + 1`` forward-mode passes in the
directions of a unit basis, and its VJP (second derivatives), written as JAX traces it,
multiplies by those constant zeros and ones; folding leaves the arithmetic that matters.
The folds are exact for finite values (``x * 0`` is 0 where XLA computes ``x * 0``, which
differs only for infinite or NaN ``x`` and in the sign of a zero). Equal expressions get
one name (the permutation every ``lu_solve`` rebuilds from the same pivots is emitted
once), and the code is written for GCC's vectoriser across lanes: a ``select_n`` of many
cases is a chain of two-way selects, one per statement, and truth values are 64 bits wide
(`RosenbrockEmitter.entry`).

Measured on Boehm's model (8 states, Rodas5P): 3,900 statements per lane and step forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .codegen import _BINARY, _UNARY, Emitter, _ctype
from ..._jaxpr import Unsupported, _equation

_BOOL = np.dtype(np.bool_)
# The primitives folded where one operand is a constant 0 or 1 (`RosenbrockEmitter._fold_entry`).
_LAX = ("mul", "add", "add_any", "sub", "div", "select_n")
# Elementwise primitives of constants evaluated with numpy: IEEE arithmetic, XLA's values.
_NUMPY = {"add": np.add, "add_any": np.add, "sub": np.subtract, "mul": np.multiply,
          "div": np.divide, "neg": np.negative, "abs": np.abs, "lt": np.less,
          "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
          "ne": np.not_equal, "select_n": lambda which, *cases: cases[int(which)]}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_COMPARISONS = tuple(_CMP)
_LAXFN = {"abs": lax.abs, "gt": lax.gt, "eq": lax.eq, "ne": lax.ne, "lt": lax.lt,
          "div": lax.div, "mul": lax.mul, "sub": lax.sub, "add": lax.add}


# Whole-array operations on constants evaluated with numpy (`RosenbrockEmitter._elementwise`).
_ARRAY_NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative,
                "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                "eq": np.equal, "ne": np.not_equal, "and": np.logical_and,
                "or": np.logical_or, "not": np.logical_not,
                "select_n": lambda which, *cases: np.choose(np.asarray(which, np.int64), cases),
                "convert_element_type": lambda x, dt: np.asarray(x).astype(dt)}


def _numpy_exact(name, values, out_dt) -> bool:
    """Whether numpy gives XLA's values for ``name`` of ``values``: integer and boolean
    operands (bitwise ``and``/``or``/``not`` of integers excepted), or floating-point
    arithmetic and comparisons; conversions between integers, booleans and floats of
    integers, not from floating point (XLA's rounding of out-of-range values differs)."""
    kinds = {np.asarray(v).dtype.kind for v in values}
    if name in ("and", "or", "not"):
        return kinds <= {"b"}
    if name == "convert_element_type":
        return kinds <= {"b", "i", "u"} or (kinds == {"f"} and out_dt.kind == "f")
    return kinds <= {"b", "i", "u", "f"}


def _is(sc, entry, value) -> bool:
    v = sc.constant_value(entry)
    return v is not None and not isinstance(v, np.bool_) and v == value


class RosenbrockEmitter(Emitter):
    """`Emitter` with the dense linear algebra of a Rosenbrock step and constant folding
    of trivial multiplications and additions (see the module notes)."""

    def __init__(self):
        super().__init__()
        self._seen: dict[tuple[str, str], str] = {}

    def fresh(self, ctype: str, expr: str) -> str:
        """A name for ``expr``, the one already given to the same expression if any (the
        emitted code is pure, each name assigned once: common subexpressions, e.g. the
        permutation each ``lu_solve`` rebuilds from the same pivots, are emitted once)."""
        key = (ctype, expr)
        name = self._seen.get(key)
        if name is None:
            name = self._seen[key] = super().fresh(ctype, expr)
        return name

    def _elementwise(self, eqn, ins):
        """As the translator's, but an operation on constants that numpy computes as XLA
        does (IEEE arithmetic, comparisons, selects, integer and boolean conversions) is
        evaluated with numpy: JAX compiled each distinct one (the index arithmetic of the
        Jacobian's gathers and scatters), seconds of a model's build."""
        name = eqn.primitive.name
        if name in _ARRAY_NUMPY:
            values = [self._values(a, v.aval.dtype) for a, v in zip(ins, eqn.invars)]
            out_dt = np.dtype(eqn.outvars[0].aval.dtype)
            if all(v is not None for v in values) and _numpy_exact(name, values, out_dt):
                with np.errstate(all="ignore"):
                    out = _ARRAY_NUMPY[name](*values, **({"dt": out_dt}
                                                        if name == "convert_element_type"
                                                        else {}))
                out = np.broadcast_to(np.asarray(out).astype(out_dt),
                                      eqn.outvars[0].aval.shape)
                return [self.constant(out, out_dt)]
        return super()._elementwise(eqn, ins)

    def primitive(self, eqn, ins):
        rule = _LINALG.get(eqn.primitive.name)
        if rule is not None:
            return rule(self, ins, eqn.params, [v.aval for v in eqn.outvars],
                        [v.aval for v in eqn.invars])
        return super().primitive(eqn, ins)

    def elementwise(self, eqn, ins):
        name = eqn.primitive.name
        aval = eqn.outvars[0].aval
        if name == "not" or not (name in _LAX or name in _UNARY or name in _BINARY):
            return super().elementwise(eqn, ins)
        shape = tuple(aval.shape)
        ins = [np.broadcast_to(a, shape) for a in ins]
        dts = [np.dtype(v.aval.dtype) for v in eqn.invars]
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = self.entry(name, dts, np.dtype(aval.dtype), [a[idx] for a in ins],
                                  eqn.primitive, eqn.params)
        return [out]

    def entry(self, name, dts, out_dt, args, prim=None, params=None):
        """One entry of the elementwise primitive ``name`` of entries ``args`` (of dtypes
        ``dts``): evaluated now if every operand is a constant (numpy for IEEE arithmetic
        and comparisons, which give XLA's values; JAX for the rest), folded where
        `_fold_entry` can, else a new C++ name."""
        values = [self.constant_value(x) for x in args]
        if all(v is not None for v in values):
            fn = _NUMPY.get(name)
            if fn is not None and (name != "div" or np.issubdtype(out_dt, np.floating)):
                with np.errstate(all="ignore"):
                    value = fn(*[np.asarray(v, dt) for v, dt in zip(values, dts)])
            else:
                if prim is None:
                    prim, params, _ = _equation(_LAXFN[name], tuple(((), dt) for dt in dts))
                with jax.ensure_compile_time_eval():
                    value = prim.bind(*map(jnp.asarray, values), **params)
            return self.constant(np.asarray(value), out_dt)[()]
        numeric = np.issubdtype(out_dt, np.floating) or np.issubdtype(out_dt, np.integer)
        ct = _ctype(out_dt)
        if name in _LAX and numeric:
            return self._fold_entry(name, args, ct, self.constant(np.zeros(()), out_dt)[()])
        if name in _UNARY:
            return self.fresh(ct, _UNARY[name].format(*args))
        if name == "select_n":
            return self._fold_entry(name, args, ct, None)
        if name in _COMPARISONS:
            # 64-bit truth values, the width of the doubles they select between: with
            # `int` ones GCC narrowed some to 1-byte booleans and then refused the lane loop
            # (a mask conversion it does not support; Boehm's 8 states).
            a, b = args
            return self.fresh("long long", f"((long long)(({a}) {_CMP[name]} ({b})))")
        return self.fresh(ct, _BINARY[name].format(*args))

    def _fold_entry(self, name, args, ct, zero):
        """One entry of ``name`` (`_LAX`) with some operand not a constant: ``x * 0`` is 0,
        ``x * 1``, ``x + 0``, ``x - 0``, ``x / 1`` are ``x``, ``0 - x`` and ``x * -1`` are
        ``-x``, ``0 / x`` is 0, a ``select_n`` on a constant (or between equal cases) is
        its case."""
        if name == "select_n":
            pred, *cases = args
            which = self.constant_value(pred)
            if which is not None:
                return cases[min(max(int(which), 0), len(cases) - 1)]
            if all(c == cases[0] for c in cases[1:]):
                return cases[0]
            # One two-way select per statement: a nested ?: chain is one join with as
            # many PHI arguments as cases, which GCC's if-conversion refuses past 4, and
            # then the whole lane loop is not vectorised.
            expr = cases[-1]
            for k in range(len(cases) - 2, -1, -1):
                expr = self.fresh(ct, f"(({pred}) == {k} ? ({cases[k]}) : ({expr}))")
            return expr
        a, b = args
        if name == "mul":
            if _is(self, a, 0) or _is(self, b, 0):
                return zero
            if _is(self, a, 1):
                return b
            if _is(self, b, 1):
                return a
            if _is(self, a, -1):
                return self.fresh(ct, f"(-{b})")
            if _is(self, b, -1):
                return self.fresh(ct, f"(-{a})")
        elif name in ("add", "add_any"):
            if _is(self, a, 0):
                return b
            if _is(self, b, 0):
                return a
        elif name == "sub":
            if _is(self, b, 0):
                return a
            if _is(self, a, 0):
                return self.fresh(ct, f"(-{b})")
        elif name == "div":
            if _is(self, a, 0):
                return zero
            if _is(self, b, 1):
                return a
        return self.fresh(ct, _BINARY[name].format(a, b))


# ---------------------------------------------------------------------- helpers


def _op(sc, name, dtypes, *xs):
    """One entry: the elementwise primitive ``name`` of entries ``xs`` (constants folded)."""
    out_dt = _BOOL if name in _COMPARISONS else np.dtype(dtypes[0])
    return sc.entry(name, [np.dtype(d) for d in dtypes], out_dt, list(xs))


def _sel(sc, pred, if_false, if_true, dt):
    """One entry: ``if_true`` where the boolean entry ``pred`` holds, else ``if_false``."""
    return sc.entry("select_n", [_BOOL, np.dtype(dt), np.dtype(dt)], np.dtype(dt),
                    [pred, if_false, if_true])


def _batched(fn, arrays, core_ndims):
    """``fn(*cores)`` for every leading (batch) index of ``arrays``, whose last
    ``core_ndims[i]`` axes are the core; outputs stacked back (a list of arrays)."""
    batch = arrays[0].shape[:arrays[0].ndim - core_ndims[0]]
    results = {}
    for bi in np.ndindex(batch):
        results[bi] = fn(*[a[bi] for a in arrays])
    outs = []
    for j in range(len(results[next(iter(results))]) if results else 0):
        first = results[next(iter(results))][j]
        o = np.empty(batch + first.shape, dtype=object)
        for bi, res in results.items():
            o[bi] = res[j]
        outs.append(o)
    return outs


# ---------------------------------------------------------------------- rules


def _lu(sc, ins, p, avals, in_avals):
    dt = np.dtype(in_avals[0].dtype)
    if not np.issubdtype(dt, np.floating):
        raise Unsupported(f"an LU factorisation of {dt} values")
    idt = np.dtype(avals[1].dtype)
    pdt = np.dtype(avals[2].dtype)

    def one(a):
        A = np.array(a, dtype=object)
        m, n = A.shape
        perm = [sc.constant(i, pdt)[()] for i in range(m)]
        pivots = []
        for k in range(min(m, n)):
            # The pivot: the first row of largest magnitude in column k, at or below k.
            best = _op(sc, "abs", [dt], A[k, k])
            pk = sc.constant(k, idt)[()]
            for i in range(k + 1, m):
                mag = _op(sc, "abs", [dt], A[i, k])
                better = _op(sc, "gt", [dt, dt], mag, best)
                best = _sel(sc, better, best, mag, dt)
                pk = _sel(sc, better, pk, sc.constant(i, idt)[()], idt)
            pivots.append(pk)
            if sc.constant_value(pk) is None or int(sc.constant_value(pk)) != k:
                hits = {i: _op(sc, "eq", [idt, idt], pk, sc.constant(i, idt)[()])
                        for i in range(k + 1, m)}
                for c in range(n):  # the whole rows, multipliers included (getrf)
                    old = A[k, c]
                    new = old
                    for i, hit in hits.items():
                        new = _sel(sc, hit, new, A[i, c], dt)
                        A[i, c] = _sel(sc, hit, A[i, c], old, dt)
                    A[k, c] = new
                old = perm[k]
                new = old
                for i, hit in hits.items():
                    new = _sel(sc, hit, new, perm[i], pdt)
                    perm[i] = _sel(sc, hit, perm[i], old, pdt)
                perm[k] = new
            # The multipliers, by the pivot's reciprocal; a zero pivot leaves the column.
            x = A[k, k]
            if k + 1 < m:
                nz = _op(sc, "ne", [dt, dt], x, sc.constant(0, dt)[()])
                safe = _sel(sc, nz, sc.constant(1, dt)[()], x, dt)
                recip = _op(sc, "div", [dt, dt], sc.constant(1, dt)[()], safe)
                for i in range(k + 1, m):
                    A[i, k] = _sel(sc, nz, A[i, k], _op(sc, "mul", [dt, dt], A[i, k], recip),
                                   dt)
            # The trailing update.
            for i in range(k + 1, m):
                for c in range(k + 1, n):
                    A[i, c] = _op(sc, "sub", [dt, dt], A[i, c],
                                  _op(sc, "mul", [dt, dt], A[i, k], A[k, c]))
        piv = np.empty(len(pivots), dtype=object)
        piv[:] = pivots
        pm = np.empty(m, dtype=object)
        pm[:] = perm
        return A, piv, pm

    return _batched(one, [ins[0]], [2])


def _lu_pivots_to_permutation(sc, ins, p, avals, in_avals):
    size = int(p["permutation_size"])
    idt, pdt = np.dtype(in_avals[0].dtype), np.dtype(avals[0].dtype)

    def one(piv):
        perm = [sc.constant(i, pdt)[()] for i in range(size)]
        for i in range(piv.shape[0]):
            j = piv[i]
            jv = sc.constant_value(j)
            if jv is not None:
                jv = int(jv)
                if 0 <= jv < size:
                    perm[i], perm[jv] = perm[jv], perm[i]
                continue
            x = perm[i]
            y = x
            hits = [_op(sc, "eq", [idt, idt], j, sc.constant(c, idt)[()]) for c in range(size)]
            for c in range(size):
                y = _sel(sc, hits[c], y, perm[c], pdt)
            perm[i] = y
            for c in range(size):
                perm[c] = _sel(sc, hits[c], perm[c], x, pdt)
        out = np.empty(size, dtype=object)
        out[:] = perm
        return (out,)

    return _batched(one, [ins[0]], [1])


def _triangular_solve(sc, ins, p, avals, in_avals):
    dt = np.dtype(avals[0].dtype)
    if not np.issubdtype(dt, np.floating):
        raise Unsupported(f"a triangular solve of {dt} values")
    left, lower = bool(p["left_side"]), bool(p["lower"])
    trans, unit = bool(p["transpose_a"]), bool(p["unit_diagonal"])

    def one(a, b):
        # op(A) X = B (left) or X op(A) = B (right, solved as op(A)^T X^T = B^T).
        M = a.T if trans else a
        is_lower = lower != trans
        if not left:
            M, is_lower, b = M.T, not is_lower, b.T
        m = M.shape[0]
        order = range(m) if is_lower else range(m - 1, -1, -1)
        X = np.empty(b.shape, dtype=object)
        for col in range(b.shape[1]):
            done = []
            for i in order:
                acc = b[i, col]
                for j in done:
                    acc = _op(sc, "sub", [dt, dt], acc,
                              _op(sc, "mul", [dt, dt], M[i, j], X[j, col]))
                X[i, col] = acc if unit else _op(sc, "div", [dt, dt], acc, M[i, i])
                done.append(i)
        return (X if left else X.T,)

    return _batched(one, [ins[0], ins[1]], [2, 2])


def _custom_linear_solve(sc, ins, p, avals, in_avals):
    lengths = list(p["const_lengths"])
    jaxprs = p["jaxprs"]
    start = sum(lengths[:2])  # matvec, vecmat consts come first
    solve_consts = ins[start:start + lengths[2]]
    b = ins[sum(lengths):]
    return sc.run(jaxprs.solve, [*solve_consts, *b])


def _sort(sc, ins, p, avals, in_avals):
    if int(p["num_keys"]) != 1:
        raise Unsupported("a sort on several keys")
    kdt = np.dtype(in_avals[0].dtype)
    if not (np.issubdtype(kdt, np.integer) or kdt == _BOOL):
        raise Unsupported("`sort` of floating-point values (jnp.sort, jnp.median, ...)")
    dim = int(p["dimension"])
    arrays = [np.moveaxis(np.array(a, dtype=object), dim, -1).copy() for a in ins]
    dts = [np.dtype(a.dtype) for a in in_avals]
    n = arrays[0].shape[-1]
    for rest in np.ndindex(arrays[0].shape[:-1]):
        for rnd in range(n):
            for i in range(rnd % 2, n - 1, 2):
                # stable: exchange only where the later key is strictly smaller
                swap = _op(sc, "lt", [kdt, kdt], arrays[0][rest + (i + 1,)],
                           arrays[0][rest + (i,)])
                for arr, dt in zip(arrays, dts):
                    lo, hi = arr[rest + (i,)], arr[rest + (i + 1,)]
                    arr[rest + (i,)] = _sel(sc, swap, lo, hi, dt)
                    arr[rest + (i + 1,)] = _sel(sc, swap, hi, lo, dt)
    return [np.moveaxis(a, -1, dim) for a in arrays]


_LINALG = {
    "lu": _lu,
    "lu_pivots_to_permutation": _lu_pivots_to_permutation,
    "triangular_solve": _triangular_solve,
    "custom_linear_solve": _custom_linear_solve,
    "sort": _sort,
}
