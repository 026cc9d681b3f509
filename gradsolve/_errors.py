"""Failure messages for records that did not reach ``t1``.

Outside ``jit`` a failed record raises a ``RuntimeError`` that names the trajectories, says
what happened and suggests the fix. For explicit solvers the message also estimates
stiffness from the Jacobian at the point where the trajectory stopped: an explicit method
whose step size is pinned at ``h * |lambda_max| ~ 1..4`` is limited by stability, not
accuracy, and should be replaced by a linearly implicit one.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._mesh import Mesh, Status
from ._sharding import host

_FIX = (
    "Fixes: a stiff solver such as gs.Rodas5P(), a looser `rtol`/`atol`, or a larger "
    "`max_steps`."
)
_FIX_AFTER_STIFF = "Other fixes: a looser `rtol`/`atol`, or a larger `max_steps`."
_FIX_INPUTS = "Fix: pass finite `y0` and `params` (NaN/inf in the inputs)."


def _count(k: int) -> str:
    return f"{k} trajectory" if k == 1 else f"{k} trajectories"


def _nonfinite_inputs(mesh: Mesh, idx: int) -> bool:
    """Whether trajectory ``idx`` (batched mesh) failed before its first step on non-finite
    ``y0``/``params``, rather than on a state that became non-finite along the way."""
    if int(mesh.n_steps[idx]) != 0:
        return False
    leaves = [mesh.y_last[idx]] + [x[idx] for x in jax.tree_util.tree_leaves(mesh.params)
                                   if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return not all(np.all(np.isfinite(np.asarray(x))) for x in leaves)


def stiffness_estimate(f, t, y, params, h) -> float:
    """``h * max|Re(lambda)|`` of the Jacobian of ``f`` at ``(t, y)`` (host-side, one trajectory)."""
    jac = np.asarray(jax.jacfwd(f, argnums=1)(t, y, params), dtype=np.float64)
    if not np.all(np.isfinite(jac)):
        return float("nan")
    lam = np.linalg.eigvals(jac)
    return float(abs(h) * np.max(-np.minimum(lam.real, 0.0)))


def stiffness_report(mesh: Mesh, f, idx: int) -> tuple[bool, str]:
    """Whether failed trajectory ``idx`` (batched mesh) looks stiff, with a sentence why."""
    if getattr(mesh.solver, "implicit", False):
        return False, ""
    n_acc = int(mesh.n_steps[idx])
    t = mesh.times[idx, min(n_acc, mesh.times.shape[-1] - 1)]
    y = mesh.y_last[idx]
    p = jax.tree_util.tree_map(lambda x: x[idx], mesh.params)
    try:
        ratio = stiffness_estimate(f, t, y, p, mesh.dt_next[idx])
    except Exception:  # noqa: BLE001 - a diagnostic must never mask the real error
        return False, ""
    if np.isfinite(ratio) and ratio > 1.0:
        return True, (
            f"The problem looks stiff: at t={float(t):.6g} the explicit solver's step "
            f"h={float(mesh.dt_next[idx]):.3g} times the Jacobian's largest decay rate is "
            f"{ratio:.2g} (stability-limited, not accuracy-limited). Use a stiff solver: "
            "solver=gs.Rodas5P()."
        )
    return False, ""


def raise_if_failed(mesh: Mesh, f, where: str) -> None:
    """Raise ``RuntimeError`` naming the failed trajectories of a concrete batched mesh."""
    status = host(mesh.status)
    if status.ndim == 0:
        status = status[None]
    bad = np.flatnonzero(status != Status.OK)
    if bad.size == 0:
        return

    bm = mesh.batch().to_host()  # the messages index it on the host
    names = {
        Status.MAX_STEPS: f"reached max_steps={bm.capacity}",
        Status.NONFINITE: "met a non-finite state (NaN/inf in f or y)",
        Status.STEP_UNDERFLOW: "had the step size underflow",
        Status.INVALID_INPUT: "had invalid inputs (ts, t0/t1, rtol/atol or dt0; see "
                              "gs.Status.INVALID_INPUT)",
    }
    def stopped(i):
        t_stop = float(np.asarray(bm.times)[i, min(int(bm.n_steps[i]), bm.capacity)])
        return f"; trajectory {i} stopped at t={t_stop:.6g} of t1={float(bm.t1):.6g}"

    inputs = [i for i in bad if status[i] == Status.NONFINITE and _nonfinite_inputs(bm, int(i))]
    if inputs:
        status = status.copy()
        status[inputs] = -1  # reported on their own line, with their own fix
        names = {-1: "had non-finite `y0` or `params` (NaN/inf before the first step)",
                 **names}
    lines = _failure_lines(status, bad, names, stopped)
    stiff_msg = ""
    for i in bad[:3]:
        if status[i] in (Status.MAX_STEPS, Status.STEP_UNDERFLOW):
            stiff, msg = stiffness_report(bm, f, int(i))
            if stiff:
                stiff_msg = f"Trajectory {i}: {msg} "
                break
    if len(inputs) == bad.size:
        fix = _FIX_INPUTS
    else:
        fix = _FIX_AFTER_STIFF if stiff_msg else _FIX
    raise RuntimeError(
        f"{where}: {bad.size} of {_count(status.size)} failed. " + " ".join(lines) + " "
        + stiff_msg + fix + " Inside jax.jit no exception is raised: check "
        "`mesh.status` (failed trajectories give NaN outputs); pass throw=False to get that "
        "behaviour here too."
    )


def raise_if_fallback_failed(status, where: str, dt0, max_steps: int) -> None:
    """`raise_if_failed` for the ``diffrax.diffeqsolve`` fallback (constant steps ``dt0``,
    no mesh): ``status`` is the concrete ``(n,)`` `Status` per trajectory."""
    status = np.atleast_1d(host(status))
    bad = np.flatnonzero(status != Status.OK)
    if bad.size == 0:
        return
    names = {
        Status.MAX_STEPS: f"reached max_steps={max_steps} (constant steps of dt0={dt0} need "
                          "(t1 - t0) / dt0 of them; pass a larger `max_steps` or `dt0`)",
        Status.NONFINITE: "met a non-finite state or a failed implicit solve (a smaller `dt0`, "
                          "or an adaptive solver: gs.Tsit5(), or gs.Rodas5P() if stiff)",
        Status.STEP_UNDERFLOW: "had the step size underflow",
        Status.INVALID_INPUT: "had invalid inputs (ts, t0/t1 or dt0)",
    }
    lines = _failure_lines(status, bad, names)
    raise RuntimeError(
        f"{where}: {bad.size} of {_count(status.size)} failed on the diffrax.diffeqsolve "
        "fallback route. " + " ".join(lines) + " Inside jax.jit no exception is raised: check "
        "`sol.stats['status']` (failed trajectories give NaN outputs); pass throw=False to "
        "get that behaviour here too."
    )


def _failure_lines(status, bad, names: dict, detail=None) -> list[str]:
    """One sentence per failure code in ``names`` (code -> what happened): how many of the
    ``bad`` trajectories, their first indices, and ``detail(first index)`` if given."""
    lines = []
    for code, what in names.items():
        ids = bad[status[bad] == code]
        if ids.size:
            shown = ", ".join(str(i) for i in ids[:10]) + (" ..." if ids.size > 10 else "")
            extra = detail(int(ids[0])) if detail is not None else ""
            lines.append(f"{_count(ids.size)} {what} (indices: {shown}{extra}).")
    return lines


def error_if_failed(x, status, invalid: dict | None, where: str, failure: str):
    """``x`` guarded by ``equinox.error_if`` (``throw=True`` under ``jit``): one error per
    input found invalid on device (``invalid``: message -> ``(n,)`` bool, from
    `gradsolve._record.runtime_checks`), then ``failure`` for any other failed status."""
    for msg, bad in (invalid or {}).items():
        x = eqx.error_if(x, jnp.any(bad),
                         f"{where}: invalid input (found at run time under jax.jit): {msg}.")
    failed = (status != Status.OK) & (status != Status.INVALID_INPUT)
    return eqx.error_if(x, jnp.any(failed), f"{where}: {failure}")
