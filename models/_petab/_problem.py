"""`PetabProblem`: a PEtab v1 problem as one ensemble of ODE trajectories and its likelihood.

Each distinct (pre-equilibration condition, simulation condition) pair of the measurement
table is one trajectory of the ensemble; the condition table's values become that
trajectory's parameters (or initial values). Observables, noise formulas and their
per-measurement placeholders are evaluated at the solution's save times, and the
log-likelihood is PEtab's: the full density of every measurement, normalising constants and
the Jacobian of the log/log10 transformation included (the number AMICI and pyPESTO report).
With hierarchical optimisation (`load_petab`'s default) the observable scalings, offsets and
noise parameters are optimised in closed form inside it (`_hierarchical`), and the
parameter vector holds only the others.
"""

from __future__ import annotations

import copy
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import petab.v1 as petab

import gradsolve as gs

from ._hierarchical import evaluate as evaluate_inner
from ._hierarchical import find_hierarchy, outer_parameters
from ._load import check_tables, read_problem
from ._measurements import (noise_weighted, observe, read_measurements,
                            residual_constants)
from ._model import model_functions
from ._sbml import SbmlOdes
from ._solver_choice import probe_explicit
from ._tables import (STEADY_STATE_T, as_vector, fill, read_conditions, read_parameters,
                      unscale)

__all__ = ["PetabProblem", "Residuals", "load_petab"]


class Residuals(NamedTuple):
    """Every measurement's noise-weighted residual, in the form a least-squares solver
    uses: ``log_likelihood = constant - sum(normal: z^2 / 2 + log_sigma;
    laplace: |z| + log_sigma)``.

    Attributes:
        z: ``(m,)`` ``(t(measurement) - t(simulation)) / sigma``, ``t`` the observable's
            transformation (``lin``, ``log``, ``log10``).
        log_sigma: ``(m,)`` ``log |sigma|`` (the noise formula's value).
        laplace: ``(m,)`` True where the noise is Laplace (else normal); static.
        constant: the rest of the log-likelihood (normalising constants and the
            transformations' Jacobians), independent of the parameters.
        profiled: ``(m,)`` True where ``log_sigma`` is an inner noise parameter at its
            closed-form optimum (hierarchical optimisation), ``None`` where there is
            none; static. The Fisher information of the outer parameters leaves such
            rows' ``d log_sigma / dx`` out (module `inference.optimize._lm`).
    """

    z: jax.Array
    log_sigma: jax.Array
    laplace: np.ndarray
    constant: float
    profiled: np.ndarray | None = None


class PetabProblem:
    """A PEtab problem: parameters, one ODE ensemble over its conditions, and a likelihood.

    Build it with `load_petab`. Parameters are the table's estimated parameters on their
    ``parameterScale`` (``lin``, ``log`` natural, ``log10``), in the order of
    `parameter_ids`: with hierarchical optimisation (the default) all but the *inner* ones
    (`inner_parameter_ids`: observable scalings, offsets and noise parameters), which every
    method optimises in closed form at the given outer ``x``: `log_likelihood` is then the
    full log-likelihood maximised over them (its gradient exact, by autodiff through the
    closed forms), `residuals` and `simulate` are at that optimum, and `full_parameters`
    gives the full vector. `full` is the problem without hierarchical optimisation.

    All conditions are one ensemble of one `gradsolve.solve` (by default `gradsolve.Rodas5P`
    where the problem is stiff at its nominal parameters, as most are, else `gradsolve.Tsit5`:
    see `solver_reason`; rtol 1e-8, atol 1e-12), saved at the union of the
    measurement times (a steady-state measurement, time ``inf``, at ``t = 1e5``, checked by
    `simulate`). Each switch time of a piecewise function of time (and of a time-triggered
    SBML event, see `load_petab`) is a state of the solve, 0 before and 1 after, that jumps
    at that time: no stage of a step sees the new branch before the step ends there, and
    where the time depends on estimated parameters (a lag time) the jump's node moves with
    it, so its gradient is exact. A
    pre-equilibration condition is integrated to ``t = 1e5`` and the state reached starts
    the simulation condition (species the simulation condition sets are reset); its gradient
    is that long solve's discrete adjoint, and `preequilibration_residual` says how close to
    a steady state it got. `log_prior` is the parameter table's objective priors.

    The tables are read at load by `_tables`, `_model` and `_measurements`; the class is
    what runs on them: conditions to initial states, pre-equilibration, the solve (or the
    replay of a recorded mesh), and the densities. It stays one class past 300 lines
    because every public method goes through that one path, and half of its lines are the
    public methods and their documentation.

    Attributes:
        parameter_ids: estimated parameter ids (the order of a parameter vector ``x``;
            without the inner ones).
        full_parameter_ids: every estimated parameter id of the table, inner ones included
            (the order of `full_parameters`' vector and of ``full.parameter_ids``).
        inner_parameter_ids: the parameters optimised in closed form (``()`` without
            hierarchical optimisation); inner_kinds: ``{id: "scaling" | "offset" |
            "sigma"}``.
        nominal: ``(n_par,)`` their nominal values, on the parameter scale.
        bounds: ``(lower, upper)``, each ``(n_par,)``, on the parameter scale.
        scales: tuple of ``"lin" | "log" | "log10"``, one per parameter.
        condition_ids: ``(preequilibration, simulation)`` condition id pairs, one per
            trajectory of the ensemble (``""`` where there is no pre-equilibration).
        state_ids: the ODE state (species, then rate-rule parameters/compartments).
        ts: ``(k,)`` the save times shared by all trajectories.
        odes: the symbolic model (`SbmlOdes`).
        priors: the estimated parameters' objective priors, vectorised (`log_prior`).
        petab_problem: the `petab.v1.Problem` the tables came from.
        solver, rtol, atol, max_steps: how the ensemble is solved (`gradsolve.solve`'s;
            ``max_steps`` its step capacity per trajectory, 20,000 by default).
        solver_reason: why that solver (``load_petab``'s default ``solver="auto"`` probes
            `gradsolve.Tsit5` at the nominal parameters and keeps it where the problem is
            not stiff there, else `gradsolve.Rodas5P`).

    Example:
        >>> problem = models.load_petab("Boehm_JProteomeRes2014")
        >>> problem.log_likelihood()            # at the nominal parameters
        >>> problem.log_prior(problem.nominal)   # uniform in bounds where none is given
    """

    def __init__(self, problem: petab.Problem, odes: SbmlOdes, *, hierarchical: bool = True,
                 solver=None, rtol: float = 1e-8, atol: float = 1e-12,
                 max_steps: int = 20000):
        self.petab_problem = problem
        self.odes = odes
        self.solver = gs.Rodas5P() if solver in (None, "auto") else solver
        self.solver_reason = "given" if solver not in (None, "auto") else \
            "gs.Rodas5P(): the default for these (mostly stiff) models"
        self.rtol, self.atol, self.max_steps = rtol, atol, max_steps
        self.state_ids = tuple(odes.state_ids)
        check_tables(problem)
        # The tables, read by `_tables`, `_model` and `_measurements` in this order (each
        # reading the ones before), kept under the names the simulation below reads.
        pars = read_parameters(problem)
        self._set_parameters(pars)
        conds = read_conditions(problem, odes, pars.theta_index)
        (self.condition_ids, self._traj_of_row, self._has_preeq, self._sim_slots,
         self._pre_slots) = conds
        (self.vector_field, self._y0, self._n_p, self._d,
         self._switches) = model_functions(odes, pars, conds)
        self._switch_exprs, self._switch_jax = self._switches.exprs, self._switches.fn
        self._n_switch_states = len(self._switch_exprs)
        self.ts, self._t1, self._at_steady_state, self._groups = read_measurements(
            problem, odes, pars.theta_ids, conds.traj_of_row)
        self._laplace, self._llh_constant = residual_constants(self._groups)
        # the inner parameters leave the estimated vector (the full one is kept for
        # `full_parameters` and `full`)
        self._full_pars, self._full = pars, None
        self.full_parameter_ids = tuple(pars.ids)
        self._hier = find_hierarchy(problem, odes, pars, conds, self._groups) \
            if hierarchical else None
        if self._hier is not None:
            self._set_parameters(outer_parameters(pars, self._hier))
        self.inner_parameter_ids = () if self._hier is None else self._hier.ids
        self.inner_kinds = {} if self._hier is None else dict(zip(self._hier.ids,
                                                                  self._hier.kinds))
        self._jit_functions()
        if solver == "auto":
            self._choose_solver()

    def _set_parameters(self, pars) -> None:
        """The estimated parameters' fields from a `Parameters` (the full or outer set)."""
        (self.parameter_ids, self.scales, self.nominal, self.bounds, self.priors,
         self._theta_ids, self._theta_index, self._theta_const, self._est_pos,
         self._est_scale) = pars

    # Steps an explicit solver may take per trajectory at the nominal parameters before the
    # problem counts as stiff: a stiff model needs tens of thousands (its fastest decay
    # rate, not its accuracy, bounds the explicit step), a non-stiff one tens to hundreds.
    EXPLICIT_STEP_BUDGET = 2000

    def _choose_solver(self) -> None:
        """`gradsolve.Tsit5` where it solves every condition at the nominal parameters
        within `EXPLICIT_STEP_BUDGET` steps (not stiff there: an explicit step costs a
        fraction of a Rosenbrock step, and runs on the compiled kernel), else
        `gradsolve.Rodas5P`; the choice and its reason in `solver` and `solver_reason`."""
        if self._has_preeq or self._switches.move(self.odes.param_ids, self._sim_slots,
                                                  self._est_pos):
            self.solver_reason = ("gs.Rodas5P(): pre-equilibration or moving switch times "
                                  "(not probed)")
            return
        y0, p, _, jumps = jax.jit(self._inputs)(jnp.asarray(self.nominal))  # one program
        solver, self.solver_reason = probe_explicit(
            self.vector_field, y0, p, self.ts, self._t1, jumps, rtol=self.rtol,
            atol=self.atol, budget=min(self.EXPLICIT_STEP_BUDGET, self.max_steps))
        if solver is not None:
            self.solver = solver

    # ----------------------------------------------------------------- simulation
    def _theta_lin(self, x):
        """All parameter-table values, linear scale, from the estimated ``x`` on its scale."""
        const = jnp.asarray(self._theta_const, dtype=x.dtype)
        return const.at[self._est_pos].set(unscale(x, jnp.asarray(self._est_scale)))

    def _as_vector(self, x):
        return as_vector(x, self.parameter_ids, self.nominal)

    def _gs_solve(self, name, f, t0, t1, y0, params, *, ts=None, jumps=None):
        """The default ``solve`` hook: `gradsolve.solve` at this problem's solver,
        tolerances and step capacity (``name`` names the solve for hooks that keep
        meshes by it: ``"preequilibration"`` or ``"simulation"``)."""
        return gs.solve(f, t0, t1, y0, params, ts=ts, solver=self.solver, rtol=self.rtol,
                        atol=self.atol, max_steps=self.max_steps, jumps=jumps)

    def _start(self, slots, theta, t1: float, y=None):
        """``(y0 (n, d + L), model parameters (n, n_p), jumps or None)`` of the conditions
        ``slots`` at ``theta``: the species a condition sets, the others from ``y (n, d)``
        (default the model's initial values), and the switch states jumping up to ``t1``."""
        full = fill(slots, theta)
        p = full[:, :self._n_p]
        y = jax.vmap(self._y0)(p) if y is None else y
        y0 = jnp.where(jnp.asarray(slots.override), full[:, self._n_p:], y)
        jumps = None
        if self._n_switch_states:
            s0, (at, sizes) = self._switches.jumps(p, t1)
            if not self._switches.move(self.odes.param_ids, slots, self._est_pos):
                # Fixed switch times: computed from the parameter vector, they would carry a
                # (zero) derivative, and a replay differentiated in its jump times takes a
                # costlier adjoint (the compiled kernel hands it to XLA).
                at = jax.lax.stop_gradient(at)
            jumps = (at, sizes)
            y0 = jnp.concatenate([y0, s0], axis=1)
        return y0, p, jumps

    def _preequilibrate(self, theta, solve=None):
        """Each trajectory's pre-equilibration condition solved from its initial state to
        ``t = 1e5``: ``(state reached (n, d), that condition's parameters (n, n_p))``."""
        y0, pp, jumps = self._start(self._pre_slots, theta, STEADY_STATE_T)
        pre = (solve or self._gs_solve)("preequilibration", self.vector_field, 0.0,
                                        STEADY_STATE_T, y0, pp, jumps=jumps)
        return pre.y1[:, :self._d], pp

    def _steady_residual(self, y, p):
        """How far states ``y (n, d)`` of parameters ``p (n, n_p)`` are from a steady state
        at ``t = 1e5``: the RMS over states of ``|dy/dt| / (atol + rtol |y|)``, ``(n,)``."""
        y = self._switches.append(y, p, STEADY_STATE_T)
        dy = jax.vmap(self.vector_field, in_axes=(None, 0, 0))(STEADY_STATE_T, y, p)
        y, dy = y[:, :self._d], dy[:, :self._d]
        w = dy / (self.atol + self.rtol * jnp.abs(y))
        return jnp.sqrt(jnp.mean(w ** 2, axis=-1))

    def _preeq_residual(self, x):
        return self._steady_residual(*self._preequilibrate(self._theta_lin(x)))

    def preequilibration_residual(self, x=None):
        """How far each pre-equilibrated state is from a steady state: the RMS over states
        of ``|dy/dt| / (atol + rtol |y|)`` there, ``(n,)`` (``None`` without
        pre-equilibration). Pre-equilibration integrates to ``t = 1e5``; a value well above
        1 means the system had not settled (slow or oscillating) and the likelihood uses a
        state that is not its steady state. `simulate` warns when this is above 1."""
        if not self._has_preeq:
            return None
        return self._residual_jit(self._as_vector(x))

    def _inputs(self, x, solve=None):
        """(``y0 (n, d')``, model parameters ``(n, n_p)``, theta, jumps or None) of the
        ensemble at ``x`` (pre-equilibration solved here, by ``solve``)."""
        theta = self._theta_lin(x)
        y_pre = self._preequilibrate(theta, solve)[0] if self._has_preeq else None
        y0, p, jumps = self._start(self._sim_slots, theta, self._t1, y_pre)
        return y0, p, theta, jumps

    def record(self, x, tol_factor: float = 1.0) -> gs.Mesh:
        """The ensemble's mesh at ``x`` (``(n_par,)`` on the parameters' scales): every
        condition recorded by `gradsolve.record` at ``tol_factor`` times the tolerances,
        without derivative, for `replay_residuals` to replay at nearby points. Jittable
        and ``vmap``-able over ``x`` (pre-equilibration is solved afresh, not recorded).
        Fitters that keep meshes call this."""
        y0, p, _, jumps = jax.lax.stop_gradient(self._inputs(jnp.asarray(x)))
        return gs.record(self.vector_field, 0.0, self._t1, y0, p, ts=jnp.asarray(self.ts),
                         solver=self.solver, rtol=self.rtol * tol_factor,
                         atol=self.atol * tol_factor,
                         max_steps=self.max_steps, jumps=jumps,
                         throw=False)

    def _solve(self, x, mesh=None, solve=None):
        """(states at ``ts`` ``(n, k, d)``, model parameters ``(n, n_p)``, theta, the
        solve's error ratio ``(n,)``): a fresh solve (by ``solve``, default
        `gradsolve.solve`), or the replay of ``mesh`` (from `record`) whose error ratio
        says whether it still meets the tolerances at ``x``."""
        y0, p, theta, jumps = self._inputs(x, solve)
        if mesh is None:
            sol = (solve or self._gs_solve)("simulation", self.vector_field, 0.0, self._t1,
                                            y0, p, ts=jnp.asarray(self.ts), jumps=jumps)
        else:
            sol = gs.replay(self.vector_field, mesh, y0, p, jumps=jumps)
        return sol.ys[..., :self._d], p, theta, sol.error_ratio

    def _observe(self, x, mesh=None, solve=None):
        """(each measurement group's ``(h, sigma)``, the solve's error ratio ``(n,)``); with
        inner parameters, at their closed-form optimum."""
        ys, p, theta, err = self._solve(x, mesh, solve)
        if self._hier is None:
            return observe(self._groups, ys, p, theta), err
        return evaluate_inner(self._hier, self._groups, ys, p, theta)[0], err

    def _full_values(self, x):
        """(the full estimated vector, the log-likelihood) at the outer ``x``: one solve."""
        ys, p, theta, _ = self._solve(x)
        if self._hier is None:
            obs, full = observe(self._groups, ys, p, theta), x
        else:
            obs, inner = evaluate_inner(self._hier, self._groups, ys, p, theta)
            full = jnp.zeros(len(self.full_parameter_ids), x.dtype)
            full = full.at[self._hier.outer_pos].set(x).at[self._hier.full_pos].set(inner)
        return full, self._llh(*noise_weighted(self._groups, obs))

    def _predict(self, x):
        return self._observe(x)[0]

    def _residuals(self, x):
        return self._residuals_on(x, None)[:2]

    def _residuals_on(self, x, mesh, solve=None):
        """``(z, log_sigma, error ratio (n,))`` at ``x``, by a fresh solve (``mesh`` None)
        or a replay of ``mesh``."""
        obs, err = self._observe(x, mesh, solve)
        return (*noise_weighted(self._groups, obs), err)

    def _loglik(self, x, solve=None):
        return self._llh(*self._residuals_on(x, None, solve)[:2])

    def _llh(self, z, log_sigma):
        lap = jnp.asarray(self._laplace)
        return self._llh_constant - jnp.sum(
            jnp.where(lap, jnp.abs(z), 0.5 * z**2) + log_sigma)

    # ----------------------------------------------------------------- public
    def log_likelihood(self, x=None, *, solve=None) -> jax.Array:
        """PEtab's log-likelihood of all measurements at ``x``.

        Args:
            x: estimated parameters on their scale, ``(n_par,)`` in the order of
                `parameter_ids`, or a dict by parameter id; ``None`` the nominal values.
            solve: how the ODEs are solved: ``None`` (`gradsolve.solve` at the problem's
                solver and tolerances), or a function ``solve(name, f, t0, t1, y0, params,
                *, ts=None, jumps=None) -> gradsolve.Solution`` called once for the
                pre-equilibration (``name="preequilibration"``, where the problem has one)
                and once for the simulation (``"simulation"``): how `inference` runs the
                solves as sites of a NumPyro program, whose meshes it keeps.

        Returns:
            A scalar: the sum over measurements of the noise model's log density (normal
            or Laplace, of the transformed measurement), with its normalising constant and
            the log/log10 transformation's Jacobian; with inner parameters, at their
            closed-form optimum given ``x`` (a dict's entries for them are not read:
            ``full.log_likelihood`` evaluates given values). Jittable and differentiable
            in ``x`` (reverse mode through `gradsolve.solve`); NaN where a solve fails.
        """
        if solve is not None:
            return self._loglik(self._as_vector(x), solve)
        return self._loglik_jit(self._as_vector(x))

    def full_parameters(self, x=None, *, log_likelihood: bool = False):
        """Every estimated parameter at the outer ``x`` (a vector or dict as
        `log_likelihood`'s): ``(len(full_parameter_ids),)`` on the parameters' scales, the
        inner ones at their closed-form optimum (``x`` itself without inner parameters).

        ``full.log_likelihood(full_parameters(x))`` equals ``log_likelihood(x)``.
        ``log_likelihood=True``: also that log-likelihood, from the same solve (what
        `inference.fit` reports). Jittable and ``vmap``-able over ``x``.

        Example:
            >>> problem.full_parameters(problem.nominal)   # sd_* of Boehm at their optimum
        """
        full, ll = self._full_jit(self._as_vector(x))
        return (full, ll) if log_likelihood else full

    @property
    def full(self) -> "PetabProblem":
        """This problem without hierarchical optimisation: every estimated parameter in
        its vector (`full_parameter_ids`), as ``load_petab(..., hierarchical=False)``
        loads it (the tables and settings shared). ``self`` where nothing is inner."""
        if self._hier is None:
            return self
        if self._full is None:
            out = copy.copy(self)
            out._hier, out._full = None, None
            out._set_parameters(self._full_pars)
            out.inner_parameter_ids, out.inner_kinds = (), {}
            out._jit_functions()
            self._full = out
        return self._full

    def replay_residuals(self, x, mesh) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`residuals`' ``z`` and ``log_sigma`` at ``x`` from a replay of ``mesh`` (from
        `record`), and that replay's error ratio per trajectory ``(n,)`` (above 1: the
        mesh no longer meets the tolerances at ``x``). Jittable, differentiable."""
        return self._residuals_on(jnp.asarray(x), mesh)

    def residuals(self, x=None) -> Residuals:
        """Every measurement's noise-weighted residual and log noise at ``x`` (a vector or
        dict as `log_likelihood`'s), in the form Gauss-Newton and Levenberg-Marquardt
        solvers use (`Residuals`; ``m`` measurements, grouped by observable). Jittable and
        differentiable (forward and reverse mode)."""
        z, log_sigma = self._residuals_jit(self._as_vector(x))
        return Residuals(z, log_sigma, self._laplace, self._llh_constant, self._profiled())

    def residual_layout(self) -> Residuals:
        """`residuals`' parameter-independent parts without a solve: ``z`` and
        ``log_sigma`` are ``None``, ``laplace``, ``constant`` and ``profiled`` as
        `residuals` gives them."""
        return Residuals(None, None, self._laplace, self._llh_constant, self._profiled())

    def _profiled(self) -> np.ndarray | None:
        """The rows whose noise is an inner parameter (`Residuals.profiled`)."""
        if self._hier is None or not len(self._hier.noise):
            return None
        return np.asarray(self._hier.row_noise) < len(self._hier.noise)

    def log_prior_terms(self, x, *, jacobian: bool = True) -> jax.Array:
        """Each estimated parameter's log prior density at ``x`` ``(n_par,)`` (their sum
        is `log_prior`; a parameter without a prior: ``-log(upper - lower)`` inside its
        bounds). Jittable; ``x (n_par,)`` on the parameters' scales."""
        lo, hi = self.bounds
        scale = jnp.asarray(self._est_scale)
        x = jnp.asarray(x)
        return self.priors.log_density(x, unscale(x, scale), scale, lo, hi, jacobian)

    def with_settings(self, *, solver=None, rtol: float | None = None,
                      atol: float | None = None, max_steps: int | None = None):
        """This problem solved otherwise: a copy with ``solver``, ``rtol``, ``atol`` or
        ``max_steps`` replaced where given (the tables are shared, the compiled functions
        are not: they read the settings when first traced). Returns ``self`` where
        nothing changes."""
        changes = {k: v for k, v in dict(solver=solver, rtol=rtol, atol=atol,
                                         max_steps=max_steps).items()
                   if v is not None and v != getattr(self, k)}
        if not changes:
            return self
        out = copy.copy(self)
        out._full = None
        for k, v in changes.items():
            setattr(out, k, v)
        if "solver" in changes:
            out.solver_reason = "given"
        out._jit_functions()
        return out

    def _jit_functions(self) -> None:
        self._loglik_jit = jax.jit(self._loglik)
        self._residuals_jit = jax.jit(self._residuals)
        self._prior_jit = jax.jit(self._log_prior, static_argnames=("jacobian", "given_only"))
        self._predict_jit = jax.jit(self._predict)
        self._residual_jit = jax.jit(self._preeq_residual)
        self._full_jit = jax.jit(self._full_values)

    def _log_prior(self, x, jacobian: bool = True, given_only: bool = False):
        lo, hi = self.bounds
        lp = self.log_prior_terms(x, jacobian=jacobian)
        if given_only:
            inside = (x >= lo) & (x <= hi)
            lp = jnp.where(jnp.asarray(self.priors.given), lp, jnp.where(inside, 0.0, -jnp.inf))
        return jnp.sum(lp)

    def log_prior(self, x=None, *, jacobian: bool = True, given_only: bool = False
                  ) -> jax.Array:
        """Log prior density of the estimated parameters at ``x`` (as `log_likelihood`'s).

        Each parameter's ``objectivePriorType`` with its ``objectivePriorParameters``
        (``normal``, ``laplace``, ``uniform``, ``logNormal``, ``logLaplace`` of the linear
        value; ``parameterScaleNormal``, ``parameterScaleLaplace``,
        ``parameterScaleUniform`` of the value on the parameter scale), truncated to the
        bounds and renormalised there; a parameter without one is uniform on its scale
        inside its bounds. ``-inf`` outside the bounds.

        Args:
            x: estimated parameters on their scale (``None``: nominal).
            jacobian: the density of ``x`` on the parameter scale (``True``: a prior of the
                linear value gets the log-Jacobian ``log |d theta / d x|``, what a sampler
                in ``x`` needs), or that prior's density at ``theta(x)`` (``False``: the
                objective prior term of PEtab and pyPESTO).
            given_only: sum only the priors the table gives (parameters without one add
                ``0`` inside the bounds).

        Returns:
            A scalar, jittable and differentiable in ``x``.
        """
        return self._prior_jit(self._as_vector(x), jacobian=jacobian, given_only=given_only)

    def simulate(self, x=None):
        """PEtab's simulation table at ``x``: the measurement table with a ``simulation``
        column (the observable, untransformed) in place of ``measurement``, and a ``sigma``
        column (the noise formula's value); with inner parameters, at their optimum."""
        res = self.preequilibration_residual(x)
        if res is not None and not bool(jnp.all(res <= 1.0)):
            bad = [self.condition_ids[i] for i in np.flatnonzero(~(np.asarray(res) <= 1.0))]
            warnings.warn(f"pre-equilibration did not reach a steady state by t = 1e5 for "
                          f"{bad} (residuals {np.asarray(res).max():.3g} > 1, see "
                          "preequilibration_residual)", stacklevel=2)
        if self._at_steady_state.any():
            ys, p, _, _ = self._solve(self._as_vector(x))
            y = ys[:, int(np.searchsorted(self.ts, STEADY_STATE_T))]
            r = np.asarray(self._steady_residual(y, p))
            if not np.all(r <= 1.0):
                bad = [self.condition_ids[i] for i in np.flatnonzero(~(r <= 1.0))]
                warnings.warn(f"steady-state measurements (time 'inf') read the state at "
                              f"t = 1e5, which is not a steady state for {bad} (residuals "
                              f"{r.max():.3g} > 1)", stacklevel=2)
        df = self.petab_problem.measurement_df.copy()
        sim = np.full(len(df), np.nan)
        sig = np.full(len(df), np.nan)
        for g, (h, s) in zip(self._groups, self._predict_jit(self._as_vector(x))):
            sim[g["rows"]] = np.asarray(h)
            sig[g["rows"]] = np.asarray(s)
        df = df.drop(columns=[petab.MEASUREMENT])
        df[petab.SIMULATION] = sim
        df["sigma"] = sig
        return df

    def __repr__(self):
        inner = (f" (+ {len(self.inner_parameter_ids)} inner, in closed form)"
                 if self.inner_parameter_ids else "")
        return (f"PetabProblem('{self.odes.model_id}': {len(self.odes.state_ids)} states, "
                f"{len(self.parameter_ids)} estimated parameters{inner}, "
                f"{len(self.condition_ids)} "
                f"conditions, {len(self.petab_problem.measurement_df)} measurements; "
                f"{self.solver_reason})")


def load_petab(path, *, lint: bool = True, hierarchical: bool = True,
               **solve_options) -> PetabProblem:
    """Load a PEtab v1 problem.

    Args:
        path: the problem's YAML file, or a folder holding exactly one YAML file, or
            the name of a problem that ships with `models` (``"Boehm_JProteomeRes2014"``),
            where no such file or folder exists.
        lint: run the `petab` linter first; its errors are a ``ValueError``.
        hierarchical: optimise observable scalings, offsets and noise parameters in
            closed form inside the objective (Loos et al. 2018, Bioinformatics 34:4266;
            pyPESTO's hierarchical optimisation): they leave `PetabProblem.parameter_ids`
            for `PetabProblem.inner_parameter_ids`, and fits, profiles and samplers see
            the reduced problem. Detected symbolically (an estimated parameter without a
            prior, not in the model, entering observables only as ``s * h(x)`` or
            ``h(x) + b``, or the noise as ``sigma`` times a constant, with normal noise),
            or, where the parameter table has a ``parameterType`` column (``scaling``,
            ``offset``, ``sigma``), exactly the parameters it marks. ``False``: every
            estimated parameter is outer (the problem as before; also ``problem.full``).
        solve_options: ``solver`` (default ``"auto"``: `gradsolve.Tsit5` where it solves
            every condition at the nominal parameters within 2,000 steps, else
            `gradsolve.Rodas5P`; the choice and why in ``problem.solver_reason``),
            ``rtol`` (1e-8), ``atol`` (1e-12), ``max_steps`` (20,000).

    SBML supported: species, compartments, reactions, assignment and rate rules, initial
    assignments, function definitions, piecewise functions of time, and time-triggered
    events (``time >= T``, ``T`` in parameters, possibly per condition) that set a boundary
    species or a non-constant parameter to a parameter expression: the target is then the
    value of the latest event fired. Events that reset a state that reactions change, are
    triggered by the state, or are delayed are not.

    Returns:
        A `PetabProblem`.

    Raises:
        NotImplementedError: for an SBML or PEtab construct this importer does not support,
            naming it and the element's id.
        ValueError: for an inconsistent problem (with the linter's messages), a table
            that is empty (naming it and its file), or a parameter marked in a
            ``parameterType`` column that cannot be inner (naming it and the formula).
        ValueError: also in float32 (call ``gs.enable_x64()`` first), and for an
            estimated parameter whose nominal value or bound has no value on its scale
            (negative on a ``log``/``log10`` scale) or whose bounds are missing or crossed
            (naming it).
        NotImplementedError: also for marked scalings/offsets and noise parameters whose
            measurement groups do not nest (one noise parameter per scaling group; without
            the column such noise parameters stay outer, with a warning).

    Example:
        >>> problem = models.load_petab("Boehm_JProteomeRes2014")   # ships with models
        >>> problem.parameter_ids, problem.log_likelihood(problem.nominal)
    """
    if jnp.result_type(float) != jnp.float64:
        raise ValueError(
            "load_petab needs 64-bit floats: call gs.enable_x64() (import gradsolve as gs) "
            "before loading. A PEtab objective of hundreds of measurements, with parameters "
            "spanning decades and the default rtol=1e-8, is not resolved in float32 (whose "
            "tolerance floor is 4.8e-7 and whose objective values carry about 7 digits)")
    problem, odes = read_problem(path, lint=lint)
    solve_options.setdefault("solver", "auto")
    return PetabProblem(problem, odes, hierarchical=hierarchical, **solve_options)
