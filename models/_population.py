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
        obs_cmt: ``(k,)`` 0-based compartment index of each observation (``CMT - 1``;
            ``-1``: ``CMT`` 0 or missing, the model's default).
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
        obs_after: ``(k,)`` bool, ``True`` where the observation row comes after a dose or
            reset row at its time (it reads the state after every event at that time, as
            NONMEM does), or ``None``: all ``False`` (the state before them).
        obs_rows: ``(k,)`` the table row (1-based) each observation comes from, or
            ``None``.

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
    obs_after: np.ndarray | None = None
    obs_rows: np.ndarray | None = None


def _column(table, name: str, argname: str, required: bool = True):
    """Column ``name`` of ``table`` as a list, or ``None`` if absent and optional."""
    try:
        col = table[name]
    except (KeyError, IndexError, TypeError):
        if required:
            cols = list(table)
            if argname == "covariates":  # a list of columns, not one
                raise ValueError(
                    f"PopulationDataset.from_table: no column {name!r} (named in "
                    f"`covariates`); the table has {cols}. Pass covariates=['<column>', ...] "
                    "naming the table's covariate columns."
                ) from None
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


def _missing(value) -> bool:
    """Whether a cell is empty: ``None``, NaN, or text ``""``, ``.``, ``NA``, ``nan``."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() in _MISSING
    try:
        return bool(np.isnan(value))
    except (TypeError, ValueError):
        return False


def _where(sid, row: int, *columns: str) -> str:
    return (f"PopulationDataset.from_table: subject {sid!r}, row {row}, "
            f"column{'s' if len(columns) > 1 else ''} {' and '.join(columns)}")


def _read_id(value, row: int, column: str):
    """``(id, number, spelling)`` of an ID cell: a number is read as that number (an int
    when integral), as NONMEM reads IDs; other text stays text (``number`` None). Text
    keeps its spelling (``"01"``), a number is spelled as Python writes its value."""
    value = value.item() if isinstance(value, np.generic) else value
    if _missing(value):
        raise ValueError(f"PopulationDataset.from_table: row {row}, column {column}: the ID is "
                         "missing; every row must name its subject.")
    if isinstance(value, str):
        spelling = value.strip()
        try:
            number = int(spelling)
        except ValueError:
            try:
                number = float(spelling)
            except ValueError:
                return spelling, None, spelling
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value  # a number has no spelling of its own: 1 and 1.0 are one subject
        spelling = (str(int(value)) if np.isfinite(value) and value == int(value)
                    else repr(float(value)))
    else:
        raise ValueError(f"PopulationDataset.from_table: row {row}, column {column}: an ID "
                         f"must be a number or text, got {value!r}.")
    if not np.isfinite(number):
        raise ValueError(f"PopulationDataset.from_table: row {row}, column {column}: the ID "
                         f"{spelling!r} is not a finite number.")
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    return number, number, spelling


def _comment(value, sid, row: int, column: str) -> bool:
    """Whether a row is a comment (NONMEM's ``C`` column: a value starting with ``C``,
    ``#`` or ``@`` drops the row); empty, ``.`` and ``0`` keep it, anything else is an
    error."""
    if _missing(value):
        return False
    value = value.item() if isinstance(value, np.generic) else value
    text = value.strip() if isinstance(value, str) else None
    if text is not None and text[:1] in ("C", "#", "@"):
        return True
    try:
        if float(value) == 0:
            return False
    except (TypeError, ValueError):
        pass
    raise ValueError(f"{_where(sid, row, column)}: a comment flag is C, # or @ (the row is "
                     f"skipped) or empty, '.' or 0 (the row is read), got {value!r}.")


_KIND = {0: "observation", 1: "dose", 2: "other-event", 3: "reset", 4: "reset-and-dose"}


def _dose_record(where, t: float, amount: float, v: dict, names: dict) -> list[tuple]:
    """The ``(time, rate, duration, ss, ii)`` of a dose and of its ``ADDL`` additional
    doses (rate ``0``: a bolus; ``-1``/``-2``: modelled), with NONMEM's rules for
    ``RATE``, ``DUR``, ``SS``, ``II`` (only the row's own dose is at steady state).
    ``where(key)`` starts an error message naming the subject, row and column."""
    rate, dur, addl, ii, ss = (v[k] for k in ("rate", "dur", "addl", "ii", "ss"))
    if rate < 0 and rate not in (-1.0, -2.0):
        raise ValueError(f"{where('rate')}: RATE must be >= 0 (or -1/-2), got {rate:g}.")
    if dur < 0:
        raise ValueError(f"{where('dur')}: DUR must be >= 0, got {dur:g}.")
    if rate != 0 and dur > 0:
        raise ValueError(f"{where('rate', 'dur')}: give RATE or DUR, not both "
                         f"(RATE {rate:g}, DUR {dur:g}).")
    if ss not in (0.0, 1.0, 2.0):
        raise ValueError(f"{where('ss')}: SS must be 0, 1 or 2, got {ss:g}.")
    if ii < 0:
        raise ValueError(f"{where('ii')}: II must be >= 0, got {ii:g}.")
    if ss and ii <= 0:
        raise ValueError(f"{where('ii')}: SS = {ss:g} needs an interval II > 0.")
    if ss and dur > ii:
        raise ValueError(f"{where('dur')}: a steady-state infusion must end within its "
                         f"interval (DUR {dur:g} > II {ii:g}).")
    if ss and rate > 0 and amount / rate > ii:
        raise ValueError(f"{where('rate')}: a steady-state infusion must end within its "
                         f"interval (AMT / RATE = {amount / rate:g} > II {ii:g}).")
    if addl < 0 or addl != int(addl):
        raise ValueError(f"{where('addl')}: ADDL must be a whole number >= 0, got {addl:g} "
                         "(a negative ADDL, NONMEM's empirical steady state, is not "
                         "supported).")
    if addl and ii <= 0:
        raise ValueError(f"{where('ii')}: ADDL = {addl:g} needs an interval II > 0.")
    if dur > 0:
        rate = amount / dur
    return [(t + k * ii, rate, dur, int(ss) if k == 0 else 0, ii)
            for k in range(int(addl) + 1)]


def _censoring(where, value: float, v: dict, lloq: float | None) -> tuple[float, int]:
    """An observation's ``(value, cens)`` from ``CENS``, ``LLOQ``, ``BLQ``, ``LIMIT`` and
    the ``lloq`` number (Beal's M3: ``cens = 1`` below ``value``, ``-1`` above it)."""
    cens, limit, blq, bound = v["cens"], v["lloq_column"], v["blq"], v["limit"]
    cens = 0.0 if np.isnan(cens) else cens
    if cens not in (0.0, 1.0, -1.0):
        raise ValueError(f"{where('cens')}: CENS must be 0, 1 or -1, got {cens:g}.")
    if not np.isnan(blq) and blq not in (0.0, 1.0):
        raise ValueError(f"{where('blq')}: BLQ must be 0 or 1, got {blq:g}.")
    if not np.isnan(limit) and cens == 1 and value != limit:
        raise ValueError(f"{where('lloq_column')}: CENS = 1 says DV ({value:g}) is the limit, "
                         f"but LLOQ is {limit:g}; make them agree.")
    if blq == 1:
        if cens == -1:
            raise ValueError(f"{where('blq')}: BLQ = 1 (below the limit) but CENS = -1 "
                             "(above it).")
        if cens == 0:
            known = limit if not np.isnan(limit) else lloq
            if known is None:
                raise ValueError(
                    f"{where('blq')}: BLQ = 1 but the limit of quantification is unknown "
                    "(no LLOQ column value, no CENS, no `lloq=`); DV often holds 0 or "
                    "LLOQ/2, so it is not taken as the limit.")
            value, cens = float(known), 1.0
    elif cens == 0 and not np.isnan(limit) and value < limit:
        if blq == 0:
            raise ValueError(f"{where('blq')}: BLQ = 0 but DV {value:g} is below LLOQ "
                             f"{limit:g}; make them agree.")
        value, cens = float(limit), 1.0
    elif cens == 0 and lloq is not None and value < lloq:
        value, cens = float(lloq), 1.0
    if cens and np.isnan(value):
        raise ValueError(f"{where('dv')}: a censored observation needs its limit as DV.")
    if cens and not np.isnan(bound) and bound != -cens * np.inf:
        raise ValueError(f"{where('limit')}: LIMIT {bound:g} on a censored observation asks "
                         "for interval censoring (between LIMIT and DV), which is not "
                         "supported.")
    return value, int(cens)


def _read_subject(sid, rows: list[int], col: dict, names: dict, lloq: float | None,
                  cov_cols: dict) -> dict:
    """Subject ``sid``'s rows (0-based table indices, in table order) read as PREDPP reads
    an individual record: observations with their flags, doses (ADDL expanded, those an
    ``SS = 1`` or reset row cancels dropped), resets, covariate values."""
    def num(key: str, r: int, default: float = np.nan) -> float:
        if col[key] is None or _missing(col[key][r]):
            return default
        x = col[key][r]
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise ValueError(f"{_where(sid, r + 1, names[key])}: {names[key]} must be a "
                             f"number, got {x!r}.") from None
        if not np.isfinite(x) and key != "limit":
            raise ValueError(f"{_where(sid, r + 1, names[key])}: {names[key]} must be a "
                             f"finite number, got {x!r}.")
        return x

    obs, doses, resets, times = [], [], [], []
    events: dict[float, list[int]] = {}      # time -> rows of its dose and reset events
    cov = {c: [] for c in cov_cols}
    prev = None
    for r in rows:
        row = r + 1
        where = lambda *keys: _where(sid, row, *(names[k] for k in keys))
        if col["time"] is not None and _missing(col["time"][r]):
            raise ValueError(f"{where('time')}: TIME is missing.")
        t = num("time", r)
        if prev is not None and t < prev[0]:
            raise ValueError(
                f"PopulationDataset.from_table: subject {sid!r}: rows are not in time order "
                f"(row {row}, column {names['time']}: {t:g} after {prev[0]:g} on row "
                f"{prev[1]}); sort each subject's rows by TIME, as NONMEM requires (a reset "
                "that turns the clock back is not supported).")
        prev = (t, row)
        v = {k: num(k, r, 0.0 if k in ("rate", "dur", "addl", "ii", "ss") else np.nan)
             for k in ("amt", "rate", "dur", "addl", "ii", "ss", "mdv", "cmt", "cens",
                       "lloq_column", "blq", "limit")}
        amount, mdv, cmt = v["amt"], v["mdv"], v["cmt"]
        if not np.isnan(mdv) and mdv not in (0.0, 1.0):
            raise ValueError(f"{where('mdv')}: MDV must be 0 or 1, got {mdv:g} (NONMEM's "
                             "MDV 100/101 are not supported).")
        if col["evid"] is not None:
            if _missing(col["evid"][r]):
                raise ValueError(f"{where('evid')}: EVID is missing.")
            kind = num("evid", r)
            if kind not in (0.0, 1.0, 2.0, 3.0, 4.0):
                raise ValueError(f"PopulationDataset: subject {sid!r}: EVID {kind:g} (row "
                                 f"{row}, column {names['evid']}) is not one of 0 "
                                 "(observation), 1 (dose), 2 (other event), 3 (reset), 4 "
                                 "(reset and dose).")
            kind = int(kind)
            if kind and mdv == 0:
                raise ValueError(f"{where('mdv')}: an EVID {kind} ({_KIND[kind]}) row has "
                                 "MDV = 0; NONMEM requires MDV = 1 on every row but an "
                                 "observation.")
        else:  # NM-TRAN's rule: a non-zero AMT or RATE makes a dose; else MDV 1: skipped
            kind = int((not np.isnan(amount) and amount != 0) or v["rate"] != 0)
            kind = 2 if not kind and mdv == 1 else kind
            if kind == 1 and mdv == 0:
                raise ValueError(f"{where('mdv')}: without an EVID column a row with a "
                                 "non-zero AMT or RATE is a dose, which NONMEM requires to "
                                 "have MDV = 1; MDV = 0 leaves it unclear whether a dose or "
                                 "an observation is meant: add EVID or fix MDV.")
        if kind in (0, 2, 3):
            for key in ("amt", "rate", "dur", "ss", "ii", "addl"):
                if not np.isnan(v[key]) and v[key] != 0:
                    raise ValueError(
                        f"{where(key)}: an EVID {kind} ({_KIND[kind]}) row has "
                        f"{names[key]} = {v[key]:g}; NONMEM requires the dose items (AMT, "
                        "RATE, SS, II, ADDL) to be 0 or empty on observation, other-event "
                        "and reset rows.")
        if col["cmt"] is not None and not np.isnan(cmt):
            if cmt != int(cmt):
                raise ValueError(f"{where('cmt')}: CMT must be a whole number, got {cmt:g}.")
            if cmt < 0:
                raise ValueError(f"{where('cmt')}: a negative CMT ({cmt:g}) turns a "
                                 "compartment off in NONMEM, which is not supported.")
        times.append(t)
        for c, values in cov_cols.items():
            x = _number(values[r], f"covariate {c!r} (row {row}, column {c})", sid)
            if np.isnan(x):
                raise ValueError(f"PopulationDataset: subject {sid!r}: covariate {c!r} is "
                                 f"missing (row {row}, column {c}).")
            cov[c].append(x)
        if kind == 0:
            cmt0 = 0 if col["cmt"] is None else (-1 if np.isnan(cmt) or cmt == 0
                                                 else int(cmt) - 1)
            value = np.nan if mdv == 1 else num("dv", r)
            censored = 0
            if mdv != 1:
                value, censored = _censoring(where, value, v, lloq)
            if mdv == 0 and np.isnan(value):
                raise ValueError(f"{where('dv')}: MDV = 0 but DV is empty, which NONMEM "
                                 "reads as an observed 0; give the value, or MDV = 1 for a "
                                 "missing one.")
            obs.append((t, value, cmt0, row, censored))
        if kind in (3, 4):  # zero state, stop inputs, cancel pending doses (PREDPP V.K)
            doses = [d for d in doses if d[0] < t]
            resets.append((t, row))
            events.setdefault(t, []).append(row)
        if kind in (1, 4):
            if col["cmt"] is None:
                cmt0 = 0
            elif np.isnan(cmt) or cmt == 0:
                raise ValueError(f"{where('cmt')}: the dose has CMT "
                                 f"{'missing' if np.isnan(cmt) else 0}, NONMEM's default "
                                 "dose compartment, which the model does not name; give "
                                 "the compartment.")
            else:
                cmt0 = int(cmt) - 1
            if np.isnan(amount):
                if not (v["ss"] or v["rate"]):
                    raise ValueError(f"PopulationDataset: subject {sid!r}: the dose at TIME "
                                     f"{t:g} (row {row}, column {names['amt']}) has no AMT.")
                amount = 0.0
            if amount < 0:
                raise ValueError(f"{where('amt')}: AMT must be >= 0, got {amount:g}.")
            if amount == 0 and v["ss"]:
                raise ValueError(f"{where('amt')}: SS = {v['ss']:g} with AMT 0 (a "
                                 "steady-state constant infusion, or NONMEM's endogenous "
                                 "steady state) is not supported.")
            if amount == 0 and v["rate"]:
                raise ValueError(f"{where('rate')}: RATE = {v['rate']:g} with AMT 0 is not a "
                                 "dose this reader supports (an infusion needs AMT > 0).")
            given = _dose_record(where, t, amount, v, names)
            if amount > 0:  # AMT 0: a dose of nothing, no event
                if v["ss"] == 1:  # SS = 1 resets the state: cancels pending doses
                    doses = [d for d in doses if d[0] < t]
                doses += [(t_k, amount, cmt0, rate_k, dur_k, ss_k, ii_k, row, k > 0)
                          for k, (t_k, rate_k, dur_k, ss_k, ii_k) in enumerate(given)]
                events.setdefault(t, []).append(row)
    after = []
    for t, value, _, row, censored in obs:
        here = events.get(t, [])
        before = [e for e in here if e < row]
        later = [e for e in here if e > row]
        after.append(bool(before))
        if np.isnan(value) and not censored:
            continue  # a missing observation is never read
        if before and later:
            raise ValueError(
                f"{_where(sid, row, names['time'])}: an observation between dose or reset "
                f"rows at TIME {t:g} (rows {before[-1]} and {later[0]}) reads the state "
                "between them, which gradsolve cannot read (only before or after every "
                "event at a time); move it before or after them.")
        implied = [d[7] for d in doses if d[8] and d[0] == t]
        if before and implied:
            raise ValueError(
                f"{_where(sid, row, names['time'])}: an additional (ADDL) dose of row "
                f"{implied[0]} falls at this observation's TIME {t:g}; NONMEM gives it after "
                f"the observation, which comes after the dose or reset on row {before[-1]}: "
                "the state between them cannot be read; move the observation.")
    return {"obs": obs, "dose": doses, "resets": resets, "times": times, "cov": cov,
            "after": after}


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

    def observations_after(self) -> np.ndarray:
        """``(S, K)`` whether each observation reads the state after the doses and resets
        at its time (`Subject.obs_after`), padded as `observations` with ``False``: pass
        it as ``gs.solve(..., ts_after=...)``."""
        K = max(s.ts.size for s in self.subjects)
        out = np.zeros((self.n_subjects, K), bool)
        for i, s in enumerate(self.subjects):
            if s.obs_after is not None:
                out[i, :s.obs_after.size] = s.obs_after
        return out

    def check_observed_compartments(self, n_states: int) -> None:
        """Refuse observations a model with ``n_states`` states and one prediction per
        time cannot match: an observation row's ``CMT`` outside ``1..n_states``, or
        observation rows naming more than one compartment (``CMT`` 0 or missing, the
        model's default, is never refused). The ``ValueError`` names the subject, row and
        column."""
        seen = None  # (compartment, subject, row) of the first observation naming one
        for s in self.subjects:
            rows = np.zeros(s.ts.size, np.int64) if s.obs_rows is None else s.obs_rows
            for c, y, row in zip(s.obs_cmt, s.ys, rows):
                where = f"PopulationDataset: subject {s.id!r}, row {row}, column CMT"
                if c >= n_states or c < -1:
                    raise ValueError(f"{where}: an observation of compartment CMT={c + 1}, "
                                     f"but the model has {n_states} states (CMT 1..{n_states}"
                                     ", or 0 for its default).")
                if c < 0 or np.isnan(y):
                    continue
                if seen is None:
                    seen = (c, s.id, row)
                elif c != seen[0]:
                    raise ValueError(
                        f"{where}: an observation of compartment CMT={c + 1}, but subject "
                        f"{seen[1]!r}'s row {seen[2]} observes CMT={seen[0] + 1}; the model "
                        "predicts one value per time, whatever CMT says: give observations "
                        "of one compartment.")

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
                   units: str | None = None, source: str | None = None,
                   comment: str | None = "C", lloq_column: str | None = "LLOQ",
                   blq: str | None = "BLQ", limit: str | None = "LIMIT"
                   ) -> "PopulationDataset":
        """Read a long-format NONMEM-style table as NONMEM (PREDPP) reads it, or refuse it
        (where it would read differently, or NONMEM's reading is unclear) with a
        ``ValueError`` naming the subject, the row (1-based, data rows), the column and the
        rule; the rules are in the documentation's "Reading a NONMEM-style table".

        Rows: ``EVID`` 0 observation, 1 dose, 2 other event (skipped; its covariates are
        read), 3 reset (every compartment to zero, running infusions stopped, pending
        ``ADDL`` doses cancelled), 4 reset and dose. Without ``EVID``, a row with a non-zero
        ``AMT`` or ``RATE`` is a dose (NM-TRAN's rule), any other an observation, or with
        ``MDV = 1`` an other event. ``MDV = 1`` makes an observation missing. A subject's
        rows form one block in time order; at one time, an observation row after a dose or
        reset row reads the state after it (`Subject.obs_after`), one before it the state
        before.

        Args:
            table: a mapping of column name to values (a dict of lists or arrays, a pandas
                DataFrame) or the path of a CSV file (``#`` lines are comments; ``#
                source:``/``# units:``/``# title:`` comments give the metadata).
            id, time, dv, amt, evid, cmt: the names of those columns. An ID that is a
                number is that number (``"007"``, ``7.0``: 7), other text stays text; one
                number written two ways as text (``"01"`` and ``"1"``) is refused. Without
                a ``CMT`` column everything goes into (and is observed from) compartment 1;
                an observation's ``CMT`` 0 or missing is the model's default. Missing
                values: empty, ``.`` or NaN.
            rate, dur: a dose's zero-order input: ``RATE`` (amount per unit time) or
                ``DUR`` (its duration), ``0`` or missing for a bolus; ``RATE = -1``/``-2``:
                the model's rate/duration ``Rc``/``Dc`` (see `doses`).
            addl, ii: ``ADDL`` additional doses, one every ``II`` after the row's.
            ss: ``SS = 1``: the row's dose is at steady state (the state is reset to it;
                pending ``ADDL`` doses and running infusions are cancelled); ``SS = 2``: the
                same, added to the current state. Needs ``II``.
            mdv: ``MDV = 1`` makes an observation row missing (``MDV = 0`` with an empty
                ``DV`` is refused: NONMEM reads that as an observed 0).
            cens, lloq: censored observations (Beal's M3, see
                `PopulationModel.observations`): ``CENS = 1``, the value is below ``DV``
                (the limit); ``CENS = -1``, above it. With a number ``lloq``, every observed
                ``DV`` below it is censored at it.
            covariates: covariate columns (constant within a subject); default every column
                not named here (nor ``C``, ``LLOQ``, ``BLQ``, ``LIMIT``).
            time_varying: the covariates that may change within a subject: each row's
                value holds from its time on (see `covariate_at`).
            name, units, source: metadata (a CSV's comments fill them when not given).
            comment: NONMEM's comment column: rows whose value starts with ``C``, ``#`` or
                ``@`` are skipped; ``None``: no such column.
            lloq_column, blq: a per-row limit of quantification (``DV`` below it is
                censored at it) and a below-limit flag (``BLQ = 1``: censored at the row's
                ``LLOQ``, or ``lloq``); ``None``: no such column.
            limit: the ``LIMIT`` column (interval censoring), refused on censored rows.

        Returns:
            A `PopulationDataset`.
        """
        meta: dict[str, str] = {}
        if isinstance(table, (str, Path)):
            table, meta = read_csv(Path(table).read_text(encoding="utf-8"), str(table))
        names = {"id": id, "time": time, "dv": dv, "amt": amt, "evid": evid, "cmt": cmt,
                 "rate": rate, "dur": dur, "addl": addl, "ii": ii, "ss": ss, "mdv": mdv,
                 "cens": cens, "comment": comment, "lloq_column": lloq_column, "blq": blq,
                 "limit": limit}
        special = {k: names[k] for k in ("comment", "lloq_column", "blq", "limit")
                   if names[k] is not None}
        col = {k: (_column(table, c, k, required=k in ("id", "time")) if c is not None
                   else None) for k, c in names.items()}
        if col["dv"] is None and col["amt"] is None:
            raise ValueError("PopulationDataset.from_table: the table has neither a `dv` nor "
                             "an `amt` column.")
        if lloq is not None and col["lloq_column"] is not None:
            raise ValueError(f"PopulationDataset.from_table: both `lloq={lloq}` and an "
                             f"{lloq_column!r} column give the limit of quantification; give "
                             "one (lloq_column=None ignores the column).")
        named = {c for c in names.values() if c is not None} | {"C", "LLOQ", "BLQ", "LIMIT"}
        if covariates is None:
            covariates = [k for k in table if k not in named]
        covariates = list(covariates)
        clash = sorted(set(covariates) & set(special.values()))
        if clash:
            raise ValueError(f"PopulationDataset.from_table: {clash} are read as the "
                             "comment/censoring columns, never as covariates.")
        cov_cols = {c: _column(table, c, "covariates") for c in covariates}
        n = len(col["id"])
        for c, values in [(names[k], x) for k, x in col.items() if x is not None] + list(
                cov_cols.items()):
            if len(values) != n:
                raise ValueError(f"PopulationDataset.from_table: column {c!r} has "
                                 f"{len(values)} values, column {id!r} {n}.")
        kept = [r for r in range(n) if col["comment"] is None
                or not _comment(col["comment"][r], col["id"][r], r + 1, comment)]
        blocks: dict[Any, list[int]] = {}
        spelled: dict[Any, tuple[str, int]] = {}
        last = None  # the subject of the previous kept row
        for r in kept:
            sid, number, spelling = _read_id(col["id"][r], r + 1, id)
            if number is not None:
                first = spelled.setdefault(number, (spelling, r + 1))
                if first[0] != spelling:
                    raise ValueError(
                        f"PopulationDataset.from_table: subject {sid!r}, rows {first[1]} "
                        f"and {r + 1}, column {id}: one ID written two ways ({first[0]!r} "
                        f"and {spelling!r}); NONMEM reads both as the number {sid!r}, text "
                        "would keep them apart: write each subject's ID one way.")
            if sid in blocks and sid == last:
                blocks[sid].append(r)
                continue
            if sid in blocks:
                after = next(q for q in kept if q > blocks[sid][-1])
                raise ValueError(
                    f"PopulationDataset.from_table: subject {sid!r}, row {r + 1}, column "
                    f"{id}: the subject's rows are not one block (rows {blocks[sid][0] + 1}"
                    f"-{blocks[sid][-1] + 1}, then other subjects from row {after + 1}); "
                    "NONMEM would start a new individual here: keep each subject's rows "
                    "together.")
            blocks[sid] = [r]
            last = sid
        unknown = sorted(set(time_varying) - set(covariates))
        if unknown:
            raise ValueError(f"PopulationDataset.from_table: `time_varying` names {unknown}, "
                             f"which are not covariates ({covariates}).")
        subjects = [cls._subject(sid, _read_subject(sid, rows, col, names, lloq, cov_cols),
                                 tuple(time_varying))
                    for sid, rows in blocks.items()]
        title = meta.get("title")
        src = source if source is not None else meta.get("source")
        if source is None and title:
            src = title + (f". Source: {src}" if src else "")
        return cls(subjects, covariates, name=name, units=units or meta.get("units"),
                   source=src)

    @staticmethod
    def _subject(sid, d, time_varying: tuple = ()) -> Subject:
        obs, dose, resets = d["obs"], d["dose"], d["resets"]
        if not obs or all(np.isnan(x[1]) for x in obs):
            raise ValueError(f"PopulationDataset: subject {sid!r} has no observations.")
        covs, steps = {}, {}
        for c, values in d["cov"].items():
            v = np.asarray(values)
            if c in time_varying:
                rt = np.asarray(d["times"])
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
        after = np.array(d["after"], dtype=bool)
        return Subject(id=sid, ts=arr(obs, 0), ys=arr(obs, 1), obs_cmt=arr(obs, 2, np.int64),
                       dose_times=arr(dose, 0), dose_amounts=arr(dose, 1),
                       dose_cmt=arr(dose, 2, np.int64), covariates=covs,
                       dose_rates=rates if np.any(rates != 0) else None,
                       dose_durations=arr(dose, 4), dose_ss=ss if np.any(ss) else None,
                       dose_ii=arr(dose, 6), dose_rows=arr(dose, 7, np.int64),
                       resets=np.array(sorted(t for t, _ in resets)) if resets else None,
                       cens=(arr(obs, 4, np.int64) if any(x[4] for x in obs) else None),
                       covariate_steps=steps or None,
                       obs_after=after if after.any() else None,
                       obs_rows=arr(obs, 3, np.int64))
