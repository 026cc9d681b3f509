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

from . import _population_doses as _doses
from ._dataset import Dataset

__all__ = ["PopulationDataset", "Subject"]

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
        scale = _doses.checked_scale(scale, n_states, "jumps")
        J = max(1, max(s.dose_times.size for s in self.subjects))
        times = np.full((self.n_subjects, J), np.inf)
        sizes = np.zeros((self.n_subjects, J, n_states))
        _doses.check_compartments(self, n_states, "jumps")
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
        return _doses.schedule(self, n_states, scale, parameters)

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
        from ._table import read_table  # the reader builds `Subject`s: imported on use

        names = {"id": id, "time": time, "dv": dv, "amt": amt, "evid": evid, "cmt": cmt,
                 "rate": rate, "dur": dur, "addl": addl, "ii": ii, "ss": ss, "mdv": mdv,
                 "cens": cens, "comment": comment, "lloq_column": lloq_column, "blq": blq,
                 "limit": limit}
        return cls(**read_table(table, names, lloq, covariates, time_varying, name, units, source))
