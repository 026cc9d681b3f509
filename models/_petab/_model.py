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


def scalars(v: jax.Array) -> list[jax.Array]:
    """The entries of a 1-D array as 0-d arrays, through one ``lax.split``.

    The generated SymPy code unpacks its array arguments; iterating over an array slices
    each entry apart, and reverse mode turns every slice into a padded full-size
    cotangent summed with the others: a 15-species model's Rosenbrock step carried
    thousands of those, and its gradient compiled ~25 times slower than its value. A split
    transposes to one concatenation."""
    n = v.shape[0]
    return [c.reshape(()) for c in jax.lax.split(v, (1,) * n)] if n else []


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
    rhs_fn = sp.lambdify([TIME, ysyms, psyms], rhs, modules="jax", cse=True)
    init_fn = sp.lambdify([psyms], odes.init, modules="jax", cse=True)
    L = len(switch)

    def f(t, y, p):
        out = rhs_fn(t, scalars(y), scalars(p))
        return jnp.stack([jnp.asarray(v, dtype=y.dtype) * jnp.ones((), y.dtype)
                          for v in out] + [jnp.zeros((), y.dtype)] * L)

    def y0(p):
        out = init_fn(scalars(p))
        return jnp.stack([jnp.asarray(v, dtype=p.dtype) * jnp.ones((), p.dtype)
                          for v in out])

    return ModelFunctions(f, y0, len(psyms), d, switches)
