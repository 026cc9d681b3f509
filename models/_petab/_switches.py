"""Switch times of piecewise functions of time, as states of the solve that jump there.

A piecewise function of time (and a time-triggered SBML event, which `read_sbml` turns into
one) switches branch at times that are expressions in the model parameters. Each switch
becomes a state ``s_j`` of the ODE (0 before, 1 after, ``ds_j/dt = 0``) that jumps by 1 at
its time: a solver's stages never see the switch inside a step (the step landing on it sees
``s_j = 0``, the next one ``s_j = 1``), and where the time is estimated the jump's node moves
with it, so the gradient w.r.t. a lag is the exact discrete adjoint. A solver stop at the
time would not do: the landing step's last stages are evaluated AT the switch time, on the
new branch, so a large switch (Isensee_JCB2018's stimuli) fails that step's error test down
to a step size underflow, and a moving stop carries no gradient.

`switch_times` finds the switches (symbolic, at load); `Switches` evaluates them per
trajectory (jittable: initial switch states, jumps, the states at a time).
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

from ._sbml import TIME, SbmlOdes
from ._tables import Slots

__all__ = ["switch_times", "Switches"]


def switch_times(odes: SbmlOdes) -> tuple[list[sp.Expr], dict]:
    """``(switch times, relations)``: the times where a piecewise function of time
    switches (expressions in the parameters), and each time relation mapped to
    ``(its switch's index, whether it holds after the switch)``. A relation that is not a
    comparison linear in time is warned about and left in place."""
    switch, relations = [], {}
    for e in odes.rhs:
        for pw in e.atoms(sp.Piecewise):
            for _, cond in pw.args:
                for rel in ([cond] if isinstance(cond, sp.core.relational.Relational)
                            else cond.atoms(sp.core.relational.Relational)):
                    if TIME not in rel.free_symbols:
                        continue
                    d = sp.expand(rel.lhs - rel.rhs)
                    a = d.diff(TIME)
                    rest = sp.simplify(d - a * TIME)
                    if a != 0 and not a.free_symbols and TIME not in rest.free_symbols \
                            and not isinstance(rel, (sp.Eq, sp.Ne)):
                        tau = -rest / a
                        if tau not in switch:
                            switch.append(tau)
                        greater = isinstance(rel, (sp.GreaterThan, sp.StrictGreaterThan))
                        relations[rel] = (switch.index(tau), greater == bool(a > 0))
                    else:
                        # stacklevel: the caller of load_petab (through PetabProblem and
                        # model_functions).
                        warnings.warn(f"piecewise condition '{rel}' is not a comparison "
                                      "linear in time: the solver does not stop "
                                      "at its switch", stacklevel=5)
    return switch, relations


class Switches(NamedTuple):
    """The ``L`` switch states of a model with ``d`` ODE states (``L`` may be 0).

    Attributes:
        exprs: the ``L`` switch times, SymPy in the model parameters.
        fn: ``fn(p)``, ``p (n_p,)`` the model parameters, gives the ``L`` times (JAX);
            ``None`` where ``L`` is 0.
        d: the ODE states before the switch states in ``y``.
    """

    exprs: list[sp.Expr]
    fn: Callable | None
    d: int

    def move(self, param_ids: list[str], slots: Slots, est_pos: np.ndarray) -> bool:
        """Whether a switch time depends on an estimated parameter in some condition (a
        lag time estimated per experiment, Beer_MolBioSystems2014's ``tau``): ``slots``
        the conditions' `Slots` over the model parameters ``param_ids`` (then the
        species), ``est_pos`` the estimated parameters' positions in ``theta``."""
        if not self.exprs:
            return False
        used = set()
        for e in self.exprs:
            used |= {s.name for s in e.free_symbols}
        cols = [j for j, pid in enumerate(param_ids) if pid in used]
        is_ref, idx, _, _ = slots
        return bool(np.any(is_ref[:, cols] & np.isin(idx[:, cols], est_pos)))

    def times(self, p):
        """Each trajectory's switch times ``(n, L)`` from its model parameters ``p``."""
        return jax.vmap(lambda pi: jnp.stack([jnp.asarray(v, p.dtype) * jnp.ones((), p.dtype)
                                              for v in self.fn(pi)]))(p)

    def jumps(self, p, t1):
        """``(initial switch states (n, L), jumps)``: each switch state starts at 1 where
        its time is <= 0 (already switched), else at 0 and jumps by 1 at its time (``(n,
        L)`` times, ``+inf`` past ``t1``; sizes ``(n, L, d + L)``)."""
        times = self.times(p)
        n, L = times.shape
        s0 = (times <= 0.0).astype(p.dtype)
        at = jnp.where((times > 0.0) & (times <= t1), times, jnp.inf)
        order = jnp.argsort(at, axis=1)
        at = jnp.take_along_axis(at, order, axis=1)
        sizes = jax.nn.one_hot(self.d + order, self.d + L, dtype=p.dtype)
        sizes = jnp.where(jnp.isfinite(at)[..., None], sizes, 0.0)
        return s0, (at, sizes)

    def append(self, y, p, t: float):
        """States ``y (n, d)`` with the switch states at time ``t`` appended (each 1 where
        its switch time is <= t), the vector field's input."""
        if not self.exprs:
            return y
        return jnp.concatenate([y, (self.times(p) <= t).astype(y.dtype)], axis=1)
