"""The parameter and condition tables of a PEtab problem as arrays: what `PetabProblem` reads.

The parameter table becomes `Parameters`: every parameter's id, its fixed value or its place
in the estimated vector ``x``, and the estimated ones' scales, bounds, nominal values and
priors. The condition table becomes `Conditions`: one trajectory per distinct
(pre-equilibration, simulation) condition pair of the measurement table, and for each the
*slots* of the model parameters and species overrides, each slot either a constant or a
reference into the parameter table's values ``theta`` (`fill` evaluates them). The tables
are read once at load, with NumPy; `fill`, `unscale` and `as_vector` are the small
jittable pieces that read them at a parameter vector.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import petab.v1 as petab

from ._priors import Priors, read_priors
from ._sbml import SbmlOdes

__all__ = ["SCALES", "STEADY_STATE_T", "Parameters", "read_parameters", "as_vector",
           "Conditions", "read_conditions", "Slots", "fill", "unscale", "value_ref", "is_nan"]

SCALES = ("lin", "log", "log10")
"""PEtab's parameter scales (and observable transformations); an index into it is a scale's
code (0 lin, 1 log, 2 log10)."""

STEADY_STATE_T = 1e5
"""Pre-equilibration integrates its condition to this time: the state reached is taken as
the steady state (a long solve of a stable system)."""


def is_nan(v) -> bool:
    """Whether a table cell ``v`` is an empty (NaN float) cell."""
    return isinstance(v, float) and math.isnan(v)


def unscale(x, scale):
    """Parameter-scale values ``x`` to linear values (``scale`` an int array: 0 lin, 1 log,
    2 log10). The exponentials see 0 in place of a linear-scale value: a linear value
    above ~308 would overflow ``10 ** x`` to inf, and ``where``'s reverse-mode gradient,
    0 times the inf derivative of the branch not taken, would be NaN."""
    e = jnp.where(scale == 0, 0.0, x)
    return jnp.where(scale == 1, jnp.exp(e), jnp.where(scale == 2, 10.0 ** e, x))


class Parameters(NamedTuple):
    """The parameter table, read once (``n_theta`` rows, ``n_par`` of them estimated);
    `PetabProblem` keeps its fields as ``parameter_ids``, ``scales``, ``nominal``,
    ``bounds``, ``priors`` and, with a leading underscore, the rest.

    Attributes:
        ids: the estimated parameters' ids (``PetabProblem.parameter_ids``).
        scales: their scale names.
        nominal: ``(n_par,)`` their nominal values on their scale.
        bounds: ``(lower, upper)``, each ``(n_par,)``, on their scale.
        priors: their objective priors (`Priors`).
        theta_ids: every parameter id of the table, in its order (the order of ``theta``).
        theta_index: those ids mapped to their position.
        theta_const: ``(n_theta,)`` the fixed parameters' linear values (0 where estimated).
        est_pos: ``(n_par,)`` the estimated parameters' positions in ``theta``.
        est_scale: ``(n_par,)`` their scale codes (`SCALES`' indices).
    """

    ids: tuple[str, ...]
    scales: tuple[str, ...]
    nominal: jnp.ndarray
    bounds: tuple[jnp.ndarray, jnp.ndarray]
    priors: Priors
    theta_ids: list[str]
    theta_index: dict[str, int]
    theta_const: np.ndarray
    est_pos: np.ndarray
    est_scale: np.ndarray


def read_parameters(problem: petab.Problem) -> Parameters:
    """The parameter table of ``problem`` as `Parameters`; a ``NotImplementedError`` for a
    scale other than ``lin``, ``log``, ``log10``, a ``ValueError`` for a fixed parameter
    without a nominal value."""
    df = problem.parameter_df
    theta_ids = list(df.index)
    scale = [str(s) for s in df[petab.PARAMETER_SCALE]]
    for pid, s in zip(theta_ids, scale):
        if s not in SCALES:
            raise NotImplementedError(f"parameterScale '{s}' of parameter '{pid}'")
    est = np.asarray(df[petab.ESTIMATE], dtype=int) == 1
    nominal_lin = np.asarray(df[petab.NOMINAL_VALUE], dtype=float) \
        if petab.NOMINAL_VALUE in df else np.full(len(df), np.nan)
    if np.isnan(nominal_lin[~est]).any():
        bad = [p for p, e, v in zip(theta_ids, est, nominal_lin) if not e and v != v]
        raise ValueError(f"fixed parameters without a nominalValue: {bad}")
    est_pos = np.flatnonzero(est)
    est_scale = np.array([SCALES.index(s) for s in scale])[est]
    scales = tuple(scale[i] for i in est_pos)
    lo = np.asarray(df[petab.LOWER_BOUND], dtype=float)[est]
    hi = np.asarray(df[petab.UPPER_BOUND], dtype=float)[est]
    _check_estimated(list(scales), [theta_ids[i] for i in est_pos], nominal_lin[est], lo, hi)

    def to_scale(v, s):
        return np.where(s == 1, np.log(v), np.where(s == 2, np.log10(v), v))

    with np.errstate(divide="ignore", invalid="ignore"):
        nominal = jnp.asarray(to_scale(nominal_lin[est], est_scale))
        bounds = (jnp.asarray(to_scale(lo, est_scale)), jnp.asarray(to_scale(hi, est_scale)))
    return Parameters(
        theta_ids=theta_ids, theta_index={p: i for i, p in enumerate(theta_ids)},
        theta_const=np.where(est, 0.0, nominal_lin), est_pos=est_pos, est_scale=est_scale,
        ids=tuple(theta_ids[i] for i in est_pos), scales=scales, nominal=nominal,
        bounds=bounds, priors=read_priors(df, est_pos, scales))


def _check_estimated(scales, ids, nominal, lo, hi) -> None:
    """A ``ValueError`` naming the first estimated parameter whose table values have no
    value on its scale: a negative nominal value or bound on a ``log`` or ``log10`` scale
    (its logarithm is NaN; 0, the limit -inf, is a linear value of 0 and stays allowed, as
    in the benchmark collection), a bound that is not a number, or ``lowerBound >
    upperBound`` (all values linear, as the table gives them)."""
    for pid, s, v, a, b in zip(ids, scales, nominal, lo, hi):
        where = f"parameter '{pid}' (parameterScale {s})"
        if np.isnan(a) or np.isnan(b):
            raise ValueError(f"{where}: an estimated parameter needs numeric lowerBound and "
                             f"upperBound, got {a} and {b}")
        if a > b:
            raise ValueError(f"{where}: lowerBound {a:g} is above upperBound {b:g}")
        if s != "lin":
            for name, w in (("nominalValue", v), ("lowerBound", a), ("upperBound", b)):
                if w < 0:
                    raise ValueError(
                        f"{where}: {name} {w:g} is negative, so it has no {s} (the "
                        "table gives values on the linear scale; a log-scaled parameter "
                        "cannot be negative)")


def as_vector(x, ids: tuple[str, ...], nominal):
    """The estimated parameters ``x`` as a vector ``(n_par,)`` in the order of ``ids``:
    ``x`` a vector in that order, a dict by id, or ``None`` (``nominal``); a ``ValueError``
    for a missing id or a wrong shape."""
    if x is None:
        return nominal
    if isinstance(x, dict):
        missing = set(ids) - set(x)
        if missing:
            raise ValueError(f"x is missing parameters {sorted(missing)}")
        return jnp.stack([jnp.asarray(x[p]) for p in ids])
    x = jnp.asarray(x)
    if x.shape != (len(ids),):
        raise ValueError(f"x has shape {x.shape}, expected ({len(ids)},) "
                         "in the order of parameter_ids")
    return x


def value_ref(v, theta_index: dict[str, int], where: str) -> tuple[bool, int, float]:
    """A table cell ``v`` (a number, or a parameter id of the parameter table) as
    ``(is_ref, theta index, constant)``; ``where`` names the cell in the error."""
    if isinstance(v, str):
        try:
            return False, 0, float(v)
        except ValueError:
            pass
        if v not in theta_index:
            raise NotImplementedError(
                f"{where}: '{v}' is neither a number nor a parameter of the parameter "
                "table")
        return True, theta_index[v], 0.0
    return False, 0, float(v)


class Slots(NamedTuple):
    """Values read from ``theta`` or given as constants, ``n`` rows of ``k`` slots each.

    Attributes:
        is_ref: ``(n, k)`` True where the slot reads ``theta``.
        idx: ``(n, k)`` the ``theta`` index read there.
        const: ``(n, k)`` the constant elsewhere.
        override: ``(n, d)`` for a condition's slots (the model parameters, then one per
            species), True where the condition sets that species' initial value; ``None``
            for a measurement's placeholder slots.
    """

    is_ref: np.ndarray
    idx: np.ndarray
    const: np.ndarray
    override: np.ndarray | None


def fill(slots, theta):
    """The values of ``slots`` (`Slots`, or any ``(is_ref, idx, const, _)``) ``(n, k)``
    given the parameter table's linear values ``theta (n_theta,)``. Jittable."""
    is_ref, idx, const, _ = slots
    return jnp.where(jnp.asarray(is_ref), theta[jnp.asarray(idx)],
                     jnp.asarray(const, dtype=theta.dtype))


class Conditions(NamedTuple):
    """The trajectories of the ensemble and their conditions.

    Attributes:
        ids: ``(preequilibration, simulation)`` condition id pairs, one per trajectory
            (``""`` where there is no pre-equilibration).
        traj_of_row: ``(m,)`` each measurement row's trajectory.
        has_preeq: whether the trajectories are pre-equilibrated (all or none are).
        sim_slots: `Slots` ``(n, n_p + d)`` of the simulation conditions.
        pre_slots: `Slots` of the pre-equilibration conditions, ``None`` without.
    """

    ids: tuple[tuple[str, str], ...]
    traj_of_row: np.ndarray
    has_preeq: bool
    sim_slots: Slots
    pre_slots: Slots | None


def _condition_slots(cdf, cond_id: str, odes: SbmlOdes, theta_index: dict[str, int]):
    """(is_ref, idx, const) for every model parameter and every species' override, and
    the species override mask, for one condition: the condition table's cell, else the
    parameter table's parameter of that id, else the SBML value."""
    row = cdf.loc[cond_id] if cond_id in cdf.index else None
    n_p = len(odes.param_ids)
    is_ref = np.zeros(n_p + len(odes.state_ids), bool)
    idx = np.zeros_like(is_ref, dtype=int)
    const = np.zeros(len(is_ref))
    ovr = np.zeros(len(odes.state_ids), bool)
    for j, pid in enumerate(odes.param_ids):
        v = None
        if row is not None and pid in row.index and not is_nan(row[pid]):
            v = row[pid]
        elif pid in theta_index:
            v = pid
        else:
            v = odes.param_values[j]
        is_ref[j], idx[j], const[j] = value_ref(v, theta_index,
                                                f"condition '{cond_id}', '{pid}'")
    for i, sid in enumerate(odes.state_ids):
        if row is not None and sid in row.index and not is_nan(row[sid]):
            ovr[i] = True
            is_ref[n_p + i], idx[n_p + i], const[n_p + i] = value_ref(
                row[sid], theta_index, f"condition '{cond_id}', '{sid}'")
    return is_ref, idx, const, ovr


def read_conditions(problem: petab.Problem, odes: SbmlOdes,
                    theta_index: dict[str, int]) -> Conditions:
    """The condition table of ``problem`` for the condition pairs its measurement table
    uses, as `Conditions`; a ``ValueError`` for a column or a condition that is not
    defined, a ``NotImplementedError`` for an override of an assignment-rule target or
    pre-equilibration of only some conditions."""
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
    pre = [("" if (pre_col not in mdf or is_nan(v) or v == "") else str(v))
           for v in (mdf[pre_col] if pre_col in mdf else [np.nan] * len(mdf))]
    sim = [str(v) for v in mdf[petab.SIMULATION_CONDITION_ID]]
    undefined = sorted(set(sim + [c for c in pre if c]) - set(map(str, cdf.index)))
    if undefined:
        raise ValueError(f"the measurement table uses condition(s) {undefined} that the "
                         "condition table does not define")
    pairs = list(dict.fromkeys(zip(pre, sim)))
    has_preeq = any(p for p, _ in pairs)
    if has_preeq and not all(p for p, _ in pairs):
        raise NotImplementedError(
            "pre-equilibration for only some simulation conditions is not supported "
            f"(conditions without one: {[s for p, s in pairs if not p]})")

    def slots(ids):
        return Slots(*(np.stack(a) for a in zip(
            *(_condition_slots(cdf, c, odes, theta_index) for c in ids))))

    return Conditions(
        ids=tuple(pairs), traj_of_row=np.array([pairs.index(k) for k in zip(pre, sim)]),
        has_preeq=has_preeq, sim_slots=slots([s for _, s in pairs]),
        pre_slots=slots([p for p, _ in pairs]) if has_preeq else None)
