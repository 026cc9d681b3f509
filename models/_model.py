"""`ODEModel`: an ODE model as data (vector field, priors, initial state, noise model)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from ._dataset import Dataset, check_column_names

__all__ = ["ODEModel", "prior_median"]

# Number of prior draws used for a median when the distribution has no usable icdf.
_MEDIAN_DRAWS = 20001


def prior_median(d: dist.Distribution) -> jax.Array:
    """Median of a NumPyro distribution, elementwise, of shape ``batch_shape + event_shape``.

    Uses the inverse CDF at 1/2 when the (unwrapped) base distribution has one, otherwise the
    elementwise median of 20,001 draws (fixed seed, so it is reproducible).

    Args:
        d: a NumPyro distribution (possibly ``expand``-ed, ``to_event``-ed or truncated).

    Returns:
        An array of shape ``d.batch_shape + d.event_shape``.

    Example:
        >>> import numpyro.distributions as dist
        >>> models.prior_median(dist.LogNormal(0.0, 1.0))            # 1.0
        >>> models.prior_median(dist.Normal(jnp.zeros(3), 1.0)).shape  # (3,)
    """
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    base = d
    while isinstance(base, (dist.Independent, dist.ExpandedDistribution)):
        base = base.base_dist
    if tuple(base.event_shape) == ():
        try:
            with jax.ensure_compile_time_eval():
                med = base.icdf(jnp.full(base.batch_shape, 0.5))
                med = jnp.broadcast_to(med, shape)
            if bool(jnp.all(jnp.isfinite(med))):
                return med
        except Exception:  # no icdf (NotImplementedError, missing optional dependency, ...)
            pass
    with jax.ensure_compile_time_eval():
        draws = d.sample(jax.random.PRNGKey(0), (_MEDIAN_DRAWS,))
        return jnp.median(draws, axis=0)


def default_solver(stiff: bool):
    """A model's default solver: ``gs.Rodas5P()`` if ``stiff`` (L-stable, linearly implicit)
    else ``gs.Tsit5()``."""
    import gradsolve as gs

    return gs.Rodas5P() if stiff else gs.Tsit5()


def _is_distribution(d: Any) -> bool:
    return isinstance(d, dist.Distribution)


def _default_normal_noise(params: Mapping[str, Any], y_pred: jax.Array) -> dist.Distribution:
    """Independent Normal(y_pred, sigma) observations (the default when ``noise`` is None)."""
    return dist.Normal(y_pred, params["sigma"]).to_event(jnp.ndim(y_pred))


class LogLikelihoodDistribution(dist.Distribution):
    """A user's log-likelihood seen as a NumPyro distribution of the observations.

    ``ODEModel(log_likelihood=fn)`` wraps ``fn(params, y_pred, ys)`` in this class, so that
    every place that calls ``model.noise(params, y_pred).log_prob(ys)`` (NumPyro's
    ``numpyro.sample("obs", ..., obs=ys)``, `inference.log_density`, fits and samplers)
    uses the user's function unchanged. It has no sampler: a log-likelihood alone does not
    say how to draw data, so ``simulate`` needs ``noise=`` instead.

    Args:
        fn: ``fn(params, y_pred, ys) -> scalar`` for ONE trajectory.
        params: the parameter dict.
        y_pred: ``(k, m)`` predicted observed states; the event shape.
    """

    arg_constraints = {}
    support = dist.constraints.independent(dist.constraints.real, 2)

    def __init__(self, fn, params, y_pred):
        self.fn, self.params, self.y_pred = fn, params, y_pred
        super().__init__(batch_shape=(), event_shape=jnp.shape(y_pred))

    def log_prob(self, value):
        return jnp.asarray(self.fn(self.params, self.y_pred, value))

    def sample(self, key, sample_shape=()):
        raise NotImplementedError(
            "this model was built with `log_likelihood=`, which does not say how to draw "
            "observations; build it with `noise=` (a NumPyro distribution) to simulate data "
            "or draw posterior predictive samples"
        )


class MissingObservations(dist.Distribution):
    """A noise distribution whose ``log_prob`` skips missing observations (NaN entries).

    Real data sets have gaps: a species not counted one year, a sample lost. NaN in
    ``Dataset.ys`` marks them, and the likelihood is the product over the observed entries
    only. ``log_prob(value)`` strips the ``Independent`` wrappers of ``noise`` to reach the
    elementwise distribution, fills the gaps with the prediction ``fill`` (inside the
    support, so the masked terms and their gradients stay finite: the double-``where``
    rule) and sums the log densities of the observed entries. Where the base distribution
    has its own event shape (e.g. a ``MultivariateNormal`` over the ``m`` states at one
    time), a time with a gap is skipped whole; a partly observed such row is an error
    (outside ``jit``), since its marginal is not this distribution's to take. Sampling
    draws from ``noise`` (no gaps).

    Args:
        noise: the observation distribution of ONE trajectory, event shape ``(k, m)``.
        fill: ``(k, m)`` values in the support, used at the gaps (the prediction).
    """

    arg_constraints = {}

    def __init__(self, noise: dist.Distribution, fill: jax.Array):
        self.noise, self.fill = noise, fill
        super().__init__(batch_shape=noise.batch_shape, event_shape=noise.event_shape)

    @property
    def support(self):
        return self.noise.support

    def sample(self, key, sample_shape=()):
        return self.noise.sample(key, sample_shape)

    def log_prob(self, value):
        miss = jnp.isnan(value)
        if not isinstance(miss, jax.core.Tracer) and not bool(np.any(np.asarray(miss))):
            return self.noise.log_prob(value)
        base, n_ind = self.noise, 0
        while isinstance(base, dist.Independent):
            n_ind += base.reinterpreted_batch_ndims
            base = base.base_dist
        filled = jnp.where(miss, jnp.broadcast_to(self.fill, jnp.shape(value)), value)
        lp = base.log_prob(filled)
        n_ev = len(base.event_shape)
        if n_ev:
            axes = tuple(range(-n_ev, 0))
            partial = jnp.any(miss, axis=axes) & ~jnp.all(miss, axis=axes)
            if not isinstance(partial, jax.core.Tracer) and bool(np.any(np.asarray(partial))):
                raise ValueError(
                    f"`ys` has partly missing (NaN) rows, but the noise model's "
                    f"{type(base).__name__} couples the entries of a row; mark whole rows "
                    "missing or use an elementwise noise model"
                )
            miss = jnp.any(miss, axis=axes)
        if jnp.shape(lp) != jnp.shape(miss):
            raise ValueError(
                f"missing observations (NaN in `ys`) need an elementwise noise model; "
                f"{type(base).__name__} gives log densities of shape {jnp.shape(lp)} for "
                f"observations of shape {jnp.shape(value)}"
            )
        lp = jnp.where(miss, 0.0, lp)
        return jnp.sum(lp, axis=tuple(range(-n_ind, 0))) if n_ind else lp


def _wrap_log_likelihood(fn):
    def noise(params, y_pred):
        return LogLikelihoodDistribution(fn, params, y_pred)

    noise.log_likelihood = fn
    return noise


def _observation_size(observation, t0: float, y0_struct, params) -> int:
    """``m``, the length of ``observation(t, y (d,), params)``, read by ``jax.eval_shape``
    (ValueError naming `observation` if it fails or is not of shape ``(m,)``, ``m >= 1``)."""
    if not callable(observation):
        raise ValueError("`observation` must be a callable observation(t, y, params) -> (m,)")
    t_struct = jax.ShapeDtypeStruct((), jnp.result_type(float))
    try:
        out = jax.eval_shape(observation, t_struct, y0_struct, params)
    except Exception as e:  # surface the user's error with context
        raise ValueError(
            f"`observation` failed on (t, y of shape {y0_struct.shape}, defaults): {e}"
        ) from e
    shape = getattr(out, "shape", None)
    if shape is None or len(shape) != 1 or shape[0] < 1:
        raise ValueError(
            f"`observation` must return shape (m,) with m >= 1 for ONE time and ONE "
            f"trajectory (y of shape {y0_struct.shape}); got "
            f"{shape if shape is not None else type(out).__name__}"
        )
    return int(shape[0])


@eqx.filter_jit
def _sample_prior(priors, key, n):
    # compiled once per prior structure (eager NumPyro sampling costs seconds)
    keys = jax.random.split(key, len(priors))
    shape = () if n is None else (n,)
    return {k: d.sample(kk, shape) for kk, (k, d) in zip(keys, priors.items())}


class ODEModel(eqx.Module):
    """One ODE model, as data.

    Built by keyword (every zoo constructor in `models` does exactly this)::

        ODEModel(name=..., vector_field=..., priors=..., y0=..., t0=0.0, noise=None,
                 observed=None, stiff=False, defaults=None, state_names=None,
                 log_likelihood=None, observation=None, observed_names=None)

    Arguments:
        name: a short name.
        vector_field: ``f(t, y, params) -> dy/dt`` for ONE trajectory, ``y`` of shape ``(d,)``
            and ``params`` a dict of named arrays (the keys of ``priors``).
        priors: dict parameter name -> NumPyro distribution. A vector parameter has a
            vector distribution, e.g. ``dist.LogNormal(0., 1.).expand([2]).to_event(1)``;
            a parameter's shape is the prior's ``batch_shape + event_shape``.
        y0: the state at ``t0``, shape ``(d,)``: an array, or a function ``params -> (d,)``
            array (unknown initial states are parameters).
        t0: initial time (a Python float).
        noise: ``noise(params, y_pred) -> distribution`` of the observations of ONE trajectory,
            ``y_pred`` the predicted observed states, shape ``(k, m)``; the distribution's
            samples have shape ``(k, m)`` (use ``.to_event(2)``). Default (``None``):
            independent ``Normal(y_pred, params["sigma"])``, which needs a ``sigma`` prior.
            Give either ``noise`` or ``log_likelihood``.
        observed: indices of the measured states (tuple); default all states, in order
            (unless ``observation`` is given: then leave it ``None``; `observed` is ``()``).
        stiff: picks the default solver (``gs.Rodas5P()`` if stiff, else ``gs.Tsit5()``).
        defaults: a parameter dict (e.g. a sensible or literature value); missing entries are
            the prior medians (see `prior_median`).
        state_names: names of the ``d`` states; default ``("y0", "y1", ...)``.
        log_likelihood: instead of ``noise``, a plain function ``log_likelihood(params,
            y_pred, ys) -> scalar`` for ONE trajectory (``y_pred``, ``ys`` of shape
            ``(k, m)``), for observation models that are not a NumPyro distribution.
            Fitting, `inference.log_density` and sampling use it as is; `simulate` needs
            ``noise`` (a log-likelihood does not say how to draw data).
        observation: instead of ``observed``, a function ``observation(t, y, params) ->
            (m,)`` for ONE time and ONE trajectory (``y`` of shape ``(d,)``): what is
            measured, e.g. a concentration ``amount / volume``. ``m`` (>= 1) is read from
            ``jax.eval_shape`` at construction. `observe` applies it at every time.
        observed_names: names of the ``m`` observed quantities (the data columns); default
            the observed states' names, or ``("obs0", "obs1", ...)`` with ``observation``.

    Parameters are passed as dicts with exactly the keys of ``priors``. A dict whose every
    value has one extra leading axis ``n`` is an ensemble of ``n`` parameter sets: then
    `predict`, `solve`, `log_prior` and `log_likelihood` return a
    leading axis ``n`` too, as every gradsolve call does. All of them are jittable and
    differentiable: ``jax.jit(lambda p: model.log_joint(p, data))`` or
    ``eqx.filter_jit(model.log_joint)(params, data)``. (Plain ``jax.jit(model.log_prior)``
    fails: JAX hashes the bound method, and the model holds arrays.) Outside ``jit`` the
    solve runs eagerly, which is slow (seconds); wrap repeated calls in ``jit``.

    The observation model of ONE trajectory is ``model.noise(params, y_pred)``, a NumPyro
    distribution with event shape ``(k, m)``: a NumPyro program is
    ``numpyro.sample(name, model.priors[name])`` for each parameter, then
    ``numpyro.sample("obs", model.noise(params, model.predict(params, data.ts)),
    obs=data.ys)``.

    Why one class: every method reads the model's own fields (priors, noise, observation,
    initial state) and is part of the documented model interface that `inference` and the
    zoo rely on; argument checking (construction, `replace`, `check_params`) is done by the
    module's functions, so what stays is the model's meaning and its docstrings.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx
        >>> import numpyro.distributions as dist
        >>> model = models.ODEModel(
        ...     name="decay",
        ...     vector_field=lambda t, y, p: -p["k"] * y,
        ...     priors={"k": dist.LogNormal(0.0, 0.5), "sigma": dist.LogNormal(-2.0, 0.5)},
        ...     y0=jnp.array([1.0]),
        ... )
        >>> ts = jnp.linspace(0.5, 5.0, 10)
        >>> data = model.simulate(jax.random.key(0), None, ts)    # ts (10,), ys (10, 1)
        >>> model.predict(model.defaults, ts).shape               # (10, 1)
        >>> eqx.filter_jit(model.log_joint)(model.defaults, data)  # scalar
    """

    name: str = eqx.field(static=True)
    vector_field: Callable[[Any, jax.Array, Mapping[str, Any]], jax.Array] = eqx.field(static=True)
    priors: dict[str, dist.Distribution]
    y0: Any
    t0: float = eqx.field(static=True)
    noise: Callable[[Mapping[str, Any], jax.Array], dist.Distribution] = eqx.field(static=True)
    observed: tuple[int, ...] = eqx.field(static=True)
    stiff: bool = eqx.field(static=True)
    defaults: dict[str, jax.Array]
    state_names: tuple[str, ...] = eqx.field(static=True)
    observation: Callable[[Any, jax.Array, Mapping[str, Any]], jax.Array] | None = eqx.field(
        static=True)
    observed_names: tuple[str, ...] = eqx.field(static=True)

    def __init__(
        self,
        *,
        name: str,
        vector_field: Callable,
        priors: Mapping[str, dist.Distribution],
        y0: Any,
        t0: float = 0.0,
        noise: Callable | None = None,
        observed: Any = None,
        stiff: bool = False,
        defaults: Mapping[str, Any] | None = None,
        state_names: Any = None,
        log_likelihood: Callable | None = None,
        observation: Callable | None = None,
        observed_names: Any = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a non-empty string, got {name!r}")
        if not callable(vector_field):
            raise ValueError("`vector_field` must be a callable f(t, y, params) -> dy/dt")
        priors = _checked_priors(priors)
        noise = _checked_noise(noise, log_likelihood, priors)
        try:
            t0 = float(t0)
        except (TypeError, ValueError):
            raise ValueError(f"`t0` must be a Python float (a scalar), got {t0!r}") from None
        full_defaults = _full_defaults(priors, defaults)
        y0, y0_struct = _checked_y0(y0, vector_field, t0, full_defaults)
        d = y0_struct.shape[0]
        observed, m = _checked_observed(observation, observed, d, t0, y0_struct, full_defaults)
        state_names, observed_names = _checked_names(state_names, observed_names, d, m, observed)

        self.name = name
        self.vector_field = vector_field
        self.priors = priors
        self.y0 = y0
        self.t0 = t0
        self.noise = noise
        self.observed = observed
        self.stiff = bool(stiff)
        self.defaults = full_defaults
        self.state_names = state_names
        self.observation = observation
        self.observed_names = observed_names

    # ---------------------------------------------------------------- descriptive properties

    @property
    def param_names(self) -> tuple[str, ...]:
        """The parameter names (keys of ``priors``)."""
        return tuple(self.priors)

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of each parameter for ONE trajectory (``batch_shape + event_shape``)."""
        return {k: tuple(d.batch_shape) + tuple(d.event_shape) for k, d in self.priors.items()}

    @property
    def n_states(self) -> int:
        """``d``, the number of states."""
        return len(self.state_names)

    @property
    def solver(self):
        """The default solver: ``gs.Rodas5P()`` if ``stiff`` else ``gs.Tsit5()``."""
        return default_solver(self.stiff)

    def replace(self, **changes: Any) -> "ODEModel":
        """A copy with some constructor arguments changed (validated again).

        If ``priors`` changes and ``defaults`` is not given, the defaults become the new
        priors' medians, except for parameters whose prior is unchanged.
        """
        return ODEModel(**_replaced_arguments(self, changes))

    # ---------------------------------------------------------------- parameter handling

    def check_params(self, params: Mapping[str, Any]) -> int | None:
        """Validate a parameter dict; return the ensemble size ``n`` or ``None`` (one set).

        Raises ``ValueError`` naming missing or unknown parameters and wrong shapes.
        """
        return _ensemble_size(self.name, self.param_shapes, params)

    def _as_arrays(self, params: Mapping[str, Any]) -> dict[str, jax.Array]:
        return {k: jnp.asarray(params[k]) for k in self.priors}

    def sample_prior(self, key: jax.Array, n: int | None = None) -> dict[str, jax.Array]:
        """Draw one parameter dict (``n=None``) or an ensemble of ``n`` from the priors."""
        return _sample_prior(self.priors, key, None if n is None else int(n))

    def initial_state(self, params: Mapping[str, Any]) -> jax.Array:
        """``y0`` at these parameters: shape ``(d,)``, or ``(n, d)`` for an ensemble."""
        n = self.check_params(params)
        return self._initial_state(self._as_arrays(params), n)

    def _initial_state(self, params: dict[str, jax.Array], n: int | None) -> jax.Array:
        dtype = jnp.result_type(float)
        if callable(self.y0):
            y0 = jax.vmap(self.y0)(params) if n is not None else self.y0(params)
            y0 = jnp.asarray(y0)
            if not jnp.issubdtype(y0.dtype, jnp.floating):
                y0 = y0.astype(dtype)
        else:
            y0 = jnp.asarray(self.y0)
            if n is not None:
                y0 = jnp.broadcast_to(y0, (n,) + y0.shape)
        return y0

    # ---------------------------------------------------------------- solving

    def solve(
        self,
        params: Mapping[str, Any],
        ts: Any,
        *,
        solver: Any = None,
        rtol: float = 1e-8,
        atol: float = 1e-10,
        **solve_kwargs: Any,
    ):
        """Solve from ``t0`` to ``ts[-1]`` with gradsolve; returns a ``gs.Solution``.

        ``solver`` defaults to `solver`; extra keywords (``dt0``, ``max_steps``, ...)
        go to ``gradsolve.solve``. The default tolerances (``rtol=1e-8``, ``atol=1e-10``)
        are tighter than those of fitting and sampling (``inference.TOLERANCES``, 1e-6 and
        1e-8) on purpose: predictions and synthetic data (`simulate`) should not carry the
        discretisation error a fit at those tolerances makes. ``Solution.ys`` holds ALL states, shape ``(k, d)`` or
        ``(n, k, d)``.
        """
        import gradsolve as gs

        n = self.check_params(params)
        params = self._as_arrays(params)
        if np.ndim(ts) != 1 or np.shape(ts)[0] == 0:
            raise ValueError(
                f"{self.name}: `ts` must have shape (k,) with k >= 1, got {np.shape(ts)}"
            )
        if isinstance(ts, jax.core.Tracer):
            ts = jnp.asarray(ts)
            t1 = ts[-1]
        else:
            ts_np = np.asarray(ts, dtype=float)
            t1 = float(ts_np[-1])
            ts = jnp.asarray(ts_np, dtype=jnp.result_type(float))
        y0 = self._initial_state(params, n)
        return gs.solve(
            self.vector_field,
            self.t0,
            t1,
            y0,
            params,
            ts=ts,
            solver=self.solver if solver is None else solver,
            rtol=rtol,
            atol=atol,
            **solve_kwargs,
        )

    def _observe(self, ys: jax.Array) -> jax.Array:
        if self.observed == tuple(range(self.n_states)):
            return ys
        return ys[..., np.asarray(self.observed)]

    def observe(self, params: Mapping[str, Any], ts: Any, ys: jax.Array) -> jax.Array:
        """The observed quantities of solved states: ``(k, m)``, or ``(n, k, m)``.

        Args:
            params: a parameter dict (one set, or an ensemble of ``n`` for ``ys (n, k, d)``).
            ts: ``(k,)`` the times of the rows of ``ys`` (or ``(n, k)`` per trajectory).
            ys: ``(k, d)`` or ``(n, k, d)`` solved states at ``ts`` (``Solution.ys``).

        With an ``observation`` function it is applied at every time (and trajectory);
        without, the observed states are selected by index (`observed`). Jittable and
        differentiable; `predict`, `log_likelihood` and `inference` all observe through it.
        """
        if self.observation is None:
            return self._observe(ys)
        if jnp.ndim(ys) not in (2, 3) or jnp.shape(ys)[-1] != self.n_states:
            raise ValueError(
                f"{self.name}: `ys` must have shape (k, {self.n_states}) or (n, k, "
                f"{self.n_states}), got {jnp.shape(ys)}"
            )
        ts = jnp.asarray(ts, dtype=jnp.result_type(float))
        params = self._as_arrays(params)

        def one(p, t, y):  # ONE trajectory: (k,), (k, d) -> (k, m)
            return jax.vmap(self.observation, in_axes=(0, 0, None))(t, y, p)

        if jnp.ndim(ys) == 2:
            return one(params, jnp.broadcast_to(ts, jnp.shape(ys)[:1]), ys)
        n, k = jnp.shape(ys)[:2]
        if self.check_params(params) != n:
            raise ValueError(
                f"{self.name}: `ys` holds an ensemble of {n} trajectories, so `params` must "
                f"be an ensemble of {n} (every leaf with leading axis {n})"
            )
        return jax.vmap(one)(params, jnp.broadcast_to(ts, (n, k)), ys)

    def predict(self, params: Mapping[str, Any], ts: Any, **solve_kwargs: Any) -> jax.Array:
        """Noise-free observed quantities at ``ts``: shape ``(k, m)``, or ``(n, k, m)``.

        Keywords as in `solve` (``solver``, ``rtol=1e-8``, ``atol=1e-10``, ...); the
        solved states go through `observe`.
        """
        sol = self.solve(params, ts, **solve_kwargs)
        return self.observe(params, sol.ts if self.observation is not None else ts, sol.ys)

    # ---------------------------------------------------------------- densities

    def log_prior(self, params: Mapping[str, Any]) -> jax.Array:
        """Sum of the priors' log densities (constrained space): scalar, or ``(n,)``."""
        self.check_params(params)
        params = self._as_arrays(params)
        total = 0.0
        for k, d in self.priors.items():
            lp = d.log_prob(params[k])
            nb = len(d.batch_shape)
            if nb:
                lp = jnp.sum(lp, axis=tuple(range(-nb, 0)))
            total = total + lp
        return jnp.asarray(total)

    def _check_data(self, data: Any) -> tuple[jax.Array, jax.Array]:
        try:
            ts, ys = data.ts, data.ys
        except AttributeError:
            raise ValueError(
                f"{self.name}: `data` must be a models.Dataset (with .ts and .ys), "
                f"got {type(data).__name__}"
            ) from None
        m = len(self.observed_names)
        if np.ndim(ys) != 2 or np.shape(ys)[1] != m or np.shape(ys)[0] != np.shape(ts)[0]:
            raise ValueError(
                f"{self.name}: `data.ys` has shape {np.shape(ys)}; "
                f"expected ({np.shape(ts)[0]}, {m}) "
                f"for the observed quantities {self.observed_names}"
            )
        self.check_data_names(data)
        return ts, jnp.asarray(ys)

    def check_data_names(self, data: Any) -> None:
        """Refuse a `Dataset` whose column ``names`` hold this model's observed quantities
        (`observed_names`) in another order (a ``ValueError`` naming both orders): its
        columns would be fitted to the wrong predictions. Data without names, or with names
        that share none with the model's, is not checked."""
        check_column_names(self.observed_names, data, self.name)

    def log_likelihood_from_prediction(
        self, params: Mapping[str, Any], y_pred: jax.Array, ys: jax.Array
    ) -> jax.Array:
        """Log likelihood of observations ``ys`` (``(k, m)``) given predictions ``y_pred``.

        ``y_pred`` of shape ``(k, m)`` (scalar result) or ``(n, k, m)`` with an ensemble of
        parameters (result ``(n,)``). Useful when the states come from elsewhere (e.g. a
        replayed mesh).
        """
        n = self.check_params(params)
        params = self._as_arrays(params)

        def one(p, yp):
            return jnp.sum(self.observations(p, yp).log_prob(ys))

        if n is None:
            return one(params, y_pred)
        return jax.vmap(one)(params, y_pred)

    def observations(self, params: Mapping[str, Any], y_pred: jax.Array) -> dist.Distribution:
        """The distribution of ONE trajectory's observations given predictions ``y_pred``
        ``(k, m)``: ``noise(params, y_pred)``, whose ``log_prob`` skips missing observations
        (NaN in ``ys``; see `MissingObservations`). A model built with ``log_likelihood=``
        gets its ``ys`` as they are, NaN included."""
        d = self.noise(params, y_pred)
        if isinstance(d, LogLikelihoodDistribution):
            return d
        return MissingObservations(d, y_pred)

    def log_likelihood(
        self, params: Mapping[str, Any], data: Dataset, **solve_kwargs: Any
    ) -> jax.Array:
        """Log likelihood of ``data`` at ``params`` (scalar, or ``(n,)`` for an ensemble).

        Solves at ``data.ts`` (keywords as in `solve`) and sums the noise model's log
        density of ``data.ys``. Jittable and differentiable.
        """
        ts, ys = self._check_data(data)
        y_pred = self.predict(params, ts, **solve_kwargs)
        return self.log_likelihood_from_prediction(params, y_pred, ys)

    def log_joint(self, params: Mapping[str, Any], data: Dataset, **solve_kwargs: Any) -> jax.Array:
        """``log_prior(params) + log_likelihood(params, data)`` (unnormalised log posterior)."""
        return self.log_prior(params) + self.log_likelihood(params, data, **solve_kwargs)

    # ---------------------------------------------------------------- synthetic data

    def simulate(
        self,
        key: jax.Array,
        params: Mapping[str, Any] | None,
        ts: Any,
        *,
        rtol: float = 1e-8,
        atol: float = 1e-10,
        **solve_kwargs: Any,
    ) -> Dataset:
        """Synthetic data: solve at ``ts``, keep the observed states, draw the noise.

        ``params=None`` uses `defaults`. One parameter set only (for an ensemble,
        call once per member or ``jax.vmap`` `predict` and the noise yourself).
        """
        if params is None:
            params = self.defaults
        n = self.check_params(params)
        if n is not None:
            raise ValueError(
                f"{self.name}: simulate() draws ONE data set; `params` is an ensemble of {n}"
            )
        if getattr(self.noise, "log_likelihood", None) is not None:
            raise ValueError(
                f"{self.name}: simulate() needs a `noise` distribution to draw observations; "
                "this model was built with `log_likelihood=` only"
            )
        y_pred = self.predict(params, ts, rtol=rtol, atol=atol, **solve_kwargs)
        ys = self.noise(self._as_arrays(params), y_pred).sample(key)
        return Dataset(
            ts=ts,
            ys=ys,
            names=self.observed_names,
            source=f"simulated from model {self.name!r}",
        )


def _checked_priors(priors) -> dict:
    if not isinstance(priors, Mapping) or not priors:
        raise ValueError(
            "`priors` must be a non-empty dict: parameter name -> NumPyro distribution"
        )
    bad = [k for k, v in priors.items() if not isinstance(k, str) or not _is_distribution(v)]
    if bad:
        raise ValueError(
            f"`priors` entries {bad} are not (str -> numpyro.distributions.Distribution)"
        )
    return {k: priors[k] for k in priors}


def _checked_noise(noise, log_likelihood, priors) -> Callable:
    """The noise model: ``noise``, a wrapped ``log_likelihood``, or Normal(y_pred, sigma)."""
    if log_likelihood is not None:
        if noise is not None and getattr(noise, "log_likelihood", None) is not log_likelihood:
            raise ValueError("give either `noise` or `log_likelihood`, not both")
        if not callable(log_likelihood):
            raise ValueError(
                "`log_likelihood` must be a callable log_likelihood(params, y_pred, ys) "
                "-> scalar"
            )
        return _wrap_log_likelihood(log_likelihood)
    if noise is None:
        if "sigma" not in priors:
            raise ValueError(
                "`noise` not given and `priors` has no 'sigma' entry for the default "
                "Normal(y_pred, sigma) noise model: pass `noise=`, pass "
                "`log_likelihood=`, or add a 'sigma' prior"
            )
        return _default_normal_noise
    if not callable(noise):
        raise ValueError("`noise` must be a callable noise(params, y_pred) -> distribution")
    return noise


def _full_defaults(priors, defaults) -> dict:
    """Every parameter's default: the given value, else its prior's median."""
    defaults = {} if defaults is None else dict(defaults)
    unknown = sorted(set(defaults) - set(priors))
    if unknown:
        raise ValueError(
            f"`defaults` has unknown parameter names {unknown}; priors: {sorted(priors)}"
        )
    full = {}
    for k, d in priors.items():
        shape = tuple(d.batch_shape) + tuple(d.event_shape)
        if k in defaults:
            v = jnp.asarray(defaults[k], dtype=jnp.result_type(float))
            if v.shape != shape:
                raise ValueError(
                    f"`defaults[{k!r}]` has shape {v.shape}, but its prior has shape {shape}"
                )
        else:
            v = jnp.asarray(prior_median(d), dtype=jnp.result_type(float))
        full[k] = v
    return full


def _checked_y0(y0, vector_field, t0, defaults):
    """``(y0, its (d,) shape struct)``, the vector field checked to return ``(d,)``."""
    if callable(y0):
        y0_shape = jax.eval_shape(y0, defaults).shape
    else:
        y0 = jnp.asarray(y0, dtype=jnp.result_type(float))
        y0_shape = y0.shape
    if len(y0_shape) != 1:
        raise ValueError(f"`y0` must have shape (d,) (one trajectory), got shape {y0_shape}")
    d = y0_shape[0]
    y0_struct = jax.ShapeDtypeStruct((d,), jnp.result_type(float))
    try:
        f_shape = jax.eval_shape(vector_field, t0, y0_struct, defaults).shape
    except Exception as e:  # surface the user's error with context
        raise ValueError(
            f"`vector_field` failed on (t0, y0 of shape {(d,)}, defaults): {e}"
        ) from e
    if f_shape != (d,):
        raise ValueError(
            f"`vector_field` returns shape {f_shape} for y of shape {(d,)}; it must return (d,)"
        )
    return y0, y0_struct


def _checked_observed(observation, observed, d, t0, y0_struct, defaults):
    """``(observed state indices, m)``: ``m`` the size of ``observation``'s output
    (``None`` without one, where the observed states are the data's columns)."""
    if observation is not None:
        if observed is not None and tuple(np.atleast_1d(np.asarray(observed))) != ():
            raise ValueError(
                "give either `observed` (state indices) or `observation` (a function "
                "observation(t, y, params) -> (m,)), not both"
            )
        return (), _observation_size(observation, t0, y0_struct, defaults)
    if observed is None:
        return tuple(range(d)), None
    try:
        observed = tuple(int(i) for i in np.atleast_1d(np.asarray(observed)))
    except (TypeError, ValueError):
        raise ValueError(f"`observed` must be a tuple of state indices, got {observed!r}") from None
    if not observed or any(i < 0 or i >= d for i in observed):
        raise ValueError(f"`observed` must hold state indices in [0, {d}), got {observed}")
    if len(set(observed)) != len(observed):
        raise ValueError(
            f"`observed` lists a state twice: {observed}; each data column is one state "
            "(for repeated measurements, add rows to the Dataset)"
        )
    return observed, None


def _checked_names(state_names, observed_names, d, m, observed):
    """``(state names, observed names)``, defaults ``y{i}`` and ``obs{i}`` (``m``: the
    observation function's output size, ``None`` when states are observed directly)."""
    if state_names is None:
        state_names = tuple(f"y{i}" for i in range(d))
    else:
        state_names = tuple(str(s) for s in state_names)
        if len(state_names) != d:
            raise ValueError(f"`state_names` has {len(state_names)} names for {d} states")
    if observed_names is None:
        return state_names, (tuple(f"obs{i}" for i in range(m)) if m is not None
                             else tuple(state_names[i] for i in observed))
    observed_names = tuple(str(s) for s in observed_names)
    want = m if m is not None else len(observed)
    if len(observed_names) != want:
        raise ValueError(
            f"`observed_names` has {len(observed_names)} names for {want} observed quantities"
        )
    return state_names, observed_names


def _replaced_arguments(model: ODEModel, changes: Mapping[str, Any]) -> dict:
    """The constructor arguments of `ODEModel.replace`: ``model``'s own, with ``changes``
    applied and the arguments derived from a changed one reset to their defaults (new
    priors: medians for the changed parameters; a new state: state names; ``observed``
    and ``observation`` exclude each other, as do ``noise`` and ``log_likelihood``)."""
    kwargs = dict(
        name=model.name,
        vector_field=model.vector_field,
        priors=model.priors,
        y0=model.y0,
        t0=model.t0,
        noise=model.noise,
        observed=model.observed,
        stiff=model.stiff,
        defaults=model.defaults,
        state_names=model.state_names,
        log_likelihood=getattr(model.noise, "log_likelihood", None),
        observation=model.observation,
        observed_names=_given_observed_names(model),
    )
    unknown = sorted(set(changes) - set(kwargs))
    if unknown:
        raise ValueError(f"replace() got unknown arguments {unknown}")
    if "priors" in changes and "defaults" not in changes:
        kwargs["defaults"] = {
            k: v
            for k, v in model.defaults.items()
            if k in changes["priors"] and changes["priors"][k] is model.priors.get(k)
        }
    if ("y0" in changes or "vector_field" in changes) and "state_names" not in changes:
        kwargs["state_names"] = None
        if "observed" not in changes and model.observation is None:
            kwargs["observed"] = None
    if "observed" in changes and changes["observed"] is not None and (
            "observation" not in changes):
        kwargs["observation"] = None
    elif "observation" in changes and "observed" not in changes:
        kwargs["observed"] = None
    if "observed_names" not in changes and any(
            k in changes for k in ("observed", "observation", "state_names", "y0",
                                   "vector_field")):
        kwargs["observed_names"] = None
    if "noise" in changes and "log_likelihood" not in changes:
        kwargs["log_likelihood"] = None
    elif "log_likelihood" in changes and "noise" not in changes:
        kwargs["noise"] = None
    kwargs.update(changes)
    return kwargs


def _given_observed_names(model: ODEModel) -> tuple[str, ...] | None:
    """``model.observed_names`` if they differ from the default (what `replace` passes on)."""
    default = (tuple(f"obs{i}" for i in range(len(model.observed_names)))
               if model.observation is not None
               else tuple(model.state_names[i] for i in model.observed))
    return None if model.observed_names == default else model.observed_names


def _ensemble_size(name: str, shapes: Mapping[str, tuple[int, ...]],
                   params: Mapping[str, Any]) -> int | None:
    """`ODEModel.check_params`: ``params`` checked against the parameter ``shapes`` of ONE
    trajectory (exactly those keys; each of that shape, or all with one leading axis
    ``n``); ``n``, or ``None`` for one parameter set. ``name`` starts the messages."""
    if not isinstance(params, Mapping):
        raise ValueError(
            f"{name}: `params` must be a dict with keys {sorted(shapes)}, "
            f"got {type(params).__name__}"
        )
    missing = sorted(set(shapes) - set(params))
    unknown = sorted(set(params) - set(shapes))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing parameters {missing}")
        if unknown:
            parts.append(f"unknown parameters {unknown}")
        raise ValueError(
            f"{name}: `params` has " + " and ".join(parts)
            + f"; expected exactly {sorted(shapes)}"
        )
    sizes: dict[str, int | None] = {}
    for k, ref in shapes.items():
        shape = tuple(np.shape(params[k]))
        if shape == ref:
            sizes[k] = None
        elif len(shape) == len(ref) + 1 and shape[1:] == ref:
            sizes[k] = shape[0]
        else:
            raise ValueError(
                f"{name}: parameter {k!r} has shape {shape}; expected {ref} (one "
                f"parameter set) or (n, *{ref}) (an ensemble of n)"
            )
    distinct = set(sizes.values())
    if len(distinct) > 1:
        raise ValueError(
            f"{name}: inconsistent ensemble axes in `params`: either no parameter or "
            f"every parameter must have the same leading axis n; got {sizes}"
        )
    return distinct.pop()
