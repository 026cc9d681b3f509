"""`Dataset`: the observations of one trajectory (the embedded files: `models._data`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Dataset"]


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


def check_column_names(observed_names: Sequence[str], data: Any, where: str) -> None:
    """Refuse ``data`` whose column ``names`` put a model's observed quantity in another
    column: ``("lynx", "hare")`` for a model observing ``("hare", "lynx")`` would fit each
    series to the other's prediction, silently.

    Compared only where they can be: data without ``names``, and names that share nothing
    with ``observed_names`` (another vocabulary, default names), pass; a name of both must
    be in the same column, or a ``ValueError`` names both orders. (Called once the shapes
    agree: one name per observed quantity.)"""
    names = getattr(data, "names", None)
    if names is None:
        return
    names, observed_names = tuple(names), tuple(observed_names)
    for j, (c, o) in enumerate(zip(names, observed_names)):
        if c != o and c in observed_names:
            raise ValueError(
                f"{where}: the data's columns are {names} but the model observes "
                f"{observed_names}, in that order: column {j} ({c!r}) would be fitted to "
                f"the prediction of {o!r}. Put the data's columns in the model's order "
                "(Dataset(ts, ys[:, order], names=...)).")


class Dataset(eqx.Module):
    """Observations of the ``m`` measured states of one system at ``k`` times.

    Arguments:
        ts: observation times, shape ``(k,)``, sorted (non-decreasing).
        ys: observations, shape ``(k, m)``; column ``j`` is the ``j``-th observed state
            of the model (``ODEModel.observed[j]``). NaN marks a missing observation: the
            likelihood (``ODEModel.observations``) and the fits skip it.
        names: optional names of the ``m`` columns. A model whose `ODEModel.observed_names`
            share a name with them refuses the data unless each shared name is in the same
            column (``("lynx", "hare")`` for a model observing ``("hare", "lynx")`` is an
            error, not a silent swap); names from another vocabulary are not compared.
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
