"""What inference needs from a model (`InferenceModel`), and a model bound to its data.

`InferenceModel` is the interface between `models` and `inference`: the attributes and
methods below, no others. `models.ODEModel` satisfies it; so does any user class that
provides them (checked with ``isinstance``, structurally). `inference` never looks a
model's attribute up by name.

`Problem` binds a model to a data set and to how its ODE is solved, and holds the ONE
log-posterior path of the package: `Problem.log_posterior` (log prior plus the likelihood
of the predicted states) is what `inference.log_density`, the NumPyro program's likelihood
(`Problem.predictions`), `inference.fit`, `inference.fit_least_squares` and
`inference.sample` evaluate, whether the states come from an adaptive solve
(``gs.solve``) or from a replay of a recorded mesh (``gs.replay``).

Default tolerances (`TOLERANCES`, ``rtol = 1e-6``, ``atol = 1e-8``) are those of every
function of `inference`: ``rtol`` is the core's (``gs.solve``); ``atol = 1e-8`` is that of
the Diffrax baseline (`inference.diffrax_numpyro_model`) every sampler test and benchmark
compares against, so both sides solve the same problem. At these tolerances the lynx–hare
log density is within ~4e-5 of its rtol = 1e-12 value, far below the posterior's scale.
(`models.ODEModel.solve`/``simulate`` default to 1e-8/1e-10 on purpose: synthetic data
drawn at the fitting tolerance would share the fit's discretisation error.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

import gradsolve as gs

from ._abstract import AbstractProblem
from ._policy import tightened
from .._checkpoint import digest
from ._space import ParamSpace
from .._transfer import to_device

__all__ = ["InferenceModel", "Problem", "Tolerances", "TOLERANCES"]


class Tolerances(NamedTuple):
    """The default ODE tolerances of every function of `inference`, in one place
    (`inference.TOLERANCES` documents them and why).

    Attributes:
        rtol, atol: fits, least squares, samplers, profiles and log densities of an ODE
            model or a program (a population model's program included).
        population_rtol, population_atol: `inference.fit_population` and its profiles.
    """

    rtol: float = 1e-6
    atol: float = 1e-8
    population_rtol: float = 1e-8
    population_atol: float = 1e-10


TOLERANCES = Tolerances()
MAX_STEPS = 4096  # default step capacity of a record or a solve
SITE_MAX_STEPS = 16384
"""Default step capacity of an `inference.ode` site (a population's ensemble). Explicit
solvers take steps no longer than a subject's fastest rate allows, and a population's
posterior reaches rates far beyond its typical ones: theophylline's absorption rates reach
150/h among 4,000 draws and NUTS trajectories go further, where Tsit5 needs about 7.6
steps per unit of rate over 25 h (4,096 steps at 560/h). A solve that runs out of steps
gives the sampler a cliff of -inf and a divergence. On the compiled kernel each subject
takes only the steps it needs, so the larger capacity costs ~20 % of a 12-subject
gradient (0.21 against 0.25 ms at 4 chains); on the XLA drivers a replay under ``vmap``
runs every slot, so pass a smaller ``max_steps`` there."""


@runtime_checkable
class InferenceModel(Protocol):
    """The interface between a model and `inference` (`models.ODEModel` satisfies it).

    Shapes: ``d`` states, ``m`` observed quantities (``len(observed_names)``: observed
    states, or the outputs of an observation function), ``k`` observation times; a parameter dict
    has the keys of ``priors``, each leaf of the prior's shape, or with a leading axis
    ``n`` for an ensemble.

    Example:
        >>> isinstance(models.lynx_hare(), inference.InferenceModel)   # True
        >>> inference.log_density(MyModel(), data, params)  # any class with these members
    """

    name: str
    priors: Mapping[str, dist.Distribution]   # parameter name -> NumPyro prior
    defaults: Mapping[str, Any]               # a parameter dict (inside the support)
    t0: float                                 # initial time
    observed: tuple[int, ...]                 # indices of observed states; () if observe
                                              # applies an observation function
    observed_names: tuple[str, ...]           # the m observed quantities (data columns)
    vector_field: Callable                    # f(t, y (d,), params) -> (d,)
    solver: Any                               # the default gradsolve solver

    def check_params(self, params: Mapping[str, Any]) -> int | None:
        """Validate a parameter dict (ValueError); its ensemble size or ``None``."""

    def initial_state(self, params: Mapping[str, Any]) -> jax.Array:
        """``y0``: ``(d,)``, or ``(n, d)`` for an ensemble."""

    def sample_prior(self, key: jax.Array, n: int | None = None) -> dict[str, jax.Array]:
        """One parameter dict drawn from the priors, or an ensemble of ``n``."""

    def log_prior(self, params: Mapping[str, Any]) -> jax.Array:
        """Sum of the priors' log densities: scalar, or ``(n,)``."""

    def observe(self, params: Mapping[str, Any], ts: Any, ys: jax.Array) -> jax.Array:
        """The ``m`` observed quantities of solved states at times ``ts (k,)``: ``ys (k, d)
        -> (k, m)``, ``(n, k, d) -> (n, k, m)`` (an ensemble of ``params``)."""

    def log_likelihood_from_prediction(self, params, y_pred, ys) -> jax.Array:
        """``log p(ys (k, m) | y_pred)``: scalar, or ``(n,)`` for ``y_pred (n, k, m)``."""

    def observations(self, params, y_pred) -> dist.Distribution:
        """The distribution of ONE trajectory's observations, event shape ``(k, m)``."""

    def noise(self, params, y_pred) -> dist.Distribution:
        """The noise model itself (without the skipping of missing observations)."""


def _positive(name: str, v) -> None:
    if not (isinstance(v, (int, float, np.floating, np.integer)) and v > 0):
        raise ValueError(f"`{name}` must be a positive number, got {v!r}")


class Problem(AbstractProblem):
    """A model, its data and how its ODE is solved: the pieces every fitter and sampler
    evaluates.

    Fitters and samplers hand it flat unconstrained parameters ``u`` of shape ``(D,)`` or
    ``(n, D)`` (`ParamSpace`); it maps them to the constrained dict once, solves or replays,
    and returns log densities of shape ``()`` or ``(n,)``.

    Args:
        model: an `InferenceModel` (e.g. a `models.ODEModel`).
        data: a `models.Dataset`: ``ts (k,)`` concrete and sorted, ``ys (k, m)`` (NaN marks
            a missing observation; ``ys`` may be traced).
        solver: a gradsolve solver (``None``: the model's).
        rtol, atol: ODE tolerances; max_steps: step capacity of records and solves.
    """

    count_failures_by_default = True

    def __init__(self, model, data, *, solver=None, rtol: float = TOLERANCES.rtol,
                 atol: float = TOLERANCES.atol, max_steps: int = MAX_STEPS):
        if not isinstance(model, InferenceModel):
            raise ValueError(
                "`model` must be a models.ODEModel (or provide what "
                f"inference.InferenceModel lists), got {type(model).__name__}"
            )
        ts, ys = _checked_data(model, data)
        _positive("rtol", rtol)
        _positive("atol", atol)
        if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
            raise ValueError(f"`max_steps` must be a positive int, got {max_steps!r}")
        self.model = self.source = model
        self.solver = model.solver if solver is None else solver
        self.rtol, self.atol, self.max_steps = float(rtol), float(atol), int(max_steps)
        self.t0, self.t1 = float(model.t0), float(ts[-1])
        self.ts_np = ts
        self.ys_obs = jnp.asarray(ys, dtype=jnp.result_type(float))
        self.space = ParamSpace(model.priors)
        self._constrained = jax.jit(self.space.from_unconstrained)  # one program per shape

    def sample_starts(self, key: jax.Array, n: int) -> np.ndarray:
        """``(n, D)`` draws from the model's priors, mapped to ``u`` (`inference.fit`'s
        starts where no ``init`` is given)."""
        from ._starts import prior_draws

        return prior_draws(self.model, self.space, key, int(n))

    def fingerprint(self) -> dict:
        """What a checkpoint must share with this problem to be resumed by it: the model's
        name and dimension, the data (a digest of ``ts`` and ``ys``), the solver, the
        tolerances and the step capacity."""
        return dict(model=self.model.name, dim=self.space.dim,
                    data=digest((self.ts_np, np.asarray(self.ys_obs))),
                    solver=repr(self.solver), rtol=self.rtol, atol=self.atol,
                    max_steps=self.max_steps)

    @property
    def ts(self) -> jax.Array:
        return jnp.asarray(self.ts_np, dtype=jnp.result_type(float))

    # --------------------------------------------------------------------- solving
    def _args(self, x: Mapping[str, jax.Array]) -> tuple:
        return (self.model.vector_field, self.t0, self.t1, self.model.initial_state(x), x)

    def record(self, u: jax.Array, tol_factor: float = 1.0) -> gs.Mesh:
        """``gs.record`` at ``u (D,)`` or ``(n, D)``, at ``tol_factor`` times the
        tolerances (fitters record tighter than they test; see `MeshPolicy`)."""
        x = self._constrained(to_device(u))
        args = self._args(x)
        return gs.record(*args, ts=self.ts, solver=self.solver,
                         rtol=tightened(self.rtol, tol_factor, args[3]),
                         atol=self.atol * tol_factor,
                         max_steps=self.max_steps, throw=False)

    records_in_place = True

    def record_in_place(self, u: jax.Array, mesh: gs.Mesh, tol_factor: float = 1.0) -> gs.Mesh:
        """`record` at ``u (n, D)`` under ``jit``, at ``mesh``'s step capacity (see
        `AbstractProblem.record_in_place`; ``mesh.where`` casts the rows it takes)."""
        args = self._args(self.space.from_unconstrained(u))
        return gs.record(*args, ts=self.ts, solver=self.solver,
                         rtol=tightened(self.rtol, tol_factor, args[3]),
                         atol=self.atol * tol_factor, max_steps=mesh.capacity, throw=False)

    def solve(self, x: Mapping[str, jax.Array], max_steps: int | None = None) -> gs.Solution:
        """``gs.solve`` (record + replay: the adaptive solution) at a constrained dict."""
        return gs.solve(*self._args(x), ts=self.ts, solver=self.solver, rtol=self.rtol,
                        atol=self.atol, max_steps=max_steps or self.max_steps, throw=False)

    def states(self, x: Mapping[str, jax.Array], mesh: gs.Mesh | None = None,
               max_steps: int | None = None) -> gs.Solution:
        """The solution at a constrained dict ``x``: ``gs.replay`` of ``mesh`` (on
        `replay_driver`) or, with ``mesh=None``, `solve`."""
        if mesh is None:
            return self.solve(x, max_steps)
        return gs.replay(self.model.vector_field, mesh, self.model.initial_state(x), x,
                         driver=self.replay_driver)

    @property
    def replay_driver(self) -> gs.drivers.AbstractDriver:
        """The driver this problem's replays run on: `gs.drivers.Auto`'s choice from the
        model's vector field, solver and shapes (no replay traced to find it), made where a
        density is traced and passed to its replay, so the fitters and samplers that ask
        know which one runs. (Not cached: `gs.use_compiled_kernel` may change it.)"""
        x = jax.eval_shape(self.space.from_unconstrained,
                           jax.ShapeDtypeStruct((1, self.space.dim), jnp.result_type(float)))
        y0 = jax.eval_shape(self.model.initial_state, x)
        return gs.drivers.Auto().choose("replay", self.model.vector_field, self.solver, y0, x)

    def ragged_replay(self, u: jax.Array, mesh: gs.Mesh) -> bool:
        """Whether replaying ``mesh`` runs on a driver whose cost follows each trajectory's
        own steps (`gs.drivers.AbstractDriver` ``ragged``: the compiled kernel)."""
        return self.replay_driver.ragged

    # --------------------------------------------------------------------- densities
    def observe(self, x: Mapping[str, jax.Array], ys: jax.Array) -> jax.Array:
        """The observed quantities ``(..., k, m)`` of solved states ``ys (..., k, d)`` at
        the constrained dict ``x`` (``model.observe`` at the data's times: an observation
        function may depend on the parameters, e.g. ``amount / volume``)."""
        return self.model.observe(x, self.ts, ys)

    def predictions(self, x: Mapping[str, jax.Array], ys: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
        """Predicted observed quantities of solved states ``ys (..., k, d)`` at the
        constrained dict ``x``: ``(y_pred, ok)``, ``y_pred (..., k, m)`` with non-finite
        rows (a failed solve) replaced by ones so the noise model stays finite, ``ok (...)``
        False there."""
        y = self.observe(x, ys)
        ok = jnp.all(jnp.isfinite(y), axis=(-2, -1))
        return jnp.where(ok[..., None, None], y, 1.0), ok

    def log_posterior(self, x: Mapping[str, jax.Array], ys: jax.Array, *,
                      prior: bool = True) -> jax.Array:
        """``log p(x) + log p(data | states ys)`` (without the prior: ``prior=False``), for a
        constrained dict ``x`` and solved states ``ys (..., k, d)``. A failed solve or a
        non-finite likelihood gives ``-inf`` with a zero (not NaN) gradient."""
        y, ok = self.predictions(x, ys)
        ll = self.model.log_likelihood_from_prediction(x, y, self.ys_obs)
        good = ok & jnp.isfinite(ll)
        ll = jnp.where(good, jnp.where(good, ll, 0.0), -jnp.inf)
        return ll + self.model.log_prior(x) if prior else ll

    def log_density(self, u: jax.Array, mesh: gs.Mesh | None = None, *, prior: bool = True,
                    jacobian: bool = True, max_steps: int | None = None
                    ) -> tuple[jax.Array, gs.Solution]:
        """The log density at unconstrained ``u (D,)`` or ``(n, D)``: `log_posterior`, plus
        ``log |dx/du|`` with ``jacobian``; states from ``gs.replay`` of ``mesh`` or, with
        ``mesh=None``, from ``gs.solve`` (``max_steps`` its capacity). Returns ``(value,
        solution)``; ``solution.error_ratio`` says how well the mesh holds."""
        x = self.space.from_unconstrained(u)
        sol = self.states(x, mesh, max_steps)
        lp = self.log_posterior(x, sol.ys, prior=prior)
        if jacobian:
            lp = lp + self.space.log_abs_det_jacobian(u)
        return lp, sol

    def error_ratio(self, u: jax.Array, mesh: gs.Mesh) -> jax.Array:
        """The replay error ratio of ``mesh`` at unconstrained ``u (D,)``."""
        return self.states(self.space.from_unconstrained(u), mesh).error_ratio

    def observed_data(self) -> tuple[dict, dict, dict]:
        """``(values, dims, coords)`` of the observations, for ``arviz``: ``obs (time,
        observed_state)``."""
        return ({"obs": np.asarray(self.ys_obs)}, {"obs": ["time", "observed_state"]},
                {"time": self.ts_np, "observed_state": list(self.model.observed_names)})


def _checked_data(model, data) -> tuple[np.ndarray, Any]:
    """``(ts, ys)`` of a `models.Dataset`, checked against the model (ValueError)."""
    try:
        ts, ys = data.ts, data.ys
    except AttributeError:
        raise ValueError(
            f"`data` must be a models.Dataset (with .ts and .ys), got {type(data).__name__}"
        ) from None
    if isinstance(ts, jax.core.Tracer):
        raise ValueError(
            "`data.ts` is traced (the Dataset was passed through jax.jit/vmap): the "
            "observation times fix the solve's mesh points and must be concrete; close "
            "over the Dataset instead (its `ys` may be traced)"
        )
    ts = np.asarray(ts, dtype=float)
    m_obs = len(model.observed_names)
    if np.ndim(ys) != 2 or np.shape(ys) != (ts.shape[0], m_obs):
        raise ValueError(
            f"`data.ys` has shape {np.shape(ys)}; expected ({ts.shape[0]}, {m_obs}) for "
            f"the observed quantities {tuple(model.observed_names)} of model {model.name!r}"
        )
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"`data.ts` must have shape (k,) with k >= 1, got {ts.shape}")
    if np.any(np.diff(ts) < 0):
        raise ValueError("`data.ts` must be sorted")
    if ts[0] < model.t0:
        raise ValueError(f"`data.ts` starts at {ts[0]}, before the model's t0 = {model.t0}")
    if not ts[-1] > model.t0:
        raise ValueError(f"`data.ts` must reach past the model's t0 = {model.t0}")
    check_data_names(model, data)
    return ts, ys


def check_data_names(model, data) -> None:
    """A `models.ODEModel` refuses data whose named columns are in another order than
    its observed quantities (other models are not asked)."""
    check = getattr(model, "check_data_names", None)
    if check is not None:
        check(data)
