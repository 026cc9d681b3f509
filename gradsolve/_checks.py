"""Input validation and the ensemble rule, shared by record, replay and solve.

The rule: ``y0`` of shape ``(n, d)`` is an ensemble of ``n`` trajectories and every leaf of
``params`` then has leading axis ``n``; ``y0`` of shape ``(d,)`` is one trajectory. Inside,
everything is batched; the public functions squeeze the ensemble axis back off.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from ._caches import cache
from ._sharding import host


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


def _float_leaves(params) -> list:
    return [x for x in jax.tree_util.tree_leaves(params)
            if jnp.issubdtype(jnp.result_type(x), jnp.floating)]


def common_dtype(y0, params) -> Any:
    """The one floating dtype the state, times and floating ``params`` leaves are solved in.

    ``jnp.result_type`` of ``y0`` and the floating leaves of ``params`` (so a float32 ``y0``
    with float64 parameters runs in float64, as ``y0 * p`` would), at least float32: half
    precision (float16, bfloat16) is promoted to float32, because step-size control and the
    error test need more than its ~3 significant digits. Integer ``y0`` takes the default
    float dtype (or the parameters' floating dtype).
    """
    dtype = jnp.result_type(y0, *_float_leaves(params))
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    if jnp.finfo(dtype).bits < 32:
        dtype = jnp.dtype(jnp.float32)
    return dtype


def _as_array(name: str, x, dtype, where: str):
    """``jnp.asarray(x, dtype)``, or a ``ValueError`` naming the argument (a Diffrax
    ``SaveAt`` passed as ``ts`` would otherwise fail deep inside ``jnp``)."""
    try:
        return jnp.asarray(x, dtype)
    except (TypeError, ValueError) as e:
        hint = ""
        if type(x).__name__ == "SaveAt":
            hint = " For a diffrax.SaveAt(ts=...), pass its times: ts=saveat.subs.ts."
        raise ValueError(
            f"{where}: `{name}` must be an array of times, got {type(x).__name__}.{hint}"
        ) from e


def _check_real(name: str, v, where: str) -> None:
    """``v`` is a real number or array (not text, not complex): a ``ValueError`` naming
    ``name`` otherwise, instead of a ``TypeError`` deep inside ``jnp``."""
    if isinstance(v, (str, bytes)) or not eqx.is_array_like(v) or \
            jnp.issubdtype(jnp.result_type(v), jnp.complexfloating):
        raise ValueError(f"{where}: `{name}` must be a real number, got "
                         f"{type(v).__name__} {v!r}.")


def check_layout(group_size, chunk_size, where: str) -> None:
    """The replay layout: ``group_size`` a positive int or ``None``, ``chunk_size`` a
    positive int (checked before a solve records anything)."""
    ok = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
    if not (group_size is None or ok(group_size)):
        raise ValueError(f"{where}: `group_size` must be a positive int or None, got "
                         f"{group_size!r}.")
    if not ok(chunk_size):
        raise ValueError(f"{where}: `chunk_size` must be a positive int, got {chunk_size!r}.")


def check_throw(throw, where: str) -> None:
    """``throw`` is ``None``, ``True`` or ``False`` (a string such as ``"no"`` is truthy, so
    it would silently mean ``True``)."""
    if not (throw is None or isinstance(throw, (bool, np.bool_))):
        raise ValueError(f"{where}: `throw` must be None, True or False, got {throw!r}.")


def check_interval(t0, t1, where: str) -> None:
    _check_real("t0", t0, where)
    _check_real("t1", t1, where)
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
        _check_real(name, v, where)
        if jnp.ndim(v) != 0:
            raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(v)}.")
        # (an infinite tolerance accepts every step: no error control at all)
        if is_concrete(v) and not (float(v) > 0 and np.isfinite(float(v))):
            raise ValueError(f"{where}: `{name}` must be positive and finite, got {float(v)}.")
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"{where}: `max_steps` must be a positive int, got {max_steps!r}.")


def rtol_floor(dtype) -> float:
    """The smallest relative tolerance a ``dtype`` state can meet: 4 machine epsilons
    (`check_tolerance_precision`); 0 for a non-float dtype."""
    if not jnp.issubdtype(dtype, jnp.floating):
        return 0.0
    return 4.0 * float(jnp.finfo(dtype).eps)


def check_tolerance_precision(rtol, dtype, where: str) -> None:
    """A relative tolerance the state's precision can meet: at least 4 machine epsilons.

    An embedded error estimate is a difference of stage sums whose rounding is a few
    epsilons of the state, so below that the controller rejects every step and shrinks the
    step size until ``max_steps`` (float32: ``rtol >= 4.8e-7``; gradsolve's default 1e-6
    is 8.4 epsilons)."""
    floor = rtol_floor(dtype)
    if not is_concrete(rtol) or float(rtol) >= floor:
        return
    name = jnp.dtype(dtype).name
    raise ValueError(
        f"{where}: `rtol`={float(rtol):.3g} is below what {name} states can resolve (4 "
        f"machine epsilons, {floor:.2g}): the error estimate's rounding alone would reject "
        f"every step. Use rtol >= {floor:.2g} (1e-5 is a good {name} tolerance), or float64 "
        "states (jax.config.update('jax_enable_x64', True)).")


def check_dt0(dt0, where: str) -> None:
    """``dt0``: ``None`` or a positive, finite scalar (checked when concrete)."""
    if dt0 is None:
        return
    _check_real("dt0", dt0, where)
    if jnp.ndim(dt0) != 0:
        raise ValueError(f"{where}: `dt0` must be a scalar or None, got shape {jnp.shape(dt0)}.")
    if is_concrete(dt0):
        v = float(dt0)
        if not (np.isfinite(v) and v > 0):
            raise ValueError(
                f"{where}: `dt0` (the initial step) must be positive and finite, got {v}; "
                "steps go from t0 towards t1 > t0. Pass dt0=None to pick it automatically."
            )


def check_save_count(t0, t1, ts, max_steps: int, where: str, n_events: int = 0) -> None:
    """Save times are forced mesh points: each distinct one after ``t0`` (and ``t1``) costs
    an accepted step, so more of them than ``max_steps`` can never be recorded.
    ``n_events``: forced nodes the events add at most (two per jump, one per tstop)."""
    k = ts.shape[-1]
    if n_events and k + n_events >= max_steps:
        raise ValueError(
            f"{where}: {k} save times and events needing up to {n_events} more mesh points "
            f"(two per jump, one per tstop) but `max_steps`={max_steps}; pass e.g. "
            f"max_steps={k + n_events + 4096}."
        )
    if k < max_steps:  # at most k + 1 forced points (with t1): always room
        return
    if is_concrete(ts, t0, t1):
        tv = host(ts).reshape(-1, k)  # sorted, in [t0, t1] (checked by `batch`)
        new = np.concatenate([np.ones_like(tv[:, :1], bool), tv[:, 1:] != tv[:, :-1]], axis=1)
        need = int(np.max(np.sum(new & (tv > float(t0)), axis=1) + (tv[:, -1] != float(t1))))
        shown = f"{need} distinct save times after t0 (with t1)"
    else:
        need = k
        shown = f"len(ts) = {k} save times"
    if need > max_steps:
        raise ValueError(
            f"{where}: {shown} but `max_steps`={max_steps}. Save times are mesh points (each "
            "costs one accepted step, on top of the steps the solver itself takes), so "
            f"`max_steps` must exceed len(ts); pass e.g. max_steps={k + 4096}."
        )


def check_array_params(params, where: str) -> None:
    """Every leaf of ``params`` must be array-like (arrays or numbers)."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not eqx.is_array_like(leaf):
            name = "params" + jax.tree_util.keystr(path)
            raise ValueError(
                f"{where}: `{name}` is not an array but a {type(leaf).__name__} "
                f"({str(leaf)[:60]!r}); pass only arrays in `params`, e.g. "
                "`arrays, static = eqx.partition(params, eqx.is_array)`, and combine them in "
                "`f` (`eqx.combine(p, static)`), with `f` defined once, outside the loop."
            )


def batch(t0, t1, y0, params, ts, where: str) -> Batched:
    """Validate shapes and apply the ensemble rule; returns batched inputs.

    ``y0``, ``ts`` and the floating leaves of ``params`` are cast to one floating dtype,
    `common_dtype` (at least float32).
    """
    y0 = jnp.asarray(y0)
    if jnp.issubdtype(y0.dtype, jnp.complexfloating):
        raise ValueError(f"{where}: `y0` must be real, got dtype {y0.dtype}.")
    check_array_params(params, where)
    dtype = common_dtype(y0, params)
    y0 = y0.astype(dtype)
    if y0.ndim not in (1, 2):
        raise ValueError(
            f"{where}: `y0` must have shape (d,) for one trajectory or (n, d) for an "
            f"ensemble, got shape {y0.shape}."
        )
    if y0.shape[-1] == 0:
        raise ValueError(f"{where}: `y0` has no states (shape {y0.shape}).")
    if y0.shape[0] == 0:
        raise ValueError(
            f"{where}: `y0` is an empty ensemble (shape {y0.shape}); pass at least one "
            "trajectory."
        )
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
                f"trajectories; every leaf of `params` needs leading axis {n} (y0 of "
                "shape (n, d) means n trajectories, each with its own parameters). "
                "Broadcast shared parameters yourself, e.g. "
                f"jnp.broadcast_to(x, ({n},) + x.shape)."
            )
    def as_leaf(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(dtype)
        return x[None] if single else x

    params = jax.tree_util.tree_map(as_leaf, params)

    if ts is None:
        ts = jnp.full((n, 1), t1, dtype)
    else:
        ts = _as_array("ts", ts, dtype, where)
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
            tv = host(ts)
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


_CHECKED = cache("checked vector fields")  # (f, input shapes) already checked


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
            f"{where}: calling `f(t, y, params)` for ONE trajectory failed: "
            f"{type(e).__name__}: {e}\n{_call_shapes(y0b, p0)}"
        ) from e
    if not hasattr(out, "shape") or tuple(out.shape) != tuple(y0b.shape[1:]):
        raise ValueError(
            f"{where}: `f` must return dy/dt of the same shape as y {tuple(y0b.shape[1:])}, "
            f"got {getattr(out, 'shape', type(out))}.\n{_call_shapes(y0b, p0)}"
        )
    if jnp.result_type(out.dtype, y0b.dtype) != y0b.dtype:
        # A wider result (float64 from a constant built while x64 is on, complex) would
        # change the state's dtype mid-step: an internal loop-carry error otherwise.
        raise ValueError(
            f"{where}: `f` returned dtype {out.dtype} for a state y of dtype {y0b.dtype}; "
            f"dy/dt must have y's dtype. Build the field's constants with dtype=y.dtype (or "
            f"return `dydt.astype(y.dtype)`), or solve in {out.dtype} by passing y0 of that "
            "dtype."
        )
    if key is not None and len(_CHECKED) < 4096:
        _CHECKED[key] = True


def _call_shapes(y0b, p0) -> str:
    """What ``f`` was called with, for error messages: the usual mistakes (odeint's
    ``f(y, t)`` order, parameters without the ensemble axis, an ensemble of parameters
    with a single ``y0``) all show up as unexpected shapes here."""
    leaves = jax.tree_util.tree_leaves_with_path(p0)
    shown = ", ".join(f"params{jax.tree_util.keystr(k)}: {tuple(x.shape)}" for k, x in leaves[:8])
    more = ", ..." if len(leaves) > 8 else ""
    return (
        f"It was called as f(t, y, params) with scalar t, y of shape {tuple(y0b.shape[1:])} and "
        f"params {{{shown}{more}}}. With y0 of shape (n, d) every params leaf gives up its "
        "leading axis n; with y0 of shape (d,) params is passed whole."
    )


_SPLIT = cache("split vector fields")  # (f, static part of params) -> recombining field


def split_static(f, params):
    """``(f, params)`` with the non-array leaves of ``params`` (an ``eqx.nn.MLP``'s
    activation, a label string) moved out of ``params`` and into the vector field.

    Diffrax accepts such ``args``; the record and replay loops batch, flatten and vmap
    ``params``, which only arrays survive. ``params`` is split with
    ``eqx.partition(params, eqx.is_array_like)`` and ``f`` is wrapped to recombine the parts
    (``eqx.combine``). The wrapper is memoised per ``(f, static part)``: the compiled kernels
    and jitted drivers are cached by the vector field, so a fresh wrapper per call would
    rebuild them every call. Returns ``f`` and ``params`` unchanged when every leaf is an
    array or a number.
    """
    leaves = jax.tree_util.tree_leaves(params)
    if all(eqx.is_array_like(x) for x in leaves):
        return f, params
    arrays, static = eqx.partition(params, eqx.is_array_like)
    s_leaves, s_def = jax.tree_util.tree_flatten(static)
    key = None
    for ident in (tuple(s_leaves), tuple(id(x) for x in s_leaves)):  # equal, else identical
        try:
            key = (f, s_def, ident)
            hash(key)
            break
        except TypeError:
            key = None
    hit = _SPLIT.get(key) if key is not None else None
    if hit is None:
        def f_split(t, y, p, _f=f, _static=static):
            return _f(t, y, eqx.combine(p, _static))

        hit = (f_split, s_leaves)  # keeps the static leaves alive: ids stay unique
        if key is not None and len(_SPLIT) < 4096:
            _SPLIT[key] = hit
    return hit[0], arrays
