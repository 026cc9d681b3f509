"""`MeshPolicy`: when a fitter or sampler records, re-records, or keeps a mesh.

A recorded mesh (`gradsolve.Mesh`) is the step sequence an adaptive solve accepted at some
parameters. Replaying it at other parameters is a fixed-step solve whose gradient is exact
for that discretisation; the replay's ``error_ratio`` (in units of ``rtol``/``atol``; ``<=
1``: the adaptive controller would still accept every step) says how well the mesh holds.
`inference.fit` (its gradient descent, and the least-squares multistart of PEtab problems),
`inference.fit_least_squares` and `inference.sample` ask one policy object the same
questions:

- at which tolerances to record (`record_tol_factor` times the requested ones, so a fresh
  mesh starts at ``error_ratio <= record_tol_factor`` and parameters can move before it
  must be re-recorded; a mesh recorded at the tolerance itself holds steps accepted at
  ratio ~0.99 and would trigger at once);
- which trajectories to re-record after a step (`rerecord_after`: relative parameter
  drift since the record beyond `drift_tol`, or ``error_ratio`` beyond
  `error_ratio_max`);
- which steps to redo at once on a fresh mesh (`redo`: a replay that is not finite or an
  ``error_ratio`` beyond ``redo_factor * error_ratio_max``: no gradient is taken on a mesh
  worse than that);
- when a least-squares solution has settled on its mesh (`settled`: the mesh holds there
  and the solution moved less than ``settle_factor * drift_tol`` from where it was
  recorded, so the last solve ran on the solution's own mesh);
- in a sampler, whether meshes change during warmup and sampling (`warmup_rerecords`,
  `frozen_in_sampling`) and whether one mesh holds for every chain (`holds_for_all`).

Why a sampler freezes its mesh while sampling: with the mesh fixed, the potential is a
fixed smooth function of the parameters and its replay gradient is exact, so NUTS/HMC is
an exact MCMC for that fixed-mesh posterior; re-recording during sampling would make the
target depend on the chain's path and break detailed balance. During warmup the draws are
discarded, so each chain's mesh may follow it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

__all__ = ["MeshPolicy"]

_MODES = {"fit": ("auto", "always", "never"), "sample": ("warmup", "always", "never")}



def tightened(rtol, factor: float, y0):
    """``rtol * factor`` for a record made tighter than requested (`MeshPolicy`), kept at
    or above 4 machine epsilons of ``y0``'s dtype: ``gs.record`` refuses less (a float32
    error estimate's rounding alone would reject every step), and a heuristic factor must
    not turn a valid float32 request into an invalid one."""
    dtype = jnp.result_type(y0)
    if not jnp.issubdtype(dtype, jnp.floating):
        return rtol * factor
    floor = 4.0 * float(jnp.finfo(dtype).eps)
    if isinstance(rtol, (int, float, np.floating)):
        return max(float(rtol) * factor, floor)
    return jnp.maximum(rtol * factor, floor)

def _xp(*arrays):
    """``jax.numpy`` where an argument is a JAX array (the fit's compiled loop asks the
    policy inside its program), else NumPy (host decisions stay host arrays)."""
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


@dataclasses.dataclass(frozen=True)
class MeshPolicy:
    """The re-record rule shared by fits and samplers (see the module docstring).

    Attributes:
        rerecord: ``"auto"`` (on drift or error ratio), ``"always"`` (every step: the
            plain adaptive-solve gradient, or ``gs.solve`` in every sampler evaluation),
            ``"never"`` (one mesh throughout) or, for samplers, ``"warmup"`` (per-chain
            meshes re-recorded between warmup windows, one frozen mesh for sampling).
        drift_tol: relative parameter change (constrained space, largest over coordinates)
            since a trajectory's record that triggers a re-record.
        error_ratio_max: re-record where the replay's ``error_ratio`` exceeds this.
        record_tol_factor: meshes are recorded at this times ``rtol``/``atol``.
        redo_factor: redo a step at once beyond ``redo_factor * error_ratio_max``.
        settle_factor: a least-squares solution has settled within
            ``settle_factor * drift_tol`` of its mesh's parameters.
        fill_urgency: a partial re-record is padded to a fixed ensemble size; the padding
            slots re-record, for free, the others whose urgency exceeds this (most urgent
            first).
        shared_margin: one sampling mesh serves every chain if its error ratio is at most
            ``shared_margin * error_ratio_max`` at each chain's position.
        drift_measure: how `distance` measures a move: ``"relative"`` (`drift`, on
            constrained values) or ``"absolute"`` (the largest coordinate's change, for
            coordinates already on log scales, such as a PEtab problem's ``log10``
            parameters, where a relative change of the logarithm means nothing).

    Example:
        >>> policy = inference.MeshPolicy(drift_tol=0.1, error_ratio_max=1.0)
        >>> policy.rerecord_after(alive, drift, err)     # (n,) bool: re-record these
        >>> inference.fit(model, data, drift_tol=0.05)   # fit builds its policy itself
    """

    rerecord: str = "auto"
    drift_tol: float = 0.1
    error_ratio_max: float = 1.0
    record_tol_factor: float = 0.5
    redo_factor: float = 4.0
    settle_factor: float = 0.1
    shared_margin: float = 0.5
    fill_urgency: float = 0.25
    drift_measure: str = "relative"

    @classmethod
    def checked(cls, kind: str, rerecord: str, **fields) -> "MeshPolicy":
        """A policy for a ``kind`` of run (``"fit"`` or ``"sample"``), its arguments
        validated (``ValueError`` naming the bad one)."""
        modes = _MODES[kind]
        if rerecord not in modes:
            allowed = ", ".join(repr(m) for m in modes[:-1]) + f" or {modes[-1]!r}"
            raise ValueError(f"`rerecord` must be {allowed}, got {rerecord!r}")
        for name in ("drift_tol", "error_ratio_max"):
            v = fields.get(name, 1.0)
            if not (isinstance(v, (int, float, np.number)) and v > 0):
                raise ValueError(f"`{name}` must be a positive number, got {v!r}")
        return cls(rerecord=rerecord, **fields)

    # -------------------------------------------------------------- measurements
    def error_ratio(self, raw, tol_factor: float | None = None):
        """A replay's error ratio on a mesh recorded by this policy, in units of the
        requested tolerances (the mesh's own are ``record_tol_factor``, or the given
        ``tol_factor``, times tighter)."""
        return raw * (self.record_tol_factor if tol_factor is None else tol_factor)

    @staticmethod
    def drift(x, x_rec):
        """Relative drift ``max |x - x_rec| / |x_rec|`` over the last axis of flat
        constrained parameters ``(D,)`` or ``(n, D)``: `gradsolve.MeshReuse`'s rule."""
        return gs.MeshReuse.relative_drift(x, x_rec, ensemble=jnp.ndim(x) > 1)

    def distance(self, x, x_rec) -> np.ndarray:
        """How far points ``(D,)`` or ``(n, D)`` moved from where their meshes were
        recorded, in `drift_measure`'s sense (compared with `drift_tol`)."""
        if self.drift_measure == "absolute":
            return np.max(np.abs(np.asarray(x) - np.asarray(x_rec)), axis=-1)
        return np.asarray(self.drift(x, x_rec))

    def urgency(self, drift: np.ndarray, err: np.ndarray) -> np.ndarray:
        """How close each trajectory is to a re-record (1 = at the bound)."""
        return _xp(drift, err).maximum(drift / self.drift_tol, err / self.error_ratio_max)

    def fill(self, alive: np.ndarray, trig: np.ndarray, urgency: np.ndarray) -> np.ndarray:
        """The rows worth re-recording in the padding of a record of ``trig``: alive, not
        triggered, urgency above `fill_urgency`, most urgent first."""
        urgency = np.where(alive & ~trig, urgency, -1.0)
        order = np.argsort(-urgency, kind="stable")
        return order[urgency[order] > self.fill_urgency]

    # -------------------------------------------------------------- fit decisions
    def redo(self, alive: np.ndarray, loss: np.ndarray, err: np.ndarray) -> np.ndarray:
        """``(n,)`` the trajectories whose step must be redone on a fresh mesh now."""
        xp = _xp(alive, loss, err)
        if self.rerecord == "never":
            return xp.zeros_like(alive)
        return alive & (~xp.isfinite(loss) | ~(err <= self.redo_factor * self.error_ratio_max))

    def rerecord_after(self, alive: np.ndarray, drift: np.ndarray, err: np.ndarray
                       ) -> np.ndarray:
        """``(n,)`` the trajectories to re-record before the next step."""
        if self.rerecord == "always":
            return alive.copy()
        if self.rerecord == "never":
            return _xp(alive, drift, err).zeros_like(alive)
        return alive & ((drift > self.drift_tol) | ~(err <= self.error_ratio_max))

    def settled(self, drift: float, err: float) -> bool:
        """Whether a least-squares solution ran on its own mesh (see the class)."""
        return err <= self.error_ratio_max and drift <= self.drift_tol * self.settle_factor

    # -------------------------------------------------------------- sampler decisions
    @property
    def warmup_rerecords(self) -> bool:
        """Per-chain meshes re-recorded between warmup windows."""
        return self.rerecord == "warmup"

    @property
    def solves_each_evaluation(self) -> bool:
        """``gs.solve`` in every evaluation (no mesh is kept)."""
        return self.rerecord == "always"

    def holds_for_all(self, err: np.ndarray) -> bool:
        """Whether one mesh with error ratios ``err`` (requested units) at the chains'
        positions may serve them all."""
        return bool(np.all(err <= self.shared_margin * self.error_ratio_max))

    def describe_sampling(self) -> str:
        """What the sampler's target is under this policy, and why it is exact."""
        f = self.record_tol_factor
        return {
            "warmup": "warmup: per-chain meshes re-recorded between warmup windows (10, 20, "
                      "40, ... iterations); sampling: ONE mesh recorded at the chains' mean "
                      f"after warmup (rtol*{f}, atol*{f}) and frozen: exact MCMC for the "
                      "fixed-mesh posterior",
            "always": "gs.solve (record + replay) in every evaluation: exact MCMC for the "
                      "adaptive-solution posterior",
            "never": f"one mesh recorded at the initial points' mean (rtol*{f}, atol*{f}), "
                     "frozen throughout: exact MCMC for the fixed-mesh posterior",
        }[self.rerecord]

