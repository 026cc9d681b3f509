"""`load_petab`'s ``solver="auto"``: an explicit solver where the problem is not stiff.

An explicit step costs a fraction of a Rosenbrock step and runs on the compiled kernel, but a
stiff problem needs tens of thousands of them (its fastest decay rate, not its accuracy,
bounds the explicit step), a non-stiff one tens to hundreds. `probe_explicit` decides at one
point (the nominal parameters): first by the Jacobian's spectral radius, then by a bounded
`gradsolve.Tsit5` record.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

__all__ = ["probe_explicit"]


def probe_explicit(vector_field: Callable, y0, p, ts, t1: float, jumps, *, rtol: float,
                   atol: float, budget: int) -> tuple[gs.AbstractSolver | None, str]:
    """``(gradsolve.Tsit5() or None, why)``: `gradsolve.Tsit5` where it solves every
    trajectory (``y0 (n, d')``, ``p (n, n_p)``, saved at ``ts``, to ``t1``, with
    ``jumps``) within ``budget`` steps, else ``None`` (keep `gradsolve.Rodas5P`); ``why``
    is the sentence `PetabProblem.solver_reason` gives."""
    # First the cheap bound: an explicit step stays stable only while h * rho(J) is
    # below ~3.5 (Tsit5's stability interval on the negative real axis), so a
    # Jacobian spectral radius rho at the start already needing more than the budget
    # over the horizon is stiff without a probe solve (whose kernel build costs
    # a large model a minute).
    # one compiled program: run op by op, each operation of the Jacobian would be a
    # program of its own to compile
    jac = np.asarray(jax.jit(jax.vmap(jax.jacfwd(vector_field, argnums=1),
                                      in_axes=(None, 0, 0)))(0.0, y0, p))
    if not np.all(np.isfinite(jac)):
        # e.g. an estimated parameter without a nominal value: no point to probe at
        return None, ("gs.Rodas5P(): the stiffness probe needs a finite Jacobian at the "
                      "nominal parameters, and it is not finite there")
    rho = float(np.max(np.abs(np.linalg.eigvals(jac))))
    if not np.isfinite(rho) or rho * t1 / 3.5 > budget:
        return None, (f"gs.Rodas5P(): stiff (the Jacobian's spectral radius {rho:.3g} at "
                      f"t = 0 needs more than {budget} explicit steps over [0, {t1:g}])")
    mesh = gs.record(vector_field, 0.0, t1, y0, p, ts=jnp.asarray(ts), solver=gs.Tsit5(),
                     rtol=rtol, atol=atol, max_steps=budget, jumps=jumps, throw=False)
    steps = int(np.max(np.asarray(mesh.n_steps)))
    if bool(np.all(np.asarray(mesh.status) == 0)):
        return gs.Tsit5(), (f"gs.Tsit5(): not stiff at the nominal parameters (at most "
                            f"{steps} explicit steps per condition)")
    return None, (f"gs.Rodas5P(): stiff (gs.Tsit5() needed more than {budget} steps at the "
                  "nominal parameters)")
