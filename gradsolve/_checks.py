"""Input validation and the ensemble rule (SPEC §1), shared by record, replay and solve.

The rule: ``y0`` of shape ``(n, d)`` is an ensemble of ``n`` trajectories and every leaf of
``params`` then has leading axis ``n``; ``y0`` of shape ``(d,)`` is one trajectory. Inside,
everything is batched; the public functions squeeze the ensemble axis back off.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree


def is_concrete(*xs) -> bool:
    """True when none of ``xs`` is a tracer (values can be inspected on the host)."""
    leaves = jax.tree_util.tree_leaves(xs)
    return not any(isinstance(x, jax.core.Tracer) for x in leaves)


class Batched(NamedTuple):
    y0: Float[Array, "n d"]
    params: PyTree
    ts: Float[Array, "n k"]
    single: bool
    n: int
    d: int


def _float_dtype(y0) -> Any:
    dtype = jnp.result_type(y0)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    return dtype


def check_interval(t0, t1, where: str) -> None:
    if jnp.ndim(t0) != 0:
        raise ValueError(f"{where}: `t0` must be a scalar, got shape {jnp.shape(t0)}.")
    if jnp.ndim(t1) != 0:
        raise ValueError(f"{where}: `t1` must be a scalar, got shape {jnp.shape(t1)}.")
    if is_concrete(t0, t1):
        t0v, t1v = float(t0), float(t1)
        if not (np.isfinite(t0v) and np.isfinite(t1v)):
            raise ValueError(f"{where}: `t0` and `t1` must be finite, got {t0v}, {t1v}.")
        if not t1v > t0v:
            raise ValueError(f"{where}: `t1` must be greater than `t0`, got t0={t0v}, t1={t1v}.")


def check_tolerances(rtol, atol, max_steps, where: str) -> None:
    for name, v in (("rtol", rtol), ("atol", atol)):
        if jnp.ndim(v) != 0:
            raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(v)}.")
        if is_concrete(v) and not float(v) > 0:
            raise ValueError(f"{where}: `{name}` must be positive, got {float(v)}.")
    if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"{where}: `max_steps` must be a positive int, got {max_steps!r}.")


def batch(t0, t1, y0, params, ts, where: str) -> Batched:
    """Validate shapes and apply the ensemble rule; returns batched inputs."""
    y0 = jnp.asarray(y0)
    dtype = _float_dtype(y0)
    y0 = y0.astype(dtype)
    if y0.ndim not in (1, 2):
        raise ValueError(
            f"{where}: `y0` must have shape (d,) for one trajectory or (n, d) for an "
            f"ensemble, got shape {y0.shape}."
        )
    if y0.shape[-1] == 0:
        raise ValueError(f"{where}: `y0` has no states (shape {y0.shape}).")
    single = y0.ndim == 1
    if single:
        y0 = y0[None]
    n, d = y0.shape

    leaves_with_path = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in leaves_with_path:
        shape = jnp.shape(leaf)
        if not single and (len(shape) == 0 or shape[0] != n):
            name = "params" + jax.tree_util.keystr(path)
            raise ValueError(
                f"{where}: `{name}` has shape {shape} but `y0` is an ensemble of n={n} "
                f"trajectories; every leaf of `params` needs leading axis {n} (SPEC "
                "ensemble rule). Broadcast shared parameters yourself, e.g. "
                f"jnp.broadcast_to(x, ({n},) + x.shape)."
            )
    if single:
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], params)
    else:
        params = jax.tree_util.tree_map(jnp.asarray, params)

    if ts is None:
        ts = jnp.full((n, 1), t1, dtype)
    else:
        ts = jnp.asarray(ts, dtype)
        if single and ts.ndim != 1:
            raise ValueError(f"{where}: `ts` must have shape (k,) for one trajectory, got {ts.shape}.")
        if ts.ndim == 1:
            ts = jnp.broadcast_to(ts, (n,) + ts.shape)
        elif ts.ndim != 2 or ts.shape[0] != n:
            raise ValueError(
                f"{where}: `ts` must have shape (k,) or (n, k) with n={n}, got {ts.shape}."
            )
        if ts.shape[-1] == 0:
            raise ValueError(f"{where}: `ts` is empty; pass ts=None to save only at t1.")
        if is_concrete(ts, t0, t1):
            tv = np.asarray(ts)
            if not np.all(np.isfinite(tv)):
                raise ValueError(f"{where}: `ts` contains non-finite values.")
            if np.any(np.diff(tv, axis=-1) < 0):
                raise ValueError(f"{where}: `ts` must be sorted (non-decreasing).")
            if np.any(tv < float(t0)) or np.any(tv > float(t1)):
                raise ValueError(
                    f"{where}: `ts` must lie inside [t0, t1] = [{float(t0)}, {float(t1)}]; got "
                    f"values in [{tv.min()}, {tv.max()}]."
                )
    return Batched(y0, params, ts, single, n, d)


_CHECKED: dict = {}  # vector fields already checked for given input shapes


def check_vector_field(f, t0, y0b, paramsb, where: str) -> None:
    """Trace ``f`` once for one trajectory and check it maps (d,) to (d,).

    Abstract inputs only (nothing is dispatched), and a passed check is remembered per
    (f, shapes, dtypes), so repeated eager calls do not pay for it again.
    """
    if not callable(f):
        raise ValueError(f"{where}: `f` must be callable f(t, y, params), got {type(f).__name__}.")
    one = lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x))
    p0 = jax.tree_util.tree_map(one, paramsb)
    y1 = one(y0b)
    try:
        key = (f, y1, jax.tree_util.tree_structure(p0), tuple(jax.tree_util.tree_leaves(p0)))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _CHECKED:
        return
    try:
        out = jax.eval_shape(f, jax.ShapeDtypeStruct((), y0b.dtype), y1, p0)
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise ValueError(
            f"{where}: calling `f(t, y, params)` for ONE trajectory (y of shape "
            f"{tuple(y0b.shape[1:])}) failed: {type(e).__name__}: {e}"
        ) from e
    if not hasattr(out, "shape") or tuple(out.shape) != tuple(y0b.shape[1:]):
        raise ValueError(
            f"{where}: `f` must return dy/dt of the same shape as y {tuple(y0b.shape[1:])}, "
            f"got {getattr(out, 'shape', type(out))}."
        )
    if key is not None and len(_CHECKED) < 4096:
        _CHECKED[key] = True
