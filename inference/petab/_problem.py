"""A PEtab problem (`models.PetabProblem`) behind the interface every method uses.

`petab_program` writes the problem's posterior as a NumPyro program: one bounded site per
estimated parameter (named by its id, on the table's scale, with the table's prior), the
pre-equilibration and the simulation as `inference.ode` sites, and the PEtab
log-likelihood as a factor. `PetabProgramProblem` is the `ProgramProblem` of that
program, so `inference.sample` runs on a PEtab problem exactly as on any other
program: the sites' meshes recorded once and replayed for every gradient, re-recorded by
the same `MeshPolicy`, with checkpoints, progress, retuning and the same ArviZ output.
Its residuals (`replay_residuals`, `record_at`) are what `inference.fit`'s least-squares
multistart reads.

`PetabFitProblem` is the same problem over the coordinates fits and profiles move in: the
estimated parameters on the table's scales (``lin``, ``log``, ``log10``) inside its bounds,
hierarchical inner parameters solved in closed form inside every evaluation; its
`residual_terms` are what the batched Levenberg–Marquardt reads. What the table means to
a fit is here too (`table_starts`: Latin hypercube starts after the user's rows, checked
against the table; `table_params`: a result's inner parameters; `default_method`).

Why a program and not a problem class of its own for sampling: the sampler's machinery (per-chain
meshes, their merging at the end of warmup, replays under ``vmap``) already exists for
programs with several ode sites; a PEtab problem is one such program whose sites are an
ensemble of its conditions. Moving it onto that path replaced a plain-NumPyro sampler
that solved adaptively at every evaluation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from .._checkpoint import digest
from ..problem._abstract import AbstractProblem, ResidualTerms
from ..problem._ode import ode
from ..problem._program import ProgramProblem, problem_of, register_kind  # noqa: F401

__all__ = ["is_petab", "petab_program", "PetabProgramProblem", "PetabFitProblem",
           "finite_bounds", "problem_of", "latin_hypercube", "table_starts", "table_params",
           "default_method"]


def is_petab(model) -> bool:
    """Whether ``model`` is a `models.PetabProblem` (without importing the PEtab extra)."""
    import sys

    mod = sys.modules.get("models._petab._problem")
    return mod is not None and isinstance(model, mod.PetabProblem)


def finite_bounds(problem) -> tuple[np.ndarray, np.ndarray]:
    """The PEtab problem's ``(lower, upper)`` on the parameter scale, checked finite with
    ``lower < upper`` (starts and the sampler's coordinates live inside them)."""
    lo, hi = (np.asarray(b, float) for b in problem.bounds)
    bad = [p for p, a, b in zip(problem.parameter_ids, lo, hi)
           if not (np.isfinite(a) and np.isfinite(b) and b > a)]
    if bad:
        raise ValueError(f"parameters {bad} need finite bounds with lowerBound < upperBound on "
                         "their parameter scale for starts inside the bounds")
    return lo, hi


class TablePrior(dist.Distribution):
    """One estimated parameter's prior on its scale, as the parameter table gives it
    (``objectivePriorType``, truncated to the bounds; uniform in them where none is
    given): its support is the bounds, so the sampler moves in ``u`` with
    ``x = lower + (upper - lower) sigmoid(u)``.

    Args:
        problem: the `models.PetabProblem`; index: the parameter's position in
            ``problem.parameter_ids``.
    """

    arg_constraints = {}
    reparametrized_params = []

    def __init__(self, problem, index: int):
        lo, hi = finite_bounds(problem)
        self.problem, self.index = problem, int(index)
        self.low, self.high = float(lo[index]), float(hi[index])
        self._x0 = jnp.asarray(np.clip(np.asarray(problem.nominal, float), lo, hi))
        super().__init__(batch_shape=(), event_shape=())

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.interval(self.low, self.high)

    def sample(self, key, sample_shape=()):
        """Uniform draws inside the bounds (starts; the table's priors are not drawn
        from)."""
        return jax.random.uniform(key, sample_shape, minval=self.low, maxval=self.high)

    def log_prob(self, value):
        value = jnp.asarray(value)

        def one(v):
            x = self._x0.astype(v.dtype).at[self.index].set(v)
            return self.problem.log_prior_terms(x)[self.index]

        flat = jnp.reshape(value, (-1,))
        return jnp.reshape(jax.vmap(one)(flat), jnp.shape(value))


def _site_solve(name, f, t0, t1, y0, params, *, ts=None, jumps=None):
    return ode(name, f, t0, t1, y0, params, ts=ts, jumps=jumps)


def petab_program(problem):
    """The NumPyro program of a `models.PetabProblem`'s posterior: ``program(data=None)``.

    Sites: one per estimated parameter of ``problem`` (its id; `TablePrior`, on the
    parameter scale);
    the ode sites ``"preequilibration"`` (where the problem has one) and ``"simulation"``
    (every condition one ensemble); the factor ``"log_likelihood"`` (PEtab's, NaN where a
    solve fails read as ``-inf``). Under plain NumPyro the ode sites solve with
    ``gs.solve``; under `inference.sample` they replay kept meshes.
    """
    ids = tuple(problem.parameter_ids)
    priors = [TablePrior(problem, i) for i in range(len(ids))]

    def program(data=None):
        x = jnp.stack([jnp.asarray(numpyro.sample(pid, prior))
                       for pid, prior in zip(ids, priors)])
        ll = problem.log_likelihood(x, solve=_site_solve)
        numpyro.factor("log_likelihood", jnp.where(jnp.isnan(ll), -jnp.inf, ll))

    program.__name__ = problem.odes.model_id
    program.__doc__ = f"NumPyro program of PEtab problem {problem.odes.model_id!r}."
    return program


class PetabProgramProblem(ProgramProblem):
    """The `ProgramProblem` of a PEtab problem (`petab_program` of ``problem.full``: a
    site for every estimated parameter, hierarchical or not), with the problem's own
    solver, tolerances and step capacity unless the caller gives others.

    Attributes:
        petab: the `models.PetabProblem` (with the settings the run solves at).
    """

    def __init__(self, problem, *, solver=None, rtol: float | None = None,
                 atol: float | None = None, max_steps: int | None = None):
        problem = problem.with_settings(solver=solver, rtol=rtol, atol=atol,
                                        max_steps=max_steps)
        self.petab = problem
        # the program has a site for every estimated parameter, those hierarchical
        # optimisation solves in closed form included (`PetabProblem.full`): with them at
        # their optimum inside the density, NUTS would draw from a profile likelihood, not
        # the posterior. Fits and profiles run on ``petab`` itself, closed forms and all.
        super().__init__(petab_program(problem.full), None, name=problem.odes.model_id,
                         solver=problem.solver, rtol=problem.rtol, atol=problem.atol,
                         max_steps=problem.max_steps, source=problem)
        # the starts of a MAP fit: PEtab's least-squares multistart (inference.fit's
        # route for a problem with residuals) converges in tens of iterations
        self.map_fit_options = dict(n_starts=10, steps=1000)

    @property
    def fit_problem(self) -> "PetabFitProblem":
        """The problem `inference.fit` moves in: the outer parameters on the table's
        scales inside its bounds (`PetabFitProblem`), not the sampler's coordinates."""
        return PetabFitProblem(self.petab)

    def fingerprint(self) -> dict:
        """The program's fingerprint and a digest of the measurement table."""
        df = self.petab.petab_problem.measurement_df
        return dict(super().fingerprint(),
                    measurements=digest(df.to_csv(index=False).encode()))

    def start_point(self, params) -> jax.Array:
        """``u`` of a point (a fit's best, or the user's ``init``; leaves ``()`` or
        ``(n,)``), pulled 0.1 % of each range inside the bounds: a
        parameter the data leave flat up to a bound would start NUTS far out in the
        sigmoid's flat tail (at ``u = +-inf`` on the bound itself)."""
        full = self.petab.full  # the program's sites: every estimated parameter
        lo, hi = finite_bounds(full)
        ids = full.parameter_ids
        x = np.stack([np.asarray(params[p], float) for p in ids], axis=-1)
        x = np.clip(x, lo + 1e-3 * (hi - lo), hi - 1e-3 * (hi - lo))
        return self.space.to_unconstrained({p: x[..., i] for i, p in enumerate(ids)})

    def to_x(self, u) -> jax.Array:
        """Unconstrained ``u (..., D)`` -> the parameters on their scales ``(..., D)`` in
        the order of ``petab.full.parameter_ids``."""
        return self.space.flat_constrained(jnp.asarray(u))

    def observed_data(self) -> tuple[dict, dict, dict]:
        """The measurements, for ``arviz`` (one value per row of the measurement table)."""
        df = self.petab.petab_problem.measurement_df
        return ({"measurement": np.asarray(df["measurement"], float)},
                {"measurement": ["measurement_row"]}, {})


# ------------------------------------------------------------------ what the table means
# to a fit: the starts (Latin hypercube draws inside the bounds on the parameter scale,
# after the ``init`` rows the user gives, checked against the table), the parameters of a
# result (hierarchical optimisation's inner parameters at their closed-form optimum), the
# default local optimiser. `PetabFitProblem`'s ``fit_starts``, ``fit_params`` and
# ``default_method`` call them.

def latin_hypercube(lower, upper, n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, D)`` points inside ``[lower, upper]``: each coordinate's range cut into ``n``
    equal strata, one point in each, strata paired at random across coordinates (McKay,
    Beckman & Conover 1979)."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    d = lower.shape[0]
    strata = np.stack([rng.permutation(n) for _ in range(d)], axis=1)
    u = (strata + rng.uniform(size=(n, d))) / n
    return lower + (upper - lower) * u


def table_starts(problem, init, n_starts: int, seed: int, lo, hi) -> np.ndarray:
    """The starts ``(n, D)`` of a fit of ``problem`` (a `models.PetabProblem`) inside
    ``[lo, hi]`` (its finite bounds): Latin hypercube draws seeded by ``seed``, after the
    given ``init`` rows (checked by `_given_starts`)."""
    for name, v in (("n_starts", n_starts),):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
    rng = np.random.default_rng(seed)
    x = latin_hypercube(lo, hi, n_starts, rng)
    if init is None:
        return x
    given = _given_starts(problem, init, lo, hi)
    if len(given) > n_starts:
        raise ValueError(f"`init` holds {len(given)} starts, more than n_starts={n_starts}")
    x[: len(given)] = given
    return x


def _given_starts(problem, init, lo, hi) -> np.ndarray:
    """``init`` (a dict by parameter id, a ``(D,)`` vector or ``(k, D)`` rows, on the
    parameter scale) as ``(k, D)`` rows, refused with a ``ValueError`` naming the key,
    parameter or row where it is not a start of ``problem``: an unknown key, a missing
    parameter, a value that is not finite or lies outside the bounds (the optimiser would
    clip it to the bound without a word: typically a value given on the linear scale)."""
    ids = list(problem.parameter_ids)
    if isinstance(init, dict):
        # a previous fit's params hold the inner parameters too: known, set in closed form
        unknown = set(init) - set(ids) - set(problem.inner_parameter_ids)
        if unknown:
            raise ValueError(f"`init` has keys {sorted(unknown)} that are not parameters "
                             f"of the problem (estimated: {ids})")
        missing = set(ids) - set(init)
        if missing:
            raise ValueError(f"`init` is missing parameters {sorted(missing)}")
        given = np.stack([np.asarray(init[p], float).reshape(-1) for p in ids], axis=1)
    else:
        given = np.atleast_2d(np.asarray(init, float))
    if given.ndim != 2 or given.shape[1] != len(ids):
        inner = ""
        if given.shape[-1] == len(problem.full_parameter_ids) != len(ids):
            inner = (f"; the inner parameters {list(problem.inner_parameter_ids)} are set "
                     "in closed form: give the outer ones, or a dict by id")
        raise ValueError(f"`init` has {given.shape[-1]} parameters, the problem "
                         f"{len(ids)} ({ids}){inner}")
    bad = np.argwhere(~np.isfinite(given))
    if len(bad):
        row, j = bad[0]
        raise ValueError(f"`init`'s parameter '{ids[j]}' (start {row}) is {given[row, j]}; "
                         "starts must be finite")
    # a hair of slack: a start read back from a fit's result sits on its bound
    slack = 1e-9 * (hi - lo)
    bad = np.argwhere((given < lo - slack) | (given > hi + slack))
    if len(bad):
        row, j = bad[0]
        v, scale = given[row, j], problem.scales[j]
        hint = ""
        if scale != "lin" and v > 0:
            on_scale = np.log10(v) if scale == "log10" else np.log(v)
            if lo[j] <= on_scale <= hi[j]:
                hint = (f"; starts are on the parameter scale: was {v:g} given linear? "
                        f"its {scale} is {on_scale:.6g}")
        raise ValueError(f"`init`'s parameter '{ids[j]}' (start {row}) is {v:g}, outside "
                         f"its bounds [{lo[j]:g}, {hi[j]:g}] on its {scale} scale{hint}")
    return np.clip(given, lo, hi)


def table_params(problem, x, full=None) -> dict:
    """Each start's parameters by id from its outer point ``x (n, D)``: with inner
    parameters, every estimated parameter (``full (n, n_full)``, else computed here by
    ``problem.full_parameters``), else those of ``x``."""
    if not problem.inner_parameter_ids:
        return {p: x[:, i] for i, p in enumerate(problem.parameter_ids)}
    if full is None:
        full = np.asarray(jax.jit(jax.vmap(problem.full_parameters))(jnp.asarray(x)))
    return {p: full[:, i] for i, p in enumerate(problem.full_parameter_ids)}


def default_method(problem) -> str:
    """The local optimiser of a `models.PetabProblem`'s fit: ``"lm"`` (the batched
    Levenberg–Marquardt on its noise-weighted residuals) where every noise model is
    normal, else ``"lbfgs"`` (L-BFGS-B: Laplace noise is no sum of squares)."""
    return "lbfgs" if np.asarray(problem.residual_layout().laplace).any() else "lm"


class _Replay:
    """What `PetabFitProblem.log_density` returns beside the value: the replay's (or the
    fresh solve's) error ratio per condition."""

    def __init__(self, error_ratio):
        self.error_ratio = error_ratio


class PetabFitProblem(AbstractProblem):
    """A `models.PetabProblem` over the coordinates its fits and profiles move in:
    ``x (D,)`` or ``(n, D)``, the estimated parameters (hierarchical optimisation's outer
    ones) on the table's scales, inside its bounds.

    The objective is PEtab's negative log-likelihood (inner parameters at their closed-form
    optimum), plus minus the table's given priors with ``prior`` (the ``"map"`` fit's); its
    `residual_terms` are the noise-weighted residuals and log noise scales the batched
    Levenberg–Marquardt reads. Sampling runs on `PetabProgramProblem` instead (every
    parameter a site, none profiled out).

    Args:
        problem: the `models.PetabProblem`; solver, rtol, atol, max_steps: settings that
            replace the problem's own where given.
    """


    def __init__(self, problem, *, solver=None, rtol: float | None = None,
                 atol: float | None = None, max_steps: int | None = None):
        self.petab = self.source = problem.with_settings(
            solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)
        self.space = None  # the coordinates are the parameters themselves (`start_point`)
        self.dim = len(problem.parameter_ids)
        layout = problem.residual_layout()
        self._layout = layout
        self._given = bool(np.any(problem.priors.given))

    def with_tolerance_factor(self, factor: float) -> "PetabFitProblem":
        """The same problem with its solves at ``factor`` times its tolerances (the global
        search ranks its points by such looser solves: a ranking needs no eight digits)."""
        p = self.petab
        return PetabFitProblem(p, rtol=p.rtol * factor, atol=p.atol * factor)

    def names(self) -> tuple[str, ...]:
        """The estimated (outer) parameter ids, in the table's order."""
        return tuple(self.petab.parameter_ids)

    def scales(self) -> tuple[str, ...]:
        """``"lin"``, ``"log"`` or ``"log10"``: each parameter's ``parameterScale``."""
        return tuple(self.petab.scales)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The table's ``(lowerBound, upperBound)`` on the parameter scales."""
        lo, hi = self.petab.bounds
        return np.asarray(lo, float).copy(), np.asarray(hi, float).copy()

    def sample_starts(self, key, n: int) -> np.ndarray:
        """``(n, D)`` Latin hypercube samples of the bounds (pyPESTO's starts), seeded from
        ``key``."""
        seed = int(np.asarray(jax.random.randint(key, (), 0, 2**31 - 1)))
        lo, hi = finite_bounds(self.petab)
        return latin_hypercube(lo, hi, int(n), np.random.default_rng(seed))

    def start_point(self, params) -> np.ndarray:
        """``x (D,)`` (or ``(n, D)``) of a dict by parameter id on the parameter scales."""
        return np.stack([np.asarray(params[p], float) for p in self.names()], axis=-1)

    kind = "PEtab problem"
    """How `inference.fit`'s messages name this problem."""

    @property
    def default_method(self) -> str:
        """`inference.fit`'s ``method="auto"``: the batched Levenberg–Marquardt where every
        noise model is normal, else L-BFGS-B."""
        return default_method(self.petab)

    def fit_starts(self, init, n_starts: int, seed: int) -> np.ndarray:
        """`inference.fit`'s starts ``(n, D)``: Latin hypercube draws in the bounds seeded
        by ``seed``, after the ``init`` rows (a dict by id, a vector or rows on the
        parameter scales), checked against the table with errors naming the parameter."""
        lo, hi = finite_bounds(self.petab)
        return table_starts(self.petab, init, n_starts, seed, lo, hi)

    def fit_params(self, x) -> dict:
        """Each start's parameters by id at ``x (n, D)``, hierarchical optimisation's inner
        parameters at their closed-form optimum there."""
        return table_params(self.petab, np.asarray(x, float))

    def fit_point(self, result) -> np.ndarray:
        """``x (D,)`` of a PEtab fit's ``params``, checked to be a fit of this problem
        (its parameter ids, in order; finite; inside the bounds): ValueError naming
        what differs."""
        ids = self.names()
        inner = tuple(self.petab.inner_parameter_ids)
        theirs = tuple(result.parameter_ids) if getattr(result, "parameter_ids", None) \
            is not None else tuple(result.params)
        if theirs != ids:
            extra = [p for p in theirs if p not in ids]
            missing = [p for p in ids if p not in theirs]
            how = ("; it was fitted without hierarchical optimisation: profile it on "
                   "problem.full" if inner and set(theirs) == set(self.petab.full_parameter_ids)
                   else "")
            raise ValueError("inference.profile: `result` is a fit of another problem: "
                             + (f"it estimates {extra}, which this problem does not"
                                if extra else "") + ("; " if extra and missing else "")
                             + (f"it lacks {missing}" if missing else "")
                             + ("" if extra or missing else
                                f"its parameters are in another order {list(theirs)}")
                             + f" (the problem's: {list(ids)}){how}")
        x = np.array([float(np.asarray(result.params[p])) for p in ids])
        bad = [p for p, v in zip(ids, x) if not np.isfinite(v)]
        if bad:
            raise ValueError(f"inference.profile: `result`'s params {bad} are not finite "
                             "(a failed fit)")
        lo, hi = self.bounds()
        outside = [p for p, a, b, v in zip(ids, lo, hi, x) if not (a <= v <= b)]
        if outside:
            raise ValueError(f"inference.profile: `result` is a fit of another problem: "
                             f"{outside} lie outside the problem's bounds")
        return x

    def refuse_parameters(self, names) -> None:
        """ValueError where ``names`` holds inner parameters of hierarchical optimisation
        (solved in closed form at every point: profiled out, not profiled), saying how to
        profile them."""
        hier = [p for p in names if p in self.petab.inner_parameter_ids]
        if hier:
            kinds = ", ".join(f"'{p}' ({self.petab.inner_kinds[p]})" for p in hier)
            raise ValueError(
                f"inference.profile: `parameters`: {kinds} "
                f"{'is an inner parameter' if len(hier) == 1 else 'are inner parameters'} "
                "of hierarchical optimisation: computed in closed form at every point (so "
                "profiled out, not profiled). To profile it, load the problem without "
                "hierarchical optimisation, models.load_petab(..., hierarchical=False) "
                "(or problem.full), and fit and profile that")

    def _penalty(self, x):
        return -self.petab.log_prior(x, jacobian=False, given_only=True)

    def _one(self, x, mesh, prior):
        lap = jnp.asarray(self._layout.laplace)
        if mesh is None:
            z, s, err = self.petab._residuals_on(x, None)
        else:
            z, s, err = self.petab.replay_residuals(x, mesh)
        f = jnp.sum(jnp.where(lap, jnp.abs(z), 0.5 * z**2) + s) - self._layout.constant
        if prior and self._given:
            f = f + self._penalty(x)
        return jnp.where(jnp.isnan(f), jnp.inf, f), err

    def objective(self, u, mesh=None, *, prior: bool = True):
        """``(value, aux)``: PEtab's negative log-likelihood at ``x (D,)`` or ``(n, D)``
        (minus the table's given priors with ``prior``), by a fresh solve or a replay of
        ``mesh`` (`record`'s); ``inf`` where a solve fails; ``aux.error_ratio`` per
        condition."""
        f, err = self._objective_jit(jnp.asarray(u, float), mesh, bool(prior))
        return f, _Replay(err)

    @functools.cached_property
    def _objective_jit(self):
        def batch(x, mesh, prior):
            if x.ndim == 1:
                return self._one(x, mesh, prior)
            if mesh is None:
                return jax.vmap(lambda xi: self._one(xi, None, prior))(x)
            return jax.vmap(lambda xi, m: self._one(xi, m, prior))(x, mesh)

        return jax.jit(batch, static_argnums=2)

    def log_density(self, u, mesh=None, *, prior: bool = True, jacobian: bool = True,
                    max_steps: int | None = None):
        """Minus `objective` (the coordinates are the parameters: no Jacobian term)."""
        f, aux = self.objective(u, mesh, prior=prior)
        return -f, aux

    def residual_terms(self, *, prior: bool = True) -> ResidualTerms:
        """PEtab's noise-weighted residuals ``z`` and log noise scales, replayed on kept
        meshes; the table's given priors as the penalty with ``prior``; conditions of
        similar mesh length evaluated together where there are several."""
        petab = self.petab
        cost = None
        if len(petab.condition_ids) > 1:
            def cost(mesh):
                return np.max(np.asarray(mesh.n_steps), axis=-1)
        return ResidualTerms(
            record=petab.record, terms=petab.replay_residuals,
            laplace=np.asarray(self._layout.laplace), profiled=self._layout.profiled,
            penalty=self._penalty if prior and self._given else None,
            constant=-float(self._layout.constant), cost=cost)

    def fingerprint(self) -> dict:
        """The model id, the settings and a digest of the measurement table."""
        p = self.petab
        df = p.petab_problem.measurement_df
        return dict(model=p.odes.model_id, parameters=self.names(), solver=repr(p.solver),
                    rtol=p.rtol, atol=p.atol, max_steps=p.max_steps,
                    measurements=digest(df.to_csv(index=False).encode()))

    def record(self, u, tol_factor: float = 1.0):
        """Every condition's mesh at ``x (D,)`` (``(n, D)``: one per row)."""
        x = jnp.asarray(u, float)
        if x.ndim == 1:
            return self.petab.record(x, tol_factor)
        return jax.vmap(lambda xi: self.petab.record(xi, tol_factor))(x)

    def ragged_replay(self, u, mesh) -> bool:
        """False: the conditions replay under ``vmap`` (every slot runs)."""
        return False

    def error_ratio(self, u, mesh):
        """The replay's error ratio per condition at ``x (D,)``."""
        return self.petab.replay_residuals(jnp.asarray(u, float), mesh)[2]

    def observed_data(self) -> tuple[dict, dict, dict]:
        """The measurements, one value per row of the measurement table."""
        df = self.petab.petab_problem.measurement_df
        return ({"measurement": np.asarray(df["measurement"], float)},
                {"measurement": ["measurement_row"]}, {})


def _petab_problem(model, data, *, solver=None, rtol=None, atol=None, max_steps=None,
                   fit: bool = False):
    """A PEtab problem's `PetabProgramProblem` (sampling), or with ``fit`` its
    `PetabFitProblem` (the coordinates fits move in, built without tracing the sampler's
    program); it carries its data (``data`` must be ``None``) and ``None`` settings are the
    problem's own. `problem_of` reaches it through `register_kind`."""
    if data is not None:
        raise ValueError("`data` does not apply to a PEtab problem (it carries its "
                         "measurements); pass data=None")
    if jnp.result_type(float) != jnp.float64:
        raise ValueError("a PEtab problem is fitted, sampled and profiled in 64-bit "
                         "floats, as it was loaded: call gs.enable_x64() again (import "
                         "gradsolve as gs)")
    kind = PetabFitProblem if fit else PetabProgramProblem
    return kind(model, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)


# every method finds a PEtab problem's problems through `problem_of`, none names them
register_kind(is_petab, _petab_problem)
