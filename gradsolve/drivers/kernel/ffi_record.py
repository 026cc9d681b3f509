"""The compiled adaptive record (same kernel source as the replay, handler ``Rec``).

Lanes run independent trajectories, one step attempt per lane per iteration, and are
refilled as trajectories finish; the controller is `gradsolve._controller`'s, written per
lane.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from ..._adjoint import flat_params, flatten_spec, per_trajectory
from .ffi_replay import spread


def kernel_record(prefix: str, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                  max_steps: int, fill: bool = True) -> dict:
    """Record on batched inputs ``y0 (n, d)``, ``ts (n, k)`` through the kernel ``prefix``;
    returns the `gradsolve.Mesh` fields it computes.

    ``fill=False`` leaves mesh slots past each trajectory's ``n_steps`` unwritten (see
    `gradsolve.Mesh`), so the cost follows the steps taken, not ``max_steps``.
    """
    n, d = y0.shape
    k = ts.shape[1]
    dtype = y0.dtype
    leaves = flatten_spec(params)[0]
    pflat = flat_params(leaves, n, dtype)
    t01 = per_trajectory((t0, t1), n, dtype)
    tol = per_trajectory((rtol, atol), n, dtype)
    dt0 = per_trajectory((jnp.nan if dt0 is None else dt0,), n, dtype)[:, 0]  # NaN: pick h0
    ctrl = per_trajectory((controller.pcoeff, controller.icoeff, controller.safety,
                           controller.factormin, controller.factormax), n, dtype)
    i32 = jnp.int32
    call = spread(lambda m: partial(jax.ffi.ffi_call(
        f"{prefix}_rec",
        (jax.ShapeDtypeStruct((m, max_steps + 1), dtype), jax.ShapeDtypeStruct((m,), i32),
         jax.ShapeDtypeStruct((m,), i32), jax.ShapeDtypeStruct((m,), i32),
         jax.ShapeDtypeStruct((m, k), i32), jax.ShapeDtypeStruct((m,), dtype),
         jax.ShapeDtypeStruct((m, d), dtype)),
        vmap_method="broadcast_all",
    ), fill=bool(fill)), n)
    times, n_steps, n_rej, status, save_index, dt_next, y_last = call(
        t01, y0, pflat, ts.astype(dtype), tol, dt0, ctrl)
    return dict(times=times, n_steps=n_steps, n_rejected=n_rej, status=status,
                save_index=save_index, dt_next=dt_next, y_last=y_last)
