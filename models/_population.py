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

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

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
            or ``AMT / DUR``); ``None`` (the default) for bolus doses only.

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


def read_csv(text: str, label: str) -> tuple[dict[str, list], dict[str, str]]:
    """CSV ``text`` (from ``label``, for messages) as columns of strings, and its ``# key:
    value`` comment metadata."""
    path = label
    meta: dict[str, str] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                key = key.strip().lower()
                meta[key] = (meta[key] + " " + value.strip()) if key in meta else value.strip()
            continue
        if line.strip():
            body.append(line)
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    if not rows:
        raise ValueError(f"PopulationDataset: {path} has no header and no rows.")
    header = [h.strip() for h in rows[0]]
    cols: dict[str, list] = {h: [] for h in header}
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"PopulationDataset: {path}, data row {lineno}: {len(row)} "
                             f"fields, expected {len(header)}.")
        for h, v in zip(header, row):
            cols[h].append(v.strip())
    return cols, meta


def _dose_record(sid, r: int, t: float, amount: float, get) -> list[tuple[float, float]]:
    """The ``(time, rate)`` of the dose on row ``r`` and of its ``ADDL`` additional doses
    (rate ``0``: a bolus), with NONMEM's rules for ``RATE``, ``DUR``, ``SS``, ``II``."""
    where = f"PopulationDataset: subject {sid!r}, row {r + 1}"
    rate, dur, addl, ii, ss = (get(k) for k in ("rate", "dur", "addl", "ii", "ss"))
    rate, dur, addl, ii, ss = (0.0 if np.isnan(v) else v for v in (rate, dur, addl, ii, ss))
    if rate in (-1.0, -2.0):
        raise NotImplementedError(
            f"{where}: RATE = {rate:g} (a {'rate' if rate == -1 else 'duration'} the model "
            "estimates) is not read from a table yet; write the dose with gs.Infusion in a "
            "NumPyro program (inference.ode(..., doses=...)), where it may be a parameter.")
    if rate < 0:
        raise ValueError(f"{where}: RATE must be >= 0 (or -1/-2), got {rate:g}.")
    if dur < 0:
        raise ValueError(f"{where}: DUR must be >= 0, got {dur:g}.")
    if rate > 0 and dur > 0:
        raise ValueError(f"{where}: give RATE or DUR, not both (RATE {rate:g}, DUR {dur:g}).")
    if ss:
        if ii <= 0:
            raise ValueError(f"{where}: SS = {ss:g} needs an interval II > 0.")
        raise NotImplementedError(
            f"{where}: SS = {ss:g} (a dose at steady state) is not read from a table yet; "
            "compute the pre-dose state with gradsolve.steady_state and start there.")
    if addl < 0 or addl != int(addl):
        raise ValueError(f"{where}: ADDL must be a whole number >= 0, got {addl:g}.")
    if addl and ii <= 0:
        raise ValueError(f"{where}: ADDL = {addl:g} needs an interval II > 0.")
    if dur > 0:
        rate = amount / dur
    return [(t + k * ii, rate) for k in range(int(addl) + 1)]


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

    def jumps(self, n_states: int, scale: Sequence[float] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """Every subject's doses as bolus jumps of the state: ``(times (S, J), sizes (S, J,
        n_states))``, padded to the largest dose count ``J`` with ``inf`` times (inert) and
        zero sizes; a dose of amount ``a`` into compartment ``c`` adds ``a * scale[c]`` to
        state ``c`` (``scale`` default ones: e.g. a bioavailability or a unit change).

        A dose into a compartment at or beyond ``n_states`` is a ``ValueError`` naming the
        subject.
        """
        if self.has_infusions:
            raise ValueError("PopulationDataset.jumps: the data set has zero-order inputs "
                             "(RATE or DUR), which are not jumps; use `doses`.")
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
        return any(s.dose_rates is not None and np.any(s.dose_rates > 0)
                   for s in self.subjects)

    def _check_compartments(self, n_states: int, where: str) -> None:
        """A dose into a compartment the model does not have is a ``ValueError`` naming
        the subject."""
        for s in self.subjects:
            bad = s.dose_cmt[(s.dose_cmt < 0) | (s.dose_cmt >= n_states)]
            if bad.size:
                raise ValueError(
                    f"PopulationDataset.{where}: subject {s.id!r} has a dose into compartment "
                    f"CMT={int(bad[0]) + 1}, but the model has {n_states} states "
                    f"(CMT 1..{n_states}).")

    @staticmethod
    def _scale(scale, n_states: int, where: str) -> np.ndarray:
        scale = np.ones(n_states) if scale is None else np.asarray(scale, dtype=np.float64)
        if scale.shape != (n_states,):
            raise ValueError(f"PopulationDataset.{where}: `scale` must have shape "
                             f"({n_states},), got {scale.shape}.")
        return scale

    def doses(self, n_states: int, scale: Sequence[float] | None = None):
        """Every subject's doses as a ``gradsolve.DoseSchedule``: per compartment, one
        ``gs.Bolus`` of the bolus doses and one ``gs.Infusion`` of the zero-order inputs
        (``(S, J)`` fields padded with ``inf`` times), amounts and rates times
        ``scale[c]``. Pass it as ``doses=`` to ``gs.solve`` or ``inference.ode``.

        A dose into a compartment at or beyond ``n_states`` is a ``ValueError`` naming the
        subject.
        """
        import gradsolve as gs

        scale = self._scale(scale, n_states, "doses")
        S = self.n_subjects
        records = []
        self._check_compartments(n_states, "doses")
        rates = [np.zeros(s.dose_times.size) if s.dose_rates is None else s.dose_rates
                 for s in self.subjects]
        for c in range(n_states):
            for infused in (False, True):
                picks = [(s.dose_cmt == c) & ((r > 0) == infused)
                         for s, r in zip(self.subjects, rates)]
                J = max(int(m.sum()) for m in picks)
                if J == 0:
                    continue
                t = np.full((S, J), np.inf)
                a = np.zeros((S, J))
                rr = np.ones((S, J))  # padding: an inert positive rate
                for i, (s, r, m) in enumerate(zip(self.subjects, rates, picks)):
                    k = int(m.sum())
                    t[i, :k], a[i, :k], rr[i, :k] = s.dose_times[m], s.dose_amounts[m], r[m]
                a = a * scale[c]
                if infused:
                    records.append(gs.Infusion(time=t, amount=a, rate=rr * scale[c], cmt=c))
                else:
                    records.append(gs.Bolus(time=t, amount=a, cmt=c))
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
                   ss: str = "SS", mdv: str = "MDV",
                   covariates: Sequence[str] | None = None, name: str | None = None,
                   units: str | None = None, source: str | None = None
                   ) -> "PopulationDataset":
        """Read a long-format table: one row per observation (``EVID`` 0), dose
        (``EVID`` 1) or other event (``EVID`` 2, skipped), with NONMEM's dose columns.

        Args:
            table: a mapping of column name to values (a dict of lists or arrays, a pandas
                DataFrame) or the path of a CSV file (``#`` lines are comments; ``#
                source:``/``# units:``/``# title:`` comments give the metadata).
            id, time, dv, amt, evid, cmt: the names of those columns. ``EVID`` and ``CMT``
                may be absent: then rows with an ``AMT`` are doses and everything goes into
                (and is observed from) compartment 1. Missing values: empty, ``.`` or NaN.
            rate, dur: a dose's zero-order input: ``RATE`` (amount per unit time) or
                ``DUR`` (its duration), ``0`` or missing for a bolus. Both given on one row,
                a negative ``RATE`` other than ``-1``/``-2``, and ``-1``/``-2`` (a rate or
                duration that the model estimates: write it with ``gs.Infusion`` in a
                program) are errors naming the row.
            addl, ii: ``ADDL`` additional doses, one every ``II`` after the row's.
            ss, mdv: ``SS = 1`` (a dose at steady state: see `gradsolve.steady_state`) is
                an error naming the row; ``MDV = 1`` makes an observation row missing.
            covariates: covariate columns (constant within a subject); default every column
                not named above.
            name, units, source: metadata (a CSV's comments fill them when not given).

        Rows of a subject must be in time order (as NONMEM requires); at one time an
        observation row before a dose row reads the state before that dose.

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
                              ("ss", ss), ("mdv", mdv))}
        n = len(ids)
        if dvs is None and amts is None:
            raise ValueError("PopulationDataset.from_table: the table has neither a `dv` nor "
                             "an `amt` column.")
        named = {id, time, dv, amt, evid, cmt, rate, dur, addl, ii, ss, mdv}
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
            d = rows.setdefault(sid, {"obs": [], "dose": [], "cov": {c: [] for c in covariates}})
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
                d["obs"].append((t, value, comp - 1))
            elif kind == 1:
                if not np.isfinite(amount):
                    raise ValueError(f"PopulationDataset: subject {sid!r}: the dose at TIME "
                                     f"{t:g} (row {r + 1}) has no AMT.")
                for t_dose, r_dose in _dose_record(sid, r, t, amount, get):
                    d["dose"].append((t_dose, amount, comp - 1, r_dose))
            elif kind == 2:
                pass  # another event: nothing to solve or observe
            elif kind in (3, 4):
                raise NotImplementedError(
                    f"PopulationDataset: subject {sid!r}: EVID {kind} (row {r + 1}, a reset of "
                    "every compartment) is not supported yet: split the subject at the reset.")
            else:
                raise ValueError(f"PopulationDataset: subject {sid!r}: EVID {kind} (row {r + 1}) "
                                 "is not one of 0 (observation), 1 (dose), 2 (other event).")
            for c in covariates:
                d["cov"][c].append(_number(cov_cols[c][r], f"covariate {c!r} (row {r + 1})",
                                           sid))
        subjects = [cls._subject(sid, d) for sid, d in rows.items()]
        title = meta.get("title")
        src = source if source is not None else meta.get("source")
        if source is None and title:
            src = title + (f". Source: {src}" if src else "")
        return cls(subjects, covariates, name=name, units=units or meta.get("units"),
                   source=src)

    @staticmethod
    def _subject(sid, d) -> Subject:
        obs, dose = d["obs"], d["dose"]
        for what, recs in (("observation", obs),):
            t = np.array([x[0] for x in recs])
            if np.any(np.diff(t) < 0):
                raise ValueError(f"PopulationDataset: subject {sid!r}: {what} times are not "
                                 "in time order; sort each subject's rows by TIME.")
        if not obs or all(np.isnan(x[1]) for x in obs):
            raise ValueError(f"PopulationDataset: subject {sid!r} has no observations.")
        covs = {}
        for c, values in d["cov"].items():
            v = np.asarray(values)
            if np.any(np.isnan(v)):
                raise ValueError(f"PopulationDataset: subject {sid!r}: covariate {c!r} is "
                                 "missing (NaN) on some rows.")
            if np.any(v != v[0]):
                raise ValueError(f"PopulationDataset: subject {sid!r}: covariate {c!r} changes "
                                 "within the subject; time-varying covariates are not "
                                 "supported.")
            covs[c] = float(v[0])
        dose = sorted(dose, key=lambda x: x[0])  # additional doses interleave later rows
        arr = lambda recs, j, dt=np.float64: np.array([x[j] for x in recs], dtype=dt)
        rates = arr(dose, 3)
        return Subject(id=sid, ts=arr(obs, 0), ys=arr(obs, 1), obs_cmt=arr(obs, 2, np.int64),
                       dose_times=arr(dose, 0), dose_amounts=arr(dose, 1),
                       dose_cmt=arr(dose, 2, np.int64), covariates=covs,
                       dose_rates=rates if np.any(rates > 0) else None)
