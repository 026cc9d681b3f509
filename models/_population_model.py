"""`PopulationModel`: a many-subject ODE model (one trajectory per subject), as data.

A population model says, for a `PopulationDataset` of ``S`` subjects:

- which latent variables there are and their priors (``latent(data)``: a NumPyro program
  fragment that ``numpyro.sample``-s every latent site and returns them as a dict
  ``theta``), population-level ones and per-subject ones (random effects) alike;
- each subject's ODE parameters (``individual(theta, data)``: a dict whose every leaf has the
  leading subject axis ``S``, as an ensemble solve of gradsolve requires);
- the doses (``dosing(theta, p, data)``: the initial state ``(S, d)`` and the later doses as
  bolus jumps);
- what is observed (``observation(theta, p, ts, ys)``: ``(S, K, d) -> (S, K)``) and the
  noise (``noise(theta, pred)``: an elementwise distribution of batch shape ``(S, K)``).

`inference` builds the NumPyro program from these (``models`` never imports ``inference``)::

    theta = model.latent(data)
    p = model.individual(theta, data)
    y0, jumps = model.dosing(theta, p, data)
    ts, ys = data.observations()
    sol = gs.solve(model.vector_field, model.t0, ts.max(), y0, p, ts=ts, jumps=jumps,
                   solver=model.solver)
    pred = model.observation(theta, p, ts, sol.ys, as_solved=model.solved_at_t0(data))
    numpyro.sample("obs", model.observations(theta, pred), obs=ys)

`PopulationModel.simulate` runs exactly this with ``gs.solve`` to draw synthetic data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from . import _population_doses as _doses
from ._model import MissingObservations, default_solver
from ._population import PopulationDataset

__all__ = ["PopulationModel", "CensoredObservations"]


# The default `dose_sizes` under its old name, so models pickled before it moved still load.
_identity_doses = _doses.identity_doses


def _checked_data(data: Any, where: str) -> PopulationDataset:
    if not isinstance(data, PopulationDataset):
        raise ValueError(
            f"{where}: `data` must be a models.PopulationDataset (e.g. "
            f"PopulationDataset.from_table(...) or models.load_dataset('theophylline')), got "
            f"{type(data).__name__}"
        )
    return data


def _callable(name: str, fn: Any, signature: str) -> Callable:
    if not callable(fn):
        raise ValueError(f"`{name}` must be a callable {signature}, got {type(fn).__name__}")
    return fn


class CensoredObservations(dist.Distribution):
    """Observations some of which are censored, with Beal's M3 likelihood: an observed
    entry contributes its density, an entry below a limit of quantification (``censored
    = 1``, its value the limit) the log of the noise's CDF there, one above a limit
    (``-1``) the log of its survival function; missing (NaN) entries nothing. (S. L.
    Beal, "Ways to fit a PK model with some data below the quantification limit", J.
    Pharmacokinet. Pharmacodyn. 28, 2001.)

    Args:
        noise: the elementwise noise distribution, batch shape ``(S, K)``; a ``Normal``
            uses ``log Phi`` (accurate far in the tail), others ``log cdf``.
        fill: ``(S, K)`` values in the support, used at the missing entries.
        censored: ``(S, K)`` ``0``, ``1`` or ``-1``.

    Example:
        >>> d = CensoredObservations(dist.Normal(pred, 0.3), pred, data.censoring())
    """

    arg_constraints = {}

    def __init__(self, noise: dist.Distribution, fill: jax.Array, censored: Any):
        self.noise, self.fill = noise, fill
        self.censored = jnp.asarray(censored)
        super().__init__(batch_shape=(), event_shape=tuple(noise.batch_shape))

    @property
    def support(self):
        return self.noise.support

    def sample(self, key, sample_shape=()):
        return self.noise.sample(key, sample_shape)

    def log_prob(self, value):
        return jnp.sum(self.entry_log_prob(value), axis=(-2, -1))

    def entry_log_prob(self, value):
        """``(S, K)``: each entry's term of `log_prob` (zero at missing entries), e.g. a
        subject's sum for a population fit."""
        miss = jnp.isnan(value)
        filled = jnp.where(miss, jnp.broadcast_to(self.fill, jnp.shape(value)), value)
        lp = m3_log_prob(self.noise, filled, self.censored)
        return jnp.where(miss, 0.0, lp)


def m3_log_prob(noise: dist.Distribution, values, censored):
    """Elementwise log-likelihood with Beal's M3: ``noise``'s density where ``censored ==
    0``, its log CDF at the limit (the entry's value) where ``1``, its log survival function
    where ``-1``. A ``Normal`` uses ``log Phi`` of the standardised limit, accurate far in
    the tail; others ``log cdf``."""
    from jax.scipy.stats import norm

    if isinstance(noise, dist.Normal):
        z = (values - noise.loc) / noise.scale
        below, above = norm.logcdf(z), norm.logcdf(-z)
    else:
        cdf = noise.cdf(values)
        below, above = jnp.log(cdf), jnp.log1p(-cdf)
    return jnp.where(censored == 1, below, jnp.where(censored == -1, above,
                                                     noise.log_prob(values)))


class SolveArgs(NamedTuple):
    """The arguments of a population's one ensemble solve (`PopulationModel.solve_args`):
    ``f``, ``t0``, ``t1``, ``y0 (S, d)``, ``params`` (leaves ``(S, ...)``), ``ts (S, K)`` and
    ``events`` (``{"doses": ...}`` or ``{"jumps": ...}``, and ``"ts_after"`` where an
    observation reads the state after the doses at its time: pass them all to the solve)."""

    f: Callable
    t0: float
    t1: float
    y0: jax.Array
    params: dict
    ts: jax.Array
    events: dict


class PopulationModel(eqx.Module):
    """A many-subject ODE model, as data: priors of the latent variables, per-subject ODE
    parameters, doses, the observation and the noise (see the module docstring for the
    NumPyro program `inference` builds from it).

    Arguments:
        name: a short name.
        vector_field: ``f(t, y (d,), p) -> (d,)`` for ONE subject, ``p`` the dict of that
            subject's individual parameters (one entry of each leaf of `individual`).
        state_names: names of the ``d`` states (their number is ``d``).
        latent: ``latent(data) -> theta``, a NumPyro program fragment: ``numpyro.sample``
            every latent site (per-subject ones inside ``numpyro.plate("subjects", S)``)
            and return the dict site name -> value.
        individual: ``individual(theta, data) -> p``, a dict of per-subject ODE parameters,
            every leaf of shape ``(S,)`` or ``(S, ...)``.
        observation: ``observation(theta, p, ts (S, K), ys (S, K, d)) -> (S, K)``, the
            predicted observed value (e.g. ``a_central / v``).
        noise: ``noise(theta, pred (S, K)) -> distribution`` elementwise, batch shape
            ``(S, K)`` (e.g. ``dist.Normal(pred, theta["sigma"])``).
        t0: initial time (doses at ``t0`` go into the initial state).
        stiff: picks the default `solver` (``gs.Rodas5P()`` if stiff, else ``gs.Tsit5()``).
        obs_name: what the observed value (``DV``) is, e.g. ``"concentration mg/L"``.
        dose_scale: ``(d,)`` a dose of amount ``a`` into compartment ``c`` adds ``a *
            dose_scale[c]`` to state ``c`` (default ones; a unit change).
        dose_sizes: ``dose_sizes(theta, p, sizes (S, J, d)) -> sizes``, e.g. a
            bioavailability estimated from the data; default the identity.
        dose_parameters: ``dose_parameters(theta, p) -> dict`` of NONMEM's dose
            parameters per compartment ``c`` (1-based), each ``(S,)``: ``ALAGc`` a lag
            time, ``Fc`` a bioavailability, ``Rc``/``Dc`` the rate/duration of the data's
            ``RATE = -1``/``-2`` doses (`PopulationDataset.doses`); differentiable.

    Example:
        >>> model = models.theophylline()
        >>> data = models.load_dataset("theophylline")
        >>> theta = model.sample_latent(jax.random.key(0), data)     # lKa (), eta (12, 2)
        >>> p = model.individual(theta, data)                        # ka, ke, cl: (12,)
        >>> y0, jumps = model.dosing(theta, p, data)                 # (12, 2), None
        >>> sim = model.simulate(jax.random.key(1), theta, data)     # a PopulationDataset

    The user callables are kept as the static fields ``latent_fn``, ``individual_fn``,
    ``observation_fn``, ``noise_fn`` and ``dose_sizes_fn``; the methods of the same names
    (without ``_fn``) validate their input and output around them. `replace` makes a
    changed copy.

    Why one class: each method is one documented piece of the program above, checking a
    user callable's input and output; how doses become ``y0``, jumps or a schedule is in
    `models._population_doses`.
    """

    name: str = eqx.field(static=True)
    vector_field: Callable = eqx.field(static=True)
    state_names: tuple[str, ...] = eqx.field(static=True)
    t0: float = eqx.field(static=True)
    stiff: bool = eqx.field(static=True)
    obs_name: str = eqx.field(static=True)
    dose_scale: tuple[float, ...] = eqx.field(static=True)
    latent_fn: Callable = eqx.field(static=True)
    individual_fn: Callable = eqx.field(static=True)
    observation_fn: Callable = eqx.field(static=True)
    noise_fn: Callable = eqx.field(static=True)
    dose_sizes_fn: Callable = eqx.field(static=True)
    dose_parameters_fn: Callable | None = eqx.field(static=True)

    def __init__(
        self,
        *,
        name: str,
        vector_field: Callable,
        state_names: Sequence[str],
        latent: Callable,
        individual: Callable,
        observation: Callable,
        noise: Callable,
        t0: float = 0.0,
        stiff: bool = False,
        obs_name: str = "DV",
        dose_scale: Sequence[float] | None = None,
        dose_sizes: Callable | None = None,
        dose_parameters: Callable | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a non-empty string, got {name!r}")
        self.vector_field = _callable("vector_field", vector_field, "f(t, y, p) -> dy/dt")
        if isinstance(state_names, str) or not state_names:
            raise ValueError(f"`state_names` must be a non-empty tuple of names, got "
                             f"{state_names!r}")
        self.state_names = tuple(str(s) for s in state_names)
        d = len(self.state_names)
        self.latent_fn = _callable("latent", latent, "latent(data) -> dict")
        self.individual_fn = _callable("individual", individual,
                                       "individual(theta, data) -> dict")
        self.observation_fn = _callable("observation", observation,
                                        "observation(theta, p, ts, ys) -> (S, K)")
        self.noise_fn = _callable("noise", noise, "noise(theta, pred) -> distribution")
        self.dose_sizes_fn = _doses.identity_doses if dose_sizes is None else _callable(
            "dose_sizes", dose_sizes, "dose_sizes(theta, p, sizes) -> sizes")
        self.dose_parameters_fn = None if dose_parameters is None else _callable(
            "dose_parameters", dose_parameters, "dose_parameters(theta, p) -> dict")
        try:
            self.t0 = float(t0)
        except (TypeError, ValueError):
            raise ValueError(f"`t0` must be a Python float (a scalar), got {t0!r}") from None
        scale = np.ones(d) if dose_scale is None else np.asarray(dose_scale, dtype=np.float64)
        if scale.shape != (d,) or not np.all(np.isfinite(scale)):
            raise ValueError(f"`dose_scale` must be {d} finite numbers (one per state), got "
                             f"{dose_scale!r}")
        self.dose_scale = tuple(float(x) for x in scale)
        if not isinstance(obs_name, str):
            raise ValueError(f"`obs_name` must be a string, got {obs_name!r}")
        self.name, self.stiff, self.obs_name = name, bool(stiff), obs_name

    # ------------------------------------------------------------------ descriptive
    @property
    def n_states(self) -> int:
        """``d``, the number of states."""
        return len(self.state_names)

    @property
    def solver(self):
        """The default solver: ``gs.Rodas5P()`` if ``stiff`` else ``gs.Tsit5()``."""
        return default_solver(self.stiff)

    def replace(self, **changes: Any) -> "PopulationModel":
        """A copy with some constructor arguments changed (validated again), e.g.
        ``model.replace(dose_sizes=lambda theta, p, sizes: 0.8 * sizes)``."""
        kwargs = dict(
            name=self.name, vector_field=self.vector_field, state_names=self.state_names,
            latent=self.latent_fn, individual=self.individual_fn,
            observation=self.observation_fn, noise=self.noise_fn, t0=self.t0,
            stiff=self.stiff, obs_name=self.obs_name, dose_scale=self.dose_scale,
            dose_sizes=self.dose_sizes_fn, dose_parameters=self.dose_parameters_fn,
        )
        unknown = sorted(set(changes) - set(kwargs))
        if unknown:
            raise ValueError(f"replace() got unknown arguments {unknown}")
        if "state_names" in changes and "dose_scale" not in changes:
            kwargs["dose_scale"] = None
        kwargs.update(changes)
        return PopulationModel(**kwargs)

    # ------------------------------------------------------------------ the program's pieces
    def latent(self, data: PopulationDataset) -> dict[str, jax.Array]:
        """``numpyro.sample`` every latent site (inside a NumPyro program) and return the
        dict ``theta``: site name -> value."""
        data = _checked_data(data, f"{self.name}.latent")
        theta = self.latent_fn(data)
        if not isinstance(theta, Mapping):
            raise ValueError(f"{self.name}: `latent` must return a dict of the latent values, "
                             f"got {type(theta).__name__}")
        return dict(theta)

    def individual(self, theta: Mapping[str, Any], data: PopulationDataset
                   ) -> dict[str, jax.Array]:
        """Each subject's ODE parameters: a dict, every leaf ``(S,)`` or ``(S, ...)``."""
        data = _checked_data(data, f"{self.name}.individual")
        p = self.individual_fn(theta, data)
        if not isinstance(p, Mapping):
            raise ValueError(f"{self.name}: `individual` must return a dict of per-subject "
                             f"parameters, got {type(p).__name__}")
        S = data.n_subjects
        p = {k: jnp.asarray(v) for k, v in p.items()}
        bad = {k: tuple(v.shape) for k, v in p.items() if v.ndim == 0 or v.shape[0] != S}
        if bad:
            raise ValueError(
                f"{self.name}: `individual` must give every parameter a leading subject axis "
                f"of {S} (broadcast population values, e.g. jnp.broadcast_to(ke, ({S},))); "
                f"got shapes {bad}"
            )
        return p

    def dosing(self, theta: Mapping[str, Any], p: Mapping[str, Any], data: PopulationDataset
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """The initial state and the doses after ``t0``: ``(y0 (S, d), jumps)``.

        ``data.jumps(d, scale=dose_scale)``, through ``dose_sizes(theta, p, sizes)``. Doses
        at exactly ``t0`` are added to ``y0 = zeros(d)`` (so a single dose at ``t0`` needs
        no event; `observation` reads the pre-dose state at ``t0``, as for every dose). The
        rest are ``jumps = (times (S, J'), sizes (S, J', d))`` for ``gs.solve``, padded with
        ``inf`` times (inert), or ``None`` when no dose is left. Doses after the data's last
        observation time change no prediction and are dropped (``gs.solve`` refuses jump
        times past ``t1``). ``data`` is concrete; ``theta`` and ``p`` may be traced.

        A data set with zero-order inputs (``RATE``/``DUR``), steady-state doses (``SS``)
        or resets (``EVID`` 3/4), and a model with `dose_parameters`, give ``(zeros (S,
        d), schedule)`` instead: every dose in a ``gradsolve.DoseSchedule``
        (`PopulationDataset.doses` at ``dose_scale`` and the dose parameters), which a
        solve takes as ``doses=``.
        """
        data = _checked_data(data, f"{self.name}.dosing")
        return _doses.initial_state_and_doses(self, theta, p, data)

    def solved_at_t0(self, data: PopulationDataset) -> np.ndarray:
        """``(S, K)`` booleans for `observation`'s ``as_solved``: the observations at
        ``t0`` whose solved state is what they read. Those after a dose row at ``t0``
        (`PopulationDataset.observations_after`), and every one when the doses are a
        schedule (`dosing` then folds nothing into ``y0``: the solve itself reads the
        state before the doses at ``t0``, or a steady state reached before ``t0``)."""
        after = data.observations_after()
        if data.needs_schedule or self.dose_parameters_fn is not None:
            return np.ones_like(after)
        return after

    def observation(self, theta: Mapping[str, Any], p: Mapping[str, Any], ts: Any,
                    ys: jax.Array, as_solved: Any = None) -> jax.Array:
        """The predicted observed values ``(S, K)`` of solved states ``ys (S, K, d)`` at
        times ``ts (S, K)``.

        At ``ts == t0`` the state read is the pre-dose one (``zeros(d)``: `dosing` folds
        the doses at ``t0`` into ``y0``, which a solve saves at ``t0``), as everywhere else
        a save time equal to a dose time reads the state before the dose (gradsolve's jump
        rule, NONMEM's order of a pre-dose sample), except for the observations
        ``as_solved`` (``(S, K)`` booleans, `solved_at_t0`), which keep the solved state:
        an observation row after the dose row at ``t0``, or doses given as a schedule.
        """
        ts = jnp.asarray(ts, dtype=jnp.result_type(ys))
        if ys.ndim != 3 or ys.shape[:2] != ts.shape or ys.shape[2] != self.n_states:
            raise ValueError(f"{self.name}: `ys` must have shape (S, K, {self.n_states}) "
                             f"matching ts {ts.shape}, got {ys.shape}")
        pre = ts == self.t0
        if as_solved is not None:
            pre = pre & ~jnp.asarray(as_solved, bool)
        ys = jnp.where(pre[..., None], 0.0, ys)   # pre-dose state at t0
        pred = jnp.asarray(self.observation_fn(theta, p, ts, ys))
        if pred.shape != ts.shape:
            raise ValueError(f"{self.name}: `observation` must return shape {ts.shape} "
                             f"(S, K), got {pred.shape}")
        return pred

    def noise(self, theta: Mapping[str, Any], pred: jax.Array) -> dist.Distribution:
        """The elementwise observation distribution, batch shape ``(S, K)``."""
        d = self.noise_fn(theta, pred)
        if not isinstance(d, dist.Distribution):
            raise ValueError(f"{self.name}: `noise` must return a NumPyro distribution, got "
                             f"{type(d).__name__}")
        if tuple(d.batch_shape) != tuple(jnp.shape(pred)) or tuple(d.event_shape) != ():
            raise ValueError(f"{self.name}: `noise` must return an elementwise distribution "
                             f"of batch shape {jnp.shape(pred)}; got batch shape "
                             f"{tuple(d.batch_shape)}, event shape {tuple(d.event_shape)}")
        return d

    def observations(self, theta: Mapping[str, Any], pred: jax.Array,
                     censored: Any = None) -> dist.Distribution:
        """The distribution of all observations, event shape ``(S, K)``, whose
        ``log_prob`` skips missing (NaN) entries (the padding of
        ``PopulationDataset.observations``): `MissingObservations` of ``noise(theta,
        pred).to_event(2)``; with ``censored`` (``(S, K)``, `PopulationDataset.censoring`)
        a `CensoredObservations`: a censored entry's term is the probability of lying
        below (``1``) or above (``-1``) its value, Beal's M3 method."""
        noise = self.noise(theta, pred)
        if censored is not None and np.any(np.asarray(censored) != 0):
            return CensoredObservations(noise, pred, censored)
        return MissingObservations(noise.to_event(2), pred)

    # ------------------------------------------------------------------ drawing
    def sample_latent(self, key: jax.Array, data: PopulationDataset) -> dict[str, jax.Array]:
        """Draw every latent site of `latent` from its prior (``numpyro.handlers.seed``
        and ``trace``): a dict site name -> value (per-subject sites with their ``S``)."""
        from numpyro import handlers

        data = _checked_data(data, f"{self.name}.sample_latent")
        tr = handlers.trace(handlers.seed(self.latent_fn, rng_seed=key)).get_trace(data)
        return {k: s["value"] for k, s in tr.items()
                if s["type"] == "sample" and not s["is_observed"]}

    def solve_args(self, theta: Mapping[str, Any], data: PopulationDataset) -> "SolveArgs":
        """What the subjects' one ensemble solve takes, given all latent values ``theta``:
        the vector field, ``t0``, ``t1`` (the last observation time), each subject's initial
        state and ODE parameters, the observation times ``(S, K)`` and the doses (as
        ``gradsolve.solve``'s ``doses=`` or ``jumps=``). `predict`, the NumPyro program
        (`inference.population_program`) and the population fit all solve from it.

        Example:
            >>> a = model.solve_args(theta, data)
            >>> sol = gs.solve(a.f, a.t0, a.t1, a.y0, a.params, ts=a.ts, **a.events)
        """
        import gradsolve as gs

        p = self.individual(theta, data)
        y0, jumps = self.dosing(theta, p, data)
        ts, _ = data.observations()
        events = {"doses": jumps} if isinstance(jumps, gs.DoseSchedule) else {"jumps": jumps}
        after = data.observations_after()
        if after.any():
            events["ts_after"] = after
        return SolveArgs(self.vector_field, self.t0, float(np.max(ts)), y0, p,
                         jnp.asarray(ts, y0.dtype), events)

    def predict(self, theta: Mapping[str, Any], data: PopulationDataset, *,
                rtol: float | None = None, atol: float = 1e-12, **solve_kwargs: Any
                ) -> jax.Array:
        """Noise-free predictions ``(S, K)`` at ``data.observations()`` times, given all
        latent values ``theta``: the program above with ``gradsolve.solve`` (tight default
        tolerances: synthetic data should not carry a fit's discretisation error). ``rtol``
        defaults to 1e-10, or 8 machine epsilons where that is larger (float32: 9.5e-7;
        the solver refuses tolerances its states cannot resolve)."""
        import gradsolve as gs

        if rtol is None:
            rtol = max(1e-10, 8.0 * float(jnp.finfo(jnp.result_type(float)).eps))
        data = _checked_data(data, f"{self.name}.predict")
        a = self.solve_args(theta, data)
        sol = gs.solve(a.f, a.t0, a.t1, a.y0, a.params, ts=a.ts, **a.events,
                       solver=solve_kwargs.pop("solver", self.solver), rtol=rtol, atol=atol,
                       **solve_kwargs)
        return self.observation(theta, a.params, data.observations()[0], sol.ys,
                                as_solved=self.solved_at_t0(data))

    def simulate(self, key: jax.Array, theta: Mapping[str, Any], design: PopulationDataset,
                 *, rtol: float | None = None, atol: float = 1e-12, **solve_kwargs: Any
                 ) -> PopulationDataset:
        """Synthetic data: the observations drawn at the design's observation times given
        ALL latent values ``theta`` (per-subject ones included).

        Args:
            key: a JAX PRNG key for the noise.
            theta: the latent values (e.g. `sample_latent`, or a known truth).
            design: a `PopulationDataset` giving subjects, doses, covariates and
                observation times; its ``DV`` values are ignored.
            rtol, atol: tolerances of ``gradsolve.solve`` (other keywords go to it too;
                ``rtol`` defaults as in `predict`).

        Returns:
            A new `PopulationDataset` (same subjects, doses, covariates, times) with the
            simulated values.
        """
        design = _checked_data(design, f"{self.name}.simulate")
        pred = self.predict(theta, design, rtol=rtol, atol=atol, **solve_kwargs)
        draws = np.asarray(self.noise(theta, pred).sample(key))
        subjects = [s._replace(ys=draws[i, : s.ts.size].copy())
                    for i, s in enumerate(design.subjects)]
        return PopulationDataset(subjects, design.covariate_names, name=design.name,
                                 units=design.units,
                                 source=f"simulated from population model {self.name!r}")
