"""Step-size control: error norm, PI(D) controller and the initial step.

The controller follows the form Diffrax documents for its ``PIDController`` (Söderlind's
digital filters written on inverse scaled errors):

    h_{n+1} = h_n * safety * r_n^{(p + i)/k} * r_{n-1}^{-p/k},   r = 1 / ||err||,

clipped to ``[factormin, factormax]`` (capped at ``safety`` after a rejection),
with ``k`` the solver's error order. ``pcoeff=0, icoeff=1`` (the default, as in Diffrax) is
the classical I-controller; ``pcoeff=0.4, icoeff=0.3`` is Hairer's PI setting for DOPRI5.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


class PIDController(eqx.Module):
    """Coefficients of the adaptive step-size controller used by `gradsolve.record`.

    Args:
        pcoeff: proportional coefficient (0 gives an I-controller).
        icoeff: integral coefficient.
        safety: safety factor applied to every proposed step.
        factormin: smallest allowed shrink factor after a rejection.
        factormax: largest allowed growth factor after an acceptance.

    Example:
        >>> mesh = gs.record(f, 0., 1., y0, p, controller=gs.PIDController(pcoeff=0.4, icoeff=0.3))
    """

    pcoeff: float = eqx.field(static=True, default=0.0)
    icoeff: float = eqx.field(static=True, default=1.0)
    safety: float = eqx.field(static=True, default=0.9)
    factormin: float = eqx.field(static=True, default=0.2)
    factormax: float = eqx.field(static=True, default=10.0)

    def __check_init__(self):
        if not (0 < self.safety <= 1):
            raise ValueError(f"`safety` must lie in (0, 1], got {self.safety}.")
        if not (0 < self.factormin < 1 <= self.factormax):
            raise ValueError("`factormin` must lie in (0, 1) and `factormax` be >= 1.")

    def factor(
        self,
        err: Float[Array, " n"],
        err_prev: Float[Array, " n"],
        accept: Array,
        error_order: int,
    ) -> Float[Array, " n"]:
        """Multiplicative change of the step size after a step with scaled error ``err``."""
        err = jax.lax.stop_gradient(err)
        inv = 1.0 / jnp.maximum(err, 1e-10)  # err == 0: grow by factormax
        inv_prev = 1.0 / jnp.maximum(err_prev, 1e-10)
        k = float(error_order)
        fac = self.safety * inv ** ((self.pcoeff + self.icoeff) / k)
        if self.pcoeff != 0:
            fac = fac * inv_prev ** (-self.pcoeff / k)
        # Accepted steps may shrink too (Hairer's choice): a step accepted with error
        # near 1 that kept its size would likely be rejected next. Diffrax keeps it
        # (factor >= 1 on acceptance), which costs it more rejections on stiff problems.
        fmin = self.factormin
        fmax = jnp.where(accept, self.factormax, self.safety)
        fac = jnp.where(jnp.isfinite(err), fac, self.factormin)
        return jnp.clip(fac, fmin, fmax)


def error_norm(
    y_error: Float[Array, "*n d"],
    y0: Float[Array, "*n d"],
    y1: Float[Array, "*n d"],
    rtol,
    atol,
) -> Float[Array, "*n"]:
    """RMS norm of the error scaled by ``atol + rtol * max(|y0|, |y1|)`` (Hairer II.4).

    ``<= 1`` means the step is accepted. Non-finite candidates give ``inf``.
    """
    scale = atol + rtol * jnp.maximum(jnp.abs(y0), jnp.abs(y1))
    ratio = y_error / scale
    err = jnp.sqrt(jnp.mean(ratio * ratio, axis=-1))
    finite = jnp.all(jnp.isfinite(y1), axis=-1) & jnp.isfinite(err)
    return jnp.where(finite, err, jnp.inf)


def initial_step(f, t0, y0, params, error_order: int, rtol, atol):
    """Starting step size for one trajectory (Hairer, Norsett & Wanner, *Solving ODEs I*, II.4).

    Two evaluations of ``f``: an explicit Euler probe estimates the second derivative.
    """

    def rms(x):
        return jnp.sqrt(jnp.mean(x * x))

    scale = atol + jnp.abs(y0) * rtol
    f0 = f(t0, y0, params)
    d0 = rms(y0 / scale)
    d1 = rms(f0 / scale)
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = jnp.where(small, 1e-6, 0.01 * d0 / jnp.where(small, 1.0, d1))
    f1 = f(t0 + h0, y0 + h0 * f0, params)
    d2 = rms((f1 - f0) / scale) / h0
    dmax = jnp.maximum(d1, d2)
    h1 = jnp.where(
        dmax <= 1e-15,
        jnp.maximum(1e-6, h0 * 1e-3),
        (0.01 / jnp.where(dmax <= 1e-15, 1.0, dmax)) ** (1.0 / error_order),
    )
    h = jnp.minimum(100 * h0, h1)
    return jnp.where(jnp.isfinite(h), h, 1e-6)


def check_controller(controller, where: str) -> PIDController:
    """``controller`` as a `PIDController` (``None``: the default), or a ``ValueError``.

    A Diffrax controller is refused rather than half-used: gradsolve takes the tolerances as
    ``rtol=``/``atol=`` arguments (they also scale `Solution.error_ratio` and the replay's
    re-record test), and the mesh is always adaptive. The message gives the translation.
    """
    if controller is None:
        return PIDController()
    if isinstance(controller, PIDController):
        return controller
    name = type(controller).__name__
    if name == "PIDController" and hasattr(controller, "rtol"):
        coeffs = ", ".join(
            f"{k}={getattr(controller, k)}" for k in ("pcoeff", "icoeff") if hasattr(controller, k)
        )
        hint = (
            f" Translate diffrax.PIDController(rtol={controller.rtol}, atol={controller.atol}, "
            f"...) to rtol={controller.rtol}, atol={controller.atol}, "
            f"controller=gs.PIDController({coeffs})."
        )
        if getattr(controller, "dcoeff", 0) not in (0, 0.0):
            hint += " (The derivative coefficient `dcoeff` is not supported.)"
    elif name == "ConstantStepSize":
        hint = (" gradsolve always records an adaptive mesh; for fixed steps call "
                "diffrax.diffeqsolve directly.")
    else:
        hint = ""
    shown = f"{type(controller).__module__.split('.')[0]}.{name}"
    raise ValueError(
        f"{where}: `controller` must be a gs.PIDController or None, got {shown}.{hint}"
    )
