"""The recorded mesh: what an adaptive solve accepted, kept so it can be replayed."""

from __future__ import annotations

import enum
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

from ._controller import PIDController
from ._solver.base import AbstractSolver


class Status(enum.IntEnum):
    """Per-trajectory outcome of `gradsolve.record` (``Mesh.status``).

    An ``IntEnum``: ``Mesh.status`` holds these codes as ``int32`` arrays of shape ``(n,)``.

    Attributes:
        OK: 0, the solve reached ``t1``.
        MAX_STEPS: 1, the mesh capacity ``max_steps`` (or the attempt cap) was reached
            before ``t1``; raise ``max_steps`` or, for a stiff problem, use
            `Rodas5P`.
        NONFINITE: 2, a NaN or inf appeared in ``f`` or the state.
        STEP_UNDERFLOW: 3, the step size became too small to advance the time.
        INVALID_INPUT: 4, an input that could only be checked at run time (a traced value
            under ``jax.jit``/``vmap``) was invalid: ``ts`` unsorted, outside ``[t0, t1]``
            or non-finite; ``t1 <= t0``; ``rtol``/``atol`` not positive; ``dt0`` not
            positive and finite. Outside ``jit`` the same inputs raise ``ValueError``.

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, throw=False)
        >>> failed = mesh.status != gs.Status.OK          # (n,) bool
    """

    OK = 0
    MAX_STEPS = 1
    NONFINITE = 2
    STEP_UNDERFLOW = 3
    INVALID_INPUT = 4


class Mesh(eqx.Module):
    """Accepted step times of an adaptive solve, per trajectory (a pytree).

    Shapes use ``n`` for the ensemble axis (absent for a single trajectory), ``S`` for the
    step capacity and ``k`` for the number of save times.

    Attributes:
        times: ``(n, S + 1)`` accepted step end points; ``times[..., 0] == t0``. Slots past
            ``n_steps`` are padding: `gradsolve.record` called outside ``jit`` fills them
            with the last time (zero-length steps); inside ``jit`` their values are
            unspecified, because the compiled record leaves them unwritten so that its cost
            follows the steps taken, not ``max_steps``. Readers mask with ``n_steps``;
            `Mesh.padded` fills them.
        n_steps: ``(n,)`` accepted steps.
        n_rejected: ``(n,)`` rejected step attempts.
        status: ``(n,)`` `Status` codes (0 = ok).
        save_index: ``(n, k)`` index into ``times`` of each save time. Save times are
            forced mesh points, so values there are exact nodes of the replay.
        ts: ``(n, k)`` save times the mesh was recorded with.
        t0, t1: integration interval.
        dt_next: ``(n,)`` the step size the controller would try next (diagnostics).
        y_last: ``(n, d)`` state at the last accepted time (diagnostics).
        y0, params: the initial state and parameters the mesh was recorded at.
        solver, rtol, atol, controller: how it was recorded.

    Example:
        >>> mesh = gs.record(f, 0.0, 10.0, y0, params, ts=jnp.linspace(0.0, 10.0, 21))
        >>> mesh.times.shape                # (n, S + 1): trimmed outside jit
        >>> mesh.n_steps, mesh.status       # (n,) each
        >>> sol = gs.replay(f, mesh, y0, 1.1 * params)   # reuse the mesh
    """

    times: Float[Array, "*n S1"]
    n_steps: Int[Array, "*n"]
    n_rejected: Int[Array, "*n"]
    status: Int[Array, "*n"]
    save_index: Int[Array, "*n k"]
    ts: Float[Array, "*n k"]
    t0: Float[Array, ""]
    t1: Float[Array, ""]
    dt_next: Float[Array, "*n"]
    y_last: Float[Array, "*n d"]
    y0: Float[Array, "*n d"]
    params: PyTree
    solver: AbstractSolver
    rtol: Any
    atol: Any
    controller: PIDController

    @property
    def is_ensemble(self) -> bool:
        """Whether this mesh belongs to an ensemble ``(n, d)`` rather than one trajectory."""
        return self.n_steps.ndim == 1

    @property
    def capacity(self) -> int:
        """Static number of step slots (``S``) the replay loops over."""
        return self.times.shape[-1] - 1

    @property
    def ok(self) -> Array:
        """Boolean mask of trajectories whose record succeeded."""
        return self.status == Status.OK

    def trim(self, exact: bool = False) -> "Mesh":
        """Drop unused trailing step slots (needs concrete values; not under ``jit``).

        By default the capacity is rounded up to a power of two (at least 16), so that
        meshes of similar length share one compiled replay; ``exact=True`` cuts to the
        longest trajectory. `gradsolve.record` trims automatically outside ``jit``.
        """
        if isinstance(self.n_steps, jax.core.Tracer):
            raise ValueError("Mesh.trim() needs concrete `n_steps`; call it outside jax.jit.")
        used = int(np.max(np.asarray(self.n_steps))) if self.n_steps.size else 0
        used = max(used, 1)
        if not exact:
            used = max(16, 1 << (used - 1).bit_length())
        if used >= self.capacity:
            return self
        return eqx.tree_at(lambda m: m.times, self, self.times[..., : used + 1])

    def padded(self) -> "Mesh":
        """The same mesh with the slots past ``n_steps`` filled with the last time.

        Meshes recorded inside ``jit`` leave those slots unspecified (see ``times``); this is
        for code that reads whole rows of ``times``. Works under ``jit`` and on host (NumPy)
        meshes.
        """
        return eqx.tree_at(lambda m: m.times, self, pad_times(self.times, self.n_steps))


def pad_times(times, n_steps):
    """``times (..., S + 1)`` with the slots past ``n_steps (...)`` set to ``times[n_steps]``.

    NumPy in, NumPy out (host meshes, no compiled program per shape); otherwise ``jnp``.
    """
    xp = np if isinstance(times, np.ndarray) and isinstance(n_steps, np.ndarray) else jnp
    n = xp.clip(xp.asarray(n_steps), 0, times.shape[-1] - 1)[..., None]
    last = xp.take_along_axis(times, n, axis=-1)
    return xp.where(xp.arange(times.shape[-1]) > n, last, times)


def _as_batched(mesh: Mesh) -> Mesh:
    """The same mesh with a leading ensemble axis of size 1 if it had none."""
    if mesh.is_ensemble:
        return mesh
    add = lambda x: None if x is None else jnp.asarray(x)[None]
    return eqx.tree_at(
        lambda m: (m.times, m.n_steps, m.n_rejected, m.status, m.save_index, m.ts,
                   m.dt_next, m.y_last, m.y0),
        mesh,
        tuple(add(x) for x in (mesh.times, mesh.n_steps, mesh.n_rejected, mesh.status,
                               mesh.save_index, mesh.ts, mesh.dt_next, mesh.y_last, mesh.y0)),
    )
