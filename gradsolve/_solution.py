"""The result of a replay (or solve)."""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, Float

from ._mesh import Mesh


class Solution(eqx.Module):
    """Values of a replayed (or solved) ensemble; a pytree, returned from ``jit``.

    Attributes:
        ys: ``(n, k, d)`` states at the save times (``(k, d)`` for one trajectory).
        y1: ``(n, d)`` state at ``t1`` (``(d,)`` for one trajectory).
        ts: ``(n, k)`` the save times of each trajectory, also when ``ts`` was given as
            ``(k,)``; ``(k,)`` for one trajectory.
        mesh: the `Mesh` that was replayed.
        stats: dict of arrays: ``num_accepted_steps`` and ``num_rejected_steps`` per
            trajectory (Diffrax's keys), ``num_replayed_steps`` (the mesh capacity, the
            static bound of the replay loops), ``replay_work`` (trajectory-steps the replay
            actually ran, padding of length-sorted groups included; compare with the sum
            of ``num_accepted_steps``) and ``status`` (`Status` per trajectory).
        error_ratio: ``(n,)`` (``()`` for one trajectory) largest embedded-error norm met along the replay, scaled so
            that ``<= 1`` means the controller would still accept every step of the mesh at
            these ``y0``/``params``; re-record when it exceeds 1. Not differentiated. In
            float32 the estimate carries rounding noise of about ``eps / rtol`` (~1 % at
            ``rtol=1e-5``), so a mesh replayed where it was recorded can read slightly
            above 1; `inference` records at a fraction of the tolerance for that reason.
        route: the name of the driver that ran (`gradsolve.drivers`):
            ``"gradsolve-kernel"``, ``"gradsolve-lanes"``, ``"gradsolve-batched"`` or
            ``"diffrax-diffeqsolve"``; with a Diffrax solver driven through its own
            ``step``, its name follows (``"gradsolve-batched/diffrax.Kvaerno5"``).

    Example:
        >>> sol = gs.solve(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0.0, 10.0, 21))
        >>> sol.ys.shape                    # (n, 21, d)
        >>> sol.stats["num_accepted_steps"] # (n,)
        >>> bool((sol.error_ratio <= 1).all())   # False means: re-record the mesh
    """

    ys: Float[Array, "*n k d"]
    y1: Float[Array, "*n d"]
    ts: Float[Array, "*n k"]
    mesh: Mesh | None
    stats: dict
    error_ratio: Float[Array, "*n"]
    route: str = eqx.field(static=True)
