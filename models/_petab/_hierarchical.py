"""Hierarchical optimisation of a PEtab problem: observable scalings, offsets and noise
parameters optimised in closed form inside the objective, not by the outer optimiser.

A parameter is *inner* (Loos, Krause & Hasenauer 2018, "Hierarchical optimization for the
efficient parametrization of ODE models", Bioinformatics 34:4266; pyPESTO's
``pypesto.hierarchical``, Schmiester et al. 2020) when it is estimated, has no objective
prior, is not read by the simulation (not an SBML parameter, not in a condition-table
cell), only meets measurements with normal noise, and either

- enters observable formulas (directly or as an ``observableParameters`` override) only
  linearly: every row's prediction is ``c + sum_j theta_j a_j`` with ``c`` and ``a_j``
  free of inner parameters (a *scaling* ``s * h(x)`` or an *offset* ``h(x) + b``); in a
  log/log10-transformed observable only as a pure factor ``s * h(x)``, then an offset
  ``log s`` in log space; or
- is a *noise* parameter: the row's noise formula is the parameter times a constant.

This is checked symbolically on each distinct (observable, placeholder overrides) pattern
of the measurement table. A ``parameterType`` column in the parameter table (pyPESTO's:
``scaling``, ``offset``, ``sigma``) decides instead where present: exactly the marked
estimated parameters are inner, and a marked one that does not pass is a ``ValueError``
naming it and the formula (fixed marked parameters have nothing to optimise: ignored).

Closed forms at the outer ``x`` (normal noise), `evaluate`:

1. the linear parameters: weighted linear least squares of the predictions
   ``c + A theta`` against the measurements (log-space rows: ``log m - log a`` against
   ``log s``), weights ``1 / sigma^2`` with the inner noise parameters at 1: one normal
   system, Jacobi-scaled, ridge ``1e-12``, restricted to the table's bounds by three
   active-set passes (a coordinate on a bound whose gradient points outward held, the
   others re-solved and clipped: the box-constrained optimum wherever the active set
   settles within them, as it does for a scaling with an offset);
2. each noise parameter: ``sigma^2 = RSS / n`` over the measurements sharing it (residuals
   in the observable's transformation, divided by the constant), clipped to its bounds
   (exact: the objective is unimodal in sigma).

Step 1 does not depend on a noise parameter common to all measurements of its linear
group (it scales all weights alike), so one pass is exact where the groups *nest*: every
connected group of linear parameters has one inner noise parameter, or only noise that is
not inner. Where they do not nest, the noise parameters involved stay outer with a
warning (with a ``parameterType`` column: ``NotImplementedError``).

The outer objective is the full negative log-likelihood at the inner optimum. Its
gradient is exact by autodiff through the closed forms (variable projection, Golub &
Pereyra 1973, SIAM J. Numer. Anal. 10:413); the residuals' Jacobian, too, is that of the
reduced residuals, which is what the batched Levenberg-Marquardt needs.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

from ._measurements import observe
from ._priors import Priors
from ._tables import SCALES, Conditions, Parameters

__all__ = ["PARAMETER_TYPE", "KINDS", "Hierarchy", "find_hierarchy", "outer_parameters",
           "evaluate"]

PARAMETER_TYPE = "parameterType"
"""The parameter table column that marks inner parameters (pyPESTO's convention)."""

KINDS = ("scaling", "offset", "sigma")
"""The values of `PARAMETER_TYPE` (an empty cell: an ordinary, outer parameter)."""

_LN10 = math.log(10.0)
_RIDGE = 1e-12  # on the Jacobi-scaled normal matrix (unit diagonal)
_PASSES = 3  # active-set passes of the bounded linear least squares


class Hierarchy(NamedTuple):
    """The inner parameters of a problem and the row layout of their closed forms
    (``m`` measurements in the groups' order, ``n_in`` inner parameters of which ``n_l``
    linear and ``n_n`` noise, ``C`` colours: no row holds two linear parameters of one).

    Attributes:
        ids: the inner parameter ids, in the parameter table's order; kinds: their
            `KINDS` (``parameterType``, else detected: ``offset`` where every coefficient
            is a constant, else ``scaling``; ``sigma`` for noise).
        full_pos: ``(n_in,)`` their positions in the full estimated vector;
            outer_pos: ``(n_out,)`` those of the outer parameters.
        theta_pos: ``(n_in,)`` their positions in ``theta``; scale: ``(n_in,)`` their
            scale codes (`SCALES`' indices).
        lin: ``(n_l,)`` indices into ``ids`` of the linear ones; lin_log: ``(n_l,)`` True
            where solved in log space (``log s``); lin_lo, lin_hi: ``(n_l,)`` their bounds
            on that variable (linear value or natural log).
        tangents: ``(C, n_theta)`` 1 at the ``theta`` positions of each colour's linear
            parameters (one directional derivative per colour gives every row's
            coefficients).
        row_lin: ``(m, C)`` each row's linear parameter of each colour (``n_l``: none);
            row_log: ``(m,)`` True for a log-space row; row_k: ``(m,)`` 1, or ln 10 for a
            log10 row.
        noise: ``(n_n,)`` indices into ``ids`` of the noise ones; noise_lo, noise_hi:
            ``(n_n,)`` their linear bounds; row_noise: ``(m,)`` each row's (``n_n``:
            none); noise_count: ``(n_n,)`` their rows.
        meas: ``(m,)`` the measurements; trans: ``(m,)`` their transformation codes;
        offsets: ``(groups + 1,)`` where each group's rows start.
    """

    ids: tuple
    kinds: tuple
    full_pos: np.ndarray
    outer_pos: np.ndarray
    theta_pos: np.ndarray
    scale: np.ndarray
    lin: np.ndarray
    lin_log: np.ndarray
    lin_lo: np.ndarray
    lin_hi: np.ndarray
    tangents: np.ndarray
    row_lin: np.ndarray
    row_log: np.ndarray
    row_k: np.ndarray
    noise: np.ndarray
    noise_lo: np.ndarray
    noise_hi: np.ndarray
    row_noise: np.ndarray
    noise_count: np.ndarray
    meas: np.ndarray
    trans: np.ndarray
    offsets: np.ndarray


# ----------------------------------------------------------------- detection (at load)
def _blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == ""


def read_marks(df) -> dict[str, str] | None:
    """The parameter table's `PARAMETER_TYPE` cells by parameter id (``None`` without the
    column); a ``ValueError`` for a value outside `KINDS`."""
    if PARAMETER_TYPE not in df.columns:
        return None
    marks = {}
    for pid, v in df[PARAMETER_TYPE].items():
        if _blank(v):
            continue
        v = str(v).strip()
        if v not in KINDS:
            raise ValueError(f"parameter table: {PARAMETER_TYPE} {v!r} of parameter "
                             f"{pid!r} is not one of {list(KINDS)} (or empty)")
        marks[str(pid)] = v
    return marks


class _Pattern(NamedTuple):
    """One observable with one assignment of its placeholders: its rows (indices into the
    groups' concatenation) and formulas with the placeholders replaced (a parameter by its
    ``__theta_`` symbol, a number by a ``__const_`` symbol: `shown` maps those back)."""

    group: int
    rows: np.ndarray
    obs: sp.Expr
    noise: sp.Expr
    consts: frozenset
    shown: dict


def _patterns(groups: list[dict], theta_ids: list[str]) -> list[_Pattern]:
    out, start = [], 0
    for gi, g in enumerate(groups):
        cells = (g["oph"], g["nph"])
        keys: dict[tuple, list[int]] = {}
        for r in range(len(g["rows"])):
            key = tuple(tuple(int(idx[r, k]) if ref[r, k] else None
                              for k in range(ref.shape[1])) for ref, idx, _ in cells)
            keys.setdefault(key, []).append(r)
        for key, rows in keys.items():
            subs, shown = {}, {}
            for kind, (phs, refs) in enumerate(zip(g["phs"], key)):
                for k, (sym, ref) in enumerate(zip(phs, refs)):
                    if ref is None:
                        c = sp.Symbol(f"__const_{kind}_{k}")
                        subs[sym] = c
                        shown[c] = sp.Float(float(cells[kind][2][rows[0], k]))
                    else:
                        subs[sym] = sp.Symbol("__theta_" + theta_ids[ref])
            out.append(_Pattern(gi, start + np.asarray(rows), g["obs_expr"].xreplace(subs),
                                g["noise_expr"].xreplace(subs), frozenset(shown), shown))
        start += len(g["rows"])
    return out


def _show(e: sp.Expr, pt: _Pattern) -> str:
    """A formula of a pattern as the tables write it (parameter ids, numbers)."""
    e = e.xreplace(pt.shown)
    return str(e.xreplace({s: sp.Symbol(s.name[len("__theta_"):]) for s in e.free_symbols
                           if s.name.startswith("__theta_")}))


def _is_zero(e: sp.Expr) -> bool:
    return e == 0 or sp.simplify(e) == 0


def _check(pats, groups, alive: set, sym: dict, marks) -> tuple[dict, dict, dict]:
    """One pass over the patterns: (why each of ``alive`` cannot be inner, each one's
    role ``"lin"``/``"noise"``, each linear one's transformations and whether all its
    coefficients are constants)."""
    bad, role, trans, const = {}, {}, {}, {}
    for pt in pats:
        g = groups[pt.group]
        o = g["id"]
        lin = {q for q in alive if sym[q] in pt.obs.free_symbols}
        noise = {q for q in alive if sym[q] in pt.noise.free_symbols}
        for q in lin | noise:
            if g["dist"] != "normal":
                bad.setdefault(q, f"observable '{o}' has {g['dist']} noise (the closed forms "
                                  "are those of normal noise)")
        for q in lin & noise:
            bad.setdefault(q, f"it enters both the observable formula of '{o}' "
                              f"({_show(pt.obs, pt)}) and its noise formula "
                              f"({_show(pt.noise, pt)})")
        lin_syms = {sym[q] for q in lin}
        for q in lin - noise:
            role.setdefault(q, set()).add("lin")
            d = sp.diff(pt.obs, sym[q])
            if d.free_symbols & lin_syms:
                bad.setdefault(q, f"it enters the observable formula of '{o}', "
                                  f"{_show(pt.obs, pt)}, nonlinearly (as an inner scaling or "
                                  "offset it must enter as s * h(x) or h(x) + b)")
                continue
            if g["trans"] != "lin" and (len(lin) > 1 or not _is_zero(pt.obs.subs(sym[q], 0))):
                bad.setdefault(q, f"it enters the {g['trans']}-transformed observable "
                                  f"'{o}', {_show(pt.obs, pt)}, not as a pure factor s * h(x) "
                                  "(an offset in log space)")
                continue
            trans.setdefault(q, set()).add("lin" if g["trans"] == "lin" else "log")
            const[q] = const.get(q, True) and g["trans"] == "lin" and \
                d.free_symbols <= pt.consts
        for q in noise - lin:
            role.setdefault(q, set()).add("noise")
            if len(noise) > 1 or not _is_zero(pt.noise.subs(sym[q], 0)) or \
                    not sp.diff(pt.noise, sym[q]).free_symbols <= pt.consts:
                bad.setdefault(q, f"the noise formula of '{o}', {_show(pt.noise, pt)}, is not "
                                  "the parameter times a constant")
    for q in alive:
        if q not in role:
            bad.setdefault(q, "it enters no observable or noise formula")
        elif len(role[q]) > 1:
            bad.setdefault(q, "it enters observable formulas and noise formulas")
        elif len(trans.get(q, ())) > 1:
            bad.setdefault(q, "it scales both linear and log-transformed observables")
        elif marks is not None and q in marks and (marks[q] == "sigma") != ("noise" in role[q]):
            bad.setdefault(q, f"it is marked {PARAMETER_TYPE}={marks[q]!r} but enters "
                              f"{'noise' if 'noise' in role[q] else 'observable'} formulas")
    return bad, role, const


def _components(row_lin: list[list[str]]) -> list[tuple[set, list[int]]]:
    """The groups of linear parameters connected by shared rows, with their rows."""
    parent: dict[str, str] = {}

    def find(a):
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for qs in row_lin:
        for q in qs[1:]:
            parent[find(q)] = find(qs[0])
        for q in qs:
            find(q)
    comps: dict[str, tuple[set, list[int]]] = {}
    for q in parent:
        comps.setdefault(find(q), (set(), []))[0].add(q)
    for i, qs in enumerate(row_lin):
        if qs:
            comps[find(qs[0])][1].append(i)
    return list(comps.values())


def find_hierarchy(problem, odes, pars: Parameters, conds: Conditions,
                   groups: list[dict]) -> Hierarchy | None:
    """The inner parameters of a PEtab problem (module docstring) and their row layout, or
    ``None`` where there are none.

    Args:
        problem: the `petab.v1.Problem`; odes: its `SbmlOdes`; pars, conds, groups: its
            tables as `read_parameters`, `read_conditions` and `read_measurements` give
            them (``groups`` with their SymPy formulas).

    Raises:
        ValueError: a parameter marked in a ``parameterType`` column that cannot be inner
            (the message names it, and the formula where it enters nonlinearly).
        NotImplementedError: marked linear and noise parameters whose groups do not nest.
    """
    marks = read_marks(problem.parameter_df)
    est = list(pars.ids)
    theta_ids = list(pars.theta_ids)
    cand = [p for p in est if p in marks] if marks is not None else list(est)
    if not cand:
        return None
    slot_refs = set()
    for slots in (conds.sim_slots, conds.pre_slots):
        if slots is not None:
            slot_refs |= {theta_ids[i] for i in np.asarray(slots.idx)[np.asarray(slots.is_ref)]}
    given = dict(zip(est, np.asarray(pars.priors.given)))
    model = set(odes.param_ids)
    reasons = {}
    for q in cand:
        if q in model:
            reasons[q] = "it is a parameter of the SBML model (the simulation reads it)"
        elif q in slot_refs:
            reasons[q] = "a condition-table cell sets a model quantity to it"
        elif given[q]:
            reasons[q] = ("it has an objective prior (an inner parameter is optimised in "
                          "closed form without one)")

    def refuse(found: dict):
        q = next(iter(found))
        raise ValueError(f"parameter '{q}' is marked {PARAMETER_TYPE}={marks[q]!r} (an inner "
                         f"parameter, optimised in closed form), but {found[q]}")

    if marks is not None and reasons:
        refuse(reasons)
    alive = set(cand) - set(reasons)
    sym = {q: sp.Symbol("__theta_" + q) for q in cand}
    pats = _patterns(groups, theta_ids)
    while True:
        bad, role, const = _check(pats, groups, alive, sym, marks)
        if not bad:
            break
        if marks is not None:
            refuse(bad)
        alive -= set(bad)
    if not alive:
        return None

    m = sum(len(g["rows"]) for g in groups)
    row_lin: list[list[str]] = [[] for _ in range(m)]
    row_noise: list[str | None] = [None] * m
    for pt in pats:
        lin = [q for q in est if q in alive and sym[q] in pt.obs.free_symbols]
        noise = [q for q in est if q in alive and sym[q] in pt.noise.free_symbols]
        for i in pt.rows:
            row_lin[i] = lin
            row_noise[i] = noise[0] if noise else None
    # nesting: each connected group of linear parameters has one noise, inner or not
    while True:
        clash = []
        for comp, rows in _components(row_lin):
            noises = {row_noise[i] for i in rows}
            if len(noises) > 1:
                clash.append((sorted(comp, key=est.index),
                              sorted((n for n in noises if n is not None), key=est.index)))
        if not clash:
            break
        for lin, noise in clash:
            msg = (f"inner scaling/offset parameters {lin} share measurements whose noise is "
                   f"{'the noise parameters ' + str(noise) if noise else 'not one parameter'}"
                   " and not one parameter common to all of them: their closed forms would "
                   "need alternating optimisation")
            if marks is not None:
                raise NotImplementedError(msg + f"; unmark the noise parameters {noise} (or "
                                          "the scalings/offsets) in the parameterType column")
            warnings.warn(f"hierarchical optimisation: {msg}; the noise parameters {noise} "
                          "stay outer parameters (optimised by the outer optimiser)",
                          stacklevel=4)
            alive -= set(noise)
            row_noise = [None if n in noise else n for n in row_noise]

    ids = tuple(q for q in est if q in alive)
    lin_ids = [q for q in ids if "lin" in role[q]]
    noise_ids = [q for q in ids if "noise" in role[q]]
    kinds = tuple(marks[q] if marks is not None else
                  ("sigma" if q in noise_ids else "offset" if const.get(q) else "scaling")
                  for q in ids)
    # colours: no row holds two linear parameters of one colour
    sets = {tuple(qs) for qs in row_lin if qs}  # the distinct rows' linear parameters
    colour: dict[str, int] = {}
    for q in lin_ids:
        taken = {colour[o] for qs in sets if q in qs for o in qs if o in colour}
        colour[q] = next(c for c in range(len(lin_ids) + 1) if c not in taken)
    n_c = max(colour.values(), default=-1) + 1
    n_l, n_n = len(lin_ids), len(noise_ids)
    full_pos = np.array([est.index(q) for q in ids], int)
    theta_pos = np.asarray(pars.est_pos)[full_pos]
    scale = np.asarray(pars.est_scale)[full_pos]
    lo_s, hi_s = (np.asarray(b, float)[full_pos] for b in pars.bounds)
    trans = np.concatenate([np.full(len(g["rows"]), SCALES.index(g["trans"]))
                            for g in groups])

    def linear_bounds(v, code):
        with np.errstate(over="ignore"):
            return np.where(code == 1, np.exp(v), np.where(code == 2, 10.0 ** v, v))

    lo_lin, hi_lin = linear_bounds(lo_s, scale), linear_bounds(hi_s, scale)
    lin_idx = np.array([ids.index(q) for q in lin_ids], int)
    on_log = {q for pt in pats if groups[pt.group]["trans"] != "lin"
              for q in lin_ids if sym[q] in pt.obs.free_symbols}
    lin_log = np.array([q in on_log for q in lin_ids], bool)

    def log_bound(lo_l, lo_sc, code):  # the bound on log s (natural)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(code == 1, lo_sc, np.where(
                code == 2, lo_sc * _LN10, np.where(lo_l > 0, np.log(np.abs(lo_l)), -np.inf)))

    lin_lo = np.where(lin_log, log_bound(lo_lin[lin_idx], lo_s[lin_idx], scale[lin_idx]),
                      lo_lin[lin_idx])
    lin_hi = np.where(lin_log, log_bound(hi_lin[lin_idx], hi_s[lin_idx], scale[lin_idx]),
                      hi_lin[lin_idx])
    tangents = np.zeros((n_c, len(theta_ids)))
    for j, q in enumerate(lin_ids):
        tangents[colour[q], theta_pos[lin_idx[j]]] = 1.0
    r_lin = np.full((m, n_c), n_l, int)
    r_log = np.zeros(m, bool)
    for i, qs in enumerate(row_lin):
        for q in qs:
            j = lin_ids.index(q)
            r_lin[i, colour[q]] = j
            r_log[i] = r_log[i] or bool(lin_log[j])
    noise_idx = np.array([ids.index(q) for q in noise_ids], int)
    r_noise = np.array([n_n if n is None else noise_ids.index(n) for n in row_noise], int)
    return Hierarchy(
        ids=ids, kinds=kinds, full_pos=full_pos,
        outer_pos=np.array([i for i, q in enumerate(est) if q not in alive], int),
        theta_pos=theta_pos, scale=scale, lin=lin_idx, lin_log=lin_log,
        lin_lo=lin_lo, lin_hi=lin_hi, tangents=tangents, row_lin=r_lin, row_log=r_log,
        row_k=np.where(trans == 2, _LN10, 1.0), noise=noise_idx,
        noise_lo=lo_lin[noise_idx], noise_hi=hi_lin[noise_idx], row_noise=r_noise,
        noise_count=np.bincount(r_noise, minlength=n_n + 1)[:n_n].astype(float),
        meas=np.concatenate([np.asarray(g["meas"], float) for g in groups]), trans=trans,
        offsets=np.cumsum([0] + [len(g["rows"]) for g in groups]))


def outer_parameters(pars: Parameters, h: Hierarchy) -> Parameters:
    """``pars`` with only the outer parameters estimated (the inner ones keep their place
    in ``theta``, where `evaluate` sets them)."""
    k = np.asarray(h.outer_pos)
    return pars._replace(
        ids=tuple(pars.ids[i] for i in k), scales=tuple(pars.scales[i] for i in k),
        nominal=jnp.asarray(pars.nominal)[k],
        bounds=tuple(jnp.asarray(b)[k] for b in pars.bounds),
        priors=Priors(*(np.asarray(a)[k] for a in pars.priors)),
        est_pos=np.asarray(pars.est_pos)[k], est_scale=np.asarray(pars.est_scale)[k])


# ----------------------------------------------------------------- closed forms (traced)
def _solve_normal(mat, rhs, lo, hi, passes: int = _PASSES):
    """The minimiser of ``beta^T mat beta / 2 - rhs^T beta`` over the box ``[lo, hi]``
    (``mat (n, n)`` a normal matrix): the unconstrained solution, then ``passes``
    active-set passes (coordinates on a bound whose gradient points outward held there,
    the others re-solved, clipped). Jacobi-scaled with a ``_RIDGE`` on the unit diagonal
    (a parameter no row informs gets 0, then its bound's clip). Differentiable: the last
    pass's solve, given its active set."""
    n = mat.shape[0]
    d = jnp.diagonal(mat)
    pos = d > 0
    s = jnp.where(pos, 1.0 / jnp.sqrt(jnp.where(pos, d, 1.0)), 1.0)
    a = s[:, None] * mat * s[None, :] + _RIDGE * jnp.eye(n, dtype=mat.dtype)
    b = s * rhs
    beta = jnp.clip(s * jnp.linalg.solve(a, b), lo, hi)
    for _ in range(passes):
        g = mat @ beta - rhs
        held = ((beta <= lo) & (g > 0)) | ((beta >= hi) & (g < 0))
        y_held = jnp.where(held, beta / s, 0.0)
        both = ~held[:, None] & ~held[None, :]
        a_free = jnp.where(both, a, 0.0) + jnp.diag(jnp.where(held, 1.0, 0.0))
        y = jnp.linalg.solve(a_free, jnp.where(held, y_held, b - a @ y_held))
        beta = jnp.clip(s * y, lo, hi)
    return beta


def _on_scale(q_lin, log_q, code):
    """A linear value (or, where known, its natural log ``log_q``) on scale ``code``."""
    return jnp.where(code == 0, q_lin, jnp.where(code == 1, log_q, log_q / _LN10))


def evaluate(h: Hierarchy, groups: list[dict], ys, p, theta):
    """The measurements at the inner optimum: ``(each group's (prediction (m_o,), sigma
    (m_o,)), the inner parameters (n_in,) on their scales)``, from the states at the save
    times ``ys (n, k, d)``, the model parameters ``p (n, n_p)`` and the parameter table's
    linear values ``theta`` (the inner entries are overwritten). Jittable; differentiable
    (forward and reverse) through the closed forms."""
    n_l, n_n = len(h.lin), len(h.noise)
    dtype = theta.dtype
    th0 = theta.at[jnp.asarray(h.theta_pos[h.lin], int)].set(0.0)
    th0 = th0.at[jnp.asarray(h.theta_pos[h.noise], int)].set(1.0)

    def predictions(th):
        obs = observe(groups, ys, p, th)
        return (jnp.concatenate([o[0] for o in obs]), jnp.concatenate([o[1] for o in obs]))

    c, sig0 = predictions(th0)
    meas = jnp.asarray(h.meas, dtype)
    lin_t, l10_t = h.trans == 0, h.trans == 2
    vals = jnp.zeros(len(h.ids), dtype)
    pred = c
    if n_l:
        # every row's coefficients: one directional derivative per colour (exact: the
        # prediction is affine in the linear inner parameters)
        def coefficient(t):
            return jax.jvp(lambda th: predictions(th)[0], (th0,), (t,))[1]

        used = h.row_lin < n_l
        in_ls = used.any(axis=1)
        logrow = h.row_log
        a = jnp.where(used, jax.vmap(coefficient)(jnp.asarray(h.tangents, dtype)).T, 0.0)
        a_one = jnp.sum(a, axis=1)
        rho = jnp.log(jnp.where(logrow, meas, 1.0)) - jnp.log(jnp.where(logrow, a_one, 1.0))
        target = jnp.where(logrow, rho, meas - c)
        u = jnp.where(logrow[:, None], jnp.asarray(used, dtype), a)
        sd = jnp.where(in_ls, sig0 * h.row_k, 1.0)
        w = jnp.where(in_ls, 1.0 / sd**2, 0.0)
        idx = jnp.asarray(h.row_lin)
        mat = jnp.zeros((n_l + 1, n_l + 1), dtype)
        rhs = jnp.zeros(n_l + 1, dtype)
        for k in range(idx.shape[1]):
            rhs = rhs.at[idx[:, k]].add(w * u[:, k] * target)
            for j in range(idx.shape[1]):
                mat = mat.at[idx[:, k], idx[:, j]].add(w * u[:, k] * u[:, j])
        beta = _solve_normal(mat[:n_l, :n_l], rhs[:n_l], h.lin_lo, h.lin_hi)
        bp = jnp.append(beta, 0.0)[idx]
        b_row = jnp.sum(jnp.where(used, bp, 0.0), axis=1)  # a log row's log s
        pred = jnp.where(logrow, jnp.exp(b_row) * a_one, c + jnp.sum(bp * a, axis=1))
        log_row_r = (rho - b_row) / h.row_k
        q_lin = jnp.where(h.lin_log, jnp.exp(beta), beta)
        log_q = jnp.where(h.lin_log, beta, jnp.log(jnp.where(q_lin > 0, q_lin, 1.0)))
        vals = vals.at[h.lin].set(_on_scale(q_lin, log_q, h.scale[h.lin]))
    sigma = sig0
    if n_n:
        safe = jnp.where(lin_t, 1.0, pred)
        r = jnp.where(lin_t, meas - pred, (jnp.log(jnp.where(lin_t, 1.0, meas)) -
                                           jnp.log(safe)) / np.where(l10_t, _LN10, 1.0))
        if n_l:
            r = jnp.where(h.row_log, log_row_r, r)
        inner = h.row_noise < n_n
        q = jnp.where(inner, r / jnp.where(inner, sig0, 1.0), 0.0)
        var = jnp.zeros(n_n + 1, dtype).at[jnp.asarray(h.row_noise)].add(q**2)[:n_n] / \
            h.noise_count
        pos = var > 0
        sd = jnp.clip(jnp.where(pos, jnp.sqrt(jnp.where(pos, var, 1.0)), 0.0), h.noise_lo,
                      h.noise_hi)
        sigma = sig0 * jnp.append(sd, 1.0)[jnp.asarray(h.row_noise)]
        vals = vals.at[h.noise].set(_on_scale(sd, jnp.log(jnp.where(sd > 0, sd, 1.0)),
                                              h.scale[h.noise]))
    o = h.offsets
    return ([(pred[o[i]:o[i + 1]], sigma[o[i]:o[i + 1]]) for i in range(len(o) - 1)], vals)
