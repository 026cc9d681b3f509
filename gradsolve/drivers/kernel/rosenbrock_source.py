"""The C++ of a Rosenbrock step, forward and reverse, for the kernel's templates
(`gradsolve.drivers.kernel.source` fills them in).

Loop form (`LoopRosenbrockSource`, for the tableau form of `AbstractRosenbrock.step`, e.g.
Rodas5P, and for Rosenbrock23's own step): the generated code is only what depends on the
model (``Model``: ``f``, the Jacobian's structural nonzeros and ``df/dt``, the VJP of
``f`` and the VJP of those Jacobian terms), each a function of all lanes; the stages,
``W``, its factorisation and solves (an elimination policy, `choose_elimination`) and the
step's exact discrete adjoint are the fixed templates of ``cc/rosenbrock.h``. The
Jacobian's pattern is read off the translated ``f`` (`_pattern`) and its columns
coloured (`_colors`), one forward-mode pass per colour, so the source grows with the
nonzeros. `LoopRosenbrockSource` states the adjoint and why the reverse step recomputes
its factorisation.

Translated whole (`RosenbrockSource`, for a method with another ``step`` of its own, up
to `gradsolve.drivers.kernel.driver.ROSENBROCK_MAX_STATES` states): an explicit
Runge–Kutta step is written here from its tableau (`source._Source`); a
linearly implicit one is translated whole from the solver's own ``step``
(`gradsolve._solver.rosenbrock.AbstractRosenbrock.step`, or a subclass's, e.g.
`gradsolve.Rosenbrock23`'s): its jaxpr holds the Jacobian ``df/dy`` and ``df/dt``
(``jacobians``: forward-mode passes in the unit directions), ``W``, its LU factorisation
with partial pivoting, the stage solves and the stage evaluations of ``f``. So the kernel
runs the very arithmetic of the XLA replay (`gradsolve.drivers.batched`), operation for
operation but for the LU's pivot search and substitutions (rounding), and any
``AbstractRosenbrock`` runs without a line of C++ of its own.

The reverse step is the translated VJP of that step (``jax.vjp`` of ``(t0, h, y0, p) ->
y1``): it recomputes the step from the stored state (the LU factors included, which the
transposed solves of ``lax.custom_linear_solve``'s transpose reuse), and differentiates
``f`` twice where it has to (the Jacobian's dependence on ``y``, ``p`` and ``t``: the VJP
of ``jacobians``' forward-mode passes). Its cotangents of ``t0`` and ``h`` give the node
times' (``CT``, ``CH``, under ``TIMES``), as the explicit step's do. A step that
differentiates its LU factorisation (Rosenbrock23's calls ``lu_factor`` and ``lu_solve``
on ``W`` itself) has its VJP traced with the solves differentiated as linear solves
(`_solves_differentiated_as_solves`): the same derivative, without the transpose of JAX's
LU rule, which made its reverse sweep 10x slower.

The linear algebra primitives and the folding of the unit directions' zeros and ones are
`gradsolve.drivers.kernel.linalg.RosenbrockEmitter`'s. Past `CHUNK` statements a lane's
step is split over several lane loops (`lane_loops`), and the source starts with a pragma
(`RosenbrockSource.prefix`): both for GCC, the build time and the vectorisation.

Checked by ``tests/test_kernel_rosenbrock.py`` (values and gradients equal the XLA
replay's to 1e-10 on one mesh); timed by ``benchmarks/bench_kernel_rosenbrock.py``.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import NamedTuple

import numpy as np

from ..._solver.rosenbrock import AbstractRosenbrock
from .codegen import Unsupported, translate
from .linalg import RosenbrockEmitter


_DEF = re.compile(r"^const (real|long long|int) ([A-Za-z_][A-Za-z0-9_]*) = ")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOOP = "#pragma omp simd\nfor (int j = 0; j < LANES; ++j) {"

CHUNK = 500
"""Statements of a lane's step per ``omp simd`` loop (see `lane_loops`)."""


def lane_loops(inputs: dict[str, str], stmts: list[str], tail: list[str],
               chunk: int | None = None) -> str:
    """A lane's step as the body of the template's ``omp simd`` loop over lanes, or, past
    ``chunk`` statements, as several such loops one after the other.

    ``stmts`` are single assignments (``const T name = expr;``), ``tail`` any code after
    them (run in the last loop), ``inputs`` the declarations (reads of the lane's inputs,
    e.g. ``const real h = H[j];``) by name; each loop declares the inputs it uses. A value
    one loop defines and a later one uses goes through a lane buffer (``GS_SPILL_R`` for
    reals, ``GS_SPILL_I`` for integers, declared before the first loop).

    Why: a Rosenbrock step is thousands of statements (its LU and stage solves grow with
    ``d**3``), and in one basic block GCC's register allocation took most of the build
    (10 states: over two minutes); loops of ``chunk`` statements keep each region small,
    and a value live across them is spilled once, explicitly. The text closes the
    template's loop and opens the next ones, the last closed by the template.
    """
    chunk = CHUNK if chunk is None else chunk
    defs, kinds = [], {}
    for st in stmts:
        m = _DEF.match(st)
        if m is None:
            raise ValueError(f"not a single assignment: {st[:80]}")
        defs.append(m.group(2))
        kinds[m.group(2)] = m.group(1)
    pieces = [list(range(i, min(i + chunk, len(stmts)))) for i in range(0, len(stmts), chunk)]
    pieces = pieces or [[]]
    where = {defs[i]: k for k, piece in enumerate(pieces) for i in piece}
    uses = []
    for k, piece in enumerate(pieces):
        text = " ".join(stmts[i] for i in piece)
        if k == len(pieces) - 1:
            text += " " + " ".join(tail)
        uses.append(set(_NAME.findall(text)))
    # values crossing loops: a slot each, in their type's buffer
    slots: dict[str, int] = {}
    count = {"real": 0, "int": 0}
    for k, used in enumerate(uses):
        for name in sorted(used):
            if name in where and where[name] < k and name not in slots:
                kind = "real" if kinds[name] == "real" else "int"
                slots[name] = count[kind]
                count[kind] += 1
    buffer = {"real": ("GS_SPILL_R", "real"), "int": ("GS_SPILL_I", "long long")}

    def slot(name):
        buf = buffer["real" if kinds[name] == "real" else "int"][0]
        return f"{buf}[{slots[name]} * LANES + j]"

    bodies = []
    for k, piece in enumerate(pieces):
        used = uses[k]
        body = [decl for name, decl in inputs.items() if name in used]
        body += [f"const {kinds[n]} {n} = {slot(n)};" for n in sorted(used)
                 if n in where and where[n] < k]
        body += [stmts[i] for i in piece]
        body += [f"{slot(defs[i])} = {defs[i]};" for i in piece if defs[i] in slots]
        if k == len(pieces) - 1:
            body += tail
        bodies.append("\n      ".join(body))
    if len(bodies) == 1:
        return bodies[0]
    out = ["}"]  # the template's loop, left empty
    for kind, (buf, ctype) in buffer.items():
        out.append(f"alignas(64) {ctype} {buf}[{max(count[kind], 1)} * LANES];")
    for k, body in enumerate(bodies):
        out += [_LOOP, body] + (["}"] if k < len(bodies) - 1 else [])
    return "\n".join(out)


_PATCH_LOCK = threading.Lock()



def _error_norm(R, d: int) -> list[str]:
    """C++ of a lane's scaled RMS error ``err`` of the step ``y -> y1`` with embedded
    error ``e`` (per state ``r`` in ``R``, as ``y_r``, ``y1_r``, ``e_r``): infinite where
    ``y1`` or the norm is not finite, so that the record rejects the step."""
    tail = ["real acc = 0, bad = 0;"]
    for r in R:
        tail.append(f"{{ const real sc = atol + rtol * rmax(std::abs(y_{r}), std::abs(y1_{r}));"
                    f" const real q = e_{r} / sc; acc += q * q; bad += y1_{r} - y1_{r}; }}")
    tail.append(f"real err = std::sqrt(acc / (real){d});")
    tail.append("bad += err - err;")
    tail.append("err = (bad == 0) ? err : (real)INFINITY;")
    return tail

class _Factors(tuple):
    """``(lu, piv)`` of `jax.scipy.linalg.lu_factor`, with the matrix ``a`` they factor."""

    a = None


@contextlib.contextmanager
def _solves_differentiated_as_solves():
    """While tracing a step's VJP: `jax.scipy.linalg.lu_factor` factors the matrix without
    differentiating the factorisation, and `jax.scipy.linalg.lu_solve` with those factors
    is a ``lax.custom_linear_solve`` with the matrix, whose derivative is
    ``W^-1 (db - dW x)`` (what `gradsolve.AbstractRosenbrock.step` writes itself).

    The same values (the same factorisation and substitutions run) and the same derivative,
    but the VJP no longer holds the transpose of JAX's LU derivative rule: on
    Rosenbrock23's step (which calls ``lu_factor`` and ``lu_solve`` on ``W`` directly)
    that transpose is gathers and scatters of ``d x d`` matrices at the traced pivot rows,
    and its C++ on Boehm's 8 states ran the reverse sweep at 6-8 us a step, slower than
    XLA's (1 us with this). Module attributes are swapped for the trace only, under a
    lock; factors and solves made without this context (a plain ``(lu, piv)`` tuple) go to
    JAX's functions as before.
    """
    import jax
    import jax.scipy.linalg as jsl

    with _PATCH_LOCK:
        factor, solve = jsl.lu_factor, jsl.lu_solve

        def lu_factor(a, overwrite_a=False, check_finite=True):
            out = _Factors(factor(jax.lax.stop_gradient(a)))
            out.a = a
            return out

        def lu_solve(lu_and_piv, b, trans=0, overwrite_b=False, check_finite=True):
            if not isinstance(lu_and_piv, _Factors):
                return solve(lu_and_piv, b, trans=trans)
            a, plain = lu_and_piv.a, tuple(lu_and_piv)
            fwd = lambda _, x: solve(plain, x, trans=0)
            tr = lambda _, x: solve(plain, x, trans=1)
            if trans == 0:
                return jax.lax.custom_linear_solve(lambda u: a @ u, b, fwd, tr)
            return jax.lax.custom_linear_solve(lambda u: a.T @ u, b, tr, fwd)

        jsl.lu_factor, jsl.lu_solve = lu_factor, lu_solve
        try:
            yield
        finally:
            jsl.lu_factor, jsl.lu_solve = factor, solve


class StepUnsupported(Unsupported):
    """The vector field translates but the Rosenbrock step around it does not (a
    translator limit reached by the step's linear algebra, e.g. Rosenbrock23's
    differentiated LU on many states): the kernel does not apply, and the field is not to
    blame (`gradsolve.drivers.auto` warns about untranslated fields only)."""


def _obj(names):
    return np.array(names, dtype=object)


def _decl(names):
    return "real " + ", ".join(names) + ";" if names else ""


def _block(lines, outs):
    body = list(lines)
    for names, exprs in outs:
        body += [f"{nm} = {ex};" for nm, ex in zip(names, exprs)]
    return "{ " + " ".join(body) + " }"


class RosenbrockSource:
    """The C++ statements of one Rosenbrock step of one lane (forward, record, reverse)
    and of ``f`` alone (the record's initial step), for the flattened vector field
    ``f_flat(t, y (d,), p (p_size,))``; the same interface as `source._Source`."""

    fsal = False
    # Put before the kernel's source: GCC's code sinking moves a value used by one side of
    # a select (the LU's pivot swaps, every entry of W) into a branch, and where that value
    # calls libm (Boehm's exp and pow) the branch stays, so the whole lane loop is not
    # vectorised (measured 3x slower). Without the pass every lane loop vectorises.
    prefix = '#pragma GCC optimize ("no-tree-sink")\n'

    def __init__(self, f_flat, d: int, p_size: int, dtype, solver):
        import jax
        import jax.numpy as jnp

        self.d, self.p_size, self.dtype = d, p_size, dtype
        self.s = len(getattr(solver, "m", ())) or 1
        scalar = jax.ShapeDtypeStruct((), dtype)
        self.ex = (scalar, scalar, jax.ShapeDtypeStruct((d,), dtype),
                   jax.ShapeDtypeStruct((p_size,), dtype))
        fvec = lambda t, y, p: jnp.asarray(f_flat(t, y, p), dtype)
        self.fvec = lambda t, y, p: (fvec(t, y, p),)

        def step(t, h, y, p):
            y1, y_error, _ = solver.step(fvec, t, h, y, p, solver.init(fvec, t, y, p))
            return y1, y_error

        def step_vjp(t, h, y, p, ct):
            _, back = jax.vjp(lambda t, h, y, p: step(t, h, y, p)[0], t, h, y, p)
            return back(ct)

        # A step of its own (Rosenbrock23's) may differentiate its LU factorisation;
        # its VJP is traced with the solves differentiated as solves instead.
        self.own_step = type(solver).step is not AbstractRosenbrock.step

        self.step, self.step_vjp = step, step_vjp
        self.solver_name = type(solver).__name__
        self.R = range(d)
        self.pn = _obj([f"p_{r}" for r in range(p_size)]).reshape(p_size)
        self.inputs = {"h": "const real h = H[j];", "ta": "const real ta = TA[j];",
                       **{f"y_{r}": f"const real y_{r} = YB[{r} * LANES + j];" for r in self.R},
                       **{f"p_{r}": f"const real p_{r} = PB[{r} * LANES + j];"
                          for r in range(p_size)}}

    def _y(self):
        return _obj([f"y_{r}" for r in self.R])

    def _translate_step(self, fn, args, exprs):
        """``translate`` of the step (or its VJP) with the Rosenbrock emitter; a failure
        there, once ``f`` alone has translated, is the step's (`StepUnsupported`)."""
        try:
            return translate(fn, args, exprs, emitter=RosenbrockEmitter)
        except StepUnsupported:
            raise
        except Unsupported as e:
            raise StepUnsupported(f"the {self.solver_name} step on {self.d} states ({e})") from e

    def forward(self) -> tuple[str, str, str]:
        """``(forward_step, record_step, rhs_eval)``, as `source._Source.forward`."""
        R, d = self.R, self.d
        t_ex, _, y_ex, p_ex = self.ex
        k0 = [f"k0_{r}" for r in R]
        # f alone first: where it does not translate, that is the field's doing.
        f_lines, (f_out,) = translate(self.fvec, [t_ex, y_ex, p_ex],
                                      [_obj("ta"), self._y(), self.pn])
        lines, (o_y1, o_e) = self._translate_step(
            self.step, list(self.ex), [_obj("ta"), _obj("h"), self._y(), self.pn])
        stmts = lines + [f"const real y1_{r} = {o_y1[r]};" for r in R] \
            + [f"const real e_{r} = {o_e[r]};" for r in R]
        inputs = {**self.inputs, "rtol": "const real rtol = RT[j];",
                  "atol": "const real atol = AT[j];"}
        tail = _error_norm(R, d)
        rec = tail + [f"Y1[{r} * LANES + j] = y1_{r};" for r in R] + ["ERR[j] = err;"]
        fw = tail + ["const bool act = ACT[j] != 0;",
                     "EMAX[j] = act ? rmax(EMAX[j], err) : EMAX[j];"]
        fw += [f"YB[{r} * LANES + j] = act ? y1_{r} : y_{r};" for r in R]
        ev = [*[f"const real y_{r} = YQ[{r} * LANES + j];" for r in R],
              *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(self.p_size)],
              "const real ta = TQ[j];",
              _decl(k0), _block(f_lines, [(k0, f_out)]),
              *[f"FQ[{r} * LANES + j] = FRESH[j] ? k0_{r} : FQ[{r} * LANES + j];" for r in R]]
        return (lane_loops(inputs, stmts, fw), lane_loops(inputs, stmts, rec),
                "\n      ".join(ev))

    def backward(self) -> str:
        """The reverse step: the translated VJP of the step at the stored state (``LAM``
        becomes ``y0``'s cotangent, ``CTP`` gathers ``p``'s; under ``TIMES`` the node-time
        cotangents ``CH``, ``CT``)."""
        R, P = self.R, range(self.p_size)
        lam = _obj([f"l_{r}" for r in R])
        with (_solves_differentiated_as_solves() if self.own_step
              else contextlib.nullcontext()):
            lines, (o_t, o_h, o_y, o_p) = self._translate_step(
                self.step_vjp, [*self.ex, self.ex[2]],
                [_obj("ta"), _obj("h"), self._y(), self.pn, lam])
        stmts = lines + [f"const real ct_t = {o_t[0]};", f"const real ct_h = {o_h[0]};"]
        stmts += [f"const real cy_{r} = {o_y[r]};" for r in R]
        stmts += [f"const real cp_{r} = {o_p[r]};" for r in P]
        inputs = {**self.inputs, **{f"l_{r}": f"const real l_{r} = LAM[{r} * LANES + j];"
                                    for r in R}}
        # No `ACT` selects (as in the explicit step): an idle lane's accumulators are
        # never read again.
        bw = [f"CTP[{r} * LANES + j] += cp_{r};" for r in P]
        bw.append("if constexpr (TIMES) {")
        bw.append("CH[j] = ct_h;")
        bw.append("CT[j] = ct_t - ct_h;")
        bw.append("}")
        bw += [f"LAM[{r} * LANES + j] = cy_{r};" for r in R]
        return lane_loops(inputs, stmts, bw)


# ------------------------------------------------------------------------ loop form


class Elimination(NamedTuple):
    """The elimination policy of a loop-form Rosenbrock kernel (``cc/rosenbrock.h`` states
    its C++ interface): ``type``, the C++ class template taking the generated ``Model``
    (``"DenseElimination"``); ``code``, C++ put after ``rosenbrock.h`` (the policy and its
    tables, empty for the dense one); ``reason``, why it was chosen, for messages."""

    type: str
    code: str
    reason: str


DENSE = Elimination("DenseElimination", "", "dense LU with partial pivoting")


def choose_elimination(rows: np.ndarray, cols: np.ndarray, d: int) -> Elimination:
    """The elimination policy for a Jacobian of ``d`` states whose structural nonzeros are
    at ``(rows[k], cols[k])``: a sparse one where
    ``gradsolve.drivers.kernel._sparse.choose(rows, cols, d)`` offers one (an
    `Elimination`, or None for dense), else `DENSE`."""
    try:
        from . import _sparse
    except ImportError:
        return DENSE
    choose = getattr(_sparse, "choose", None)
    if choose is None:
        return DENSE
    found = choose(np.asarray(rows), np.asarray(cols), d)
    return DENSE if found is None else Elimination(*found)


def loop_kind(solver) -> int | None:
    """The loop-form template a Rosenbrock method runs on: 0 for the transformed tableau
    form (`AbstractRosenbrock.step`, e.g. Rodas5P), 1 for `gradsolve.Rosenbrock23`'s own
    step, None for a method with another ``step`` of its own (translated whole,
    `RosenbrockSource`)."""
    from ..._solver.rosenbrock23 import Rosenbrock23

    step = type(solver).step
    if step is AbstractRosenbrock.step:
        return 0
    if step is Rosenbrock23.step:
        return 1
    return None


def _cpp_array(values) -> str:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim == 1:
        return "{" + ", ".join(repr(float(v)) for v in a) + "}"
    return "{" + ", ".join(_cpp_array(row) for row in a) + "}"


def _tableau(solver, kind: int) -> str:
    """The ``Tableau`` struct of ``cc/rosenbrock.h``: the method's constants."""
    if kind == 1:
        from ..._solver import rosenbrock23 as r23

        return (f"struct Tableau {{\n  static constexpr int KIND = 1, NST = 3;\n"
                f"  static constexpr real ALPHA = (real)1;\n"
                f"  static constexpr double DCOEF = {r23._d!r}, E32 = {r23._e32!r};\n}};")
    s = len(solver.m)
    return "\n".join([
        "struct Tableau {",
        f"  static constexpr int KIND = 0, NST = {s};",
        # eye / gamma in the state's dtype, as the XLA step
        f"  static constexpr real ALPHA = (real)1 / (real){float(solver.gamma)!r};",
        "  static constexpr double DCOEF = 0, E32 = 0;",
        f"  static constexpr double A[{s}][{s}] = {_cpp_array(solver.a)};",
        f"  static constexpr double CC[{s}][{s}] = {_cpp_array(solver.C)};",
        f"  static constexpr double M[{s}] = {_cpp_array(solver.m)};",
        f"  static constexpr double ME[{s}] = {_cpp_array(solver.m_error)};",
        f"  static constexpr double C[{s}] = {_cpp_array(solver.c)};",
        f"  static constexpr double DD[{s}] = {_cpp_array(solver.d)};",
        "};"])


def _pattern(lines: list[str], outs: list[str], d: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, cols)`` of the Jacobian's structural nonzeros, read off the translated
    ``f``: output ``r`` depends on ``y_c`` where its expression reaches ``y_c`` through the
    statements (a superset of the nonzeros at any point: both sides of a select count).
    Ordered by row, then column."""
    deps: dict[str, frozenset] = {f"y_{c}": frozenset([c]) for c in range(d)}
    empty = frozenset()

    def reach(expr: str) -> frozenset:
        found = [deps.get(name, empty) for name in _NAME.findall(expr)]
        return frozenset().union(*found) if found else empty

    for line in lines:
        m = _DEF.match(line)
        if m is not None:
            deps[m.group(2)] = reach(line[m.end():])
    pairs = sorted((r, c) for r, expr in enumerate(outs) for c in reach(str(expr)))
    rows = np.array([r for r, _ in pairs], dtype=np.int64)
    cols = np.array([c for _, c in pairs], dtype=np.int64)
    return rows, cols


def _colors(rows: np.ndarray, cols: np.ndarray, d: int) -> np.ndarray:
    """A colour per column, no two columns sharing a row of the same colour (greedy,
    columns in order): the columns of a colour share one forward-mode pass."""
    by_row: dict[int, list[int]] = {}
    by_col: dict[int, list[int]] = {}
    for r, c in zip(rows.tolist(), cols.tolist()):
        by_row.setdefault(r, []).append(c)
        by_col.setdefault(c, []).append(r)
    color = np.full(d, -1, dtype=np.int64)
    for c in range(d):
        if c not in by_col:
            continue
        taken = {int(color[o]) for r in by_col[c] for o in by_row[r] if color[o] >= 0}
        k = 0
        while k in taken:
            k += 1
        color[c] = k
    return np.where(color < 0, 0, color)


def _check_jacobian_size(d: int, nnz: int, n_colors: int) -> None:
    """`StepUnsupported`, before any of the Jacobian is translated, where its compressed
    form exceeds what the translator takes (`gradsolve._jaxpr`'s limits): the colours'
    forward-mode passes are one ``(n_colors + 1, d)`` array, the picked nonzeros one
    ``(nnz,)`` array, and their VJP scatters ``nnz`` entries into ``(n_colors, d)``.
    Checked once ``f`` has translated (Chen's 504 states: f in 4 s, then 4,602 nonzeros in
    145 colours, a ``(146, 504)`` array), where the Jacobian's translation would have
    stopped at the same limits only after a good part of its work."""
    from ..._jaxpr import _MAX_ELEMENTS, _MAX_SCATTER

    passes, scatter = (n_colors + 1) * d, nnz * n_colors * d
    too_large = [what for what, over in (
        (f"its {n_colors + 1} forward-mode passes (one per group and df/dt) form an array "
         f"of {passes:,} entries", passes > _MAX_ELEMENTS),
        (f"its nonzeros an array of {nnz:,}", nnz > _MAX_ELEMENTS),
        (f"their reverse mode a scatter of {nnz:,} entries into {n_colors * d:,}",
         scatter > _MAX_SCATTER)) if over]
    if too_large:
        raise StepUnsupported(
            f"the Jacobian of a vector field this large ({d} states, {nnz:,} structural "
            f"nonzeros in {n_colors} column groups): {'; '.join(too_large)}, past what it "
            f"translates ({_MAX_ELEMENTS:,} entries an array, {_MAX_SCATTER:,} for a "
            f"scatter's updates times its entries), and it has no translation of the "
            f"Jacobian group by group")


def _compressed_jacobians(f, t0, y0, params, seeds: np.ndarray):
    """``(f(t0, y0), J S, f_t)`` as `gradsolve._solver.rosenbrock.jacobians` computes
    ``(f, J, f_t)``, the unit directions replaced by the colours' seed rows ``S``
    (``(colours, d)``): ``(J S)[k, r]`` is ``J[r, c]`` for the column ``c`` of colour
    ``k`` that row ``r`` reads."""
    import jax
    import jax.numpy as jnp

    dtype = y0.dtype
    k = seeds.shape[0]
    basis = np.zeros((k + 1, y0.shape[0] + 1))
    basis[0, 0] = 1.0
    basis[1:, 1:] = seeds
    tt = jnp.asarray(basis[:, 0], t0.dtype)
    ty = jnp.asarray(basis[:, 1:], dtype)

    def directional(dt, dy):
        return jax.jvp(lambda t, y: f(t, y, params), (t0, y0), (dt, dy))

    f0, tangents = jax.vmap(directional, out_axes=(None, 0))(tt, ty)
    return f0, tangents[1:], tangents[0]


def _is_zero(expr) -> bool:
    v = getattr(expr, "value", None)
    return v is not None and not isinstance(v, np.bool_) and v == 0


def _lane_function(signature: str, inputs: dict, lines: list[str], tail: list[str]) -> str:
    """A static member function running ``lines`` (single assignments) then ``tail`` for
    every lane, in ``omp simd`` loops of at most `CHUNK` statements (`lane_loops`)."""
    body = lane_loops(inputs, lines, tail)
    return (f"  static void {signature} {{\n    #pragma omp simd\n"
            f"    for (int j = 0; j < LANES; ++j) {{\n      {body}\n    }}\n  }}")


class LoopRosenbrockSource:
    """A Rosenbrock step in loop form (``cc/rosenbrock.h``): the generated C++ holds only
    what depends on the model (``Model``: ``f``, the Jacobian's structural nonzeros and
    ``df/dt``, and the vector-Jacobian products of the adjoint), the stages, ``W``, its
    factorisation and solves, and the reverse step are fixed loops instantiated by size
    and tableau. The same interface as `RosenbrockSource` (and `source._Source`), plus
    `block` (the text of kernel.cc's ``@ROSENBROCK@``).

    The reverse step is the exact discrete adjoint of the forward step, recomputed from
    the stored state. For the tableau form (``u_i = W^-1 r_i``, ``W = I/gamma - h J``,
    ``r_i = h F_i + sum_k C_ik u_k + d_i h^2 f_t``, ``F_i = f(t0 + c_i h, y0 + sum_k a_ik
    u_k)``, ``y1 = y0 + sum_i m_i u_i``), with ``lambda`` the cotangent of ``y1``, for
    ``i = s-1, ..., 0``::

        ubar_i = m_i lambda + sum_{k>i} (C_ki rbar_k + a_ki Ybar_k)
        rbar_i = W^-T ubar_i
        hbar  += <rbar_i, F_i> + 2 d_i h <rbar_i, f_t>,   f_t bar += d_i h^2 rbar_i
        (Tbar_i, Ybar_i, pbar) += (df/d(t, y, p))(T_i, Y_i)^T (h rbar_i)
        ybar0 += Ybar_i,  t0bar += Tbar_i,  hbar += c_i Tbar_i

    and ``W``'s cotangent ``-sum_i rbar_i u_i^T`` reaches the Jacobian's nonzeros as
    ``Jbar = h G``, ``G = sum_i rbar_i u_i^T`` on the pattern, and ``h`` as ``<J, G>``;
    one second-order product (the VJP of ``(f0, J's nonzeros, f_t)`` with cotangents
    ``(F_0 bar, Jbar, f_t bar)``) ends the step. Rosenbrock23's step is adjoined the same
    way, line by line (``cc/rosenbrock.h``, ``backward_ode23s``).

    The factorisation is recomputed in the reverse step, not carried from the forward
    sweep. Measured (``benchmarks/bench_kernel_rosenbrock.py --reuse-probe --sizes 64
    --repeats 20``: the reverse sweep as built against a probe build whose reverse step
    skips its factorisation, one kernel thread, best process CPU time, 2026-12-07 on the
    shared 2-core VM): Robertson 0.122 against 0.109 us per trajectory-step, Boehm (8
    states) 0.492 against 0.442: carrying the factors would save at most 10 % of the
    reverse sweep, before the forward sweep writes ``d**2`` numbers and the pivots per step
    and the reverse reads them back (at 8 states 512 bytes a step against the state's 72:
    the stored rows, now ``O(n steps d)``, would grow ``d``-fold), while the stages must be
    recomputed anyway (they need ``f`` at the stored state).
    """

    fsal = False
    prefix = RosenbrockSource.prefix

    def __init__(self, f_flat, d: int, p_size: int, dtype, solver):
        import jax
        import jax.numpy as jnp

        from ..._solver.rosenbrock import jacobians

        self.d, self.p_size, self.dtype = d, p_size, dtype
        self.kind = loop_kind(solver)
        self.solver = solver
        self.s = 3 if self.kind == 1 else len(solver.m)
        scalar = jax.ShapeDtypeStruct((), dtype)
        vec = jax.ShapeDtypeStruct((d,), dtype)
        pvec = jax.ShapeDtypeStruct((p_size,), dtype)
        self.ex = (scalar, vec, pvec)
        fvec = lambda t, y, p: jnp.asarray(f_flat(t, y, p), dtype)
        self.fvec = lambda t, y, p: (fvec(t, y, p),)
        self.jacobians = lambda t, y, p: jacobians(fvec, t, y, p)
        self._fvec_raw = fvec
        self.R = range(d)
        self.pn = _obj([f"p_{r}" for r in range(p_size)]).reshape(p_size)
        self.yn = _obj([f"y_{r}" for r in self.R])

    def _inputs(self, extra=()):
        out = {"ta": "const real ta = T[j];",
               **{f"y_{r}": f"const real y_{r} = Y[{r} * LANES + j];" for r in self.R},
               **{f"p_{r}": f"const real p_{r} = PR[{r} * LANES + j];"
                  for r in range(self.p_size)}}
        for prefix, array, size in extra:
            out.update({f"{prefix}_{r}": f"const real {prefix}_{r} = {array}[{r} * LANES + j];"
                        for r in range(size)})
        return out

    def _model(self) -> str:
        import jax

        d, P = self.d, self.p_size
        t_ex, y_ex, p_ex = self.ex
        args = [_obj("ta"), self.yn, self.pn]
        # f
        f_lines, (f_out,) = translate(self.fvec, list(self.ex), args)
        # The Jacobian's structural pattern (what each output reads of y, through the
        # translated statements), its columns coloured so that no two of a colour share a
        # row, and the Jacobian as one forward-mode pass per colour (plus df/dt): each entry
        # comes out alone in its colour's pass, with the arithmetic of the solver's own
        # `jacobians` (one pass per column), at a cost that grows with the nonzeros.
        rows, cols = _pattern(f_lines, f_out, d)
        colors = _colors(rows, cols, d)
        self.rows, self.cols, self.n_colors = rows, cols, int(colors.max(initial=-1)) + 1
        _check_jacobian_size(d, len(rows), self.n_colors)
        seeds = np.zeros((self.n_colors, d))
        seeds[colors, np.arange(d)] = 1.0
        fvec = self._fvec_raw
        pick = (colors[cols], rows)

        def picked(t, y, p):
            f0, js, ft = _compressed_jacobians(fvec, t, y, p, seeds)
            return f0, js[pick], ft

        j_lines, (o_f0, o_jac, o_ft) = self._translate(picked, list(self.ex), args)
        nz = list(range(len(rows)))
        o_jac = list(o_jac)
        nnz = len(rows)

        def f_vjp(t, y, p, fb):
            return jax.vjp(fvec, t, y, p)[1](fb)

        def jac_vjp(t, y, p, f0b, jb, ftb):
            return jax.vjp(picked, t, y, p)[1]((f0b, jb, ftb))

        fb_ex = y_ex
        fv_lines, (o_t, o_y, o_p) = self._translate(
            f_vjp, [t_ex, y_ex, p_ex, fb_ex], [*args, _obj([f"fb_{r}" for r in self.R])])
        jb_ex = jax.ShapeDtypeStruct((nnz,), self.dtype)
        jv_lines, (q_t, q_y, q_p) = self._translate(
            jac_vjp, [t_ex, y_ex, p_ex, fb_ex, jb_ex, fb_ex],
            [*args, _obj([f"f0b_{r}" for r in self.R]),
             _obj([f"jb_{k}" for k in range(nnz)]).reshape(nnz),
             _obj([f"ftb_{r}" for r in self.R])])
        vjp_tail = lambda ot, oy, op: (
            [f"TB[j] = {ot[0]};"] + [f"YB[{r} * LANES + j] = {oy[r]};" for r in self.R]
            + [f"PB[{r} * LANES + j] += {op[r]};" for r in range(P)])
        idx = lambda a: ", ".join(str(int(v)) for v in a) if len(a) else "0"
        cotangents = [("f0b", "F0B", d), ("jb", "JNZB", nnz), ("ftb", "FTB", d)]
        return "\n".join([
            "struct Model {",
            f"  static constexpr int NNZ = {nnz};",
            f"  static constexpr int ROW[{max(nnz, 1)}] = {{{idx(rows)}}};",
            f"  static constexpr int COL[{max(nnz, 1)}] = {{{idx(cols)}}};",
            _lane_function("f(const real* T, const real* Y, const real* PR, real* F)",
                           self._inputs(), f_lines,
                           [f"F[{r} * LANES + j] = {f_out[r]};" for r in self.R]),
            _lane_function("jac(const real* T, const real* Y, const real* PR, real* F0, "
                           "real* JNZ, real* FT)", self._inputs(), j_lines,
                           [f"F0[{r} * LANES + j] = {o_f0[r]};" for r in self.R]
                           + [f"JNZ[{k} * LANES + j] = {o_jac[k]};" for k in nz]
                           + [f"FT[{r} * LANES + j] = {o_ft[r]};" for r in self.R]),
            _lane_function("f_vjp(const real* T, const real* Y, const real* PR, "
                           "const real* FB, real* TB, real* YB, real* PB)",
                           self._inputs([("fb", "FB", d)]), fv_lines, vjp_tail(o_t, o_y, o_p)),
            _lane_function("jac_vjp(const real* T, const real* Y, const real* PR, "
                           "const real* F0B, const real* JNZB, const real* FTB, real* TB, "
                           "real* YB, real* PB)", self._inputs(cotangents), jv_lines,
                           vjp_tail(q_t, q_y, q_p)),
            "};"])

    def _translate(self, fn, example, exprs):
        try:
            return translate(fn, example, exprs, emitter=RosenbrockEmitter)
        except Unsupported as e:
            raise StepUnsupported(f"the Jacobian of the vector field on {self.d} states "
                                  f"({e})") from e

    def block(self) -> str:
        """kernel.cc's ``@ROSENBROCK@``: ``Model``, ``Tableau``, ``cc/rosenbrock.h``, the
        elimination policy and the step's type ``GsRosenbrock``."""
        from .source import _read

        model = self._model()
        elim = choose_elimination(self.rows, self.cols, self.d)
        self.elimination = elim
        return "\n\n".join([
            model, _tableau(self.solver, self.kind), _read("rosenbrock.h"), elim.code,
            f"typedef RosenbrockWork<Model, Tableau, {elim.type}<Model>> GsRosenbrock;"])

    def forward(self) -> tuple[str, str, str]:
        """``(forward_step, record_step, rhs_eval)``, as `source._Source.forward`."""
        R, d = self.R, self.d
        t_ex, y_ex, p_ex = self.ex
        k0 = [f"k0_{r}" for r in R]
        # f alone first: where it does not translate, that is the field's doing.
        f_lines, (f_out,) = translate(self.fvec, list(self.ex), [_obj("ta"), self.yn, self.pn])
        head = ["}", "GsRosenbrock& gs_rw = rosenbrock_work<GsRosenbrock>();",
                "gs_rw.forward(TA, H, YB, PB, ACT, true);",
                "const real* GS_Y1 = gs_rw.Y1;", "const real* GS_E = gs_rw.ERR;",
                "#pragma omp simd", "for (int j = 0; j < LANES; ++j) {",
                "const real rtol = RT[j], atol = AT[j];"]
        head += [f"const real y_{r} = YB[{r} * LANES + j], y1_{r} = GS_Y1[{r} * LANES + j],"
                 f" e_{r} = GS_E[{r} * LANES + j];" for r in R]
        tail = _error_norm(R, d)
        rec = head + tail + [f"Y1[{r} * LANES + j] = y1_{r};" for r in R] + ["ERR[j] = err;"]
        fw = head + tail + ["const bool act = ACT[j] != 0;",
                            "EMAX[j] = act ? rmax(EMAX[j], err) : EMAX[j];"]
        fw += [f"YB[{r} * LANES + j] = act ? y1_{r} : y_{r};" for r in R]
        ev = [*[f"const real y_{r} = YQ[{r} * LANES + j];" for r in R],
              *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(self.p_size)],
              "const real ta = TQ[j];",
              _decl(k0), _block(f_lines, [(k0, f_out)]),
              *[f"FQ[{r} * LANES + j] = FRESH[j] ? k0_{r} : FQ[{r} * LANES + j];" for r in R]]
        return "\n      ".join(fw), "\n      ".join(rec), "\n      ".join(ev)

    def backward(self) -> str:
        """The reverse step (``LAM`` becomes ``y0``'s cotangent, ``CTP`` gathers ``p``'s;
        under ``TIMES`` the node-time cotangents ``CH``, ``CT``)."""
        return "\n      ".join([
            "}", "alignas(64) real GS_CTT[LANES], GS_CTH[LANES];",
            "GsRosenbrock& gs_rw = rosenbrock_work<GsRosenbrock>();",
            "gs_rw.backward(TA, H, YB, PB, ACT, LAM, CTP, GS_CTT, GS_CTH);",
            "#pragma omp simd", "for (int j = 0; j < LANES; ++j) {",
            "if constexpr (TIMES) { CH[j] = GS_CTH[j]; CT[j] = GS_CTT[j] - GS_CTH[j]; }"])
