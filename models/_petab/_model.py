"""An `SbmlOdes` as the JAX functions one solve needs: the vector field and initial values.

The vector field's state is the ``d`` ODE states followed by one state per switch time of a
piecewise function of time (`Switches`); its relations on time read those states instead.
The functions are SymPy's ``lambdify`` of the right-hand sides (common subexpressions shared)
with array arguments unpacked by `scalars`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import sympy as sp

from ._sbml import TIME, SbmlOdes
from ._switches import Switches, switch_times
from ._tables import Conditions, Parameters

__all__ = ["ModelFunctions", "model_functions", "scalars"]


def scalars(v: jax.Array, used=None) -> list:
    """The entries of a 1-D array as 0-d arrays, through one ``lax.split``.

    The generated SymPy code unpacks its array arguments; iterating over an array slices
    each entry apart, and reverse mode turns every slice into a padded full-size
    cotangent summed with the others: a 15-species model's Rosenbrock step carried
    thousands of those, and its gradient compiled ~25 times slower than its value. A split
    transposes to one concatenation.

    ``used``: one bool per entry, or ``None`` (all). An entry not used comes back as
    ``None``, and each run of them stays one piece of the split: a model reads a few of
    its parameters in each expression, and every piece costs the traced program an
    operation (and its transpose a zero cotangent) in every step of a solve."""
    n = v.shape[0]
    if used is None:
        return [c.reshape(()) for c in jax.lax.split(v, (1,) * n)] if n else []
    used = [bool(u) for u in used]
    if not any(used):
        return [None] * n
    sizes: list[int] = []
    for u in used:
        if u or not sizes or used[sum(sizes) - 1]:
            sizes.append(1)  # a used entry, or the start of a run of unused ones
        else:
            sizes[-1] += 1
    out: list = []
    for size, piece in zip(sizes, jax.lax.split(v, sizes)):
        out += [piece.reshape(())] if used[len(out)] else [None] * size
    return out


def _tidy(expr: sp.Expr) -> sp.Expr:
    """``expr`` with its integral floats as integers (``1.0*k*x`` -> ``k*x``, ``x**2.0`` ->
    ``x**2``): SBML's stoichiometries and exponents arrive as floats, and each such
    factor would be one more multiplication (or a ``pow``) in every evaluation of the field
    and of its derivatives. The values are the same."""
    ints = {a: sp.Integer(int(a)) for a in expr.atoms(sp.Float)
            if float(a).is_integer() and abs(float(a)) < 2**53}
    return expr.xreplace(ints) if ints else expr


def _stack(out, dtype, extra: int = 0):
    """The generated code's outputs (arrays or Python numbers) and ``extra`` zeros as one
    ``(len(out) + extra,)`` array of ``dtype``."""
    return jnp.stack([jnp.asarray(v, dtype=dtype) for v in out]
                     + [jnp.zeros((), dtype)] * extra)


class ModelFunctions(NamedTuple):
    """The model as JAX functions.

    Attributes:
        vector_field: ``f(t, y (d + L,), p (n_p,)) -> (d + L,)``, the switch states'
            derivatives 0.
        y0: ``y0(p (n_p,)) -> (d,)`` the initial ODE states (no switch states).
        n_p: the model parameters (and constant compartment sizes) in ``p``.
        d: the ODE states.
        switches: the ``L`` switch times (`Switches`).
    """

    vector_field: Callable
    y0: Callable
    n_p: int
    d: int
    switches: Switches


def model_functions(odes: SbmlOdes, pars: Parameters, conds: Conditions) -> ModelFunctions:
    """``odes`` as `ModelFunctions`; a ``NotImplementedError`` for switch times that move
    with estimated parameters (`Switches.move`: ``pars`` and ``conds`` say which do) in a
    problem with pre-equilibration."""
    ysyms = [sp.Symbol(s) for s in odes.state_ids]
    psyms = [sp.Symbol(p) for p in odes.param_ids]
    d = len(ysyms)
    switch, relations = switch_times(odes)
    switches = Switches(switch, sp.lambdify([psyms], switch, modules="jax") if switch
                        else None, d)
    rhs = list(odes.rhs)
    if switch:
        if conds.has_preeq and switches.move(odes.param_ids, conds.sim_slots, pars.est_pos):
            raise NotImplementedError(
                f"switch times {switch} that depend on estimated parameters, in a "
                "problem with pre-equilibration")
        ssyms = [sp.Symbol(f"__switch_{j}") for j in range(len(switch))]
        repl = {}
        for rel, (j, after) in relations.items():
            repl[rel] = (ssyms[j] > 0.5) if after else (ssyms[j] < 0.5)
        rhs = [e.xreplace(repl) for e in rhs]
        ysyms = ysyms + ssyms
    rhs = [_tidy(e) for e in rhs]
    init = [_tidy(e) for e in odes.init]
    rhs_fn = sp.lambdify([TIME, ysyms, psyms], rhs, modules="jax", cse=True)
    init_fn = sp.lambdify([psyms], init, modules="jax", cse=True)
    L = len(switch)
    in_rhs = set().union(*(e.free_symbols for e in rhs))
    in_init = set().union(*(e.free_symbols for e in init))
    y_used = [s in in_rhs for s in ysyms]
    p_used = [s in in_rhs for s in psyms]
    p_init = [s in in_init for s in psyms]

    # Rematerialised: reverse mode through a solve keeps only the field's inputs per
    # stage and recomputes the rest, where it would otherwise carry every scalar
    # intermediate of the generated code from each step to its adjoint (hundreds of
    # separate arrays per step, each stacked over the steps and compiled on its own:
    # Boehm's objective and gradient 1,025 -> 810 XLA kernels, 16 -> 11 CPU s of compile).
    @jax.checkpoint
    def f(t, y, p):
        return _stack(rhs_fn(t, scalars(y, y_used), scalars(p, p_used)), y.dtype, L)

    def y0(p):
        return _stack(init_fn(scalars(p, p_init)), p.dtype)

    return ModelFunctions(f, y0, len(psyms), d, switches)
