"""How a population's dose records become the doses of its one ensemble solve.

Two ways, chosen by the data and the model: bolus jumps of the state (`initial_state_and_doses`
folds the doses at ``t0`` into ``y0`` and keeps the rest as ``jumps=``), or a
``gradsolve.DoseSchedule`` (`schedule`: one record per compartment and kind of dose) when
the data have zero-order inputs, steady-state doses or resets, or the model has dose
parameters. `PopulationDataset.doses` and `PopulationModel.dosing` are the public faces;
these are their bodies, with the checks they share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np


def identity_doses(theta, p, sizes):
    """The default ``dose_sizes`` of a `PopulationModel`: the data's sizes unchanged."""
    return sizes


def checked_scale(scale, n_states: int, where: str) -> np.ndarray:
    """``scale`` (default ones) as a ``(n_states,)`` array, or a ``ValueError`` from
    ``PopulationDataset.{where}``."""
    scale = np.ones(n_states) if scale is None else np.asarray(scale, dtype=np.float64)
    if scale.shape != (n_states,):
        raise ValueError(f"PopulationDataset.{where}: `scale` must have shape "
                         f"({n_states},), got {scale.shape}.")
    return scale


def check_compartments(data, n_states: int, where: str) -> None:
    """A dose into a compartment the model does not have is a ``ValueError`` naming
    the subject, row and column."""
    for s in data.subjects:
        bad = np.flatnonzero((s.dose_cmt < 0) | (s.dose_cmt >= n_states))
        if bad.size:
            row = "" if s.dose_rows is None else f"row {int(s.dose_rows[bad[0]])}, "
            raise ValueError(
                f"PopulationDataset.{where}: subject {s.id!r} has a dose into compartment "
                f"CMT={int(s.dose_cmt[bad[0]]) + 1} ({row}column CMT), but the model has "
                f"{n_states} states (CMT 1..{n_states}).")


def dose_groups(data):
    """Every subject's doses by ``(cmt, kind, ss)`` (kind: ``bolus``, ``rate``,
    ``dur``, ``R`` a modelled rate, ``D`` a modelled duration): per group, per
    subject, the dose indices."""
    groups: dict[tuple, list[np.ndarray]] = {}
    for i, s in enumerate(data.subjects):
        J = s.dose_times.size
        rate = np.zeros(J) if s.dose_rates is None else s.dose_rates
        dur = np.zeros(J) if s.dose_durations is None else s.dose_durations
        ss = np.zeros(J, np.int64) if s.dose_ss is None else s.dose_ss
        kind = np.where(rate == 0, "bolus", np.where(dur > 0, "dur", np.where(
            rate == -1, "R", np.where(rate == -2, "D", "rate"))))
        for j in range(J):
            key = (int(s.dose_cmt[j]), str(kind[j]), int(ss[j]))
            groups.setdefault(key, [[] for _ in data.subjects])[i].append(j)
    return groups


def schedule(data, n_states: int, scale, parameters: Mapping[str, Any] | None):
    """`PopulationDataset.doses`: every subject's doses of ``data`` as a
    ``gradsolve.DoseSchedule``."""
    import gradsolve as gs

    scale = checked_scale(scale, n_states, "doses")
    S = data.n_subjects
    params = dict(parameters or {})
    allowed = {f"{k}{c + 1}" for k in ("ALAG", "F", "R", "D") for c in range(n_states)}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"PopulationDataset.doses: unknown dose parameters {unknown}; "
                         f"they are ALAGc, Fc, Rc, Dc for c in 1..{n_states}.")
    params = {k: jnp.reshape(jnp.asarray(v), (S,))[:, None] for k, v in params.items()}
    check_compartments(data, n_states, "doses")
    records = []
    for (c, kind, ss), picks in sorted(dose_groups(data).items()):
        J = max(len(m) for m in picks)
        t, a, rr, dd, ii = (np.full((S, J), x) for x in (np.inf, 0.0, 1.0, 1.0, 1.0))
        for i, (s, m) in enumerate(zip(data.subjects, picks)):
            k = len(m)
            t[i, :k], a[i, :k] = s.dose_times[m], s.dose_amounts[m] * scale[c]
            if s.dose_rates is not None and kind in ("rate", "dur"):
                rr[i, :k] = s.dose_rates[m] * scale[c]
                dd[i, :k] = s.dose_durations[m]
            if s.dose_ii is not None:
                ii[i, :k] = np.where(s.dose_ii[m] > 0, s.dose_ii[m], 1.0)
        extra = dict(lag=params.get(f"ALAG{c + 1}"),
                     bioavailability=params.get(f"F{c + 1}"), cmt=c)
        if kind in ("R", "D"):
            name = f"{kind}{c + 1}"
            if name not in params:
                i = next(i for i, m in enumerate(picks) if m)
                s = data.subjects[i]
                raise ValueError(
                    f"PopulationDataset.doses: subject {s.id!r}, row "
                    f"{int(s.dose_rows[picks[i][0]])}, column RATE: RATE = "
                    f"{-1 if kind == 'R' else -2} needs the model's "
                    f"{'rate' if kind == 'R' else 'duration'} {name} (the model gives "
                    f"no such dose parameter).")
            how = ({"rate": params[name] * scale[c]} if kind == "R"
                   else {"duration": params[name]})
            rec = gs.Infusion(time=t, amount=a, **how, **extra)
        elif kind == "rate":
            rec = gs.Infusion(time=t, amount=a, rate=rr, **extra)
        elif kind == "dur":
            rec = gs.Infusion(time=t, amount=a, duration=dd, **extra)
        else:
            rec = gs.Bolus(time=t, amount=a, **extra)
        records.append(gs.SteadyState(rec, interval=ii, add=ss == 2) if ss else rec)
    R = max(0 if s.resets is None else s.resets.size for s in data.subjects)
    if R:
        times = np.full((S, R), np.inf)
        for i, s in enumerate(data.subjects):
            if s.resets is not None:
                times[i, :s.resets.size] = s.resets
        records.append(gs.Reset(times))
    return gs.DoseSchedule(records)


def check_early_doses(model, data) -> None:
    """A dose before ``t0`` that is not at steady state (a bolus, an infusion started
    earlier) is a ``ValueError`` naming the subject, row and column: the solve starts
    at ``t0`` and cannot give it. A steady-state dose or a reset before ``t0`` restarts
    the state, so the solve runs it and the doses after it."""
    for s in data.subjects:
        ss = np.zeros(s.dose_times.size, np.int64) if s.dose_ss is None else s.dose_ss
        # a restart (SS = 1, EVID 3/4) at or before a dose's time carries it
        restarts = np.concatenate([s.dose_times[ss == 1],
                                   [] if s.resets is None else s.resets])
        first = restarts.min() if restarts.size else np.inf
        early = np.flatnonzero((s.dose_times < model.t0) & (ss != 1)
                               & (s.dose_times < first))
        if early.size:
            j = early[0]
            row = "" if s.dose_rows is None else f", row {int(s.dose_rows[j])}"
            raise ValueError(
                f"{model.name}: subject {s.id!r}{row}, column TIME: a dose at TIME "
                f"{s.dose_times[j]:g}, before the model's t0 = {model.t0}; only a dose "
                "at steady state (SS = 1) or a reset may come before t0 (give the "
                "earlier doses, or start the model earlier).")


def initial_state_and_doses(model, theta, p, data):
    """`PopulationModel.dosing` of ``model``: ``(y0 (S, d), jumps or a schedule)``."""
    d = model.n_states
    data.check_observed_compartments(d)
    check_early_doses(model, data)
    if data.needs_schedule or model.dose_parameters_fn is not None:
        if model.dose_sizes_fn is not identity_doses:
            raise NotImplementedError(
                f"{model.name}: `dose_sizes` acts on bolus jumps; this data set or model "
                "needs a dose schedule (RATE/DUR, SS, EVID 3/4, dose parameters): give "
                "a bioavailability as `dose_parameters` (F1, ...) instead.")
        params = (None if model.dose_parameters_fn is None
                  else model.dose_parameters_fn(theta, p))
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"{model.name}: `dose_parameters` must return a dict (ALAG1, "
                             f"F1, R1, D1, ...), got {type(params).__name__}")
        return jnp.zeros((data.n_subjects, d)), data.doses(d, scale=model.dose_scale,
                                                           parameters=params)
    times, sizes = data.jumps(d, scale=model.dose_scale)   # (S, J), (S, J, d) numpy
    sizes = jnp.asarray(model.dose_sizes_fn(theta, p, jnp.asarray(sizes)))
    if sizes.shape != times.shape + (d,):
        raise ValueError(f"{model.name}: `dose_sizes` must return shape "
                         f"{times.shape + (d,)}, got {sizes.shape}")
    at_t0 = times == model.t0
    y0 = jnp.sum(jnp.where(at_t0[..., None], sizes, 0.0), axis=1)
    t_last = data.observations()[0].max()
    keep = np.isfinite(times) & ~at_t0 & (times <= t_last)
    J = int(keep.sum(axis=1).max())
    if J == 0:
        return y0, None
    # concrete gather: each row's kept doses first (in time order), padding after
    order = np.argsort(~keep, axis=1, kind="stable")[:, :J]
    live = np.take_along_axis(keep, order, axis=1)
    jt = np.where(live, np.take_along_axis(times, order, axis=1), np.inf)
    js = jnp.take_along_axis(sizes, jnp.asarray(order)[..., None], axis=1)
    js = jnp.where(jnp.asarray(live)[..., None], js, 0.0)
    return y0, (jnp.asarray(jt, dtype=js.dtype), js)
