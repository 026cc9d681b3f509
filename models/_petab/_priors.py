"""PEtab v1 objective priors as one vectorised log density over the estimated parameters.

Each estimated parameter has one of PEtab's ``objectivePriorType`` values, or none (then
uniform on its parameter scale inside its bounds). ``normal``, ``laplace``, ``uniform``,
``logNormal`` and ``logLaplace`` are distributions of the linear value ``theta``;
``parameterScaleNormal``, ``parameterScaleLaplace`` and ``parameterScaleUniform`` of the
value on the parameter scale ``x``. Every prior is truncated to the bounds and renormalised
there (as ``petab.v1.priors.Prior``), so it integrates to one over them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import petab.v1 as petab

__all__ = ["Priors", "read_priors"]

# code: (PEtab name, family, on the parameter scale)
_TYPES = {
    "": (0, "uniform", True),                  # no prior: uniform in bounds on the scale
    "parameterScaleUniform": (1, "uniform", True),
    "parameterScaleNormal": (2, "normal", True),
    "parameterScaleLaplace": (3, "laplace", True),
    "uniform": (4, "uniform", False),
    "normal": (5, "normal", False),
    "laplace": (6, "laplace", False),
    "logNormal": (7, "normal", False),
    "logLaplace": (8, "laplace", False),
}
_LOG_TYPES = ("logNormal", "logLaplace")  # the family is that of log(theta)


def _scaled(v, scale: str) -> float:
    if scale == "lin":  # a linear-scale value may be negative: no log of it is taken
        return float(v)
    with np.errstate(divide="ignore"):
        return float({"log": np.log, "log10": np.log10}[scale](v))


def _cdf(family: str, v: float, a: float, b: float) -> float:
    """CDF at ``v`` of the family with location/scale (or lower/upper) ``a, b``."""
    if family == "normal":
        return 0.5 * math.erfc(-(v - a) / (b * math.sqrt(2.0)))
    if family == "laplace":
        z = (v - a) / b
        return 0.5 * math.exp(z) if z < 0 else 1.0 - 0.5 * math.exp(-z)
    raise AssertionError(family)


class Priors(NamedTuple):
    """The estimated parameters' priors, vectorised (``n_par`` entries each).

    Attributes:
        kind: ``(n_par,)`` 0 uniform (also "no prior"), 1 normal, 2 Laplace: the family of
            the variable ``v`` the prior is written in.
        variable: ``(n_par,)`` what ``v`` is: 0 the parameter-scale value ``x``, 1 the
            linear value ``theta``, 2 ``log(theta)``.
        a, b: ``(n_par,)`` location and scale (normal: mean, sd; Laplace: location, scale),
            or lower and upper end (uniform, already intersected with the bounds).
        log_mass: ``(n_par,)`` log of the untruncated prior's mass inside the bounds.
        given: ``(n_par,)`` True where the parameter table gives a prior.
    """

    kind: np.ndarray
    variable: np.ndarray
    a: np.ndarray
    b: np.ndarray
    log_mass: np.ndarray
    given: np.ndarray

    def log_density(self, x, theta, scale_code, lower, upper, jacobian: bool):
        """Per-parameter log prior density ``(n_par,)`` at ``x`` (on the parameter scale,
        ``theta`` its linear value; ``scale_code`` 0 lin, 1 log, 2 log10): the density of
        ``x`` (``jacobian=True``) or, for a prior written in ``theta`` or ``log(theta)``,
        that density at ``theta(x)`` (``jacobian=False``, PEtab's objective); ``-inf``
        outside the bounds."""
        var = jnp.asarray(self.variable)
        safe = jnp.where(theta > 0, theta, 1.0)  # log(theta) only used where theta > 0
        logt = jnp.where(scale_code == 2, x * jnp.log(10.0),
                         jnp.where(scale_code == 1, x, jnp.log(safe)))
        v = jnp.where(var == 0, x, jnp.where(var == 1, theta, logt))
        a, b, kind = jnp.asarray(self.a), jnp.asarray(self.b), jnp.asarray(self.kind)
        z = (v - a) / b
        lp = jnp.where(kind == 1, -0.5 * z**2 - jnp.log(b) - 0.5 * jnp.log(2 * jnp.pi),
                       jnp.where(kind == 2, -jnp.abs(z) - jnp.log(2 * b),
                                 -jnp.log(b - a)))
        lp = jnp.where((kind == 0) & ((v < a) | (v > b)), -jnp.inf, lp)
        lp = lp - jnp.asarray(self.log_mass)
        # density of theta from that of log(theta): d log(theta) / d theta = 1 / theta
        lp = jnp.where(var == 2, lp - logt, lp)
        if jacobian:
            # d theta / dx: 1 (lin), theta (log), theta ln 10 (log10)
            log_dtheta = jnp.where(scale_code == 0, 0.0, logt + jnp.where(
                scale_code == 2, jnp.log(jnp.log(10.0)), 0.0))
            lp = jnp.where(var == 0, lp, lp + log_dtheta)
        inside = (x >= lower) & (x <= upper)
        return jnp.where(inside, lp, -jnp.inf)


def read_priors(df, est_rows, scales) -> Priors:
    """`Priors` of the estimated rows ``est_rows`` of parameter table ``df`` (``scales``
    their ``parameterScale``). Unknown prior types and bad parameters are a ``ValueError``
    naming the parameter."""
    ids = list(df.index)
    cols = (petab.OBJECTIVE_PRIOR_TYPE, petab.OBJECTIVE_PRIOR_PARAMETERS)
    out = {k: [] for k in Priors._fields}
    for row, scale in zip(est_rows, scales):
        pid, rec = ids[row], df.iloc[row]
        ptype = rec.get(cols[0], "")
        ptype = "" if (ptype is None or (isinstance(ptype, float) and math.isnan(ptype))) \
            else str(ptype)
        if ptype not in _TYPES:
            raise ValueError(f"parameter '{pid}': objectivePriorType '{ptype}' is not one of "
                             f"{sorted(t for t in _TYPES if t)}")
        _, family, on_scale = _TYPES[ptype]
        lo_lin = float(rec[petab.LOWER_BOUND])
        hi_lin = float(rec[petab.UPPER_BOUND])
        params = rec.get(cols[1], "")
        if ptype == "" or (ptype == "parameterScaleUniform" and (
                params is None or (isinstance(params, float) and math.isnan(params))
                or params == "")):
            pa, pb = _scaled(lo_lin, scale), _scaled(hi_lin, scale)
        else:
            try:
                pa, pb = (float(s) for s in str(params).split(";"))
            except ValueError:
                raise ValueError(f"parameter '{pid}': objectivePriorParameters {params!r} "
                                 "must be two numbers separated by ';'") from None
        if on_scale:
            variable, lo, hi = 0, _scaled(lo_lin, scale), _scaled(hi_lin, scale)
        elif ptype in _LOG_TYPES:
            variable, lo, hi = 2, _scaled(lo_lin, "log"), _scaled(hi_lin, "log")
        else:
            variable, lo, hi = 1, lo_lin, hi_lin
        if family == "uniform":
            pa, pb = max(pa, lo), min(pb, hi)
            if not pb > pa:
                raise ValueError(f"parameter '{pid}': uniform prior {params!r} does not "
                                 "overlap the bounds")
            mass = 1.0
        else:
            if not pb > 0:
                raise ValueError(f"parameter '{pid}': objectivePriorParameters {params!r}: "
                                 "the scale must be positive")
            mass = _cdf(family, hi, pa, pb) - _cdf(family, lo, pa, pb)
            if not mass > 0:
                raise ValueError(f"parameter '{pid}': its {ptype} prior has no mass inside "
                                 "the bounds")
        out["kind"].append({"uniform": 0, "normal": 1, "laplace": 2}[family])
        out["variable"].append(variable)
        out["a"].append(pa)
        out["b"].append(pb)
        out["log_mass"].append(math.log(mass))
        out["given"].append(ptype != "")
    return Priors(**{k: np.asarray(v, dtype=bool if k == "given" else
                                    (int if k in ("kind", "variable") else float))
                     for k, v in out.items()})
