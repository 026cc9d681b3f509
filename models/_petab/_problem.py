"""`PetabProblem`: a PEtab v1 problem as one ensemble of ODE trajectories and its likelihood.

Each distinct (pre-equilibration condition, simulation condition) pair of the measurement
table is one trajectory of the ensemble; the condition table's values become that
trajectory's parameters (or initial values). Observables, noise formulas and their
per-measurement placeholders are evaluated at the solution's save times, and the
log-likelihood is PEtab's: the full density of every measurement, normalising constants and
the Jacobian of the log/log10 transformation included (the number AMICI and pyPESTO report).
"""

from __future__ import annotations

import copy

import logging
import math
import warnings
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import petab.v1 as petab
import yaml
import sympy as sp
from petab.v1.math import sympify_petab

import gradsolve as gs

from ._priors import read_priors
from ._sbml import TIME, SbmlOdes, read_sbml

__all__ = ["PetabProblem", "Residuals", "load_petab"]

_SCALES = ("lin", "log", "log10")
_STEADY_STATE_T = 1e5
"""Pre-equilibration integrates its condition to this time: the state reached is taken as
the steady state (a long solve of a stable system)."""


def _is_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _unscale(x, scale):
    """Parameter-scale values ``x`` to linear values (``scale`` an int array: 0 lin, 1 log,
    2 log10). The exponentials see 0 in place of a linear-scale value: a linear value
    above ~308 would overflow ``10 ** x`` to inf, and ``where``'s reverse-mode gradient,
    0 times the inf derivative of the branch not taken, would be NaN."""
    e = jnp.where(scale == 0, 0.0, x)
    return jnp.where(scale == 1, jnp.exp(e), jnp.where(scale == 2, 10.0 ** e, x))


def _placeholders(formula: sp.Expr, kind: str, obs_id: str) -> list[sp.Symbol]:
    """``kind1_obs``, ``kind2_obs``, ... in the order of their number."""
    found = {}
    pre = kind
    suffix = "_" + obs_id
    for s in formula.free_symbols:
        n = s.name
        if n.startswith(pre) and n.endswith(suffix):
            k = n[len(pre):-len(suffix)]
            if k.isdigit():
                found[int(k)] = s
    if found and sorted(found) != list(range(1, len(found) + 1)):
        raise ValueError(f"observable '{obs_id}': {kind} placeholders are not numbered "
                         f"1..{len(found)}: {sorted(found)}")
    return [found[k] for k in sorted(found)]


def _split_overrides(v, n: int, what: str, row: int) -> list:
    """A measurement's observableParameters / noiseParameters cell as ``n`` entries."""
    if n == 0:
        return []
    if _is_nan(v) or v is None or v == "":
        raise ValueError(f"measurement row {row}: {what} needs {n} values, got none")
    if isinstance(v, (int, float, np.floating, np.integer)):
        parts = [float(v)]
    else:
        parts = [s.strip() for s in str(v).split(";")]
    if len(parts) != n:
        raise ValueError(f"measurement row {row}: {what} has {len(parts)} values, the formula "
                         f"uses {n}")
    out = []
    for s in parts:
        try:
            out.append(float(s))
        except (TypeError, ValueError):
            out.append(str(s))
    return out


def _scalars(v: jax.Array) -> list[jax.Array]:
    """The entries of a 1-D array as 0-d arrays, through one ``lax.split``.

    The generated SymPy code unpacks its array arguments; iterating over an array slices
    each entry apart, and reverse mode turns every slice into a padded full-size
    cotangent summed with the others: a 15-species model's Rosenbrock step carried
    thousands of those, and its gradient compiled ~25 times slower than its value. A split
    transposes to one concatenation."""
    n = v.shape[0]
    return [c.reshape(()) for c in jax.lax.split(v, (1,) * n)] if n else []

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
    """

    z: jax.Array
    log_sigma: jax.Array
    laplace: np.ndarray
    constant: float


class PetabProblem:
    """A PEtab problem: parameters, one ODE ensemble over its conditions, and a likelihood.

    Build it with `load_petab`. Parameters are the table's estimated parameters on their
    ``parameterScale`` (``lin``, ``log`` natural, ``log10``), in the order of
    `parameter_ids`.

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

    Attributes:
        parameter_ids: estimated parameter ids (the order of a parameter vector ``x``).
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

    def __init__(self, problem: petab.Problem, odes: SbmlOdes, *, solver=None,
                 rtol: float = 1e-8, atol: float = 1e-12, max_steps: int = 20000):
        self.petab_problem = problem
        self.odes = odes
        self.solver = gs.Rodas5P() if solver in (None, "auto") else solver
        self.solver_reason = "given" if solver not in (None, "auto") else \
            "gs.Rodas5P(): the default for these (mostly stiff) models"
        self.rtol, self.atol, self.max_steps = rtol, atol, max_steps
        self.state_ids = tuple(odes.state_ids)
        _check_tables(problem)
        self._build_parameters(problem)
        self._build_conditions(problem, odes)
        self._build_model_functions(odes)
        self._build_measurements(problem, odes)
        self._laplace, self._llh_constant = self._residual_constants()
        self._jit_functions()
        if solver == "auto":
            self._choose_solver()

    # Steps an explicit solver may take per trajectory at the nominal parameters before the
    # problem counts as stiff: a stiff model needs tens of thousands (its fastest decay
    # rate, not its accuracy, bounds the explicit step), a non-stiff one tens to hundreds.
    EXPLICIT_STEP_BUDGET = 2000

    def _choose_solver(self) -> None:
        """`gradsolve.Tsit5` where it solves every condition at the nominal parameters
        within `EXPLICIT_STEP_BUDGET` steps (not stiff there: an explicit step costs a
        fraction of a Rosenbrock step, and runs on the compiled kernel), else
        `gradsolve.Rodas5P`; the choice and its reason in `solver` and `solver_reason`."""
        if self._switches_move() or self._has_preeq:
            self.solver_reason = ("gs.Rodas5P(): pre-equilibration or moving switch times "
                                  "(not probed)")
            return
        x = jnp.asarray(self.nominal)
        theta = self._theta_lin(x)
        full = self._fill(self._sim_slots, theta)
        p = full[:, :self._n_p]
        y0 = jnp.where(jnp.asarray(self._sim_slots[3]), full[:, self._n_p:],
                       jax.vmap(self._y0)(p))
        jumps = None
        if self._n_switch_states:
            s0, jumps = self._switch_jumps(p)
            y0 = jnp.concatenate([y0, s0], axis=1)
        budget = min(self.EXPLICIT_STEP_BUDGET, self.max_steps)
        # First the cheap bound: an explicit step stays stable only while h * rho(J) is
        # below ~3.5 (Tsit5's stability interval on the negative real axis), so a
        # Jacobian spectral radius rho at the start already needing more than the budget
        # over the horizon is stiff without a probe solve (whose kernel build costs
        # a large model a minute).
        jac = jax.vmap(jax.jacfwd(self.vector_field, argnums=1), in_axes=(None, 0, 0))(
            0.0, y0, p)
        rho = float(np.max(np.abs(np.linalg.eigvals(np.asarray(jac)))))
        if not np.isfinite(rho) or rho * self._t1 / 3.5 > budget:
            self.solver_reason = (f"gs.Rodas5P(): stiff (the Jacobian's spectral radius "
                                  f"{rho:.3g} at t = 0 needs more than {budget} explicit "
                                  f"steps over [0, {self._t1:g}])")
            return
        mesh = gs.record(self.vector_field, 0.0, self._t1, y0, p, ts=jnp.asarray(self.ts),
                         solver=gs.Tsit5(), rtol=self.rtol, atol=self.atol, max_steps=budget,
                         jumps=jumps, throw=False)
        steps = int(np.max(np.asarray(mesh.n_steps)))
        if bool(np.all(np.asarray(mesh.status) == 0)):
            self.solver = gs.Tsit5()
            self.solver_reason = (f"gs.Tsit5(): not stiff at the nominal parameters (at most "
                                  f"{steps} explicit steps per condition)")
        else:
            self.solver_reason = (f"gs.Rodas5P(): stiff (gs.Tsit5() needed more than "
                                  f"{budget} steps at the nominal parameters)")

    # ----------------------------------------------------------------- parameters
    def _build_parameters(self, problem):
        df = problem.parameter_df
        self._theta_ids = list(df.index)
        self._theta_index = {p: i for i, p in enumerate(self._theta_ids)}
        scale = [str(s) for s in df[petab.PARAMETER_SCALE]]
        for pid, s in zip(self._theta_ids, scale):
            if s not in _SCALES:
                raise NotImplementedError(f"parameterScale '{s}' of parameter '{pid}'")
        est = np.asarray(df[petab.ESTIMATE], dtype=int) == 1
        nominal_lin = np.asarray(df[petab.NOMINAL_VALUE], dtype=float) \
            if petab.NOMINAL_VALUE in df else np.full(len(df), np.nan)
        if np.isnan(nominal_lin[~est]).any():
            bad = [p for p, e, v in zip(self._theta_ids, est, nominal_lin) if not e and v != v]
            raise ValueError(f"fixed parameters without a nominalValue: {bad}")
        self._theta_const = np.where(est, 0.0, nominal_lin)
        self._est_pos = np.flatnonzero(est)
        sc = np.array([_SCALES.index(s) for s in scale])
        self._est_scale = sc[est]
        self.parameter_ids = tuple(self._theta_ids[i] for i in self._est_pos)
        self.scales = tuple(scale[i] for i in self._est_pos)
        lo = np.asarray(df[petab.LOWER_BOUND], dtype=float)[est]
        hi = np.asarray(df[petab.UPPER_BOUND], dtype=float)[est]

        def to_scale(v, s):
            return np.where(s == 1, np.log(v), np.where(s == 2, np.log10(v), v))

        with np.errstate(divide="ignore", invalid="ignore"):
            self.nominal = jnp.asarray(to_scale(nominal_lin[est], self._est_scale))
            self.bounds = (jnp.asarray(to_scale(lo, self._est_scale)),
                           jnp.asarray(to_scale(hi, self._est_scale)))
        self.priors = read_priors(df, self._est_pos, self.scales)

    def _theta_lin(self, x):
        """All parameter-table values, linear scale, from the estimated ``x`` on its scale."""
        const = jnp.asarray(self._theta_const, dtype=x.dtype)
        return const.at[self._est_pos].set(_unscale(x, jnp.asarray(self._est_scale)))

    def _as_vector(self, x):
        if x is None:
            return self.nominal
        if isinstance(x, dict):
            missing = set(self.parameter_ids) - set(x)
            if missing:
                raise ValueError(f"x is missing parameters {sorted(missing)}")
            return jnp.stack([jnp.asarray(x[p]) for p in self.parameter_ids])
        x = jnp.asarray(x)
        if x.shape != (len(self.parameter_ids),):
            raise ValueError(f"x has shape {x.shape}, expected ({len(self.parameter_ids)},) "
                             "in the order of parameter_ids")
        return x

    # ----------------------------------------------------------------- conditions
    def _value_ref(self, v, where):
        """A table cell as (is_ref, theta index, constant)."""
        if isinstance(v, str):
            try:
                return False, 0, float(v)
            except ValueError:
                pass
            if v not in self._theta_index:
                raise NotImplementedError(
                    f"{where}: '{v}' is neither a number nor a parameter of the parameter "
                    "table")
            return True, self._theta_index[v], 0.0
        return False, 0, float(v)

    def _condition_slots(self, cond_id, odes: SbmlOdes):
        """(is_ref, idx, const) for every model parameter and every species' override, and
        the species override mask, for one condition."""
        cdf = self.petab_problem.condition_df
        row = cdf.loc[cond_id] if cond_id in cdf.index else None
        n_p = len(odes.param_ids)
        is_ref = np.zeros(n_p + len(odes.state_ids), bool)
        idx = np.zeros_like(is_ref, dtype=int)
        const = np.zeros(len(is_ref))
        ovr = np.zeros(len(odes.state_ids), bool)
        for j, pid in enumerate(odes.param_ids):
            v = None
            if row is not None and pid in row.index and not _is_nan(row[pid]):
                v = row[pid]
            elif pid in self._theta_index:
                v = pid
            else:
                v = odes.param_values[j]
            is_ref[j], idx[j], const[j] = self._value_ref(v, f"condition '{cond_id}', '{pid}'")
        for i, sid in enumerate(odes.state_ids):
            if row is not None and sid in row.index and not _is_nan(row[sid]):
                ovr[i] = True
                is_ref[n_p + i], idx[n_p + i], const[n_p + i] = self._value_ref(
                    row[sid], f"condition '{cond_id}', '{sid}'")
        return is_ref, idx, const, ovr

    def _build_conditions(self, problem, odes):
        cdf = problem.condition_df
        known = set(odes.param_ids) | set(odes.state_ids)
        for col in cdf.columns:
            if col == petab.CONDITION_NAME:
                continue
            if col in odes.rules:
                raise NotImplementedError(
                    f"condition table column '{col}': overriding a quantity set by an "
                    "assignment rule or initial assignment is not supported")
            if col not in known:
                raise ValueError(f"condition table column '{col}' is not a parameter, "
                                 "compartment or species of the model")
        mdf = problem.measurement_df
        pre_col = petab.PREEQUILIBRATION_CONDITION_ID
        pre = [("" if (pre_col not in mdf or _is_nan(v) or v == "") else str(v))
               for v in (mdf[pre_col] if pre_col in mdf else [np.nan] * len(mdf))]
        sim = [str(v) for v in mdf[petab.SIMULATION_CONDITION_ID]]
        undefined = sorted(set(sim + [c for c in pre if c]) - set(map(str, cdf.index)))
        if undefined:
            raise ValueError(f"the measurement table uses condition(s) {undefined} that the "
                             "condition table does not define")
        pairs = list(dict.fromkeys(zip(pre, sim)))
        self.condition_ids = tuple(pairs)
        self._traj_of_row = np.array([pairs.index(k) for k in zip(pre, sim)])
        self._has_preeq = any(p for p, _ in pairs)
        if self._has_preeq and not all(p for p, _ in pairs):
            raise NotImplementedError(
                "pre-equilibration for only some simulation conditions is not supported "
                f"(conditions without one: {[s for p, s in pairs if not p]})")
        slots = [self._condition_slots(s, odes) for _, s in pairs]
        self._sim_slots = tuple(np.stack(a) for a in zip(*slots))
        if self._has_preeq:
            pslots = [self._condition_slots(p, odes) for p, _ in pairs]
            self._pre_slots = tuple(np.stack(a) for a in zip(*pslots))

    @staticmethod
    def _fill(slots, theta):
        is_ref, idx, const, _ = slots
        return jnp.where(jnp.asarray(is_ref), theta[jnp.asarray(idx)],
                         jnp.asarray(const, dtype=theta.dtype))

    # ----------------------------------------------------------------- model
    def _build_model_functions(self, odes: SbmlOdes):
        ysyms = [sp.Symbol(s) for s in odes.state_ids]
        psyms = [sp.Symbol(p) for p in odes.param_ids]
        self._n_p = len(psyms)
        self._d = len(ysyms)
        switch, relations = self._switch_times(odes)
        self._switch_exprs = switch
        self._switch_jax = (sp.lambdify([psyms], switch, modules="jax") if switch else None)
        rhs = list(odes.rhs)
        self._n_switch_states = 0
        if switch:
            # Each switch is a state s_j (0 before, 1 after, ds_j/dt = 0) that jumps at its
            # time: a solver's stages never see the switch inside a step (the step landing
            # on it sees s_j = 0, the next one s_j = 1), and where the time is estimated the
            # jump's node moves with it, so the gradient w.r.t. a lag is the exact discrete
            # adjoint. A solver stop at the time would not do: the landing step's last
            # stages are evaluated AT the switch time, on the new branch, so a large switch
            # (Isensee_JCB2018's stimuli) fails that step's error test down to a step size
            # underflow, and a moving stop carries no gradient.
            if self._has_preeq and self._switches_move():
                raise NotImplementedError(
                    f"switch times {switch} that depend on estimated parameters, in a "
                    "problem with pre-equilibration")
            ssyms = [sp.Symbol(f"__switch_{j}") for j in range(len(switch))]
            repl = {}
            for rel, (j, after) in relations.items():
                repl[rel] = (ssyms[j] > 0.5) if after else (ssyms[j] < 0.5)
            rhs = [e.xreplace(repl) for e in rhs]
            ysyms = ysyms + ssyms
            self._n_switch_states = len(switch)
        rhs_fn = sp.lambdify([TIME, ysyms, psyms], rhs, modules="jax", cse=True)
        init_fn = sp.lambdify([psyms], odes.init, modules="jax", cse=True)
        L = self._n_switch_states

        def f(t, y, p):
            out = rhs_fn(t, _scalars(y), _scalars(p))
            return jnp.stack([jnp.asarray(v, dtype=y.dtype) * jnp.ones((), y.dtype)
                              for v in out] + [jnp.zeros((), y.dtype)] * L)

        def y0(p):
            out = init_fn(_scalars(p))
            return jnp.stack([jnp.asarray(v, dtype=p.dtype) * jnp.ones((), p.dtype)
                              for v in out])

        self.vector_field = f
        self._y0 = y0

    def _switch_times(self, odes: SbmlOdes):
        """``(switch times, relations)``: the times where a piecewise function of time
        switches (expressions in the parameters), and each time relation mapped to
        ``(its switch's index, whether it holds after the switch)``."""
        switch, relations = [], {}
        for e in odes.rhs:
            for pw in e.atoms(sp.Piecewise):
                for _, cond in pw.args:
                    for rel in ([cond] if isinstance(cond, sp.core.relational.Relational)
                                else cond.atoms(sp.core.relational.Relational)):
                        if TIME not in rel.free_symbols:
                            continue
                        d = sp.expand(rel.lhs - rel.rhs)
                        a = d.diff(TIME)
                        rest = sp.simplify(d - a * TIME)
                        if a != 0 and not a.free_symbols and TIME not in rest.free_symbols \
                                and not isinstance(rel, (sp.Eq, sp.Ne)):
                            tau = -rest / a
                            if tau not in switch:
                                switch.append(tau)
                            greater = isinstance(rel, (sp.GreaterThan, sp.StrictGreaterThan))
                            relations[rel] = (switch.index(tau), greater == bool(a > 0))
                        else:
                            warnings.warn(f"piecewise condition '{rel}' is not a comparison "
                                          "linear in time: the solver does not stop "
                                          "at its switch", stacklevel=5)
        return switch, relations

    # ----------------------------------------------------------------- measurements
    def _build_measurements(self, problem, odes: SbmlOdes):
        mdf = problem.measurement_df
        odf = problem.observable_df
        times = np.asarray(mdf[petab.TIME], dtype=float)
        if np.any(times < 0) or np.any(np.isnan(times)):
            raise ValueError("measurement table: times must be >= 0 or 'inf' (rows "
                             f"{np.flatnonzero(~(times >= 0))[:10]})")
        # A steady-state measurement (time 'inf') reads the condition's state at
        # t = 1e5, as pre-equilibration does (`preequilibration_residual` tells how settled).
        self._at_steady_state = np.isinf(times)
        times = np.where(self._at_steady_state, _STEADY_STATE_T, times)
        meas = np.asarray(mdf[petab.MEASUREMENT], dtype=float)
        if not np.isfinite(meas).all():
            raise ValueError(f"measurement table rows {np.flatnonzero(~np.isfinite(meas))[:10]}"
                             " hold non-finite measurements")
        self.ts = np.unique(times)
        self._t1 = float(self.ts[-1]) if self.ts[-1] > 0 else 1.0
        tidx = np.searchsorted(self.ts, times)
        ysyms = [sp.Symbol(s) for s in odes.state_ids]
        psyms = [sp.Symbol(p) for p in odes.param_ids]
        model_ids = set(odes.state_ids) | set(odes.param_ids)
        thsyms = [sp.Symbol("__theta_" + p) for p in self._theta_ids]
        used_obs = set(mdf[petab.OBSERVABLE_ID])
        undefined = sorted(map(str, used_obs - set(odf.index)))
        if undefined:
            raise ValueError(f"the measurement table uses observable(s) {undefined} that the "
                             "observable table does not define")
        for o in odf.index:
            if o not in used_obs:
                warnings.warn(f"observable '{o}' has no measurements", stacklevel=3)
        self._groups = []
        for o in odf.index:
            rows = np.flatnonzero(np.asarray(mdf[petab.OBSERVABLE_ID] == o))
            if len(rows) == 0:
                continue
            orow = odf.loc[o]
            trans = str(orow.get(petab.OBSERVABLE_TRANSFORMATION, "lin"))
            trans = "lin" if trans in ("nan", "") else trans
            dist = str(orow.get(petab.NOISE_DISTRIBUTION, "normal"))
            dist = "normal" if dist in ("nan", "") else dist
            if trans not in _SCALES:
                raise NotImplementedError(f"observableTransformation '{trans}' (observable "
                                          f"'{o}')")
            if dist not in ("normal", "laplace"):
                raise NotImplementedError(f"noiseDistribution '{dist}' (observable '{o}')")
            exprs = []
            phs = []
            for col, kind in ((petab.OBSERVABLE_FORMULA, "observableParameter"),
                              (petab.NOISE_FORMULA, "noiseParameter")):
                e = sympify_petab(orow[col])
                if not isinstance(e, sp.Basic):
                    e = sp.sympify(e)
                ph = _placeholders(e, kind, o)
                repl = {}
                for s in e.free_symbols:
                    n = s.name
                    # A noise formula may also use the observable's placeholders.
                    if s in ph or (phs and s in phs[0]):
                        continue
                    if n == "time" and n not in model_ids:
                        repl[s] = TIME
                    elif n in model_ids:
                        repl[s] = sp.Symbol(n)
                    elif n in odes.rules:
                        repl[s] = odes.resolve(sp.Symbol(n))
                    elif n in self._theta_index:
                        repl[s] = sp.Symbol("__theta_" + n)
                    else:
                        raise ValueError(f"observable '{o}': {col} uses '{n}', which is not "
                                         "in the model or the parameter table")
                exprs.append(e.xreplace(repl))
                phs.append(ph)
            args = [TIME, ysyms, psyms, thsyms, phs[0], phs[1]]
            obs_fn = sp.lambdify(args, exprs[0], modules="jax")
            noise_fn = sp.lambdify(args, exprs[1], modules="jax")
            cells = []
            for col, n, what in ((petab.OBSERVABLE_PARAMETERS, len(phs[0]),
                                  "observableParameters"),
                                 (petab.NOISE_PARAMETERS, len(phs[1]), "noiseParameters")):
                refs = np.zeros((len(rows), n), bool)
                idx = np.zeros((len(rows), n), int)
                const = np.zeros((len(rows), n))
                for r_i, r in enumerate(rows):
                    v = mdf[col].iloc[r] if col in mdf else np.nan
                    for k, item in enumerate(_split_overrides(v, n, what, r)):
                        refs[r_i, k], idx[r_i, k], const[r_i, k] = self._value_ref(
                            item, f"measurement row {r}, {what}")
                cells.append((refs, idx, const))
            m = meas[rows]
            if trans != "lin" and (m <= 0).any():
                raise ValueError(f"observable '{o}' is {trans}-transformed but has "
                                 "measurements <= 0")
            self._groups.append(dict(
                id=o, rows=rows, traj=self._traj_of_row[rows], tidx=tidx[rows],
                t=times[rows], meas=m, trans=trans, dist=dist, obs_fn=obs_fn,
                noise_fn=noise_fn, oph=cells[0], nph=cells[1]))

    # ----------------------------------------------------------------- simulation
    def _switches_move(self) -> bool:
        """Whether a switch time depends on an estimated parameter in some condition (a
        lag time estimated per experiment, Beer_MolBioSystems2014's ``tau``)."""
        if not self._switch_exprs:
            return False
        used = set()
        for e in self._switch_exprs:
            used |= {s.name for s in e.free_symbols}
        cols = [j for j, pid in enumerate(self.odes.param_ids) if pid in used]
        is_ref, idx, _, _ = self._sim_slots
        est = np.zeros(len(self._theta_ids), bool)
        est[list(self._est_pos)] = True
        return bool(np.any(is_ref[:, cols] & est[idx[:, cols]]))

    def _switch_time_values(self, p):
        """Each trajectory's switch times ``(n, L)`` from its model parameters ``p``."""
        return jax.vmap(lambda pi: jnp.stack([jnp.asarray(v, p.dtype) * jnp.ones((), p.dtype)
                                              for v in self._switch_jax(pi)]))(p)

    def _switch_jumps(self, p, t1=None):
        """``(initial switch states (n, L), jumps)``: each switch state starts at 1 where
        its time is <= 0 (already switched), else at 0 and jumps by 1 at its time (``(n,
        L)`` times, ``+inf`` past ``t1``, default the last measurement time; sizes ``(n, L,
        d + L)``)."""
        t1 = self._t1 if t1 is None else t1
        times = self._switch_time_values(p)
        n, L = times.shape
        s0 = (times <= 0.0).astype(p.dtype)
        at = jnp.where((times > 0.0) & (times <= t1), times, jnp.inf)
        order = jnp.argsort(at, axis=1)
        at = jnp.take_along_axis(at, order, axis=1)
        sizes = jax.nn.one_hot(self._d + order, self._d + L, dtype=p.dtype)
        sizes = jnp.where(jnp.isfinite(at)[..., None], sizes, 0.0)
        return s0, (at, sizes)

    def _gs_solve(self, name, f, t0, t1, y0, params, *, ts=None, jumps=None):
        """The default ``solve`` hook: `gradsolve.solve` at this problem's solver,
        tolerances and step capacity (``name`` names the solve for hooks that keep
        meshes by it: ``"preequilibration"`` or ``"simulation"``)."""
        return gs.solve(f, t0, t1, y0, params, ts=ts, solver=self.solver, rtol=self.rtol,
                        atol=self.atol, max_steps=self.max_steps, jumps=jumps)

    def _preequilibrate(self, theta, solve=None):
        """Each trajectory's pre-equilibration condition solved from its initial state to
        ``t = 1e5``: ``(state reached (n, d), that condition's parameters (n, n_p))``."""
        pre_full = self._fill(self._pre_slots, theta)
        pp = pre_full[:, :self._n_p]
        povr = jnp.asarray(self._pre_slots[3])
        y_pre0 = jnp.where(povr, pre_full[:, self._n_p:], jax.vmap(self._y0)(pp))
        jumps = None
        if self._n_switch_states:
            s0, jumps = self._switch_jumps(pp, _STEADY_STATE_T)
            y_pre0 = jnp.concatenate([y_pre0, s0], axis=1)
        pre = (solve or self._gs_solve)("preequilibration", self.vector_field, 0.0,
                                        _STEADY_STATE_T, y_pre0, pp, jumps=jumps)
        return pre.y1[:, :self._d], pp

    def _with_switch_states(self, y, p, t: float):
        """States ``y (n, d)`` with the switch states at time ``t`` appended (each 1 where
        its switch time is <= t), the vector field's input."""
        if not self._n_switch_states:
            return y
        times = self._switch_time_values(p)
        return jnp.concatenate([y, (times <= t).astype(y.dtype)], axis=1)

    def _preeq_residual(self, x):
        y, pp = self._preequilibrate(self._theta_lin(x))
        y = self._with_switch_states(y, pp, _STEADY_STATE_T)
        dy = jax.vmap(self.vector_field, in_axes=(None, 0, 0))(_STEADY_STATE_T, y, pp)
        y, dy = y[:, :self._d], dy[:, :self._d]
        w = dy / (self.atol + self.rtol * jnp.abs(y))
        return jnp.sqrt(jnp.mean(w ** 2, axis=-1))

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
        full = self._fill(self._sim_slots, theta)
        p = full[:, :self._n_p]
        ovr = jnp.asarray(self._sim_slots[3])
        y_model = jax.vmap(self._y0)(p)
        y_start = self._preequilibrate(theta, solve)[0] if self._has_preeq else y_model
        y0 = jnp.where(ovr, full[:, self._n_p:], y_start)
        jumps = None
        if self._n_switch_states:
            s0, jumps = self._switch_jumps(p)
            y0 = jnp.concatenate([y0, s0], axis=1)
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
        ys, p, theta, err = self._solve(x, mesh, solve)
        out = []
        for g in self._groups:
            yr = ys[g["traj"], g["tidx"]]
            pr = p[g["traj"]]
            oph = self._fill((*g["oph"], None), theta)
            nph = self._fill((*g["nph"], None), theta)

            def one(t, y, pp, o, n, g=g):
                args = (t, *map(_scalars, (y, pp, theta, o, n)))
                return (jnp.asarray(g["obs_fn"](*args), dtype=ys.dtype),
                        jnp.asarray(g["noise_fn"](*args), dtype=ys.dtype))

            h, sigma = jax.vmap(one)(jnp.asarray(g["t"]), yr, pr, oph, nph)
            out.append((h, sigma))
        return out, err

    def _predict(self, x):
        return self._observe(x)[0]

    def _residuals(self, x):
        return self._residuals_on(x, None)[:2]

    def _residuals_on(self, x, mesh, solve=None):
        """``(z, log_sigma, error ratio (n,))`` at ``x``, by a fresh solve (``mesh`` None)
        or a replay of ``mesh``."""
        zs, logs = [], []
        obs, err = self._observe(x, mesh, solve)
        for g, (h, sigma) in zip(self._groups, obs):
            m = jnp.asarray(g["meas"])
            if g["trans"] == "log":
                r = jnp.log(m) - jnp.log(h)
            elif g["trans"] == "log10":
                r = jnp.log10(m) - jnp.log10(h)
            else:
                r = m - h
            zs.append(r / sigma)
            logs.append(jnp.log(jnp.abs(sigma)))
        return jnp.concatenate(zs), jnp.concatenate(logs), err

    def _residual_constants(self):
        """(laplace mask (m,), the log-likelihood's constant), in `_residuals`' order."""
        lap, const = [], 0.0
        for g in self._groups:
            m = np.asarray(g["meas"])
            if g["trans"] == "log":
                const -= float(np.sum(np.log(m)))
            elif g["trans"] == "log10":
                const -= float(np.sum(np.log(m * np.log(10.0))))
            is_lap = g["dist"] == "laplace"
            lap.append(np.full(len(m), is_lap))
            const -= len(m) * (math.log(2.0) if is_lap else 0.5 * math.log(2 * math.pi))
        return np.concatenate(lap), const

    def _loglik(self, x, solve=None):
        z, log_sigma = self._residuals_on(x, None, solve)[:2]
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
            the log/log10 transformation's Jacobian. Jittable and differentiable in ``x``
            (reverse mode through `gradsolve.solve`); NaN where a solve fails.
        """
        if solve is not None:
            return self._loglik(self._as_vector(x), solve)
        return self._loglik_jit(self._as_vector(x))

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
        return Residuals(z, log_sigma, self._laplace, self._llh_constant)

    def residual_layout(self) -> Residuals:
        """`residuals`' parameter-independent parts without a solve: ``z`` and
        ``log_sigma`` are ``None``, ``laplace`` and ``constant`` as `residuals` gives them."""
        return Residuals(None, None, self._laplace, self._llh_constant)

    def log_prior_terms(self, x, *, jacobian: bool = True) -> jax.Array:
        """Each estimated parameter's log prior density at ``x`` ``(n_par,)`` (their sum
        is `log_prior`; a parameter without a prior: ``-log(upper - lower)`` inside its
        bounds). Jittable; ``x (n_par,)`` on the parameters' scales."""
        lo, hi = self.bounds
        scale = jnp.asarray(self._est_scale)
        x = jnp.asarray(x)
        return self.priors.log_density(x, _unscale(x, scale), scale, lo, hi, jacobian)

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
        column (the noise formula's value)."""
        res = self.preequilibration_residual(x)
        if res is not None and not bool(jnp.all(res <= 1.0)):
            bad = [self.condition_ids[i] for i in np.flatnonzero(~(np.asarray(res) <= 1.0))]
            warnings.warn(f"pre-equilibration did not reach a steady state by t = 1e5 for "
                          f"{bad} (residuals {np.asarray(res).max():.3g} > 1, see "
                          "preequilibration_residual)", stacklevel=2)
        if self._at_steady_state.any():
            ys, p, _, _ = self._solve(self._as_vector(x))
            y = ys[:, int(np.searchsorted(self.ts, _STEADY_STATE_T))]
            y = self._with_switch_states(y, p, _STEADY_STATE_T)
            dy = jax.vmap(self.vector_field, in_axes=(None, 0, 0))(_STEADY_STATE_T, y, p)
            y, dy = y[:, :self._d], dy[:, :self._d]
            r = np.sqrt(np.mean(np.asarray(dy / (self.atol + self.rtol * jnp.abs(y))) ** 2, -1))
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
        return (f"PetabProblem('{self.odes.model_id}': {len(self.odes.state_ids)} states, "
                f"{len(self.parameter_ids)} estimated parameters, {len(self.condition_ids)} "
                f"conditions, {len(self.petab_problem.measurement_df)} measurements; "
                f"{self.solver_reason})")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _lint(problem, path):
    """The `petab` linter's errors as one ValueError."""
    handler = _Collect()
    logger = logging.getLogger("petab")
    logger.addHandler(handler)
    try:
        failed = petab.lint_problem(problem)
    finally:
        logger.removeHandler(handler)
    if failed:
        msgs = "\n  ".join(handler.messages) or "(no message)"
        raise ValueError(f"{path}: the PEtab linter found errors:\n  {msgs}")


_TABLES = (("measurement", "measurement_df", petab.MEASUREMENT_DF_COLS),
           ("observable", "observable_df", petab.OBSERVABLE_DF_COLS),
           ("parameter", "parameter_df", petab.PARAMETER_DF_COLS))


def _warn_unused_columns(problem, path) -> None:
    """A warning for every table column this importer does not read, so nothing is dropped
    unseen: columns outside PEtab v1 (e.g. ``useData``, or ``noiseDistribution`` in the
    measurement table, an older convention: both would change the likelihood where read)
    and initialization priors (multistart fits draw their starts by Latin hypercube within
    the bounds)."""
    for table, attr, known in _TABLES:
        df = getattr(problem, attr, None)
        if df is None:
            continue
        cols = [c for c in list(df.columns) + list(df.index.names or [])
                if c is not None and c not in known]
        if cols:
            warnings.warn(f"{path}: {table} table column(s) {cols} are not PEtab v1 columns: "
                          "ignored (they do not enter the likelihood)", stacklevel=3)
    df = problem.parameter_df
    for col in ("initializationPriorType", "initializationPriorParameters"):
        if df is not None and col in df.columns and df[col].notna().any() and \
                (df[col].astype(str).str.strip() != "").any():
            warnings.warn(f"{path}: parameter table column {col!r} is not used: multistart "
                          "fits draw their starts by Latin hypercube within the bounds "
                          "(inference.fit(problem, n_starts=...))", stacklevel=3)
            break


# (table, petab.Problem attribute, YAML key of its files, what its rows are needed for)
_NEEDED = (("measurement", "measurement_df", "measurement_files",
            "there is nothing to fit"),
           ("condition", "condition_df", "condition_files",
            "it must define every simulationConditionId of the measurement table"),
           ("observable", "observable_df", "observable_files",
            "it must define every observableId of the measurement table"),
           ("parameter", "parameter_df", "parameter_file",
            "it lists the parameters to estimate"))


def _table_files(config: dict) -> dict[str, list[str]]:
    """The files of each table a PEtab YAML names (several are concatenated)."""
    def listed(v):
        return [] if v is None else [v] if isinstance(v, str) else list(v)

    files = {table: [] for table, *_ in _NEEDED}
    for table, _, key, _ in _NEEDED:
        for sub in [config] + list(config.get("problems") or []):
            files[table] += listed(sub.get(key))
    return files


def _check_files(path: Path, files: dict[str, list[str]]) -> None:
    """A ``ValueError`` naming a table file that is empty (not even a header row), which
    pandas would report without naming the file."""
    for table, names in files.items():
        for name in names:
            f = path.parent / name
            if not f.is_file():
                continue
            with open(f, "rb") as fh:
                blank = not fh.read(1 << 16).strip()
            if blank:
                raise ValueError(f"{path}: the {table} table {name} is empty (not even its "
                                 "header row)")


def _check_tables(problem, path=None, files: dict[str, list[str]] | None = None) -> None:
    """A ``ValueError`` naming every table (and its files, where known) that is missing or
    has no rows: each is needed (`_NEEDED` says why), and an empty one would otherwise fail
    later with an error that does not say so."""
    bad = []
    for table, attr, _, why in _NEEDED:
        df = getattr(problem, attr, None)
        if df is None or len(df) == 0:
            names = (files or {}).get(table)
            named = f" ({', '.join(names)})" if names else ""
            state = "is missing" if df is None else "has no rows"
            bad.append(f"the {table} table{named} {state}: {why}")
    if bad:
        raise ValueError(("" if path is None else f"{path}: ") + "; ".join(bad))


def _read_yaml(path: Path) -> dict:
    """The problem's YAML as a dict; a ``ValueError`` naming ``path`` where the file is not
    a PEtab problem's YAML (a table, a text file: petab would fail on it without saying
    so)."""
    if not path.exists():
        raise FileNotFoundError(f"models.load_petab: `path` {path} does not exist")

    def refuse(what: str):
        hint = (" (a .tsv file is one of the problem's tables; pass the YAML file that names "
                "them)" if path.suffix.lower() == ".tsv" else "")
        return ValueError(f"models.load_petab: `path` must be a PEtab problem's YAML file "
                          f"(or a folder holding one); {path} {what}{hint}")

    try:
        config = petab.yaml.load_yaml(str(path))
    except UnicodeDecodeError:
        raise refuse("is not a text file") from None
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()
        raise refuse(f"is not YAML ({first[1] if len(first) > 1 else first[0]})") from None
    if not isinstance(config, dict):
        raise refuse(f"reads as a {type(config).__name__}, not a mapping of the problem's "
                     "files")
    if "problems" not in config:
        raise refuse("has no `problems` entry (a PEtab YAML file has `format_version`, "
                     "`parameter_file` and `problems`)")
    return config


def load_petab(path, *, lint: bool = True, **solve_options) -> PetabProblem:
    """Load a PEtab v1 problem.

    Args:
        path: the problem's YAML file, or a folder holding exactly one YAML file, or
            the name of a problem that ships with `models` (``"Boehm_JProteomeRes2014"``),
            where no such file or folder exists.
        lint: run the `petab` linter first; its errors are a ``ValueError``.
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
        ValueError: for an inconsistent problem (with the linter's messages), or a table
            that is empty (naming it and its file).

    Example:
        >>> problem = models.load_petab("Boehm_JProteomeRes2014")   # ships with models
        >>> problem.parameter_ids, problem.log_likelihood(problem.nominal)
    """
    path = Path(path)
    shipped = Path(__file__).parent.parent / "data" / "petab" / path.name
    if not path.exists() and len(path.parts) == 1 and shipped.is_dir():
        path = shipped
    if path.is_dir():
        yamls = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
        named = [y for y in yamls if y.stem == path.name]
        if len(named) == 1:
            yamls = named
        if len(yamls) != 1:
            raise ValueError(f"{path}: expected one PEtab YAML file (or one named after the "
                             f"folder), found {[y.name for y in yamls]}")
        path = yamls[0]
    config = _read_yaml(path)
    for sub in config.get("problems", []):
        vis = sub.get("visualization_files") or []
        missing = [v for v in vis if not (path.parent / v).exists()]
        if missing:
            warnings.warn(f"{path}: visualization files {missing} are missing; loading "
                          "without them (they do not enter the likelihood)", stacklevel=2)
            sub["visualization_files"] = [v for v in vis if v not in missing]
    files = _table_files(config)
    _check_files(path, files)
    problem = petab.Problem.from_yaml(config, base_path=str(path.parent))
    _check_tables(problem, path, files)
    if lint:
        _lint(problem, path)
    _warn_unused_columns(problem, path)
    if problem.model is None or not hasattr(problem.model, "sbml_document"):
        raise NotImplementedError(f"{path}: only SBML models are supported")
    odes = read_sbml(problem.model.sbml_document)
    solve_options.setdefault("solver", "auto")
    return PetabProblem(problem, odes, **solve_options)
