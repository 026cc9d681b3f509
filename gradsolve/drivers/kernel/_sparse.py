"""A sparse elimination for the Rosenbrock kernel's ``W = ALPHA I - BETA J`` (``I / gamma -
h J`` for Rodas5P): a fill-reducing order and the symbolic LU factorisation of ``W``'s
pattern, computed once at build as flat index tables that the C++ template
(``cc/sparse_lu.h``) loops over, and the rule choosing it over the dense LU.

- `choose`: what `gradsolve.drivers.kernel.rosenbrock_source.choose_elimination` asks
  for, given the generated Model's structural nonzeros of ``J``: the policy's C++ type,
  its code and the reason, or None (dense).
- `symbolic`: ``W``'s pattern (the diagonal always in) in a fill-reducing order, the
  fill of an LU factorisation without pivoting in that order, and its updates. The order
  is the one of least fill among the natural order, reverse Cuthill–McKee
  (`scipy.sparse.csgraph.reverse_cuthill_mckee`) and a minimum-degree order on the
  symmetrised pattern (`_minimum_degree`), all three computed (0.01 s at 34 states,
  0.4 s at 504). Entries of ``L + U`` (natural / RCM / minimum degree) on the
  collection: Boehm (8 states) 38 / 25 / 24, Fujita (10) 37 / 29 / 31, Zheng (15)
  103 / 97 / 83, Bachmann (25) 130 / 121 / 112, Isensee (32) 257 / 164 / 127, Laske (34)
  314 / 300 / 185, Chen (504) 104,415 / 33,387 / 7,738.
- `SparseLU.use_sparse`: the measured rule (see `SparseLU.SPARSE_WORK_RATIO`).
- `jacobian_pattern`: which entries of ``df/dy`` can be nonzero, from the vector field's
  jaxpr (the shared translator, `gradsolve._jaxpr.Scalarizer`, run on dependence sets
  instead of values): a state reaches an output through the arithmetic, never through a
  comparison, an integer, the predicate of a ``select_n`` or a ``stop_gradient`` (JAX's
  tangents do not either), and a product with a constant zero is zero. ``jax.jacfwd`` at
  points would miss entries that vanish there. (3 s for Chen's 504 states.)
- `column_groups`: columns that one forward-mode pass can share, for Jacobians too large
  to form densely.

Pivots are not exchanged: the order is fixed at build. ``cc/sparse_lu.h`` refuses a
pivot whose elimination would grow W's entries past a bound, and a block with such a lane
is factored by the dense LU with partial pivoting instead (up to 64 states), or the lane
is marked failed (its step's results NaN): never a silently wrong solution.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from ..._jaxpr import Scalarizer, Unsupported


# ---------------------------------------------------------------------- the pattern


class _Const:
    """A constant entry (its numpy value), for the dependence evaluator."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Dep:
    """A non-constant entry: the states it depends on, as the bits of ``mask``."""

    __slots__ = ("mask",)

    def __init__(self, mask: int):
        self.mask = mask


_NO_TANGENT = frozenset({"stop_gradient", "floor", "ceil", "round", "sign", "is_finite",
                         "lt", "le", "gt", "ge", "eq", "ne", "lt_to", "le_to", "eq_to",
                         "and", "or", "xor", "not"})


def _mask(entry) -> int:
    return entry.mask if isinstance(entry, _Dep) else 0


class _Dependence(Scalarizer):
    """`Scalarizer` whose entries are `_Const` (folded at translation time, as the C++
    emitter folds them) or `_Dep` (the set of states an entry's tangent can depend on)."""

    def constant(self, value, dtype) -> np.ndarray:
        arr = self._concrete(value)
        out = np.empty(arr.shape, dtype=object)
        for idx in np.ndindex(arr.shape):
            out[idx] = _Const(np.asarray(arr[idx], dtype)[()])
        return out

    def constant_value(self, entry):
        return entry.value if isinstance(entry, _Const) else None

    def elementwise(self, eqn, ins):
        name = eqn.primitive.name
        aval = eqn.outvars[0].aval
        shape = tuple(aval.shape)
        ins = [np.broadcast_to(a, shape) for a in ins]
        out = np.empty(shape, dtype=object)
        real = np.issubdtype(np.dtype(aval.dtype), np.floating)
        for idx in np.ndindex(shape):
            args = [a[idx] for a in ins]
            if not real or name in _NO_TANGENT:
                mask = 0  # no tangent: integers, truth values, piecewise constants
            elif name == "select_n":
                mask = 0
                for c in args[1:]:
                    mask |= _mask(c)
            elif name == "mul" and any(isinstance(a, _Const) and a.value == 0 for a in args):
                out[idx] = _Const(np.zeros((), aval.dtype)[()])
                continue
            else:
                mask = 0
                for a in args:
                    mask |= _mask(a)
            out[idx] = _Dep(mask)
        return [out]


def jacobian_pattern(f_flat, d: int, p_size: int, dtype=np.float64) -> np.ndarray:
    """The structural pattern of ``df/dy`` of ``f_flat(t, y (d,), p (p_size,)) -> (d,)``:
    a ``(d, d)`` boolean array, ``[i, j]`` true where output ``i`` can depend on state
    ``j`` through differentiable arithmetic (see the module notes). Raises
    `gradsolve._jaxpr.Unsupported` where the field does not translate (the kernel does not
    apply there either)."""
    scalar = jax.ShapeDtypeStruct((), dtype)
    ex = (scalar, jax.ShapeDtypeStruct((d,), dtype), jax.ShapeDtypeStruct((p_size,), dtype))
    try:
        closed = jax.make_jaxpr(lambda t, y, p: jax.numpy.asarray(f_flat(t, y, p), dtype))(*ex)
    except Exception as e:  # noqa: BLE001 - untraceable: no kernel
        raise Unsupported(f"tracing failed: {e}") from e
    sc = _Dependence()
    t = np.empty((), dtype=object)
    t[()] = _Dep(0)
    y = np.empty((d,), dtype=object)
    for r in range(d):
        y[r] = _Dep(1 << r)
    p = np.empty((p_size,), dtype=object)
    for r in range(p_size):
        p[r] = _Dep(0)
    (out,) = sc.run(closed, [t, y, p])
    out = np.asarray(out, dtype=object).reshape(-1)
    pattern = np.zeros((d, d), dtype=bool)
    for i, entry in enumerate(out):
        m = _mask(entry)
        j = 0
        while m:
            if m & 1:
                pattern[i, j] = True
            m >>= 1
            j += 1
    return pattern


# ---------------------------------------------------------------------- orderings


def _fill(pattern: np.ndarray) -> np.ndarray:
    """The pattern of ``L + U`` of an LU factorisation without pivoting of a matrix of
    ``pattern`` (square, boolean, diagonal set): symbolic Gaussian elimination."""
    f = pattern.copy()
    n = f.shape[0]
    for k in range(n - 1):
        rows = np.flatnonzero(f[k + 1:, k]) + k + 1
        if rows.size:
            cols = np.flatnonzero(f[k, k + 1:]) + k + 1
            if cols.size:
                f[np.ix_(rows, cols)] = True
    return f


def _minimum_degree(sym: np.ndarray) -> np.ndarray:
    """A minimum-degree order of the symmetric boolean pattern ``sym``: repeatedly
    eliminate a vertex of least degree in the elimination graph (ties: the lowest index),
    joining its neighbours into a clique. Explicit graph, ``O(n * degree**2)``: for the
    few hundred states of these models, not the quotient graph of AMD."""
    n = sym.shape[0]
    adj = [set(np.flatnonzero(sym[i])) - {i} for i in range(n)]
    alive = np.ones(n, dtype=bool)
    order = []
    for _ in range(n):
        deg = [(len(adj[i]), i) for i in range(n) if alive[i]]
        _, v = min(deg)
        order.append(v)
        alive[v] = False
        nb = adj[v]
        for a in nb:
            adj[a].discard(v)
            adj[a] |= nb - {a}
        adj[v] = set()
    return np.asarray(order, dtype=np.int64)


def _orders(pattern: np.ndarray) -> dict[str, np.ndarray]:
    """The candidate orders of `symbolic`, by name."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    n = pattern.shape[0]
    sym = pattern | pattern.T
    rcm = np.asarray(reverse_cuthill_mckee(csr_matrix(sym.astype(np.int8)),
                                           symmetric_mode=True), dtype=np.int64)
    return {"natural": np.arange(n), "rcm": rcm, "mindegree": _minimum_degree(sym)}


# ---------------------------------------------------------------------- symbolic LU


@dataclass(frozen=True)
class SparseLU:
    """The symbolic LU factorisation of ``W`` for the C++ template (``cc/sparse_lu.h``).

    Indices run over the permuted matrix ``W[order][:, order]``: position ``k`` holds state
    ``order[k]``. Its filled pattern's entries are numbered row by row (``slot``); the
    numeric factorisation overwrites them in place (L's multipliers below the diagonal,
    U on and above).

    Attributes (integer arrays):
        n: states. nnz: entries of the filled pattern (``L + U``).
        order: ``(n,)``, the fill-reducing order (state at each position).
        pattern: ``(n, n)`` boolean, ``df/dy``'s structural pattern, original indices.
        entry_rows, entry_cols, entry_slot: ``(m,)``, the pattern's ``m`` nonzeros of
            ``df/dy`` row by row (original indices) and the slot each one fills.
        diag: ``(n,)``, the slot of pivot ``k``.
        lptr, lslot, lrow: L column by column: ``lslot[lptr[k]:lptr[k+1]]`` are the
            slots of column ``k`` below the diagonal, ``lrow`` their rows.
        uptr, uslot, ucol: U row by row, right of the diagonal, the same way.
        tptr, target: the updates: for L entry ``e`` (of column ``k``, row ``i``) and the
            ``m``-th entry of U's row ``k`` (column ``j``), ``target[tptr[e] + m]`` is the
            slot of ``(i, j)``: ``LU[target] -= LU[lslot[e]] * LU[uslot[uptr[k] + m]]``.
        slot: ``(n, n)``, the slot of each entry of the permuted filled pattern, -1 off it.
        order_name: which candidate order this is; fills: every candidate's ``nnz``.
    """

    n: int
    nnz: int
    order: np.ndarray
    pattern: np.ndarray
    entry_rows: np.ndarray
    entry_cols: np.ndarray
    entry_slot: np.ndarray
    diag: np.ndarray
    lptr: np.ndarray
    lslot: np.ndarray
    lrow: np.ndarray
    uptr: np.ndarray
    uslot: np.ndarray
    ucol: np.ndarray
    tptr: np.ndarray
    target: np.ndarray
    slot: np.ndarray
    order_name: str
    fills: dict

    @property
    def updates(self) -> int:
        """Multiply-adds of one numeric factorisation (the dense one: ``(n**3 - n) / 3``)."""
        return int(self.target.size)

    @property
    def solve_ops(self) -> int:
        """Multiply-adds of one solve (the dense one: ``n**2 - n``)."""
        return int(self.lslot.size + self.uslot.size)

    # Measured (g++ 12, the kernel's flags, 8 lanes, float64, the shared 2-core x86 VM;
    # tests/test_kernel_sparse.py's harness, a factorisation and two solves per lane):
    # the sparse loops cost 1.5-3 ns per multiply-add of ``updates + 2 solve_ops`` (indexed
    # loads and stores), the dense LU with partial pivoting 1.3-2.4 ns per multiply-add of
    # ``(n**3 - n) / 3 + 2 (n**2 - n)``. Random patterns, sparse work / dense work -> the
    # sparse speed-up: 10 states 0.25 -> 1.7x, 0.58 -> 1.10x; 20: 0.04 -> 12x, 0.56 ->
    # 1.43x, 0.69 -> 1.29x; 34: 0.66 -> 1.11x, 0.84 -> 0.96x; 40: 0.94 -> 0.86x; 60: 0.16
    # -> 9.5x, 0.60 -> 1.23x, 0.77 -> 1.07x; 16: 0.88 -> 0.71x. The crossing is near 0.8.
    SPARSE_WORK_RATIO = 0.75

    def use_sparse(self) -> bool:
        """Whether the sparse elimination is expected to be faster than the dense LU with
        partial pivoting (see `SPARSE_WORK_RATIO`)."""
        n = self.n
        dense = (n ** 3 - n) / 3 + 2 * (n * n - n)
        return self.updates + 2 * self.solve_ops < self.SPARSE_WORK_RATIO * dense

    def slots(self, rows, cols) -> np.ndarray:
        """The slot of each entry ``(rows[k], cols[k])`` of ``W`` (original state indices),
        e.g. the Jacobian's nonzeros in the generated Model's order; each must be in
        `pattern` or on the diagonal."""
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        inside = self.pattern[rows, cols] | (rows == cols)
        if not inside.all():
            k = int(np.flatnonzero(~inside)[0])
            raise ValueError(f"entry ({rows[k]}, {cols[k]}) of the Jacobian is outside the "
                             "structural pattern the elimination was built for")
        inv = np.empty(self.n, dtype=np.int64)
        inv[self.order] = np.arange(self.n)
        return self.slot[inv[rows], inv[cols]]

    def cpp_struct(self, name: str, rows=None, cols=None) -> str:
        """C++ text of a struct ``name`` holding the tables (``cc/sparse_lu.h``), ``JSLOT``
        for the Jacobian's nonzeros ``(rows, cols)`` in the generated Model's order
        (default: `pattern`'s, row by row)."""
        rows = self.entry_rows if rows is None else rows
        cols = self.entry_cols if cols is None else cols
        tables = {"ORDER": self.order, "DIAG": self.diag, "JSLOT": self.slots(rows, cols),
                  "LPTR": self.lptr, "LSLOT": self.lslot, "LROW": self.lrow,
                  "UPTR": self.uptr, "USLOT": self.uslot, "UCOL": self.ucol,
                  "TPTR": self.tptr, "TARGET": self.target}
        lines = [f"struct {name} {{",
                 f"  static constexpr int N = {self.n}, NNZ = {self.nnz};"]
        for key, values in tables.items():
            values = np.asarray(values, dtype=np.int64).reshape(-1)
            body = ",".join(str(int(v)) for v in values) if values.size else "0"
            lines.append(f"  static constexpr int {key}[{max(values.size, 1)}] = {{{body}}};")
        lines.append("};")
        return "\n".join(lines)


def symbolic(pattern: np.ndarray, order: str | None = None) -> SparseLU:
    """The symbolic LU factorisation of ``W = I / (gamma h) - J`` for ``J``'s structural
    ``pattern`` (``(n, n)`` boolean, original state indices), in the candidate order of
    least fill (or the one named: ``"natural"``, ``"rcm"``, ``"mindegree"``)."""
    pattern = np.asarray(pattern, dtype=bool)
    n = pattern.shape[0]
    if pattern.shape != (n, n):
        raise ValueError(f"pattern must be square, got shape {pattern.shape}")
    w = pattern | np.eye(n, dtype=bool)
    candidates = _orders(w)
    if order is not None and order not in candidates:
        raise ValueError(f"order must be one of {sorted(candidates)}, got {order!r}")
    filled = {k: _fill(w[np.ix_(q, q)]) for k, q in candidates.items()}
    fills = {k: int(f.sum()) for k, f in filled.items()}
    name = order or min(candidates, key=lambda k: (fills[k], k != "natural"))
    q, f = candidates[name], filled[name]
    slot = -np.ones((n, n), dtype=np.int64)
    rows, cols = np.nonzero(f)  # row by row
    slot[rows, cols] = np.arange(rows.size)
    inv = np.empty(n, dtype=np.int64)
    inv[q] = np.arange(n)
    er, ec = np.nonzero(pattern)
    lptr, lslot, lrow, uptr, uslot, ucol = [0], [], [], [0], [], []
    for k in range(n):
        below = np.flatnonzero(f[k + 1:, k]) + k + 1
        right = np.flatnonzero(f[k, k + 1:]) + k + 1
        lslot += list(slot[below, k]); lrow += list(below); lptr.append(len(lslot))
        uslot += list(slot[k, right]); ucol += list(right); uptr.append(len(uslot))
    tptr, target = [], []
    for k in range(n):
        right = np.asarray(ucol[uptr[k]:uptr[k + 1]], dtype=np.int64)
        for e in range(lptr[k], lptr[k + 1]):
            tptr.append(len(target))
            target += list(slot[lrow[e], right])
    tptr.append(len(target))
    a = lambda x: np.asarray(x, dtype=np.int64)
    lu = SparseLU(n=n, nnz=int(rows.size), order=a(q), pattern=pattern, entry_rows=a(er),
                  entry_cols=a(ec), entry_slot=a(slot[inv[er], inv[ec]]),
                  diag=a(slot[np.arange(n), np.arange(n)]), lptr=a(lptr), lslot=a(lslot),
                  lrow=a(lrow), uptr=a(uptr), uslot=a(uslot), ucol=a(ucol), tptr=a(tptr),
                  target=a(target), slot=slot, order_name=name, fills=fills)
    assert (lu.target >= 0).all() and (lu.entry_slot >= 0).all()
    return lu


# ---------------------------------------------------------------------- the policy

_TABLES, _POLICY = "GsSparseTables", "GsSparseElimination"


def choose(rows, cols, d: int) -> tuple[str, str, str] | None:
    """The sparse elimination policy for a Rosenbrock kernel whose Jacobian of ``d``
    states has its structural nonzeros at ``(rows[k], cols[k])`` (the generated Model's
    ``ROW``/``COL``, in that order), or None where the dense LU is expected to be as fast
    (`SparseLU.use_sparse`).

    Returns ``(type, code, reason)``: the C++ class template taking the Model, the C++
    that defines it (``cc/sparse_lu.h`` and the tables, put after ``rosenbrock.h``), and
    a sentence saying what it is and why, for the route."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    cols = np.asarray(cols, dtype=np.int64).reshape(-1)
    pattern = np.zeros((d, d), dtype=bool)
    pattern[rows, cols] = True
    lu = symbolic(pattern)
    if not lu.use_sparse():
        return None
    from .source import _read

    code = "\n".join([_read("sparse_lu.h"), lu.cpp_struct(_TABLES, rows, cols),
                      f"template <class M> using {_POLICY} = SparseElimination<M, {_TABLES}>;"])
    n = d
    dense = (n ** 3 - n) // 3
    reason = (f"sparse LU: {int(pattern.sum())} nonzeros in df/dy, {lu.nnz} with the fill of "
              f"a {lu.order_name} order; {lu.updates} multiply-adds a factorisation against "
              f"{dense} dense")
    return _POLICY, code, reason


def column_groups(pattern: np.ndarray) -> np.ndarray:
    """Structurally orthogonal groups of ``df/dy``'s columns (Curtis, Powell and Reid): no
    two columns of a group have a nonzero in the same row, so one forward-mode pass in
    the sum of a group's unit directions gives each of its columns' nonzeros exactly
    (entry ``(i, j)`` is row ``i`` of the pass of ``j``'s group). Returns ``(n,)``, the
    group of each column, numbered from 0; greedy, columns by decreasing count.

    With them the Jacobian's nonzeros cost ``groups.max() + 1`` passes instead of ``n``
    (at least the fullest row's count): Chen (504 states) 144 passes, its fullest row 114
    nonzeros; Laske (34) 13; Isensee (32) 17; Bachmann (25) 9; Zheng (15) 7; Boehm (8) 4."""
    pattern = np.asarray(pattern, dtype=bool)
    n = pattern.shape[1]
    groups = -np.ones(n, dtype=np.int64)
    used = []  # per group: the rows its columns cover
    for j in sorted(range(n), key=lambda c: -int(pattern[:, c].sum())):
        rows = pattern[:, j]
        for g, cover in enumerate(used):
            if not (cover & rows).any():
                groups[j] = g
                cover |= rows
                break
        else:
            groups[j] = len(used)
            used.append(rows.copy())
    return groups
