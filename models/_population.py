"""Many-subject data sets: ragged observations, per-subject covariates and dose records.

Population data (a pharmacokinetic study, an epidemic over regions) are kept as a
long-format table, one row per observation or dose, as NONMEM and Monolix users keep them:
``ID`` (subject), ``TIME``, ``DV`` (the observed value), ``AMT`` (a dose amount), ``EVID``
(0 an observation, 1 a dose), ``CMT`` (the compartment a dose goes into, 1-based, or an
observation is taken from), and covariate columns (``WT``, ...). `PopulationDataset` reads
such a table and gives each subject's observations and doses, and the padded arrays an
ensemble solve takes: one trajectory per subject, ragged times padded (the last time
repeated, its value missing), dose schedules padded with ``inf`` (inert), as
``gradsolve``'s ``ts=`` and ``jumps=(times, sizes)`` expect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._csv import read_csv
from ._dataset import Dataset

__all__ = ["PopulationDataset", "Subject"]

_MISSING = ("", ".", "nan", "NaN", "NA")


class Subject(NamedTuple):
    """One subject of a `PopulationDataset`.

    Attributes:
        id: the subject's identifier as in the table.
        ts: ``(k,)`` observation times, sorted.
        ys: ``(k,)`` observed values (NaN: missing).
        obs_cmt: ``(k,)`` 0-based compartment index of each observation (``CMT - 1``).
        dose_times: ``(J,)`` dose times, sorted.
        dose_amounts: ``(J,)`` dose amounts.
        dose_cmt: ``(J,)`` 0-based compartment index each dose goes into.
        covariates: name -> value, constant within the subject.
        dose_rates: ``(J,)`` zero-order input rate of each dose (``0``: a bolus; ``RATE``,
            or ``AMT / DUR``; ``-1``/``-2``: a rate/duration the model gives); ``None``
            (the default) for bolus doses only.
        dose_durations: ``(J,)`` ``DUR`` of each dose (``0``: none given), or ``None``.
        dose_ss: ``(J,)`` ``SS`` of each dose (``0``; ``1``: at steady state, resetting;
            ``2``: at steady state, added), or ``None``: none.
        dose_ii: ``(J,)`` ``II`` of each dose (its steady state's interval), or ``None``.
        dose_rows: ``(J,)`` the table row (1-based) each dose comes from, or ``None``.
        resets: ``(R,)`` reset times (``EVID`` 3 and 4), or ``None``: none.
        cens: ``(k,)`` censoring of each observation (``0``: observed; ``1``: below its
            ``ys`` value, the limit; ``-1``: above it), or ``None``: none censored.
        covariate_steps: name -> ``(times, values)`` of a time-varying covariate (each
            value holds from its time until the next: last value carried forward; the
            first is the one in ``covariates``), or ``None``: none.

    Example:
        >>> s = models.load_dataset("theophylline").subjects[0]
        >>> s.id, s.ts.shape, s.dose_amounts, s.covariates["WT"]   # 1, (11,), [4.02], 79.6
    """

    id: Any
    ts: np.ndarray
    ys: np.ndarray
    obs_cmt: np.ndarray
    dose_times: np.ndarray
    dose_amounts: np.ndarray
    dose_cmt: np.ndarray
    covariates: dict
    dose_rates: np.ndarray | None = None
    dose_durations: np.ndarray | None = None
    dose_ss: np.ndarray | None = None
    dose_ii: np.ndarray | None = None
    dose_rows: np.ndarray | None = None
    resets: np.ndarray | None = None
    cens: np.ndarray | None = None
    covariate_steps: dict | None = None


def _column(table, name: str, argname: str, required: bool = True):
    """Column ``name`` of ``table`` as a list, or ``None`` if absent and optional."""
    try:
        col = table[name]
    except (KeyError, IndexError, TypeError):
        if required:
            cols = list(table)
            raise ValueError(
                f"PopulationDataset.from_table: no column {name!r} (the `{argname}` "
                f"column); the table has {cols}. Pass {argname}='<your column name>'."
            ) from None
        return None
    return list(np.asarray(col, dtype=object).reshape(-1))


def _number(value, what: str, subject, allow_missing: bool = True) -> float:
    if value is None or (isinstance(value, str) and value.strip() in _MISSING):
        if allow_missing:
            return float("nan")
        raise ValueError(f"PopulationDataset: subject {subject!r}: {what} is missing.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"PopulationDataset: subject {subject!r}: {what} must be a number, got {value!r}."
        ) from None


def _dose_record(sid, r: int, t: float, amount: float, get) -> list[tuple]:
    """The ``(time, rate, duration, ss, ii)`` of the dose on row ``r`` and of its ``ADDL``
    additional doses (rate ``0``: a bolus; ``-1``/``-2``: modelled), with NONMEM's rules
    for ``RATE``, ``DUR``, ``SS``, ``II`` (only the row's own dose is at steady state)."""
    where = f"PopulationDataset: subject {sid!r}, row {r + 1}"
    rate, dur, addl, ii, ss = (get(k) for k in ("rate", "dur", "addl", "ii", "ss"))
    rate, dur, addl, ii, ss = (0.0 if np.isnan(v) else v for v in (rate, dur, addl, ii, ss))
    if rate < 0 and rate not in (-1.0, -2.0):
        raise ValueError(f"{where}, column RATE: RATE must be >= 0 (or -1/-2), got {rate:g}.")
    if dur < 0:
        raise ValueError(f"{where}, column DUR: DUR must be >= 0, got {dur:g}.")
    if rate != 0 and dur > 0:
        raise ValueError(f"{where}, columns RATE and DUR: give RATE or DUR, not both (RATE "
                         f"{rate:g}, DUR {dur:g}).")
    if ss not in (0.0, 1.0, 2.0):
        raise ValueError(f"{where}, column SS: SS must be 0, 1 or 2, got {ss:g}.")
    if ss and ii <= 0:
        raise ValueError(f"{where}, column II: SS = {ss:g} needs an interval II > 0.")
    if ss and dur > ii:
        raise ValueError(f"{where}, column DUR: a steady-state infusion must end within its "
                         f"interval (DUR {dur:g} > II {ii:g}).")
    if addl < 0 or addl != int(addl):
        raise ValueError(f"{where}, column ADDL: ADDL must be a whole number >= 0, got "
                         f"{addl:g}.")
    if addl and ii <= 0:
        raise ValueError(f"{where}, column II: ADDL = {addl:g} needs an interval II > 0.")
    if dur > 0:
        rate = amount / dur
    return [(t + k * ii, rate, dur, int(ss) if k == 0 else 0, ii)
            for k in range(int(addl) + 1)]


class PopulationDataset:
    """Observations and doses of many subjects (one trajectory each in an ensemble).

    Build it with `PopulationDataset.from_table` (a long-format table) or load an embedded
    one with `models.load_dataset` (``"theophylline"``).

    Attributes:
        subjects: tuple of `Subject`, in the order they first appear in the table.
        covariate_names: names of the per-subject covariates.
        name: what the observed values are (the ``DV`` column's meaning).
        units: free text, the units of the columns.
        source: free text, where the numbers come from.

    Example:
        >>> data = models.load_dataset("theophylline")
        >>> data.n_subjects, data.subjects[0].ts.shape        # (12, (11,))
        >>> ts, ys = data.observations()                      # (12, 11), (12, 11)
        >>> times, sizes = data.jumps(n_states=2)             # (12, 1), (12, 1, 2)
        >>> data.covariate("WT").shape                        # (12,)
    """

    def __init__(self, subjects: Sequence[Subject], covariate_names: Sequence[str] = (),
                 name: str | None = None, units: str | None = None,
                 source: str | None = None):
        subjects = tuple(subjects)
        if not subjects:
            raise ValueError("PopulationDataset: `subjects` is empty.")
        for s in subjects:
            if not isinstance(s, Subject):
                raise ValueError(f"PopulationDataset: `subjects` must hold Subject records, "
                                 f"got {type(s).__name__}.")
            if s.ts.size == 0 or np.all(np.isnan(s.ys)):
                raise ValueError(f"PopulationDataset: subject {s.id!r} has no observations.")
        self.subjects = subjects
        self.covariate_names = tuple(covariate_names)
        self.name, self.units, self.source = name, units, source

    def __repr__(self) -> str:
        k = [s.ts.size for s in self.subjects]
        return (f"PopulationDataset({self.n_subjects} subjects, {min(k)}-{max(k)} observations "
                f"each, covariates {list(self.covariate_names)})")

    @property
    def n_subjects(self) -> int:
        """``S``, the number of subjects."""
        return len(self.subjects)

    @property
    def ids(self) -> tuple:
        """The subjects' identifiers, in order."""
        return tuple(s.id for s in self.subjects)

    def covariate(self, name: str) -> np.ndarray:
        """``(S,)`` the covariate ``name`` of every subject."""
        if name not in self.covariate_names:
            raise ValueError(f"PopulationDataset.covariate: no covariate {name!r}; the data "
                             f"set has {list(self.covariate_names)}.")
        return np.array([s.covariates[name] for s in self.subjects], dtype=np.float64)

    def observations(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ts (S, K), ys (S, K))``: every subject's observations, padded to the largest
        count ``K``: a padding slot repeats the subject's last time (so each row stays
        sorted, as ``ts=`` needs) and its value is NaN (missing, so a likelihood skips it).
        """
        K = max(s.ts.size for s in self.subjects)
        ts = np.empty((self.n_subjects, K))
        ys = np.full((self.n_subjects, K), np.nan)
        for i, s in enumerate(self.subjects):
            k = s.ts.size
            ts[i, :k], ts[i, k:] = s.ts, s.ts[-1]
            ys[i, :k] = s.ys
        return ts, ys

    def covariate_at(self, name: str, ts: Any) -> np.ndarray:
        """``(S, K)`` the covariate ``name`` of every subject at times ``ts`` (``(S, K)``,
        e.g. `observations`' times), its last value at or before each time carried
        forward (before a subject's first row: its first value); a constant covariate
        is its value everywhere.

        Example:
            >>> ts, _ = data.observations()
            >>> wt = data.covariate_at("WT", ts)           # (S, K)
        """
        base = self.covariate(name)
        ts = np.asarray(ts, dtype=np.float64)
        if ts.ndim != 2 or ts.shape[0] != self.n_subjects:
            raise ValueError(f"PopulationDataset.covariate_at: `ts` must have shape "
                             f"({self.n_subjects}, K), got {ts.shape}.")
        out = np.repeat(base[:, None], ts.shape[1], axis=1)
        for i, s in enumerate(self.subjects):
            if s.covariate_steps and name in s.covariate_steps:
                t, v = s.covariate_steps[name]
                out[i] = v[np.maximum(np.searchsorted(t, ts[i], side="right") - 1, 0)]
        return out

    def censoring(self) -> np.ndarray:
        """``(S, K)`` each observation's censoring, padded as `observations` (``0``:
        observed; ``1``: below its value; ``-1``: above it)."""
        K = max(s.ts.size for s in self.subjects)
        out = np.zeros((self.n_subjects, K), np.int64)
        for i, s in enumerate(self.subjects):
            if s.cens is not None:
                out[i, :s.cens.size] = s.cens
        return out

    def jumps(self, n_states: int, scale: Sequence[float] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """Every subject's doses as bolus jumps of the state: ``(times (S, J), sizes (S, J,
        n_states))``, padded to the largest dose count ``J`` with ``inf`` times (inert) and
        zero sizes; a dose of amount ``a`` into compartment ``c`` adds ``a * scale[c]`` to
        state ``c`` (``scale`` default ones: e.g. a bioavailability or a unit change).

        A dose into a compartment at or beyond ``n_states`` is a ``ValueError`` naming the
        subject.
        """
        if self.needs_schedule:
            raise ValueError("PopulationDataset.jumps: the data set has zero-order inputs "
                             "(RATE or DUR), steady-state doses (SS) or resets (EVID 3/4), "
                             "which are not jumps; use `doses`.")
        scale = self._scale(scale, n_states, "jumps")
        J = max(1, max(s.dose_times.size for s in self.subjects))
        times = np.full((self.n_subjects, J), np.inf)
        sizes = np.zeros((self.n_subjects, J, n_states))
        self._check_compartments(n_states, "jumps")
        for i, s in enumerate(self.subjects):
            j = s.dose_times.size
            times[i, :j] = s.dose_times
            sizes[i, np.arange(j), s.dose_cmt] = s.dose_amounts * scale[s.dose_cmt]
        return times, sizes

    @property
    def has_infusions(self) -> bool:
        """Whether any dose is a zero-order input (``RATE`` or ``DUR`` in the table)."""
        return any(s.dose_rates is not None and np.any(s.dose_rates != 0)
                   for s in self.subjects)

    @property
    def needs_schedule(self) -> bool:
        """Whether the doses need `doses` (a ``gradsolve.DoseSchedule``): zero-order
        inputs, steady-state doses or resets; else `jumps` serve."""
        return self.has_infusions or any(s.dose_ss is not None or s.resets is not None
                                         for s in self.subjects)

    def _check_compartments(self, n_states: int, where: str) -> None:
        """A dose into a compartment the model does not have is a ``ValueError`` naming
        the subject, row and column."""
        for s in self.subjects:
            bad = np.flatnonzero((s.dose_cmt < 0) | (s.dose_cmt >= n_states))
            if bad.size:
                row = "" if s.dose_rows is None else f"row {int(s.dose_rows[bad[0]])}, "
                raise ValueError(
                    f"PopulationDataset.{where}: subject {s.id!r} has a dose into compartment "
                    f"CMT={int(s.dose_cmt[bad[0]]) + 1} ({row}column CMT), but the model has "
                    f"{n_states} states (CMT 1..{n_states}).")

    @staticmethod
    def _scale(scale, n_states: int, where: str) -> np.ndarray:
        scale = np.ones(n_states) if scale is None else np.asarray(scale, dtype=np.float64)
        if scale.shape != (n_states,):
            raise ValueError(f"PopulationDataset.{where}: `scale` must have shape "
                             f"({n_states},), got {scale.shape}.")
        return scale

    def _dose_groups(self):
        """Every subject's doses by ``(cmt, kind, ss)`` (kind: ``bolus``, ``rate``,
        ``dur``, ``R`` a modelled rate, ``D`` a modelled duration): per group, per
        subject, the dose indices."""
        groups: dict[tuple, list[np.ndarray]] = {}
        for i, s in enumerate(self.subjects):
            J = s.dose_times.size
            rate = np.zeros(J) if s.dose_rates is None else s.dose_rates
            dur = np.zeros(J) if s.dose_durations is None else s.dose_durations
            ss = np.zeros(J, np.int64) if s.dose_ss is None else s.dose_ss
            kind = np.where(rate == 0, "bolus", np.where(dur > 0, "dur", np.where(
                rate == -1, "R", np.where(rate == -2, "D", "rate"))))
            for j in range(J):
                key = (int(s.dose_cmt[j]), str(kind[j]), int(ss[j]))
                groups.setdefault(key, [[] for _ in self.subjects])[i].append(j)
        return groups

    def doses(self, n_states: int, scale: Sequence[float] | None = None,
              parameters: Mapping[str, Any] | None = None):
        """Every subject's doses as a ``gradsolve.DoseSchedule``: per compartment and kind
        one record (``gs.Bolus``, ``gs.Infusion``, wrapped in ``gs.SteadyState`` for ``SS``
        doses) with ``(S, J)`` fields padded with ``inf`` times, and a ``gs.Reset`` of the
        ``EVID`` 3/4 times; amounts and rates times ``scale[c]``. Pass it as ``doses=`` to
        ``gs.solve`` or ``inference.ode``.

        Args:
            n_states: the model's states.
            scale: ``(n_states,)`` a factor per compartment (default ones).
            parameters: the model's dose parameters, NONMEM's names with the 1-based
                compartment, each ``(S,)`` (may be traced): ``ALAGc`` the lag time, ``Fc``
                the bioavailability, ``Rc`` the rate of ``RATE = -1`` doses, ``Dc`` the
                duration of ``RATE = -2`` doses.

        A dose into a compartment at or beyond ``n_states``, and a ``RATE = -1/-2`` dose
        without its ``Rc``/``Dc``, are ``ValueError``s naming the subject, row and column.
        """
        import jax.numpy as jnp

        import gradsolve as gs

        scale = self._scale(scale, n_states, "doses")
        S = self.n_subjects
        params = dict(parameters or {})
        allowed = {f"{k}{c + 1}" for k in ("ALAG", "F", "R", "D") for c in range(n_states)}
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ValueError(f"PopulationDataset.doses: unknown dose parameters {unknown}; "
                             f"they are ALAGc, Fc, Rc, Dc for c in 1..{n_states}.")
        params = {k: jnp.reshape(jnp.asarray(v), (S,))[:, None] for k, v in params.items()}
        self._check_compartments(n_states, "doses")
        records = []
        for (c, kind, ss), picks in sorted(self._dose_groups().items()):
            J = max(len(m) for m in picks)
            t, a, rr, dd, ii = (np.full((S, J), x) for x in (np.inf, 0.0, 1.0, 1.0, 1.0))
            for i, (s, m) in enumerate(zip(self.subjects, picks)):
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
                    s = self.subjects[i]
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
        R = max(0 if s.resets is None else s.resets.size for s in self.subjects)
        if R:
            times = np.full((S, R), np.inf)
            for i, s in enumerate(self.subjects):
                if s.resets is not None:
                    times[i, :s.resets.size] = s.resets
            records.append(gs.Reset(times))
        return gs.DoseSchedule(records)

    def subject_dataset(self, i: int) -> Dataset:
        """Subject ``i``'s observations as a one-column `Dataset` (``ts (k,)``, ``ys (k,
        1)``), e.g. to fit or plot one subject."""
        s = self.subjects[i]
        return Dataset(ts=s.ts, ys=s.ys[:, None], names=None if self.name is None else (
            self.name,), source=self.source)

    @classmethod
    def from_table(cls, table: Mapping | str | Path, *, id: str = "ID", time: str = "TIME",
                   dv: str = "DV", amt: str = "AMT", evid: str = "EVID", cmt: str = "CMT",
                   rate: str = "RATE", dur: str = "DUR", addl: str = "ADDL", ii: str = "II",
                   ss: str = "SS", mdv: str = "MDV", cens: str = "CENS",
                   lloq: float | None = None,
                   covariates: Sequence[str] | None = None,
                   time_varying: Sequence[str] = (), name: str | None = None,
                   units: str | None = None, source: str | None = None
                   ) -> "PopulationDataset":
        """Read a long-format table: one row per observation (``EVID`` 0), dose
        (``EVID`` 1), other event (``EVID`` 2, skipped), reset (``EVID`` 3: every
        compartment to zero, running inputs stopped) or reset and dose (``EVID`` 4), with
        NONMEM's dose columns.

        Args:
            table: a mapping of column name to values (a dict of lists or arrays, a pandas
                DataFrame) or the path of a CSV file (``#`` lines are comments; ``#
                source:``/``# units:``/``# title:`` comments give the metadata).
            id, time, dv, amt, evid, cmt: the names of those columns. ``EVID`` and ``CMT``
                may be absent: then rows with an ``AMT`` are doses and everything goes into
                (and is observed from) compartment 1. Missing values: empty, ``.`` or NaN.
            rate, dur: a dose's zero-order input: ``RATE`` (amount per unit time) or
                ``DUR`` (its duration), ``0`` or missing for a bolus; ``RATE = -1``/``-2``:
                the rate/duration is the model's dose parameter ``Rc``/``Dc`` (see
                `doses`). Both given on one row, or a negative ``RATE`` other than
                ``-1``/``-2``, are errors naming the row.
            addl, ii: ``ADDL`` additional doses, one every ``II`` after the row's.
            ss: ``SS = 1``: the row's dose is at steady state (given every ``II`` before;
                the state is reset to that steady state, see ``gradsolve.SteadyState``);
                ``SS = 2``: the same, added to the current state. Needs ``II``.
            mdv: ``MDV = 1`` makes an observation row missing.
            cens, lloq: censored observations (Beal's M3 likelihood, see
                `PopulationModel.observations`): ``CENS = 1``, the value is below ``DV``
                (the limit of quantification); ``CENS = -1``, above it. With ``lloq``,
                every observed ``DV`` below it is censored at ``lloq``.
            covariates: covariate columns (constant within a subject); default every column
                not named above.
            time_varying: the covariates that may change within a subject: each row's
                value holds from its time on (last value carried forward; see
                `covariate_at`); ``covariates`` gives the first.
            name, units, source: metadata (a CSV's comments fill them when not given).

        Rows of a subject must be in time order (as NONMEM requires); at one time an
        observation row before a dose row reads the state before that dose; an
        observation at a reset's time is an error. Bad input is a ``ValueError`` naming
        the subject, row and column.

        Returns:
            A `PopulationDataset`.
        """
        meta: dict[str, str] = {}
        if isinstance(table, (str, Path)):
            table, meta = read_csv(Path(table).read_text(encoding="utf-8"), str(table))
        ids = _column(table, id, "id")
        times = _column(table, time, "time")
        dvs = _column(table, dv, "dv", required=False)
        amts = _column(table, amt, "amt", required=False)
        evids = _column(table, evid, "evid", required=False)
        cmts = _column(table, cmt, "cmt", required=False)
        extra = {k: _column(table, c, k, required=False)
                 for k, c in (("rate", rate), ("dur", dur), ("addl", addl), ("ii", ii),
                              ("ss", ss), ("mdv", mdv), ("cens", cens))}
        n = len(ids)
        if dvs is None and amts is None:
            raise ValueError("PopulationDataset.from_table: the table has neither a `dv` nor "
                             "an `amt` column.")
        named = {id, time, dv, amt, evid, cmt, rate, dur, addl, ii, ss, mdv, cens}
        if covariates is None:
            covariates = [k for k in table if k not in named]
        covariates = list(covariates)
        cov_cols = {c: _column(table, c, "covariates") for c in covariates}
        rows: dict[Any, dict[str, list]] = {}
        for r in range(n):
            sid = ids[r]
            sid = sid.item() if hasattr(sid, "item") else sid
            if isinstance(sid, str) and sid.strip().lstrip("-").isdigit():
                sid = int(sid)
            d = rows.setdefault(sid, {"obs": [], "dose": [], "resets": [], "times": [],
                                     "cov": {c: [] for c in covariates}})
            t = _number(times[r], f"TIME (row {r + 1})", sid, allow_missing=False)
            amount = np.nan if amts is None else _number(amts[r], f"AMT (row {r + 1})", sid)
            kind = (1 if np.isfinite(amount) else 0) if evids is None else int(
                _number(evids[r], f"EVID (row {r + 1})", sid, allow_missing=False))
            comp = 1 if cmts is None else int(_number(cmts[r], f"CMT (row {r + 1})", sid,
                                                      allow_missing=False))
            get = lambda k: 0.0 if extra[k] is None else _number(
                extra[k][r], f"{k.upper()} (row {r + 1})", sid)
            if kind == 0:
                value = np.nan if dvs is None else _number(dvs[r], f"DV (row {r + 1})", sid)
                if get("mdv") == 1:
                    value = np.nan
                censored = 0.0 if np.isnan(get("cens")) else get("cens")
                if censored not in (0.0, 1.0, -1.0):
                    raise ValueError(f"PopulationDataset: subject {sid!r}: CENS must be 0, 1 "
                                     f"or -1 (row {r + 1}, column CENS), got {censored:g}.")
                if lloq is not None and value < lloq:
                    value, censored = float(lloq), 1.0
                if censored and np.isnan(value):
                    raise ValueError(f"PopulationDataset: subject {sid!r}: a censored "
                                     f"observation needs its limit as DV (row {r + 1}, "
                                     "column DV).")
                d["obs"].append((t, value, comp - 1, r + 1, int(censored)))
            elif kind in (3, 4):  # a reset (EVID 4: and a dose after it)
                d["resets"].append((t, r + 1))
            elif kind not in (1, 2):
                raise ValueError(f"PopulationDataset: subject {sid!r}: EVID {kind} (row {r + 1}, "
                                 "column EVID) is not one of 0 (observation), 1 (dose), 2 "
                                 "(other event), 3 (reset), 4 (reset and dose).")
            if kind in (1, 4):
                if not np.isfinite(amount):
                    raise ValueError(f"PopulationDataset: subject {sid!r}: the dose at TIME "
                                     f"{t:g} (row {r + 1}, column AMT) has no AMT.")
                for t_dose, r_dose, dur, ss_, ii_ in _dose_record(sid, r, t, amount, get):
                    d["dose"].append((t_dose, amount, comp - 1, r_dose, dur, ss_, ii_, r + 1))
            d["times"].append(t)
            for c in covariates:
                v = _number(cov_cols[c][r], f"covariate {c!r} (row {r + 1})", sid)
                if np.isnan(v):
                    raise ValueError(f"PopulationDataset: subject {sid!r}: covariate {c!r} is "
                                     f"missing (row {r + 1}, column {c}).")
                d["cov"][c].append(v)
        unknown = sorted(set(time_varying) - set(covariates))
        if unknown:
            raise ValueError(f"PopulationDataset.from_table: `time_varying` names {unknown}, "
                             f"which are not covariates ({covariates}).")
        subjects = [cls._subject(sid, d, tuple(time_varying)) for sid, d in rows.items()]
        title = meta.get("title")
        src = source if source is not None else meta.get("source")
        if source is None and title:
            src = title + (f". Source: {src}" if src else "")
        return cls(subjects, covariates, name=name, units=units or meta.get("units"),
                   source=src)

    @staticmethod
    def _subject(sid, d, time_varying: tuple = ()) -> Subject:
        obs, dose, resets = d["obs"], d["dose"], d["resets"]
        t = np.array([x[0] for x in obs])
        if np.any(np.diff(t) < 0):
            raise ValueError(f"PopulationDataset: subject {sid!r}: observation times are not "
                             "in time order; sort each subject's rows by TIME.")
        for t_obs, _, _, row, _ in obs:
            if any(t_obs == t_r for t_r, _ in resets):
                raise ValueError(f"PopulationDataset: subject {sid!r}, row {row}, column TIME: "
                                 f"an observation at a reset time ({t_obs:g}; EVID 3/4): it "
                                 "would read the state before the reset; move it off the "
                                 "reset time.")
        if not obs or all(np.isnan(x[1]) for x in obs):
            raise ValueError(f"PopulationDataset: subject {sid!r} has no observations.")
        covs, steps = {}, {}
        for c, values in d["cov"].items():
            v = np.asarray(values)
            if c in time_varying:
                rt = np.asarray(d["times"])
                order = np.argsort(rt, kind="stable")
                rt, v = rt[order], v[order]
                keep = np.r_[True, v[1:] != v[:-1]]  # the times where the value changes
                steps[c] = (rt[keep], v[keep])
            elif np.any(v != v[0]):
                raise ValueError(f"PopulationDataset: subject {sid!r}: covariate {c!r} changes "
                                 "within the subject; name it in `time_varying=` to read it "
                                 "as a time-varying covariate (last value carried forward).")
            covs[c] = float(v[0])
        dose = sorted(dose, key=lambda x: x[0])  # additional doses interleave later rows
        arr = lambda recs, j, dt=np.float64: np.array([x[j] for x in recs], dtype=dt)
        rates, ss = arr(dose, 3), arr(dose, 5, np.int64)
        return Subject(id=sid, ts=arr(obs, 0), ys=arr(obs, 1), obs_cmt=arr(obs, 2, np.int64),
                       dose_times=arr(dose, 0), dose_amounts=arr(dose, 1),
                       dose_cmt=arr(dose, 2, np.int64), covariates=covs,
                       dose_rates=rates if np.any(rates != 0) else None,
                       dose_durations=arr(dose, 4), dose_ss=ss if np.any(ss) else None,
                       dose_ii=arr(dose, 6), dose_rows=arr(dose, 7, np.int64),
                       resets=np.array(sorted(t for t, _ in resets)) if resets else None,
                       cens=(arr(obs, 4, np.int64) if any(x[4] for x in obs) else None),
                       covariate_steps=steps or None)
