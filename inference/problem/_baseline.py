"""The plain-NumPyro-on-Diffrax baseline: the same model, solved by ``diffrax.diffeqsolve``.

This is what a user writes without gradsolve (Tsit5 with a PID controller, Diffrax's
default ``RecursiveCheckpointAdjoint``); the tests use it as the independent reference for
`inference.sample` and the benchmarks time against it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._problem import MAX_STEPS, TOLERANCES


def diffrax_numpyro_model(model, data, *, rtol: float = TOLERANCES.rtol,
                          atol: float = TOLERANCES.atol, max_steps: int = MAX_STEPS):
    """NumPyro program of ``model`` given ``data`` whose ODE is solved by Diffrax.

    Args:
        model: a `models.ODEModel`.
        data: a `models.Dataset`.
        rtol, atol, max_steps: Diffrax ``PIDController`` tolerances and step cap.

    Returns:
        A zero-argument NumPyro model function. A failed solve contributes ``-inf``.

    Example:
        >>> mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(diffrax_numpyro_model(m, data)), ...)
    """
    import diffrax
    import numpyro

    ts = jnp.asarray(data.ts, dtype=float)
    t_end = float(np.asarray(data.ts)[-1])
    ys = jnp.asarray(data.ys)
    term = diffrax.ODETerm(lambda t, y, args: model.vector_field(t, y, args))

    def program():
        p = {k: numpyro.sample(k, d) for k, d in model.priors.items()}
        sol = diffrax.diffeqsolve(
            term, diffrax.Tsit5(), model.t0, t_end, None, model.initial_state(p), args=p,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=max_steps, throw=False,
        )
        pred = model.observe(p, ts, sol.ys)
        ok = jnp.all(jnp.isfinite(pred))  # a failed solve: -inf, as users of Diffrax do
        numpyro.factor("solver_failure", jnp.where(ok, 0.0, -jnp.inf))
        numpyro.sample("obs", model.observations(p, jnp.where(ok, pred, 1.0)), obs=ys)

    return program
