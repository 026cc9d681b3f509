"""Checks of traced inputs (under ``jit``/``vmap``), shared by every record and solve.

A traced ``ts``, ``t0``/``t1``, tolerance, ``dt0`` or jump schedule cannot raise a
``ValueError`` at trace time; `runtime_checks` checks it on device instead, marks the
invalid trajectories (`Status.INVALID_INPUT`, NaN outputs) and hands back harmless inputs
for them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool

from ._checks import is_concrete
from ._events import Events, runtime_event_checks


class RuntimeChecks(NamedTuple):
    """Checks of traced inputs (under ``jit``/``vmap``), which no trace-time ``ValueError``
    can make: what failed, per trajectory, and inputs safe to record with."""

    failed: dict  # message -> (n,) bool
    invalid: Bool[Array, " n"]
    t0: Array
    t1: Array
    ts: Array
    rtol: Array
    atol: Array
    dt0: Array | None
    events: Events | None = None


def runtime_checks(t0, t1, ts, rtol, atol, dt0, events: Events | None = None
                   ) -> RuntimeChecks | None:
    """``None`` when every input is concrete (then `batch` and the ``check_*`` functions
    have validated them at trace time). Otherwise the traced ones are checked on device:
    invalid trajectories get `Status.INVALID_INPUT` (NaN outputs), and the inputs are
    replaced by harmless ones for them (``ts`` at ``t1``, a unit interval, ``rtol = atol =
    1e-3``, ``dt0`` the whole interval), so their record is short and well defined."""
    if is_concrete(t0, t1, ts, rtol, atol, dt0, events):
        return None
    n = ts.shape[0]
    dtype = ts.dtype
    t0a, t1a = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
    each = lambda c: jnp.broadcast_to(c, (n,))
    failed = {}
    if not is_concrete(t0, t1):
        bad = ~(jnp.isfinite(t0a) & jnp.isfinite(t1a) & (t1a > t0a))
        failed["`t0` and `t1` must be finite with `t1` greater than `t0`"] = each(bad)
        t0a, t1a = jnp.where(bad, 0.0, t0a), jnp.where(bad, 1.0, t1a)
    tols = []
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not is_concrete(v):
            bad = ~(jnp.asarray(v, dtype) > 0)
            failed[f"`{name}` must be positive"] = each(bad)
            v = jnp.where(bad, 1e-3, jnp.asarray(v, dtype))
        tols.append(v)
    if dt0 is not None and not is_concrete(dt0):
        dv = jnp.asarray(dt0, dtype)
        bad = ~(jnp.isfinite(dv) & (dv > 0))
        failed["`dt0` must be positive and finite"] = each(bad)
        dt0 = jax.lax.stop_gradient(jnp.where(bad, t1a - t0a, dv))
    if not is_concrete(ts, t0, t1):
        failed["`ts` must be finite"] = ~jnp.all(jnp.isfinite(ts), axis=1)
        failed["`ts` must be sorted (non-decreasing)"] = jnp.any(jnp.diff(ts, axis=1) < 0, axis=1)
        failed["`ts` must lie inside [t0, t1]"] = jnp.any((ts < t0) | (ts > t1), axis=1)
    if events is not None:
        ev_failed, events = runtime_event_checks(events, t0a, t1a)
        failed.update(ev_failed)
    invalid = jnp.zeros((n,), bool)
    for bad in failed.values():
        invalid = invalid | bad
    ts = jnp.where(invalid[:, None], t1a, ts)
    if events is not None:  # invalid rows: no events (a short, well defined record)
        events = Events(jnp.where(invalid[:, None], jnp.inf, events.jump_times),
                        jnp.where(invalid[:, None, None], 0.0, events.jump_sizes),
                        jnp.where(invalid[:, None], jnp.inf, events.tstops))
    return RuntimeChecks(failed, invalid, t0a, t1a, ts, tols[0], tols[1], dt0, events)
