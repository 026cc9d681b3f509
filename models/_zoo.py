"""The model zoo: one constructor per model, each returning an `ODEModel`.

Conventions shared by the zoo:

- parameters are scalars named as in the cited source (vectors where the source indexes
  them, e.g. HIRES's ``k``); positive rates have LogNormal priors whose median is the
  default value, so ``model.defaults`` are the source's values;
- the observation-noise scale is the parameter ``sigma`` (``sigma_obs`` for `lorenz`,
  whose own ``sigma`` is the Prandtl number); positive states get LogNormal noise
  (``sigma`` is then a relative error), signed states Normal noise;
- vector fields are module-level functions (one trajectory, ``y`` of shape ``(d,)``).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpyro.distributions as dist

from ._model import ODEModel

__all__ = [
    "lotka_volterra",
    "sir",
    "seir",
    "van_der_pol",
    "fitzhugh_nagumo",
    "lorenz",
    "pendulum",
    "robertson",
    "hires",
    "brusselator",
    "one_compartment_pk",
    "lorenz96",
]


def _lognormal_prior(median: float, s: float) -> dist.Distribution:
    """LogNormal with the given median and log-scale ``s``."""
    return dist.LogNormal(math.log(median), s)


def _lognormal_params(**spec: tuple[float, float]) -> dict:
    """``name=(default, s)`` -> ``{"priors": ..., "defaults": ...}`` for ``ODEModel(**...)``.

    Each prior is ``LogNormal(log default, s)``, whose median is exactly the default.
    """
    priors = {k: _lognormal_prior(m, s) for k, (m, s) in spec.items()}
    defaults = {k: float(m) for k, (m, _) in spec.items()}
    return {"priors": priors, "defaults": defaults}


def _lognormal_noise(params, y_pred, *, scale_key="sigma"):
    """Independent LogNormal(log y_pred, sigma) observations (states must be positive)."""
    return dist.LogNormal(jnp.log(y_pred), params[scale_key]).to_event(jnp.ndim(y_pred))


def _normal_noise(params, y_pred, *, scale_key="sigma"):
    """Independent Normal(y_pred, sigma) observations."""
    return dist.Normal(y_pred, params[scale_key]).to_event(jnp.ndim(y_pred))


# ------------------------------------------------------------------------------ Lotka–Volterra


def _lotka_volterra_field(t, y, p):
    x, z = y[0], y[1]
    return jnp.stack([p["alpha"] * x - p["beta"] * x * z, p["delta"] * x * z - p["gamma"] * z])


def lotka_volterra() -> ODEModel:
    r"""Lotka–Volterra predator–prey model.

    $$
    \dot x = \alpha x - \beta x y, \qquad \dot y = \delta x y - \gamma y
    $$

    States: ``x`` prey, ``y`` predator (dimensionless population sizes), ``y0 = (1, 1)`` at
    ``t0 = 0``; time dimensionless (one period is about 3.3 at the defaults).

    Parameters (rates, per unit time), defaults and priors:

    - ``alpha = 1.5`` prey growth rate, ``beta = 1`` predation rate, ``gamma = 3`` predator
      death rate, ``delta = 1`` predator growth per prey eaten; each
      ``LogNormal(log default, 0.5)``;
    - ``sigma = 0.1``: LogNormal observation noise of both states (relative error),
      prior ``LogNormal(log 0.1, 0.5)``.

    Sources: A. J. Lotka, *Elements of Physical Biology* (1925); V. Volterra (1926), Nature
    118:558. The default values are the standard example of SciML's DifferentialEquations.jl
    and Diffrax documentation (``alpha, beta, gamma, delta = 1.5, 1, 3, 1``, ``y0 = (1, 1)``).
    For the fitted lynx–hare variant see `models.lynx_hare`.

    Example:
        >>> model = models.lotka_volterra()
        >>> model.predict(model.defaults, jnp.linspace(0.0, 10.0, 21)).shape  # (21, 2): prey, predator
    """
    return ODEModel(
        name="lotka_volterra",
        vector_field=_lotka_volterra_field,
        **_lognormal_params(
            alpha=(1.5, 0.5), beta=(1.0, 0.5), gamma=(3.0, 0.5), delta=(1.0, 0.5), sigma=(0.1, 0.5)
        ),
        y0=jnp.array([1.0, 1.0]),
        t0=0.0,
        noise=_lognormal_noise,
        stiff=False,
        state_names=("prey", "predator"),
    )


# ------------------------------------------------------------------------------ epidemics


def _sir_field(t, y, p, *, N):
    S, I = y[0], y[1]
    infection = p["beta"] * S * I / N
    recovery = p["gamma"] * I
    return jnp.stack([-infection, infection - recovery, recovery])


def _negbin_noise(params, y_pred):
    """NegativeBinomial2(mean = predicted count, concentration = 1 / phi_inv)."""
    return dist.NegativeBinomial2(y_pred, 1.0 / params["phi_inv"]).to_event(jnp.ndim(y_pred))


def sir(N: float = 763.0, I0: float = 1.0) -> ODEModel:
    r"""SIR epidemic model (Kermack & McKendrick), counts in a closed population of ``N``.

    $$
    \dot S = -\beta S I / N, \qquad \dot I = \beta S I / N - \gamma I,
    \qquad \dot R = \gamma I
    $$

    States: susceptible ``S``, infected ``I``, recovered ``R`` (persons), ``S + I + R = N``
    is conserved; ``y0 = (N - I0, I0, 0)`` at ``t0 = 0``; time in days. Only ``I`` is
    observed (``observed = (1,)``), as counts with negative-binomial noise
    ``NegativeBinomial2(mean = I(t), concentration = 1 / phi_inv)``.

    Parameters, priors and defaults follow the Stan case study of Grinsztajn, Semenova,
    Margossian & Riou (2021), "Bayesian workflow for disease transmission modeling in Stan",
    Statistics in Medicine 40:6209, fitted to the 1978 boarding-school influenza data
    (``models.load_dataset("influenza_england_1978")``; ``N = 763``, one initial case):

    - ``beta`` (1/day) infection rate, prior ``Normal(2, 1)`` truncated at 0, default 1.73;
    - ``gamma`` (1/day) recovery rate, prior ``Normal(0.4, 0.5)`` truncated at 0, default
      0.54 (mean infectious period ``1/gamma`` ≈ 1.9 days, ``R0 = beta/gamma`` ≈ 3.2);
    - ``phi_inv`` (dimensionless) overdispersion, prior ``Exponential(5)``, default 0.08.

    The defaults are the maximum-likelihood values for that data set (computed with SciPy,
    rounded). Source of the model: W. O. Kermack & A. G. McKendrick (1927), Proc. R. Soc.
    Lond. A 115:700.

    Args:
        N: population size (persons), default 763 (the boarding school).
        I0: initial number of infected persons, default 1.

    Example:
        >>> data = models.load_dataset("influenza_england_1978")
        >>> model = models.sir()
        >>> model.predict(model.defaults, data.ts).shape  # (14, 1): infected
    """
    N = float(N)
    I0 = float(I0)
    if not 0 < I0 < N:
        raise ValueError(f"`I0` must lie in (0, N) = (0, {N}), got {I0}")
    return ODEModel(
        name="sir",
        vector_field=functools.partial(_sir_field, N=N),
        priors={
            "beta": dist.TruncatedNormal(2.0, 1.0, low=0.0),
            "gamma": dist.TruncatedNormal(0.4, 0.5, low=0.0),
            "phi_inv": dist.Exponential(5.0),
        },
        y0=jnp.array([N - I0, I0, 0.0]),
        t0=0.0,
        noise=_negbin_noise,
        observed=(1,),
        stiff=False,
        defaults={"beta": 1.73, "gamma": 0.54, "phi_inv": 0.08},
        state_names=("S", "I", "R"),
    )


def _seir_field(t, y, p):
    S, E, I = y[0], y[1], y[2]
    infection = p["beta"] * S * I
    onset = p["kappa"] * E
    recovery = p["gamma"] * I
    return jnp.stack([-infection, infection - onset, onset - recovery, recovery])


def seir(I0: float = 1e-4) -> ODEModel:
    r"""SEIR epidemic model, population fractions (``S + E + I + R = 1``).

    $$
    \dot S = -\beta S I, \quad \dot E = \beta S I - \kappa E, \quad
    \dot I = \kappa E - \gamma I, \quad \dot R = \gamma I
    $$

    States: susceptible, exposed (infected, not yet infectious), infectious, recovered, as
    fractions of the population; ``y0 = (1 - I0, 0, I0, 0)`` at ``t0 = 0``; time in days.
    Only ``I`` is observed (``observed = (2,)``), with LogNormal noise (relative error
    ``sigma``), e.g. prevalence surveys.

    Parameters (defaults; priors ``LogNormal(log default, 0.5)``):

    - ``beta = 0.5`` (1/day) transmission rate;
    - ``kappa = 0.2`` (1/day) rate of becoming infectious (mean latent period 5 days; the
      rate is often written sigma, renamed here to keep ``sigma`` for the noise);
    - ``gamma = 0.2`` (1/day) recovery rate (mean infectious period 5 days), so
      ``R0 = beta / gamma = 2.5``;
    - ``sigma = 0.1`` observation noise (relative).

    The defaults are illustrative values of an influenza-like infection, not a fit. Source:
    M. J. Keeling & P. Rohani, *Modeling Infectious Diseases in Humans and Animals*
    (Princeton, 2008), §2.5 (the SEIR model); R. M. Anderson & R. M. May, *Infectious
    Diseases of Humans* (Oxford, 1991). A typical horizon is ``[0, 150]`` days.

    Args:
        I0: initial infectious fraction of the population, default ``1e-4``.

    Example:
        >>> model = models.seir()
        >>> model.predict(model.defaults, jnp.linspace(0.0, 150.0, 31)).shape  # (31, 1): infectious fraction
    """
    I0 = float(I0)
    if not 0 < I0 < 1:
        raise ValueError(f"`I0` is a population fraction in (0, 1), got {I0}")
    return ODEModel(
        name="seir",
        vector_field=_seir_field,
        **_lognormal_params(beta=(0.5, 0.5), kappa=(0.2, 0.5), gamma=(0.2, 0.5), sigma=(0.1, 0.5)),
        y0=jnp.array([1.0 - I0, 0.0, I0, 0.0]),
        t0=0.0,
        noise=_lognormal_noise,
        observed=(2,),
        stiff=False,
        state_names=("S", "E", "I", "R"),
    )


# ------------------------------------------------------------------------------ oscillators


def _van_der_pol_field(t, y, p):
    x, v = y[0], y[1]
    return jnp.stack([v, p["mu"] * (1.0 - x * x) * v - x])


def van_der_pol(mu: float = 1.0) -> ODEModel:
    r"""Van der Pol oscillator.

    $$
    \dot x = v, \qquad \dot v = \mu (1 - x^2) v - x
    $$

    (``x'' - mu (1 - x^2) x' + x = 0``). States ``x``, ``v`` (dimensionless),
    ``y0 = (2, 0)`` at ``t0 = 0``. The limit cycle's period is about 6.66 at ``mu = 1`` and
    about ``(3 - 2 log 2) mu`` for large ``mu``, where the problem becomes stiff (relaxation
    oscillations): ``stiff = mu >= 100`` chooses ``gs.Rodas5P()``.

    Parameters: ``mu`` (damping strength), default the constructor's ``mu``, prior
    ``LogNormal(log mu, 0.1)``; ``sigma = 0.1`` Normal observation noise of both states,
    prior ``LogNormal(log 0.1, 0.5)``.

    Sources: B. van der Pol (1926), Phil. Mag. 2:978; E. Hairer & G. Wanner, *Solving
    Ordinary Differential Equations II* (2nd ed., Springer 1996), §IV.1 (the stiff case).

    Args:
        mu: damping strength: the default of parameter ``mu`` and its prior's median;
            ``mu >= 100`` marks the model stiff.

    Example:
        >>> model = models.van_der_pol(mu=1000.0)
        >>> model.predict(model.defaults, jnp.linspace(0.0, 3000.0, 31)).shape  # (31, 2); stiff: Rodas5P
    """
    mu = float(mu)
    if not mu > 0:
        raise ValueError(f"`mu` must be positive, got {mu}")
    return ODEModel(
        name="van_der_pol",
        vector_field=_van_der_pol_field,
        **_lognormal_params(mu=(mu, 0.1), sigma=(0.1, 0.5)),
        y0=jnp.array([2.0, 0.0]),
        t0=0.0,
        noise=_normal_noise,
        stiff=mu >= 100.0,
        state_names=("x", "v"),
    )


def _fitzhugh_nagumo_field(t, y, p):
    V, R = y[0], y[1]
    c = p["c"]
    return jnp.stack([c * (V - V**3 / 3.0 + R), -(V - p["a"] + p["b"] * R) / c])


def fitzhugh_nagumo() -> ODEModel:
    r"""FitzHugh–Nagumo neuron model in the form of Ramsay et al. (2007).

    $$
    \dot V = c\,(V - V^3/3 + R), \qquad \dot R = -(V - a + b R)/c
    $$

    States: ``V`` membrane voltage, ``R`` recovery variable (dimensionless);
    ``y0 = (-1, 1)`` at ``t0 = 0``; time dimensionless, typical horizon ``[0, 20]``.

    Parameters (defaults from Ramsay et al.; priors ``LogNormal(log default, 0.5)``):
    ``a = 0.2``, ``b = 0.2``, ``c = 3``; ``sigma = 0.5``, Normal observation noise of both
    states (the noise level of Ramsay et al.'s simulation study).

    Sources: R. FitzHugh (1961), Biophys. J. 1:445; J. Nagumo, S. Arimoto & S. Yoshizawa
    (1962), Proc. IRE 50:2061; J. O. Ramsay, G. Hooker, D. Campbell & J. Cao (2007),
    "Parameter estimation for differential equations: a generalized smoothing approach",
    J. R. Statist. Soc. B 69:741.

    Example:
        >>> model = models.fitzhugh_nagumo()
        >>> model.predict(model.defaults, jnp.linspace(0.0, 20.0, 41)).shape  # (41, 2): V, R
    """
    return ODEModel(
        name="fitzhugh_nagumo",
        vector_field=_fitzhugh_nagumo_field,
        **_lognormal_params(a=(0.2, 0.5), b=(0.2, 0.5), c=(3.0, 0.5), sigma=(0.5, 0.5)),
        y0=jnp.array([-1.0, 1.0]),
        t0=0.0,
        noise=_normal_noise,
        stiff=False,
        state_names=("V", "R"),
    )


def _lorenz_field(t, y, p):
    x, yy, z = y[0], y[1], y[2]
    return jnp.stack([p["sigma"] * (yy - x), x * (p["rho"] - z) - yy, x * yy - p["beta"] * z])


def lorenz() -> ODEModel:
    r"""Lorenz (1963) convection model, the classic chaotic attractor.

    $$
    \dot x = \sigma (y - x), \quad \dot y = x (\rho - z) - y, \quad \dot z = x y - \beta z
    $$

    States ``x, y, z`` (dimensionless convection amplitudes); ``y0 = (0, 1, 0)`` at
    ``t0 = 0``, Lorenz's own starting point. Trajectories are chaotic (largest Lyapunov
    exponent ≈ 0.9): long horizons amplify any perturbation.

    Parameters (Lorenz's values; priors ``LogNormal(log default, 0.1)``): ``sigma = 10``
    (Prandtl number), ``rho = 28`` (Rayleigh number ratio), ``beta = 8/3`` (aspect factor);
    ``sigma_obs = 1``, Normal observation noise of all states, prior ``LogNormal(0, 0.5)``.

    Source: E. N. Lorenz (1963), "Deterministic nonperiodic flow", J. Atmos. Sci. 20:130.

    Example:
        >>> model = models.lorenz()
        >>> model.predict(model.defaults, jnp.linspace(0.0, 5.0, 51)).shape  # (51, 3): x, y, z
    """
    return ODEModel(
        name="lorenz",
        vector_field=_lorenz_field,
        **_lognormal_params(
            sigma=(10.0, 0.1), rho=(28.0, 0.1), beta=(8.0 / 3.0, 0.1), sigma_obs=(1.0, 0.5)
        ),
        y0=jnp.array([0.0, 1.0, 0.0]),
        t0=0.0,
        noise=functools.partial(_normal_noise, scale_key="sigma_obs"),
        stiff=False,
        state_names=("x", "y", "z"),
    )


def _pendulum_field(t, y, p, *, g):
    theta, omega = y[0], y[1]
    return jnp.stack([omega, -(g / p["length"]) * jnp.sin(theta) - p["damping"] * omega])


def pendulum(g: float = 9.81, theta0: float = 1.0) -> ODEModel:
    r"""Damped (nonlinear) pendulum.

    $$
    \dot\theta = \omega, \qquad \dot\omega = -(g/L) \sin\theta - b\,\omega
    $$

    States: angle ``theta`` (rad) from the downward vertical and angular velocity ``omega``
    (rad/s); ``y0 = (theta0, 0)`` (released at rest, default 1 rad) at ``t0 = 0``; time in
    seconds. The energy per unit mass ``E = L^2 omega^2 / 2 + g L (1 - cos theta)``
    decreases: ``dE/dt = -b L^2 omega^2 <= 0``. Only the angle is observed
    (``observed = (0,)``), with Normal noise.

    Parameters (priors): ``length`` ``L = 1`` m (``LogNormal(0, 0.2)``); ``damping``
    ``b = 0.25`` 1/s, a linear (viscous) damping rate (``LogNormal(log 0.25, 0.5)``);
    ``sigma = 0.05`` rad, observation noise (``LogNormal(log 0.05, 0.5)``). The constant
    ``g = 9.81`` m/s² is a constructor argument. Defaults are illustrative (a 1 m pendulum,
    period ≈ 2 s, amplitude halving in ≈ 5.5 s).

    Source: e.g. S. H. Strogatz, *Nonlinear Dynamics and Chaos* (2nd ed., 2015), §6.7;
    J. R. Taylor, *Classical Mechanics* (2005), §5.4 (linear damping).

    Args:
        g: gravitational acceleration (m/s²), a known constant, default 9.81.
        theta0: initial angle (rad), released at rest, default 1.

    Example:
        >>> model = models.pendulum(theta0=0.5)
        >>> model.predict(model.defaults, jnp.linspace(0.0, 10.0, 101)).shape  # (101, 1): the angle
    """
    g = float(g)
    if not g > 0:
        raise ValueError(f"`g` must be positive, got {g}")
    return ODEModel(
        name="pendulum",
        vector_field=functools.partial(_pendulum_field, g=g),
        **_lognormal_params(length=(1.0, 0.2), damping=(0.25, 0.5), sigma=(0.05, 0.5)),
        y0=jnp.array([float(theta0), 0.0]),
        t0=0.0,
        noise=_normal_noise,
        observed=(0,),
        stiff=False,
        state_names=("theta", "omega"),
    )


# ------------------------------------------------------------------------------ chemistry


def _robertson_field(t, y, p):
    y1, y2, y3 = y[0], y[1], y[2]
    r1 = p["k1"] * y1
    r2 = p["k2"] * y2 * y2
    r3 = p["k3"] * y2 * y3
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


def robertson() -> ODEModel:
    r"""Robertson's autocatalytic reaction kinetics, the classic stiff test problem.

    $$
    \dot y_1 = -k_1 y_1 + k_3 y_2 y_3, \quad
    \dot y_2 = k_1 y_1 - k_2 y_2^2 - k_3 y_2 y_3, \quad
    \dot y_3 = k_2 y_2^2
    $$

    States: concentrations of three species (dimensionless); ``y0 = (1, 0, 0)`` at
    ``t0 = 0``; mass ``y1 + y2 + y3 = 1`` is conserved. Stiff (``gs.Rodas5P()``); typical
    horizons ``[0, 40]`` up to ``[0, 1e5]`` or beyond, with log-spaced save times.

    Parameters (rate constants, Robertson's values; priors ``LogNormal(log default, 0.1)``):
    ``k1 = 0.04``, ``k2 = 3e7``, ``k3 = 1e4``; ``sigma = 0.05``, LogNormal observation noise
    of all three states (relative error), prior ``LogNormal(log 0.05, 0.5)``. All states are
    positive only for ``t > 0``: observe at times after ``t0``.

    Sources: H. H. Robertson (1966), "The solution of a set of reaction rate equations", in
    *Numerical Analysis: an Introduction*, J. Walsh (ed.), Academic Press, 178–182;
    E. Hairer & G. Wanner, *Solving ODEs II* (2nd ed., 1996), §IV.1 and §IV.10 (ROBER).

    Example:
        >>> model = models.robertson()
        >>> model.predict(model.defaults, jnp.logspace(-4.0, 5.0, 19)).shape  # (19, 3); stiff: Rodas5P
    """
    return ODEModel(
        name="robertson",
        vector_field=_robertson_field,
        **_lognormal_params(k1=(0.04, 0.1), k2=(3e7, 0.1), k3=(1e4, 0.1), sigma=(0.05, 0.5)),
        y0=jnp.array([1.0, 0.0, 0.0]),
        t0=0.0,
        noise=_lognormal_noise,
        stiff=True,
        state_names=("y1", "y2", "y3"),
    )


# Reference rate constants of HIRES (Schäfer 1975; Hairer & Wanner II §IV.10; the
# "Test Set for IVP Solvers" of Mazzia & Magherini), k1..k12.
_HIRES_K = (1.71, 0.43, 8.32, 0.0007, 8.75, 10.03, 0.035, 1.12, 1.745, 280.0, 0.69, 1.81)


def _hires_field(t, y, p):
    k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12 = (p["k"][i] for i in range(12))
    y1, y2, y3, y4, y5, y6, y7, y8 = (y[i] for i in range(8))
    r = k10 * y6 * y8
    return jnp.stack(
        [
            -k1 * y1 + k2 * y2 + k3 * y3 + k4,
            k1 * y1 - k5 * y2,
            -k6 * y3 + k2 * y4 + k7 * y5,
            k3 * y2 + k1 * y3 - k8 * y4,
            -k9 * y5 + k2 * y6 + k2 * y7,
            -r + k11 * y4 + k1 * y5 - k2 * y6 + k11 * y7,
            r - k12 * y7,
            -r + k12 * y7,
        ]
    )


def hires() -> ODEModel:
    r"""HIRES: "High Irradiance RESponse" of photomorphogenesis (8 states, stiff).

    $$
    \begin{aligned}
    \dot y_1 &= -k_1 y_1 + k_2 y_2 + k_3 y_3 + k_4, &
    \dot y_2 &= k_1 y_1 - k_5 y_2, \\
    \dot y_3 &= -k_6 y_3 + k_2 y_4 + k_7 y_5, &
    \dot y_4 &= k_3 y_2 + k_1 y_3 - k_8 y_4, \\
    \dot y_5 &= -k_9 y_5 + k_2 y_6 + k_2 y_7, &
    \dot y_6 &= -k_{10} y_6 y_8 + k_{11} y_4 + k_1 y_5 - k_2 y_6 + k_{11} y_7, \\
    \dot y_7 &= k_{10} y_6 y_8 - k_{12} y_7, &
    \dot y_8 &= -k_{10} y_6 y_8 + k_{12} y_7
    \end{aligned}
    $$

    With the reference constants this is the problem of Hairer & Wanner: ``y1' = -1.71 y1 +
    0.43 y2 + 8.32 y3 + 0.0007``, ..., ``y8' = -280 y6 y8 + 1.81 y7``. States: amounts of the
    phytochrome forms and compounds of the reaction scheme (dimensionless);
    ``y0 = (1, 0, 0, 0, 0, 0, 0, 0.0057)`` at ``t0 = 0``; the standard horizon is
    ``[0, 321.8122]``. Stiff (``gs.Rodas5P()``).

    Parameters: ``k``, the 12 rate constants above (shape ``(12,)``), defaults
    ``(1.71, 0.43, 8.32, 0.0007, 8.75, 10.03, 0.035, 1.12, 1.745, 280, 0.69, 1.81)``, prior
    ``LogNormal(log k_ref, 0.1)`` elementwise; ``sigma = 0.05``, LogNormal observation noise
    of all states (relative), prior ``LogNormal(log 0.05, 0.5)``. States 2–7 start at 0:
    observe at times after ``t0``.

    Sources: E. Schäfer (1975), J. Math. Biol. 2:41; E. Hairer & G. Wanner, *Solving ODEs
    II* (2nd ed., 1996), §IV.10 (HIRES); F. Mazzia & F. Iavernaro, *Test Set for IVP
    Solvers* (HIRES).

    Example:
        >>> model = models.hires()
        >>> model.predict(model.defaults, jnp.linspace(1.0, 321.8122, 20)).shape  # (20, 8); stiff: Rodas5P
    """
    k_ref = jnp.array(_HIRES_K)
    return ODEModel(
        name="hires",
        vector_field=_hires_field,
        priors={
            "k": dist.LogNormal(jnp.log(k_ref), 0.1).to_event(1),
            "sigma": _lognormal_prior(0.05, 0.5),
        },
        y0=jnp.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0057]),
        t0=0.0,
        noise=_lognormal_noise,
        stiff=True,
        defaults={"k": k_ref, "sigma": 0.05},
        state_names=tuple(f"y{i}" for i in range(1, 9)),
    )


def _brusselator_field(t, y, p):
    x, z = y[0], y[1]
    x2z = x * x * z
    return jnp.stack([p["A"] + x2z - (p["B"] + 1.0) * x, p["B"] * x - x2z])


def brusselator() -> ODEModel:
    r"""Brusselator: Prigogine & Lefever's autocatalytic oscillating reaction.

    $$
    \dot x = A + x^2 y - (B + 1) x, \qquad \dot y = B x - x^2 y
    $$

    States: concentrations ``x``, ``y`` (dimensionless); ``y0 = (1.5, 3)`` at ``t0 = 0``,
    horizon ``[0, 20]`` (the BRUS problem of Hairer, Nørsett & Wanner). For ``B > 1 + A^2``
    the fixed point ``(A, B/A)`` is unstable and trajectories approach a limit cycle.

    Parameters (priors ``LogNormal(log default, 0.25)``): ``A = 1``, ``B = 3`` (the
    concentrations of the reactants held constant); ``sigma = 0.05``, LogNormal observation
    noise of both states (relative), prior ``LogNormal(log 0.05, 0.5)``.

    Sources: I. Prigogine & R. Lefever (1968), J. Chem. Phys. 48:1695; E. Hairer,
    S. P. Nørsett & G. Wanner, *Solving ODEs I* (2nd ed., 1993), §I.16 and §II.10.

    Example:
        >>> model = models.brusselator()
        >>> model.predict(model.defaults, jnp.linspace(0.0, 20.0, 41)).shape  # (41, 2): x, y
    """
    return ODEModel(
        name="brusselator",
        vector_field=_brusselator_field,
        **_lognormal_params(A=(1.0, 0.25), B=(3.0, 0.25), sigma=(0.05, 0.5)),
        y0=jnp.array([1.5, 3.0]),
        t0=0.0,
        noise=_lognormal_noise,
        stiff=False,
        state_names=("x", "y"),
    )


# ------------------------------------------------------------------------------ pharmacokinetics


def _pk_field(t, y, p):
    gut, conc = y[0], y[1]
    absorption = p["ka"] * gut  # mg/h
    elimination = p["Vmax"] * conc / (p["Km"] + conc)  # mg/h
    return jnp.stack([-absorption, (absorption - elimination) / p["V"]])


def one_compartment_pk(dose: float = 300.0) -> ODEModel:
    r"""One-compartment pharmacokinetics: first-order absorption, Michaelis–Menten elimination.

    $$
    \dot A_g = -k_a A_g, \qquad
    \dot C = \frac{k_a A_g}{V} - \frac{V_{max}}{V}\,\frac{C}{K_m + C}
    $$

    States: ``A_g`` amount of drug in the gut (mg) and ``C`` plasma concentration of the
    central compartment (mg/L); a single oral dose at ``t0 = 0``: ``y0 = (dose, 0)``
    (bioavailability 1); time in hours. Only ``C`` is observed (``observed = (1,)``), with
    LogNormal noise (proportional error ``sigma``); ``C(0) = 0``, so observe after ``t0``.

    Parameters (defaults; priors ``LogNormal(log default, 0.5)``, ``sigma``'s
    ``LogNormal(log 0.1, 0.5)``):

    - ``ka = 0.5`` 1/h, first-order absorption rate (illustrative);
    - ``Vmax = 20.4`` mg/h, maximum elimination rate;
    - ``Km = 4`` mg/L, Michaelis constant;
    - ``V = 49`` L, volume of distribution;
    - ``sigma = 0.1``, proportional observation error.

    ``Vmax``, ``Km``, ``V`` are the textbook population values of phenytoin, the classic
    drug with saturable elimination (``Vmax ≈ 7 mg/kg/day``, ``Km ≈ 4 mg/L``,
    ``V ≈ 0.7 L/kg``; M. E. Winter, *Basic Clinical Pharmacokinetics*, ch. on phenytoin;
    L. A. Bauer, *Applied Clinical Pharmacokinetics*), for a 70 kg adult in mg/h. The dose
    (mg, default 300, giving a peak concentration above ``Km``: the nonlinear regime) is a
    known constructor argument, not a parameter. Source of the model: M. Rowland &
    T. N. Tozer, *Clinical Pharmacokinetics and Pharmacodynamics* (4th ed., 2011), ch. 20
    (nonlinear kinetics).

    Args:
        dose: the oral dose (mg) at ``t0 = 0``, a known constant, default 300.

    Example:
        >>> model = models.one_compartment_pk(dose=300.0)
        >>> model.predict(model.defaults, jnp.linspace(0.5, 24.0, 48)).shape  # (48, 1): concentration
    """
    dose = float(dose)
    if not dose > 0:
        raise ValueError(f"`dose` must be positive (mg), got {dose}")
    return ODEModel(
        name="one_compartment_pk",
        vector_field=_pk_field,
        **_lognormal_params(
            ka=(0.5, 0.5), Vmax=(20.4, 0.5), Km=(4.0, 0.5), V=(49.0, 0.5), sigma=(0.1, 0.5)
        ),
        y0=jnp.array([dose, 0.0]),
        t0=0.0,
        noise=_lognormal_noise,
        observed=(1,),
        stiff=False,
        state_names=("gut_amount", "concentration"),
    )


# ------------------------------------------------------------------------------ Lorenz 96


def _lorenz96_field(t, y, p):
    return (jnp.roll(y, -1) - jnp.roll(y, 2)) * jnp.roll(y, 1) - y + p["F"]


def lorenz96(d: int = 40, F: float = 8.0) -> ODEModel:
    r"""Lorenz (1996) model of an atmospheric quantity on a latitude circle, ``d`` sites.

    $$
    \dot x_i = (x_{i+1} - x_{i-2})\, x_{i-1} - x_i + F, \qquad i = 1, \dots, d
    \ (\text{indices cyclic})
    $$

    States ``x_1..x_d`` (dimensionless); ``y0 = F`` everywhere except ``x_1 = F + 0.01``
    (the usual perturbation of the unstable equilibrium) at ``t0 = 0``; one time unit ≈ 5
    days. Chaotic for ``F = 8`` and ``d >= 5`` or so.

    Parameters: ``F`` forcing, default the constructor's ``F`` (8, Lorenz's value), prior
    ``LogNormal(log F, 0.1)``; ``sigma = 1``, Normal observation noise of all states, prior
    ``LogNormal(0, 0.5)``. ``d >= 4`` (Lorenz used 36 and 40; gradsolve targets up to 64).

    Source: E. N. Lorenz (1996), "Predictability — a problem partly solved", Proc. ECMWF
    Seminar on Predictability, vol. 1, 1–18; Lorenz & Emanuel (1998), J. Atmos. Sci. 55:399.

    Args:
        d: number of sites (states), ``d >= 4``, default 40.
        F: forcing: the default of parameter ``F`` and its prior's median, default 8.

    Example:
        >>> model = models.lorenz96(d=8)
        >>> model.predict(model.defaults, jnp.linspace(0.0, 2.0, 21)).shape  # (21, 8)
    """
    d = int(d)
    if d < 4:
        raise ValueError(f"`d` must be at least 4 (the stencil spans x_(i-2)..x_(i+1)), got {d}")
    F = float(F)
    if not F > 0:
        raise ValueError(f"`F` must be positive, got {F}")
    y0 = jnp.full((d,), F).at[0].add(0.01)
    return ODEModel(
        name="lorenz96",
        vector_field=_lorenz96_field,
        **_lognormal_params(F=(F, 0.1), sigma=(1.0, 0.5)),
        y0=y0,
        t0=0.0,
        noise=_normal_noise,
        stiff=False,
        state_names=tuple(f"x{i}" for i in range(1, d + 1)),
    )
