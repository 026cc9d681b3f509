"""The measurement model of a PEtab problem: its measurement and observable tables as one
group per observable, and those groups evaluated at a solution.

Each group holds its measurements' rows, trajectories, save-time indices and values, its
observable and noise formulas as JAX functions of ``(t, y, p, theta, observable
placeholders, noise placeholders)``, and each row's placeholder values as `Slots`-like
``(is_ref, idx, const)`` into ``theta``. `read_measurements` builds them once at load (NumPy
and SymPy); `residual_constants` gives the parts of the log-likelihood that do not depend on
the parameters; `observe` and `noise_weighted` are the traced parts, from the solution's
states to the noise-weighted residuals. The groups' layout is read only here (and by
`PetabProblem.simulate`, for each group's ``rows``).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import petab.v1 as petab
import sympy as sp
from petab.v1.math import sympify_petab

from ._model import scalars
from ._sbml import TIME, SbmlOdes
from ._tables import SCALES, STEADY_STATE_T, fill, is_nan, value_ref

__all__ = ["Measurements", "read_measurements", "residual_constants", "observe",
           "noise_weighted"]


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
    if is_nan(v) or v is None or v == "":
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


class Measurements(NamedTuple):
    """The measurement table, by observable.

    Attributes:
        ts: ``(k,)`` the sorted distinct measurement times (a steady-state measurement,
            time ``inf``, at `STEADY_STATE_T`): the save times of every trajectory.
        t1: the last of them (1 where that is 0): the end of the solve.
        at_steady_state: ``(m,)`` True for a steady-state measurement.
        groups: one dict per observable with measurements, in the observable table's
            order: ``id``; ``rows``, ``traj``, ``tidx``, ``t``, ``meas`` (each ``(m_o,)``:
            measurement-table rows, trajectories, indices into ``ts``, times, values);
            ``trans`` (``lin``, ``log``, ``log10``); ``dist`` (``normal``, ``laplace``);
            ``obs_fn``, ``noise_fn`` (the formulas); ``oph``, ``nph`` (each row's
            placeholders, ``(is_ref, idx, const)`` each ``(m_o, n_placeholders)``);
            ``obs_expr``, ``noise_expr``, ``phs`` (the formulas as SymPy expressions in
            ``__theta_<id>`` and placeholder symbols, and the observable's and noise
            placeholder symbols: what `_hierarchical` reads to find scalings, offsets and
            noise parameters); ``used`` (which states, model parameters, ``theta``
            entries, observable and noise placeholders the two formulas read: one bool
            array each).
    """

    ts: np.ndarray
    t1: float
    at_steady_state: np.ndarray
    groups: list[dict]


def _formulas(orow, o: str, odes: SbmlOdes, theta_index: dict[str, int]):
    """An observable's (observable formula, noise formula) in time, state, parameter and
    ``__theta_`` symbols, and their placeholder symbols."""
    model_ids = set(odes.state_ids) | set(odes.param_ids)
    exprs, phs = [], []
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
            elif n in theta_index:
                repl[s] = sp.Symbol("__theta_" + n)
            else:
                raise ValueError(f"observable '{o}': {col} uses '{n}', which is not "
                                 "in the model or the parameter table")
        exprs.append(e.xreplace(repl))
        phs.append(ph)
    return exprs, phs


def _placeholder_cells(mdf, rows, phs, theta_index: dict[str, int]) -> list[tuple]:
    """Each row's observable and noise placeholder values, ``(is_ref, idx, const)``."""
    cells = []
    for col, n, what in ((petab.OBSERVABLE_PARAMETERS, len(phs[0]), "observableParameters"),
                         (petab.NOISE_PARAMETERS, len(phs[1]), "noiseParameters")):
        refs = np.zeros((len(rows), n), bool)
        idx = np.zeros((len(rows), n), int)
        const = np.zeros((len(rows), n))
        for r_i, r in enumerate(rows):
            v = mdf[col].iloc[r] if col in mdf else np.nan
            for k, item in enumerate(_split_overrides(v, n, what, r)):
                refs[r_i, k], idx[r_i, k], const[r_i, k] = value_ref(
                    item, theta_index, f"measurement row {r}, {what}")
        cells.append((refs, idx, const))
    return cells


def read_measurements(problem: petab.Problem, odes: SbmlOdes, theta_ids: list[str],
                      traj_of_row: np.ndarray) -> Measurements:
    """The measurement and observable tables of ``problem`` as `Measurements`
    (``theta_ids`` the parameter table's ids, ``traj_of_row`` each row's trajectory); a
    ``ValueError`` for a negative time, a non-finite measurement, an undefined observable,
    or a non-positive measurement of a log-transformed one, a ``NotImplementedError`` for
    another transformation or noise distribution, a warning for an observable without
    measurements."""
    mdf = problem.measurement_df
    odf = problem.observable_df
    theta_index = {p: i for i, p in enumerate(theta_ids)}
    times = np.asarray(mdf[petab.TIME], dtype=float)
    if np.any(times < 0) or np.any(np.isnan(times)):
        raise ValueError("measurement table: times must be >= 0 or 'inf' (rows "
                         f"{np.flatnonzero(~(times >= 0))[:10]})")
    # A steady-state measurement (time 'inf') reads the condition's state at
    # t = 1e5, as pre-equilibration does (`preequilibration_residual` tells how settled).
    at_steady_state = np.isinf(times)
    times = np.where(at_steady_state, STEADY_STATE_T, times)
    meas = np.asarray(mdf[petab.MEASUREMENT], dtype=float)
    if not np.isfinite(meas).all():
        raise ValueError(f"measurement table rows {np.flatnonzero(~np.isfinite(meas))[:10]}"
                         " hold non-finite measurements")
    ts = np.unique(times)
    tidx = np.searchsorted(ts, times)
    ysyms = [sp.Symbol(s) for s in odes.state_ids]
    psyms = [sp.Symbol(p) for p in odes.param_ids]
    thsyms = [sp.Symbol("__theta_" + p) for p in theta_ids]
    used_obs = set(mdf[petab.OBSERVABLE_ID])
    undefined = sorted(map(str, used_obs - set(odf.index)))
    if undefined:
        raise ValueError(f"the measurement table uses observable(s) {undefined} that the "
                         "observable table does not define")
    for o in odf.index:
        if o not in used_obs:
            warnings.warn(f"observable '{o}' has no measurements", stacklevel=3)
    groups = []
    for o in odf.index:
        rows = np.flatnonzero(np.asarray(mdf[petab.OBSERVABLE_ID] == o))
        if len(rows) == 0:
            continue
        orow = odf.loc[o]
        trans = str(orow.get(petab.OBSERVABLE_TRANSFORMATION, "lin"))
        trans = "lin" if trans in ("nan", "") else trans
        dist = str(orow.get(petab.NOISE_DISTRIBUTION, "normal"))
        dist = "normal" if dist in ("nan", "") else dist
        if trans not in SCALES:
            raise NotImplementedError(f"observableTransformation '{trans}' (observable "
                                      f"'{o}')")
        if dist not in ("normal", "laplace"):
            raise NotImplementedError(f"noiseDistribution '{dist}' (observable '{o}')")
        exprs, phs = _formulas(orow, o, odes, theta_index)
        args = [TIME, ysyms, psyms, thsyms, phs[0], phs[1]]
        obs_fn = sp.lambdify(args, exprs[0], modules="jax")
        noise_fn = sp.lambdify(args, exprs[1], modules="jax")
        cells = _placeholder_cells(mdf, rows, phs, theta_index)
        m = meas[rows]
        if trans != "lin" and (m <= 0).any():
            raise ValueError(f"observable '{o}' is {trans}-transformed but has "
                             "measurements <= 0")
        # by name, as lambdify matches its arguments
        free = {s.name for s in exprs[0].free_symbols | exprs[1].free_symbols}
        used = tuple(np.array([s.name in free for s in syms], bool)
                     for syms in (ysyms, psyms, thsyms, phs[0], phs[1]))
        groups.append(dict(
            id=o, rows=rows, traj=traj_of_row[rows], tidx=tidx[rows],
            t=times[rows], meas=m, trans=trans, dist=dist, obs_fn=obs_fn,
            noise_fn=noise_fn, oph=cells[0], nph=cells[1], obs_expr=exprs[0],
            noise_expr=exprs[1], phs=phs, used=used))
    return Measurements(ts, float(ts[-1]) if ts[-1] > 0 else 1.0, at_steady_state, groups)


def residual_constants(groups: list[dict]) -> tuple[np.ndarray, float]:
    """``(laplace mask (m,), the log-likelihood's constant)`` of the measurement
    ``groups``, in their order: each normal measurement's ``-log(2 pi) / 2``, each Laplace
    one's ``-log 2``, and the log/log10 transformations' Jacobians."""
    lap, const = [], 0.0
    for g in groups:
        m = np.asarray(g["meas"])
        if g["trans"] == "log":
            const -= float(np.sum(np.log(m)))
        elif g["trans"] == "log10":
            const -= float(np.sum(np.log(m * np.log(10.0))))
        is_lap = g["dist"] == "laplace"
        lap.append(np.full(len(m), is_lap))
        const -= len(m) * (math.log(2.0) if is_lap else 0.5 * math.log(2 * math.pi))
    return np.concatenate(lap), const


def observe(groups: list[dict], ys, p, theta) -> list[tuple[jax.Array, jax.Array]]:
    """Each group's observable ``h (m_o,)`` and noise ``sigma (m_o,)`` (the formulas'
    values, untransformed) from the states at the save times ``ys (n, k, d)``, the model
    parameters ``p (n, n_p)`` and the parameter table's linear values ``theta``.
    Jittable and differentiable."""
    out = []
    # every group's rows in one gather (one scatter-add in reverse mode), not one per group
    traj = np.concatenate([g["traj"] for g in groups])
    tidx = np.concatenate([g["tidx"] for g in groups])
    ys_rows, p_rows = ys[traj, tidx], p[traj]
    # and every group's placeholder values in one fill (one gather from theta)
    cells = [c for g in groups for c in (g["oph"], g["nph"])]
    flat = fill(tuple(np.concatenate([np.ravel(c[i]) for c in cells]) for i in range(3))
                + (None,), theta)
    ends = np.cumsum([np.size(c[0]) for c in cells])
    filled = [flat[e - np.size(c[0]):e].reshape(np.shape(c[0])) for c, e in zip(cells, ends)]
    start = 0
    for gi, g in enumerate(groups):
        rows = slice(start, start + len(g["traj"]))
        start = rows.stop
        yr, pr = ys_rows[rows], p_rows[rows]
        oph, nph = filled[2 * gi], filled[2 * gi + 1]

        def one(t, y, pp, o, n, g=g):
            # only the entries the formulas read: a formula reads a few of the states and
            # parameters, and every entry split off costs the traced program a slice (and
            # its gradient a zero cotangent) per group; Bachmann's 12 groups of 181 entries
            # took most of its objective's ~6 s compile
            args = (t, *(scalars(v, used) for v, used in
                         zip((y, pp, theta, o, n), g["used"])))
            return (jnp.asarray(g["obs_fn"](*args), dtype=ys.dtype),
                    jnp.asarray(g["noise_fn"](*args), dtype=ys.dtype))

        h, sigma = jax.vmap(one)(jnp.asarray(g["t"]), yr, pr, oph, nph)
        out.append((h, sigma))
    return out


def noise_weighted(groups: list[dict], obs) -> tuple[jax.Array, jax.Array]:
    """``(z (m,), log_sigma (m,))``: every measurement's residual on its observable's
    transformation divided by the noise, and ``log |sigma|``, in the groups' order (that
    of `residual_constants`), from `observe`'s ``obs``. Jittable and differentiable.

    One vectorised pass over all measurements (each transformation selected per row), not
    one per group: every group's few operations were kernels of their own in the compiled
    objective and its gradient (Zheng's 15 observables: ~100 of its ~150)."""
    h = jnp.concatenate([o[0] for o in obs])
    sigma = jnp.concatenate([o[1] for o in obs])
    m = np.concatenate([np.asarray(g["meas"], float) for g in groups])
    trans = np.concatenate([np.full(len(g["meas"]), g["trans"]) for g in groups])
    on_log = trans != "lin"
    if on_log.any():
        # log-transformed rows through log(h); lin rows through a 1 there, so that no
        # log of a lin row's value (<= 0 is allowed there) reaches the gradient
        per = np.where(trans == "log10", 1.0 / math.log(10.0), 1.0)
        m_t = np.where(on_log, np.log(np.where(on_log, m, 1.0)) * per, m)
        log_h = jnp.log(jnp.where(jnp.asarray(on_log), h, 1.0)) * jnp.asarray(per)
        r = jnp.where(jnp.asarray(on_log), jnp.asarray(m_t) - log_h, jnp.asarray(m) - h)
    else:
        r = jnp.asarray(m) - h
    return r / sigma, jnp.log(jnp.abs(sigma))
