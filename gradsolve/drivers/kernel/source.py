"""C++ source of the compiled kernel for one (vector field, solver, dtype).

The solver is an explicit Runge–Kutta pair, whose step and adjoint `_Source` writes from
its tableau (below), or a Rosenbrock method, whose ``step`` and its VJP are translated
whole (`gradsolve.drivers.kernel.rosenbrock_source`, which also puts a line before the
template's text: a ``#pragma`` for GCC). Both fill the same templates.

``LANES`` trajectories advance together, one step per iteration: a lane's whole step is
straight-line code inside an ``omp simd`` loop over lanes (vectorised by the compiler), so
no stage leaves registers, and a lane whose trajectory ends is refilled from a queue
(longest first), so ragged ensembles cost the sum of their steps. Three XLA FFI handlers:

- ``Fwd``: the replay. Stores the state at every mesh node for the reverse sweep
  (``n * (S+1) * d`` numbers), with the known-time events' jumps and recomputed stages
  (``cc/forward.h`` says how).
- ``Bwd``: the exact discrete adjoint of the same steps. Per step (last to first) it
  recomputes the stages from the stored state and runs the Runge–Kutta adjoint recursion
  (Hairer, Lubich & Wanner, *Geometric Numerical Integration*, VI.4; Sandu, "On the
  properties of Runge–Kutta discrete adjoints", 2006), which `_Source.backward` writes:

      kappa_i = h b_i lambda + h sum_{j>i} a_ji mu_j,
      (mu_i, pi_i, tau_i) = (d f / d(y, p, t))(T_i, Y_i)^T kappa_i,
      lambda <- lambda + sum_i mu_i,  grad_p += sum_i pi_i,

  plus the cotangents of the two node times through ``h`` and the stage times (only in
  the ``GS_PART_BWDT`` build); jumps and FSAL as ``cc/backward.h`` says.
- ``Rec``: the adaptive record, with `gradsolve._controller`'s initial step and controller
  written per lane (``cc/record.h``, also on its ``fill`` attribute).

Each handler is compiled as its own shared library from this one source, selected by a
macro (``GS_PART_FWD``, ``GS_PART_BWD``, ``GS_PART_BWDT``, ``GS_PART_REC``): the builds run
in parallel, and ``GS_PART_BWDT`` (``Bwd`` with node-time cotangents, for ``ts`` given to
the replay) is built only when first needed. See `gradsolve.drivers.kernel.build`.

The C++ is in template files beside this module, in ``cc/``: ``kernel.cc`` (the
translation unit: includes, the ``real`` typedef, the sizes as macros) pulls in
``common.h`` (the problem, cursors over events and mesh nodes, threads),
``special_functions.h`` (`SPECIAL_FUNCTIONS`), ``lanes.h`` (``f`` at flagged lanes, the
refill queue), ``forward.h``, ``backward.h``, ``record.h`` (the three lane loops) and
``handlers.h`` (their XLA FFI bindings). This module writes what depends on the problem:
`_Source` turns the tableau and the vector field (and its VJP, from
`gradsolve.drivers.kernel.codegen`) into one lane's straight-line step, and `generate`
fills the templates in: each one's opening ``///`` notes (and the blank line after them)
dropped, the lines ``#include "NAME.h"`` naming a file of ``cc/`` replaced by its text,
then every ``@NAME@`` replaced by its value (``cc/kernel.cc`` lists them). The result is
the text build.py compiles and hashes into its cache key.
"""

from __future__ import annotations

import re
from importlib import resources

import numpy as np

from .codegen import translate

LANES = 8

EXPLICIT_THREAD_GROUPS = 16
"""Lane groups (`LANES` trajectories each) an explicit Runge–Kutta kernel's call needs per
thread before it starts another: an explicit step of a small field costs little more than
a thread's start. A Rosenbrock kernel starts a thread per lane group (at most one per
usable CPU): its steps factorise a ``d x d`` matrix each."""

# libm functions with SIMD variants in glibc's libmvec (>= 2.35; sin, cos, exp, log, pow
# since 2.22), one and two arguments, double and float.
_UNARY = ("sin", "cos", "tan", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
          "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "cbrt",
          "erf", "erfc")
_BINARY = ("pow", "atan2")
_VECTOR_MATH_DECLS = "\n".join(
    f"#pragma omp declare simd notinbranch\n"
    f"{t} {name}{suffix}({', '.join([t] * arity)}) noexcept __attribute__((const));"
    for names, arity in ((_UNARY, 1), (_BINARY, 2))
    for name in names
    for t, suffix in (("double", ""), ("float", "f"))
)


# The template files' substitution scheme (see the module docstring and cc/kernel.cc).
_NOTES = re.compile(r"(?:///[^\n]*\n)+\n?|")  # a template's opening notes, or nothing
_INCLUDE = re.compile(r'^#include "([a-z_]+\.h)"\n', re.MULTILINE)  # a fragment of cc/
_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def _read(name: str) -> str:
    """The text of the template ``cc/<name>`` without its opening notes (the lines that
    start with ``///`` and the blank line after them)."""
    text = (resources.files(__package__) / "cc" / name).read_text(encoding="utf-8")
    return text[_NOTES.match(text).end():]


# Elementwise functions without a libm counterpart, emitted by
# `gradsolve.drivers.kernel.codegen` (plain C++ on a ``real`` typedef; also compiled alone
# by the tests against scipy).
SPECIAL_FUNCTIONS = _read("special_functions.h")

# kernel.cc with its fragments inlined, the ``@NAME@`` placeholders still in.
_TEMPLATE = _INCLUDE.sub(lambda m: _read(m.group(1)), _read("kernel.cc"))


def _block(lines: list[str], outs: list[tuple[list[str], list[str]]]) -> str:
    """A ``{ ... }`` scope running translated ``lines`` and assigning outputs to outer names."""
    body = list(lines)
    for names, exprs in outs:
        body += [f"{nm} = {ex};" for nm, ex in zip(names, exprs)]
    return "{ " + " ".join(body) + " }"


def _comb(coeffs, terms) -> str | None:
    """``sum_j c_j * term_j`` in the order `gradsolve._solver.base.combine` uses."""
    acc = None
    for c, t in zip(coeffs, terms):
        if float(c) != 0.0:
            term = f"((real){float(c)!r} * {t})"
            acc = term if acc is None else f"({acc} + {term})"
    return acc


class _Source:
    """The C++ statements of one explicit Runge–Kutta step of one lane, forward and
    reverse, for the flattened vector field ``f_flat(t, y (d,), p (p_size,))`` and the
    solver's tableau (the stages' names: ``k{i}_{r}``, ``Y{i}_{r}``, ``T{i}``)."""

    def __init__(self, f_flat, d: int, p_size: int, dtype, solver):
        import jax
        import jax.numpy as jnp

        self.d, self.p_size, self.dtype = d, p_size, dtype
        self.ex = (jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((d,), dtype),
                   jax.ShapeDtypeStruct((p_size,), dtype))
        self.pn = [f"p_{r}" for r in range(p_size)]
        self.fvec = lambda t, y, p: (jnp.asarray(f_flat(t, y, p), dtype),)

        def vjp(t, y, p, ct):
            _, back = jax.vjp(lambda t, y, p: jnp.asarray(f_flat(t, y, p), dtype), t, y, p)
            return back(ct)

        self.vjp = vjp
        self.a, self.b, self.e, self.c = (np.asarray(x, dtype=np.float64) for x in (
            solver.a, solver.b, solver.b_error, solver.c))
        self.s = len(self.b)
        self.fsal = bool(solver.fsal)
        # Stages the new state depends on; with FSAL y1 is the last stage's argument.
        self.b_eff = self.a[self.s - 1] if self.fsal else self.b
        self.s_used = self.s - 1 if self.fsal else self.s
        self.R = range(d)
        self.common = [
            "const real h = H[j], ta = TA[j];",
            *[f"const real y_{r} = YB[{r} * LANES + j];" for r in self.R],
            *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(p_size)],
        ]

    def rhs(self, t: str, ys: list[str], outs: list[str]) -> str:
        t_ex, y_ex, p_ex = self.ex
        lines, (out,) = translate(self.fvec, [t_ex, y_ex, p_ex],
                                  [_obj(t), _obj(ys), _obj(self.pn).reshape(self.p_size)])
        return _block(lines, [(outs, out)])

    def rhs_vjp(self, t, ys, ct, out_t, out_y, out_p) -> str:
        t_ex, y_ex, p_ex = self.ex
        lines, (ct_t, ct_y, ct_p) = translate(
            self.vjp, [t_ex, y_ex, p_ex, y_ex],
            [_obj(t), _obj(ys), _obj(self.pn).reshape(self.p_size), _obj(ct)])
        return _block(lines, [([out_t], ct_t), (out_y, ct_y), (out_p, ct_p)])

    def kn(self, i):
        return [f"k{i}_{r}" for r in self.R]

    def yn(self, i):
        return [f"Y{i}_{r}" for r in self.R]

    def stages(self, upto):
        """Stages 1..upto-1 from ``k0``: ``cb{i}`` (their combination), ``Y{i}``, ``T{i}``, ``k{i}``."""
        out = []
        for i in range(1, upto):
            for r in self.R:
                comb = _comb(self.a[i], [f"k{m}_{r}" for m in range(i)]) or "(real)0"
                out.append(f"const real cb{i}_{r} = {comb};")
                out.append(f"const real Y{i}_{r} = y_{r} + h * cb{i}_{r};")
            out.append(f"const real T{i} = ta + (real){float(self.c[i])!r} * h;")
            out.append(self.rhs(f"T{i}", self.yn(i), self.kn(i)))
        return out

    def forward(self) -> tuple[str, str, str]:
        """``(forward_step, record_step, rhs_eval)``: a replay step (``YB`` advanced where
        ``ACT``), a record step (``Y1``, ``ERR`` for the controller) and ``f`` at
        ``(TQ, YQ)`` for the lanes flagged in ``FRESH``."""
        R, s, d, b, e, fsal = self.R, self.s, self.d, self.b, self.e, self.fsal
        fw = list(self.common) + ["const real rtol = RT[j], atol = AT[j];"]
        fw += [_decl(self.kn(i)) for i in range(s)]
        if fsal:
            fw += [f"k0_{r} = K0[{r} * LANES + j];" for r in R]
        else:
            fw.append(self.rhs("ta", [f"y_{r}" for r in R], self.kn(0)))
        fw += self.stages(s)
        for r in R:
            if fsal:
                fw.append(f"const real y1_{r} = Y{s - 1}_{r};")
            else:
                fw.append(f"const real y1_{r} = y_{r} + h * {_comb(b, [f'k{m}_{r}' for m in range(s)])};")
            ec = _comb(e, [f"k{m}_{r}" for m in range(s)]) or "(real)0"
            fw.append(f"const real e_{r} = h * {ec};")
        fw.append("real acc = 0, bad = 0;")
        for r in R:
            fw.append(f"{{ const real sc = atol + rtol * rmax(std::abs(y_{r}), std::abs(y1_{r}));"
                      f" const real q = e_{r} / sc; acc += q * q; bad += y1_{r} - y1_{r}; }}")
        fw.append(f"real err = std::sqrt(acc / (real){d});")
        fw.append("bad += err - err;")
        fw.append("err = (bad == 0) ? err : (real)INFINITY;")
        # The record keeps y1, err and the last stage for its controller.
        rec = fw + [f"Y1[{r} * LANES + j] = y1_{r};" for r in R] + ["ERR[j] = err;"]
        if fsal:
            rec += [f"KL[{r} * LANES + j] = k{s - 1}_{r};" for r in R]
        fw.append("const bool act = ACT[j] != 0;")
        fw.append("EMAX[j] = act ? rmax(EMAX[j], err) : EMAX[j];")
        fw += [f"YB[{r} * LANES + j] = act ? y1_{r} : y_{r};" for r in R]
        if fsal:
            fw += [f"K0[{r} * LANES + j] = act ? k{s - 1}_{r} : k0_{r};" for r in R]
        ev = [*[f"const real y_{r} = YQ[{r} * LANES + j];" for r in R],
              *[f"const real p_{r} = PB[{r} * LANES + j];" for r in range(self.p_size)],
              "const real ta = TQ[j];",
              _decl(self.kn(0)), self.rhs("ta", [f"y_{r}" for r in R], self.kn(0)),
              *[f"FQ[{r} * LANES + j] = FRESH[j] ? k0_{r} : FQ[{r} * LANES + j];" for r in R]]
        return "\n      ".join(fw), "\n      ".join(rec), "\n      ".join(ev)

    def backward(self) -> str:
        """The reverse step: recompute the stages, then the adjoint recursion (``LAM``,
        ``CTP`` and, under ``TIMES``, the node-time cotangents ``CH``, ``CT``)."""
        R, p_size, s_used, a, b_eff, c = (self.R, self.p_size, self.s_used, self.a,
                                          self.b_eff, self.c)
        bw = list(self.common)
        bw += [f"const real l_{r} = LAM[{r} * LANES + j];" for r in R]
        bw += [_decl(self.kn(i)) for i in range(s_used)]
        bw.append(self.rhs("ta", [f"y_{r}" for r in R], self.kn(0)))
        bw += [f"const real Y0_{r} = y_{r};" for r in R]
        bw.append("const real T0 = ta;")
        bw += self.stages(s_used)
        for i in range(s_used - 1, -1, -1):
            for r in R:
                terms = []
                if b_eff[i] != 0.0:
                    terms.append(f"(real){float(b_eff[i])!r} * l_{r}")
                for m in range(i + 1, s_used):
                    if a[m, i] != 0.0:
                        terms.append(f"(real){float(a[m, i])!r} * mu{m}_{r}")
                bw.append(f"const real kap{i}_{r} = h * ({' + '.join(terms) if terms else '(real)0'});")
            bw.append(_decl([f"mu{i}_{r}" for r in R] + [f"ctt{i}"]
                            + [f"pi{i}_{r}" for r in range(p_size)]))
            bw.append(self.rhs_vjp(f"T{i}", self.yn(i), [f"kap{i}_{r}" for r in R], f"ctt{i}",
                                   [f"mu{i}_{r}" for r in R], [f"pi{i}_{r}" for r in range(p_size)]))
        # No `ACT` selects here: an idle lane's accumulators are never read again (its last
        # trajectory was finished before it went idle), and selects let the compiler sink the
        # stage VJPs into branches, which stops vectorisation once they call libm.
        for r in range(p_size):
            tot = " + ".join(f"pi{i}_{r}" for i in range(s_used))
            bw.append(f"CTP[{r} * LANES + j] += {tot};")
        # Node-time cotangents: needed only where a save time moved a node (``subst``); the
        # kernel instantiates the sweep with and without them (``TIMES``).
        bw.append("if constexpr (TIMES) {")
        ch = []
        for r in R:
            bs = _comb(b_eff, [f"k{m}_{r}" for m in range(s_used)]) or "(real)0"
            ch.append(f"({bs}) * l_{r}")
            ch += [f"cb{i}_{r} * mu{i}_{r}" for i in range(1, s_used)]
        ch += [f"(real){float(c[i])!r} * ctt{i}" for i in range(1, s_used) if c[i] != 0.0]
        bw.append(f"const real ch = {' + '.join(ch)};")
        bw.append(f"const real ctt = {' + '.join(f'ctt{i}' for i in range(s_used))};")
        bw.append("CH[j] = ch;")
        bw.append("CT[j] = ctt - ch;")
        bw.append("}")
        for r in R:
            dl = " + ".join(f"mu{i}_{r}" for i in range(s_used))
            bw.append(f"LAM[{r} * LANES + j] = l_{r} + ({dl});")
        return "\n      ".join(bw)


def _obj(names):
    return np.array(names, dtype=object)


def _decl(names):
    return "real " + ", ".join(names) + ";"


def _fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``@NAME@`` replaced by ``values[NAME]``, in one pass (the
    values, generated C++, are not searched for placeholders); every placeholder must have
    a value and every value a placeholder."""
    unmatched = set(_PLACEHOLDER.findall(template)) ^ values.keys()
    if unmatched:
        raise KeyError(f"kernel template placeholders without a value, or values without a "
                       f"placeholder: {sorted(unmatched)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def generate(f_flat, d: int, p_size: int, dtype, solver) -> str:
    """Full C++ source. ``f_flat(t, y (d,), p (p_size,))`` is the flattened vector field;
    ``solver`` an explicit Runge–Kutta pair (its step written from the tableau, `_Source`)
    or a Rosenbrock method: in loop form (the model's functions generated, the step fixed
    C++, `gradsolve.drivers.kernel.rosenbrock_source.LoopRosenbrockSource`) where its
    ``step`` is the tableau form's or Rosenbrock23's, else its ``step`` translated whole
    (`gradsolve.drivers.kernel.rosenbrock_source.RosenbrockSource`)."""
    from ..._solver.rosenbrock import AbstractRosenbrock
    from .rosenbrock_source import LoopRosenbrockSource, RosenbrockSource, loop_kind

    real = "double" if np.dtype(dtype) == np.float64 else "float"
    if isinstance(solver, AbstractRosenbrock):
        kind = RosenbrockSource if loop_kind(solver) is None else LoopRosenbrockSource
    else:
        kind = _Source
    src = kind(f_flat, d, p_size, dtype, solver)
    # the loop form's model functions first: the Jacobian's pattern is found there
    block = src.block() if hasattr(src, "block") else ""
    forward_step, record_step, rhs_eval = src.forward()
    values = dict(ROSENBROCK=block,
        REAL=real, FFI_TYPE="F64" if real == "double" else "F32", D=d, P=max(p_size, 1),
        S=src.s, LANES=LANES, FSAL=int(src.fsal), FORWARD_STEP=forward_step,
        RHS_EVAL=rhs_eval, RECORD_STEP=record_step, ERROR_ORDER=int(solver.error_order),
        BACKWARD_STEP=src.backward(), P_REAL=p_size, VECTOR_MATH=_VECTOR_MATH_DECLS,
        THREAD_GROUPS=1 if isinstance(solver, AbstractRosenbrock) else EXPLICIT_THREAD_GROUPS,
    )
    return getattr(src, "prefix", "") + _fill(_TEMPLATE, {k: str(v) for k, v in values.items()})
