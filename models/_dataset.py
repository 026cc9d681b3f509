"""Observed data sets: `Dataset`, the embedded files, `load_dataset`."""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Dataset", "load_dataset", "list_datasets"]


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _as_str_tuple(value: Any, m: int, argname: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,) * m
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ValueError(
            f"`{argname}` must be a string or a sequence of {m} strings, got {value!r}"
        )
    value = tuple(value)
    if len(value) != m:
        raise ValueError(
            f"`{argname}` has {len(value)} entries but `ys` has {m} columns "
            "(one per observed state)"
        )
    return value


class Dataset(eqx.Module):
    """Observations of the ``m`` measured states of one system at ``k`` times.

    Arguments:
        ts: observation times, shape ``(k,)``, sorted (non-decreasing).
        ys: observations, shape ``(k, m)``; column ``j`` is the ``j``-th observed state
            of the model (``ODEModel.observed[j]``). NaN marks a missing observation: the
            likelihood (``ODEModel.observations``) and the fits skip it.
        names: optional names of the ``m`` columns.
        units: optional units, one string for all columns or one per column.
        source: optional free text: where the numbers come from.

    A `Dataset` is a pytree (``ts`` and ``ys`` are its leaves; the metadata is
    static), so it can be passed to ``jax.jit``-compiled functions.

    Example:
        >>> data = models.Dataset(ts=jnp.arange(5.0), ys=jnp.ones((5, 2)),
        ...                       names=("hare", "lynx"), units="thousands")
        >>> data.ts.shape, data.ys.shape    # (5,), (5, 2)
        >>> models.load_dataset("lynx_hare").names
        ('hare', 'lynx')
    """

    ts: jax.Array
    ys: jax.Array
    names: tuple[str, ...] | None = eqx.field(static=True)
    units: tuple[str, ...] | None = eqx.field(static=True)
    source: str | None = eqx.field(static=True)

    def __init__(self, ts: Any, ys: Any, names: Any = None, units: Any = None, source: Any = None):
        if ts is None:
            raise ValueError("`ts` is required: observation times of shape (k,)")
        if ys is None:
            raise ValueError("`ys` is required: observations of shape (k, m)")
        ts_shape = np.shape(ts)
        ys_shape = np.shape(ys)
        if len(ts_shape) != 1:
            raise ValueError(f"`ts` must have shape (k,), got shape {ts_shape}")
        if len(ys_shape) != 2:
            hint = " (for one observed state use ys[:, None])" if len(ys_shape) == 1 else ""
            raise ValueError(f"`ys` must have shape (k, m), got shape {ys_shape}{hint}")
        if ys_shape[0] != ts_shape[0]:
            raise ValueError(
                f"`ys` has {ys_shape[0]} rows but `ts` has {ts_shape[0]} times; "
                "ys must have shape (len(ts), m)"
            )
        if ts_shape[0] == 0:
            raise ValueError("`ts` is empty: a data set needs at least one observation time")
        if _is_concrete(ts):
            ts_np = np.asarray(ts)
            if not np.issubdtype(ts_np.dtype, np.number):
                raise ValueError(f"`ts` must be numeric, got dtype {ts_np.dtype}")
            if not np.all(np.isfinite(ts_np)):
                raise ValueError("`ts` contains non-finite times")
            if np.any(np.diff(ts_np) < 0):
                raise ValueError("`ts` must be sorted (non-decreasing)")
        if _is_concrete(ys):
            ys_np = np.asarray(ys)
            if not np.issubdtype(ys_np.dtype, np.number):
                raise ValueError(f"`ys` must be numeric, got dtype {ys_np.dtype}")
            if np.any(np.isinf(ys_np)):
                raise ValueError(
                    "`ys` contains inf; mark a missing observation with NaN instead"
                )
            if np.all(np.isnan(ys_np)):
                raise ValueError("`ys` is all NaN (missing): there is nothing to fit")
        if source is not None and not isinstance(source, str):
            raise ValueError(f"`source` must be a string or None, got {type(source).__name__}")
        m = ys_shape[1]
        self.names = _as_str_tuple(names, m, "names")
        self.units = _as_str_tuple(units, m, "units")
        self.source = source
        self.ts = jnp.asarray(ts, dtype=jnp.result_type(float))
        self.ys = jnp.asarray(ys, dtype=jnp.result_type(float))

    @property
    def n_times(self) -> int:
        """``k``, the number of observation times."""
        return self.ts.shape[0]

    @property
    def n_observed(self) -> int:
        """``m``, the number of observed states (columns of ``ys``)."""
        return self.ys.shape[1]


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
    meta: dict[str, str] = {}
    header: list[str] | None = None
    rows: list[list[float]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line[1:].strip()
            if ":" in body:
                key, _, value = body.partition(":")
                key = key.strip().lower()
                if key in ("title", "source", "units", "time"):
                    meta[key] = (meta[key] + " " + value.strip()) if key in meta else value.strip()
            continue
        fields = [f.strip() for f in line.split(",")]
        if header is None:
            header = fields
            if header[0] != "t":
                raise ValueError(f"data set {name!r}: first column must be 't', got {header[0]!r}")
            continue
        if len(fields) != len(header):
            raise ValueError(
                f"data set {name!r}, line {lineno}: {len(fields)} fields, "
                f"expected {len(header)}"
            )
        rows.append([float(f) for f in fields])
    if header is None or not rows:
        raise ValueError(f"data set {name!r} has no data rows")
    arr = np.asarray(rows, dtype=np.float64)
    source = _source_line(meta)
    if "time" in meta:
        source = (source.rstrip(".") + ". " if source else "") + f"Time: {meta['time']}"
    return Dataset(
        ts=arr[:, 0],
        ys=arr[:, 1:],
        names=tuple(header[1:]),
        units=meta.get("units"),
        source=source,
    )


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
        raise ValueError(f"unknown dataset {name!r}; available data sets: {', '.join(available)}")
    text = (_data_dir() / f"{name}.csv").read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
    if header.split(",")[0].strip() == "ID":  # long format: one row per observation or dose
        from ._population import PopulationDataset, read_csv

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
