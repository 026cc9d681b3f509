"""What a population fit refuses at the start, before any solve is compiled: FOCE-I in
float32 arithmetic, and observations its noise model gives no density (a LogNormal DV <= 0); and,
after the first evaluation, a start where some subject's likelihood is not finite, named
by its table rows."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro

from ..problem._observed import outside_support
from ..problem._policy import tightened

__all__ = ["float32_rtol", "check_observations", "refuse_start"]


def float32_rtol(method: str, rtol: float, where: str) -> float:
    """The relative tolerance a population fit runs at: ``rtol`` in float64; in float32
    (``gs.enable_x64()`` not called) a ``ValueError`` for FOCE-I, and for the Laplace
    method ``rtol`` raised to the 4-epsilon floor (`tightened`, as fitters and samplers
    do) with one warning.

    Measured on theophylline in float32 at the floor, against float64: the Laplace fit's
    OFV within 5e-6, estimates within 1e-6 and standard errors within 1e-3 relative (its
    gradient stalls near 1e-4, so ``converged`` stays False); FOCE-I's estimates within
    1e-3 but its gradient near 0.66 and its standard errors meaningless (lKa 0 against
    0.198, omega[0] 0.052 against 0.150; at ``rtol=1e-5`` the same), so FOCE-I refuses."""
    dtype = jnp.result_type(float)
    if dtype == jnp.float64:
        return rtol
    if method == "foce-i":
        raise ValueError(
            f"{where}: method='foce-i' needs float64: call gs.enable_x64() (or "
            "jax.config.update('jax_enable_x64', True)) at the start of the script. In "
            "float32 its objective's gradient carries rounding of order 0.1-1, so the "
            "optimiser cannot converge and the standard errors (differences of that "
            "gradient) are meaningless. method='laplace' runs in float32, more slowly.")
    used = tightened(rtol, 1.0, jnp.zeros((), dtype))
    warnings.warn(
        f"{where}: float32 arithmetic (call gs.enable_x64() at the start of the script for "
        f"float64): the solves run at rtol={used:.3g}"
        + (f" instead of {rtol:g} (4 machine epsilons, the least float32 can resolve)"
           if used != rtol else "")
        + "; the gradient stalls near 1e-4, so `converged` may stay False, though the "
        "estimates and standard errors came within 1e-3 of float64's on theophylline.",
        RuntimeWarning, stacklevel=3)
    return used


def _where_in_table(data, i: int, k: int) -> str:
    """``subject ID, row R (TIME t, DV y)`` of observation ``k`` of subject ``i``."""
    s = data.subjects[i]
    row = f", row {int(s.obs_rows[k])}" if s.obs_rows is not None else ""
    return f"subject {s.id!r}{row} (TIME {float(s.ts[k]):g}, DV {float(s.ys[k]):g})"


def check_observations(noise, data, ys, seen, cens, where: str) -> None:
    """``ValueError`` naming the first observation outside the support of the model's
    noise distribution ``noise`` (batch shape ``(S, K)``; e.g. a DV <= 0 under LogNormal
    noise, whose log-likelihood is -inf at every parameter value), counting the others.
    Measurements and left-censored limits (``cens`` 1: the noise's CDF there) are checked;
    right-censored limits (``cens`` -1) may lie anywhere."""
    bad = outside_support(noise, ys, seen & (cens != -1))
    if bad is None or not bad.any():  # (a support not checkable entry by entry: the start shows)
        return
    i, k = (int(a[0]) for a in np.nonzero(bad))
    more = int(bad.sum()) - 1
    raise ValueError(
        f"{where}: {_where_in_table(data, i, k)} lies outside the support of the noise "
        f"model ({type(noise).__name__}: {noise.support}), where its likelihood is zero at every "
        "parameter value" + (f"; {more} more observation(s) too" if more else "") +
        ". Mark such rows missing (MDV=1), or censored at their limit of quantification "
        "(CENS=1, DV the limit) where they lie below one, or choose a noise model that "
        "allows them.")


def refuse_start(pb, where: str) -> None:
    """``ValueError`` naming the subjects, and the table rows, where the log-likelihood
    is not finite at the start (population values ``pb.u0``, random effects 0): every
    mode search there fails and the optimiser cannot begin. Called only once the first
    evaluation found it so: the entries are found by a plain solve, compiled here."""
    model, data = pb.model, pb.data
    theta = pb.theta(pb.unflatten(jnp.asarray(pb.u0)), jnp.zeros((pb.S, pb.q)))
    pred = np.asarray(model.predict(theta, data))
    fill = jnp.asarray(np.where(pb.seen & np.isfinite(pred), pred, 1.0))
    with numpyro.validation_enabled(False):  # the invalid parameters are what is sought
        if pb.censored:
            lp = model.observations(theta, fill, pb.cens).entry_log_prob(jnp.asarray(pb.ys))
        else:
            lp = jnp.where(pb.seen, model.noise(theta, fill).log_prob(jnp.asarray(pb.ys0)),
                           0.0)
    lp = np.asarray(lp)
    bad = pb.seen & ~(np.isfinite(lp) & np.isfinite(pred))
    if bad.any():
        i, k = (int(a[0]) for a in np.nonzero(bad))
        more = int(bad.sum()) - 1
        raise ValueError(
            f"{where}: at the start (`init`, random effects 0) the log-likelihood of "
            f"{_where_in_table(data, i, k)} is {lp[i, k]:g}, the prediction there "
            f"{pred[i, k]:g}" + (f" ({more} more such observation(s))" if more else "") +
            ": the noise model has no finite density there (e.g. a proportional error "
            "with a zero prediction, or a log-normal one with a prediction <= 0). Give "
            "the noise model an additive part, mark the row missing (MDV=1), or start "
            "elsewhere (`init`).")
    raise ValueError(
        f"{where}: at the start (`init`, random effects 0) the joint log-density of some "
        "subjects is not finite, though every observation's log-likelihood is: the random "
        "effects' prior or the solve fails there. Start elsewhere (`init`).")
