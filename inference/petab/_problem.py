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

Why a program and not a problem class of its own: the sampler's machinery (per-chain
meshes, their merging at the end of warmup, replays under ``vmap``) already exists for
programs with several ode sites; a PEtab problem is one such program whose sites are an
ensemble of its conditions. Moving it onto that path replaced a plain-NumPyro sampler
that solved adaptively at every evaluation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from .._checkpoint import digest
from ..problem._ode import ode
from ..problem._program import ProgramProblem, problem_for

__all__ = ["is_petab", "petab_program", "PetabProgramProblem", "problem_of",
           "finite_bounds"]


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


def problem_of(model, data, *, solver=None, rtol=None, atol=None, max_steps=None):
    """The problem every method runs on: a PEtab problem's `PetabProgramProblem` (it
    carries its data: ``data`` must be ``None``; ``None`` settings are the problem's own),
    else `problem_for`'s (``None`` tolerances: `inference`'s defaults)."""
    if is_petab(model):
        if data is not None:
            raise ValueError("`data` does not apply to a PEtab problem (it carries its "
                             "measurements); pass data=None")
        if jnp.result_type(float) != jnp.float64:
            raise ValueError("a PEtab problem is fitted, sampled and profiled in 64-bit "
                             "floats, as it was loaded: call gs.enable_x64() again (import "
                             "gradsolve as gs)")
        return PetabProgramProblem(model, solver=solver, rtol=rtol, atol=atol,
                                   max_steps=max_steps)
    from ..problem._problem import TOLERANCES

    return problem_for(model, data, solver=solver,
                       rtol=TOLERANCES.rtol if rtol is None else rtol,
                       atol=TOLERANCES.atol if atol is None else atol, max_steps=max_steps)
