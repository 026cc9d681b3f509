"""What a population fit refuses at the start, before any solve is compiled: float32
arithmetic, and observations its noise model gives no density (a LogNormal DV <= 0); and,
after the first evaluation, a start where some subject's likelihood is not finite, named
by its table rows."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro

__all__ = ["check_float64", "check_observations", "refuse_start"]


def check_float64(where: str) -> None:
    """``ValueError`` unless JAX computes in float64 (``gs.enable_x64()``).

    Why a population fit refuses float32 rather than running at its 4-epsilon tolerance
    floor: its outer optimiser differentiates an objective that contains each subject's
    conditional mode and Hessian, and its standard errors are central differences of that
    gradient. In float32 the gradient's rounding is of order 0.1-1, so the optimiser cannot
    converge and the standard errors are meaningless (theophylline, FOCE-I at the floor:
    OFV and estimates within 1e-3 of float64, but max |gradient| 0.66 against 4e-8, and
    the SE of lKa 0 against 0.198, of omega[0] 0.052 against 0.150)."""
    if jnp.result_type(float) == jnp.float64:
        return
    raise ValueError(
        f"{where}: population fits need float64: call gs.enable_x64() (or "
        "jax.config.update('jax_enable_x64', True)) at the start of the script. In float32 "
        "the objective's gradient carries rounding of order 0.1-1, so the optimiser cannot "
        "converge and the standard errors (differences of that gradient) are meaningless.")


def _where_in_table(data, i: int, k: int) -> str:
    """``subject ID, row R (TIME t, DV y)`` of observation ``k`` of subject ``i``."""
    s = data.subjects[i]
    row = f", row {int(s.obs_rows[k])}" if s.obs_rows is not None else ""
    return f"subject {s.id!r}{row} (TIME {float(s.ts[k]):g}, DV {float(s.ys[k]):g})"


def _elementwise(constraint):
    """The per-entry constraint under NumPyro's ``independent`` wrappers."""
    while hasattr(constraint, "base_constraint"):
        constraint = constraint.base_constraint
    return constraint


def check_observations(noise, data, ys, seen, cens, where: str) -> None:
    """``ValueError`` naming the first observation outside the support of the model's
    noise distribution ``noise`` (batch shape ``(S, K)``; e.g. a DV <= 0 under LogNormal
    noise, whose log-likelihood is -inf at every parameter value), counting the others.
    Measurements and left-censored limits (``cens`` 1: the noise's CDF there) are checked;
    right-censored limits (``cens`` -1) may lie anywhere."""
    checked = seen & (cens != -1)
    values = jnp.asarray(np.where(checked, ys, np.nan))
    constraint = _elementwise(noise.support)
    try:
        inside = np.asarray(constraint(values))
    except Exception:  # a support that cannot be checked entry by entry: the start shows
        return
    if inside.shape != ys.shape:
        return
    bad = checked & ~inside
    if not bad.any():
        return
    i, k = (int(a[0]) for a in np.nonzero(bad))
    more = int(bad.sum()) - 1
    raise ValueError(
        f"{where}: {_where_in_table(data, i, k)} lies outside the support of the noise "
        f"model ({type(noise).__name__}: {constraint}), where its likelihood is zero at every "
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
