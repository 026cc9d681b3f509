"""Reading a long-format NONMEM-style table into subjects (`PopulationDataset.from_table`).

NONMEM's (PREDPP's) reading of a data file, row by row: subjects as blocks of rows, the
``EVID``/``MDV`` kinds of row, doses with ``ADDL``/``II``/``SS``/``RATE``/``DUR``, resets,
censoring (``CENS``, ``LLOQ``, ``BLQ``), comment rows and covariates, each refused with a
``ValueError`` naming the subject, row (1-based, data rows) and column where NONMEM would
read it differently or its reading is unclear. The rules are in the documentation's
"Reading a NONMEM-style table".

`read_table` is the whole of `PopulationDataset.from_table` but its signature and
docstring: it returns the dataset's constructor arguments. One subject's rows are read by
`_read_subject` and made a `Subject` by `subject_from_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._csv import read_csv
from ._population import Subject

_MISSING = ("", ".", "nan", "NaN", "NA")


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
            near = [c for c in cols if _misspelling(str(c), name) is not None]
            hint = f" ({near[0]!r} looks like a misspelling of it)" if near else ""
            raise ValueError(
                f"PopulationDataset.from_table: no column {name!r} (the `{argname}` "
                f"column); the table has {cols}{hint}. Pass {argname}='<your column name>'."
            ) from None
        return None
    return list(np.asarray(col, dtype=object).reshape(-1))


def _misspelling(column: str, reserved: str) -> str | None:
    """How ``column`` looks like a typo of ``reserved``, or ``None``.

    Compared case-insensitively: the same name in other case; for names of 3 or more
    letters, two adjacent letters swapped (``RTAE``), one letter missing (``RTE``, from a
    reserved name of 4 or more letters) or one letter doubled (``RAATE``). Other one-letter
    changes are real covariates too often to refuse (``RACE`` and ``DATE`` are one letter
    from ``RATE``, ``ULOQ`` from ``LLOQ``, ``II2`` from ``II``)."""
    c, r = column.upper(), reserved.upper()
    if c == r:
        return None if column == reserved else "the same name in other case"
    if min(len(c), len(r)) < 3:
        return None
    if len(c) == len(r):
        diff = [i for i in range(len(c)) if c[i] != r[i]]
        if len(diff) == 2 and diff[1] == diff[0] + 1 and c[diff[0]] == r[diff[1]] \
                and c[diff[1]] == r[diff[0]]:
            return "two letters swapped"
        return None
    if len(c) == len(r) - 1 and any(r[:i] + r[i + 1:] == c for i in range(len(r))):
        return "one letter missing"
    if len(c) == len(r) + 1 and any(c[:i] + c[i + 1:] == r and c[i] in c[max(i - 1, 0):i]
                                    + c[i + 1:i + 2] for i in range(len(c))):
        return "one letter doubled"
    return None


def _refuse_misspelt_reserved(columns: list, names: Mapping[str, str | None],
                              present: set) -> None:
    """Refuse a would-be covariate column (of ``columns``) that looks like a misspelt
    reserved column (``names``' values) the table's ``present`` columns lack: ``RTE`` for
    ``RATE`` read as a covariate would silently make every infusion a bolus."""
    for column in columns:
        for key, reserved in names.items():
            if reserved is None or reserved in present:
                continue
            how = _misspelling(str(column), reserved)
            if how is not None:
                raise ValueError(
                    f"PopulationDataset.from_table: column {column!r} looks like the reserved "
                    f"column {reserved!r} ({how}), which the table does not have; read as a "
                    f"covariate, it would leave the table's {reserved} unread. Rename it "
                    f"{reserved!r} (or pass {key}={column!r}), or, if it is a covariate, "
                    "list the covariates: covariates=[...].")


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


def read_table(table: Mapping | str | Path, names: Mapping[str, str | None],
               lloq: float | None, covariates: Sequence[str] | None,
               time_varying: Sequence[str], name: str | None, units: str | None,
               source: str | None) -> dict:
    """`PopulationDataset.from_table`: the table read, as the dataset's constructor
    arguments (``subjects``, ``covariate_names``, ``name``, ``units``, ``source``).

    ``names`` maps each of `from_table`'s column arguments (``id``, ``time``, ``dv``, ...,
    ``comment``, ``lloq_column``, ``blq``, ``limit``) to its column name, or ``None`` for
    an optional column the table does not have; the other arguments are `from_table`'s.
    """
    meta: dict[str, str] = {}
    if isinstance(table, (str, Path)):
        table, meta = read_csv(Path(table).read_text(encoding="utf-8"), str(table))
    id, comment, lloq_column = names["id"], names["comment"], names["lloq_column"]
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
        _refuse_misspelt_reserved(covariates, names, set(table))
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
    subjects = [subject_from_rows(sid, _read_subject(sid, rows, col, names, lloq, cov_cols),
                                   tuple(time_varying))
                for sid, rows in blocks.items()]
    title = meta.get("title")
    src = source if source is not None else meta.get("source")
    if source is None and title:
        src = title + (f". Source: {src}" if src else "")
    return dict(subjects=subjects, covariate_names=covariates, name=name,
                units=units or meta.get("units"), source=src)


def subject_from_rows(sid, d, time_varying: tuple = ()) -> Subject:
    """The `Subject` of one subject's rows as `_read_subject` collected them (``d``):
    arrays in time order, covariates checked constant unless ``time_varying``."""
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
