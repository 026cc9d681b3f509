"""The embedded data files (``models/data/<name>.csv``): `list_datasets`, `load_dataset`.
On top of both data types (`Dataset`, `PopulationDataset`), so neither imports the other."""

from __future__ import annotations

import difflib
import importlib.resources

import numpy as np

from ._csv import read_csv
from ._dataset import Dataset
from ._population import PopulationDataset

__all__ = ["load_dataset", "list_datasets"]

# ------------------------------------------------------------------------------------------
# Embedded data files: models/data/<name>.csv
#
# Format: lines starting with '#' are comments; '# key: value' comments give metadata
# (title, source, units, time). Then a header line 't,<col1>,...,<colm>' and numeric rows.
# ------------------------------------------------------------------------------------------


def _data_dir():
    return importlib.resources.files("models") / "data"


def list_datasets() -> list[str]:
    """Names of the embedded data sets, for `load_dataset`.

    Returns:
        A sorted list of names.

    Example:
        >>> models.list_datasets()
        ['influenza_england_1978', 'lynx_hare', 'theophylline']
    """
    return sorted(
        entry.name[: -len(".csv")]
        for entry in _data_dir().iterdir()
        if entry.name.endswith(".csv")
    )


def _parse_csv(text: str, name: str) -> Dataset:
    """A one-trajectory data file: a ``t`` column then one column per observed state."""
    cols, meta = read_csv(text, repr(name), what="data set")
    header = list(cols)
    if header[0] != "t":
        raise ValueError(f"data set {name!r}: first column must be 't', got {header[0]!r}")
    if not cols["t"]:
        raise ValueError(f"data set {name!r} has no data rows")
    arr = np.asarray([[float(v) for v in cols[h]] for h in header], dtype=np.float64).T
    source = _source_line(meta)
    if "time" in meta:
        source = (source.rstrip(".") + ". " if source else "") + f"Time: {meta['time']}"
    return Dataset(ts=arr[:, 0], ys=arr[:, 1:], names=tuple(header[1:]),
                   units=meta.get("units"), source=source)


def load_dataset(name: str) -> Dataset:
    """Load an embedded data set (no download): a `Dataset`, or a
    `models.PopulationDataset` for a many-subject one.

    Available: see `list_datasets`.

    - ``"lynx_hare"``: Hudson's Bay Company pelts of snowshoe hare and Canada lynx,
      1900–1920, in thousands; ``ts = 0, 1, ..., 20`` (years since 1900), ``ys[:, 0]`` hare,
      ``ys[:, 1]`` lynx. Fits `models.lynx_hare`.
    - ``"influenza_england_1978"``: boys confined to bed each day of the 1978 influenza
      outbreak in an English boarding school (763 boys); ``ts = 1, ..., 14`` (days), one
      column. Fits `models.sir` with its defaults (``t0 = 0``, one initial case).
    - ``"theophylline"``: the Boeckmann–Sheiner–Beal theophylline study as shipped with R's
      ``datasets`` package (``Theoph``): 12 subjects, one oral dose each (mg/kg, into the gut,
      ``CMT`` 1) at ``t = 0``, 11 plasma concentrations (mg/L) over 25 h, body weight (kg) as
      the covariate ``WT``; a `models.PopulationDataset`.

    Args:
        name: one of `list_datasets`.

    Returns:
        A `Dataset` with ``ts (k,)`` and ``ys (k, m)``, or a `models.PopulationDataset`
        (a long-format file: its header starts with ``ID``).

    Example:
        >>> data = models.load_dataset("lynx_hare")
        >>> data.ts.shape, data.ys.shape, data.names
        ((21,), (21, 2), ('hare', 'lynx'))
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a string, got {type(name).__name__}")
    available = list_datasets()
    if name not in available:
        near = difflib.get_close_matches(name, available, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ValueError(f"unknown dataset {name!r}; {hint}available data sets: "
                         f"{', '.join(available)}")
    text = (_data_dir() / f"{name}.csv").read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
    if header.split(",")[0].strip() == "ID":  # long format: one row per observation or dose
        table, meta = read_csv(text, name)
        return PopulationDataset.from_table(table, name=meta.get("name"),
                                            units=meta.get("units"),
                                            source=_source_line(meta))
    return _parse_csv(text, name)


def _source_line(meta: dict) -> str | None:
    source = meta.get("source")
    if "title" in meta:
        source = meta["title"] + (f". Source: {source}" if source else "")
    return source
