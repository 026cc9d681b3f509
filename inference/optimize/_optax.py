"""`Optax`: Optax's gradient methods as an `AbstractOptimizer`, many starts at once,
reusing recorded meshes (`FitKernel`; what `inference.fit` runs on an ODE model or a
program unless told otherwise).

How it works:

1. The ``n_starts`` starting points form ONE ensemble: a single ``gs.record`` call records
   a mesh for all of them.
2. Each step evaluates the loss and its gradient by replaying the meshes (``gs.replay``)
   and applies the Optax update. The steps run in one compiled loop
   (`FitKernel.advance`: a ``jax.lax.while_loop``, compiled once per mesh capacity,
   which is rounded up to a power of two so it rarely changes) of up to ``chunk``
   steps; the host sees the starts' numbers once per chunk, not once per step, which on
   an accelerator is most of a step's time. The optimisation variable is the flat
   unconstrained vector of `inference.ParamSpace`, so positive parameters stay positive.
3. Each step also measures, per start, the parameter drift since its mesh was recorded and
   the replay's ``error_ratio``; `MeshPolicy` says which starts to re-record before the
   next step and which steps to redo at once on a fresh mesh. Where the problem can record
   under ``jit`` (`AbstractProblem.record_in_place`: an ODE model's, a NumPyro program's,
   a population's), both happen inside the compiled loop: every start is recorded again
   at the loop's step capacity and the rows swapped in (`gs.Mesh.where`), and after a
   redo every step of the next ``EAGER``
   is preceded by such a record (at ensemble width some start needs a redo at nearly
   every step; a record before the step saves the second evaluation). The loop returns
   to the host only for a start that outgrows the capacity, or a step to redo on a mesh
   recorded just now. Why all starts: on an accelerator one record of every start costs
   about what a record of a few does, and the mesh never leaves the device (lynx–hare,
   1,024 starts x 300 steps on 2 CPU cores: 8.4 s with host re-records, 2.7 s in the
   loop). Where the replay's cost follows the mesh capacity (the TPU's kernels), a start
   that outgrows it by far is frozen rather than grow every start's mesh
   (`FitKernel.step_limit`). Other problems (PEtab's) end the loop at either verdict
   and re-record on the host, only the starts concerned, as a sub-ensemble padded to one
   of a few fixed sizes (``n, n/4, n/16, ...``, so few record programs are compiled); the
   padding slots re-record, for free, the starts closest to triggering.
   ``rerecord="always"`` re-records every start every step (the plain adaptive-solve
   gradient).
4. Starts whose first record fails (or whose first loss is not finite) are re-drawn from
   the prior; a start whose re-record fails later is frozen at its last good parameters and
   reported with ``loss = inf`` (``FitResult.status == 1``).
5. At the end every start is re-recorded at its final parameters and its loss evaluated on
   that fresh mesh: ``FitResult.losses`` are losses of the adaptive solution.

Between re-records the optimiser minimises the fixed-mesh discretisation of the loss,
whose gradient is exact for it; the policy keeps that discretisation within the solver's
tolerance of the adaptive one.

The whole run is a `FitState` (a NamedTuple) advanced by a pure `FitKernel.step`, the way
BlackJAX's kernels are built; a checkpoint is that state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Bool, Float, Int

import gradsolve as gs

from .. import _checkpoint
from .._progress import progress_bar
from .._result import FAILED, FitResult
from .._transfer import to_device
from ..problem._abstract import AbstractProblem
from ..problem._policy import MeshPolicy
from ._optimizer import AbstractOptimizer, OptimizeResult, checked_mask

__all__ = ["Optax", "FitState", "FitKernel"]


class FitState(NamedTuple):
    """Everything a fit carries from one step to the next (host values; ``n`` starts,
    ``D`` unconstrained coordinates). A checkpoint is this state.

    Attributes:
        u: ``(n, D)`` current parameters (unconstrained).
        u_rec: ``(n, D)`` the parameters each start's mesh was recorded at.
        opt_state: the Optax state.
        mesh: the ensemble's mesh (JAX arrays).
        mesh_host: the same mesh on the host (NumPy) in a saved or returned state;
            ``None`` while a run keeps it on the device only (a re-record sends its new
            rows there, not the whole mesh: at 100,000 starts the mesh is hundreds of MB).
        alive: ``(n,)`` False for starts frozen after a failed record.
        pending: ``(n,)`` starts to re-record before the next step (the policy's verdict
            on the last step).
        urgency: ``(n,)`` how close each start was to a re-record at the last step.
        step: optimisation steps done.
        history: one ``(n,)`` row of losses per step done.
        max_error_ratio: ``(n,)`` largest ``error_ratio`` met per start.
        n_records, n_records_per_start, n_grad_evals, n_redrawn: counters (`FitResult`).
        elapsed: seconds spent before the current call (resumed runs add up).

    Example:
        >>> inference.fit(model, data, steps=50, checkpoint="fit.pkl")
        >>> with open("fit.pkl", "rb") as fh:
        ...     state = pickle.load(fh).state         # a FitState
        >>> state.step, state.u.shape, len(state.history)   # 50, (1, D), 50
    """

    u: Float[np.ndarray, "n D"]
    u_rec: Float[np.ndarray, "n D"]
    opt_state: Any
    mesh: gs.Mesh
    mesh_host: gs.Mesh | None
    alive: Bool[np.ndarray, " n"]
    pending: Bool[np.ndarray, " n"]
    urgency: Float[np.ndarray, " n"]
    step: int
    history: tuple
    max_error_ratio: Float[np.ndarray, " n"]
    n_records: int
    n_records_per_start: Int[np.ndarray, " n"]
    n_grad_evals: int
    n_redrawn: int
    elapsed: float


class _Eval(NamedTuple):
    """One compiled evaluation: the updated parameters and optimiser state, and per start
    ``(n,)`` the loss, the error ratio (requested units) and the drift."""

    u: jax.Array
    opt_state: Any
    loss: np.ndarray
    error_ratio: np.ndarray
    drift: np.ndarray


def _retired(mesh, alive):
    """``mesh`` with the rows of frozen starts (``~alive``) replaying no step: their losses
    are not used, and a replay whose cost follows its longest trajectory (a TPU block of
    4,096 lanes; the CPU kernel, per trajectory) would otherwise keep paying for the long
    mesh a start was frozen with. Meshes of other kinds are returned as they are."""
    if isinstance(mesh, gs.Mesh):
        return eqx.tree_at(lambda m: m.n_steps, mesh, jnp.where(alive, mesh.n_steps, 0))
    retire = getattr(mesh, "retired", None)
    return mesh if retire is None else retire(alive)


#: A start whose mesh needs more than this many times the live starts' median steps is
#: frozen where the replay's cost follows the capacity (`FitKernel.step_limit`).
STEP_RATIO = 8
MIN_STEP_LIMIT = 256

#: Steps after an in-loop redo before each of which every start is re-recorded (`FitKernel`).
EAGER = 16


def _buckets(n: int, smallest: int = 4) -> list[int]:
    """Sub-ensemble sizes for partial re-records: n, n/4, n/16, ... (>= smallest)."""
    out, m = [n], n // 4
    while m >= smallest:
        out.append(m)
        m //= 4
    return sorted(out)


class FitKernel:
    """`init`, `step` and `finish` of a fit of ``problem`` under ``policy``.

    Args:
        problem: the model, data and solve options (an `AbstractProblem`).
        policy: when to re-record (`MeshPolicy`).
        optimizer: an Optax transformation of the flat unconstrained ``u (n, D)``.
        objective: ``"map"`` or ``"mle"``; jacobian: add ``log |dx/du|`` to the MAP.
        mask: ``(D,)`` bool, coordinates held at their start's value, or ``None``.
    """

    def __init__(self, problem: AbstractProblem, policy: MeshPolicy, optimizer, objective: str,
                 jacobian: bool, mask: np.ndarray | None = None, chunk: int = 50):
        self.problem, self.policy, self.objective = problem, policy, objective
        self.chunk = int(chunk)
        space = problem.space
        prior = objective == "map"

        def evaluate(u, opt_state, mesh, u_rec, alive):
            def total(u):
                lp, sol = problem.log_density(u, mesh, prior=prior, jacobian=prior and jacobian)
                loss = jnp.where(jnp.isfinite(lp), -lp, jnp.inf)
                return jnp.sum(jnp.where(jnp.isfinite(loss), loss, 0.0)), (loss, sol.error_ratio)

            (_, (loss, err)), g = jax.value_and_grad(total, has_aux=True)(u)
            g = jnp.where((alive & jnp.isfinite(loss))[:, None] & jnp.isfinite(g), g, 0.0)
            if mask is not None:  # held coordinates: no gradient, so no update
                g = jnp.where(jnp.asarray(mask), 0.0, g)
            updates, new_state = optimizer.update(g, opt_state, u)
            u_new = jnp.where(alive[:, None], optax.apply_updates(u, updates), u)
            drift = policy.drift(space.flat_constrained(u), space.flat_constrained(u_rec))
            return u_new, new_state, loss, policy.error_ratio(err), drift

        in_place = bool(getattr(problem, "records_in_place", False))
        self.in_place = in_place
        tol_factor = policy.record_tol_factor

        def rerecord(c):
            """Every start recorded at its current point, at the compiled capacity, and
            taken where it is alive and its record succeeded. A pending start whose
            record failed for want of steps stays pending, for the host (a larger
            capacity); one whose solve failed otherwise (not finite, step underflow) is
            frozen at its last good parameters, as the host freezes it."""
            # a frozen start is recorded at a live one's point: it is not used, and its
            # own may take far more steps (a device's block waits for its longest lane)
            live = c["alive"]
            u = jnp.where(live[:, None], c["u"], c["u"][jnp.argmax(live)])
            fresh = problem.record_in_place(u, c["mesh"], tol_factor)
            take = live & (fresh.status == 0)
            failed = c["pending"] & ~take
            # out of steps goes to the host, unless the capacity may not grow (`step_limit`)
            freeze = failed & ((fresh.status != gs.Status.MAX_STEPS) | ~c["can_grow"])
            return dict(c, mesh=_retired(c["mesh"].where(take, fresh), live & ~freeze),
                        u=jnp.where(freeze[:, None], c["u_rec"], c["u"]),
                        u_rec=jnp.where(take[:, None], c["u"], c["u_rec"]),
                        alive=c["alive"] & ~freeze,
                        pending=failed & ~freeze, fresh=jnp.ones((), bool),
                        n_rec=c["n_rec"] + 1, per=c["per"] + take.astype(c["per"].dtype))

        def steps(u, opt_state, mesh, u_rec, alive, max_err, urgency, pending, k, force,
                  can_grow):
            """Up to ``k`` steps on the meshes, stopping early where the host must act.

            Where the problem records in place (`AbstractProblem.record_in_place`), the
            policy's re-records and redone steps happen here: before a step, if any
            start is pending, all starts are re-recorded at the compiled capacity (one
            ensemble record; on an accelerator a record of every start costs about what a
            record of a few does, and the rows never leave the device), and a step the
            policy says to redo is re-recorded and redone. The loop stops for the host
            only where a pending start outgrew the capacity, or a step must be redone on
            a mesh that is already fresh. Otherwise it stops after a step whose verdict
            asks for a re-record, or before committing a step the policy says to redo
            (its evaluation is returned, for the host to redo it on fresh meshes).
            ``force``: commit the first step whatever the verdict (a plain evaluation);
            ``can_grow``: whether a start that outgrows the capacity may grow it (else it is
            frozen here, as the host would freeze it: `step_limit`)."""
            n = u.shape[0]

            def cond(c):
                return (c["done"] < k) & ~c["stop"]

            def body(c):
                if in_place:
                    c = jax.lax.cond((jnp.any(c["pending"]) | (c["eager"] > 0)) & ~force,
                                     rerecord, lambda c: dict(c, fresh=jnp.zeros((), bool)), c)
                    # a pending start whose record failed here: the host records it
                    blocked = jnp.any(c["pending"]) & ~force
                else:
                    blocked = jnp.zeros((), bool)
                alive = c["alive"]
                u_new, opt_new, loss, err, drift = evaluate(c["u"], c["opt"], c["mesh"],
                                                            c["u_rec"], alive)
                redo = policy.redo(alive, loss, err)
                ok = (force | ~jnp.any(redo)) & ~blocked
                pending = policy.rerecord_after(alive, drift, err)
                seen = jnp.where(alive & jnp.isfinite(err), err, 0.0)
                row = jnp.where(alive, loss, jnp.inf).astype(c["history"].dtype)
                i = c["done"]

                def keep(new, old):
                    return jnp.where(ok, new, old)

                if in_place:
                    # a step to redo on a mesh recorded just now goes to the host too
                    host_redo = ~ok & ~blocked & c["fresh"]
                    stop = blocked | host_redo
                    pending_next = jnp.where(ok, pending, c["pending"] | redo)
                    # after a redo, record before each of the next EAGER steps: at ensemble
                    # width some start needs a redo at nearly every step, and a record
                    # before the step costs one evaluation less than a redo after it
                    eager = jnp.where(~ok & ~c["fresh"], EAGER, jnp.maximum(c["eager"] - 1, 0))
                else:
                    host_redo = ~ok
                    stop = ~ok | jnp.any(pending)
                    pending_next = keep(pending, c["pending"])
                    eager = c["eager"]
                return dict(
                    c,
                    u=keep(u_new, c["u"]),
                    opt=jax.tree_util.tree_map(keep, opt_new, c["opt"]),
                    history=c["history"].at[i].set(keep(row, c["history"][i])),
                    max_err=keep(jnp.maximum(c["max_err"], seen), c["max_err"]),
                    pending=pending_next,
                    urgency=keep(policy.urgency(drift, err), c["urgency"]),
                    done=i + ok.astype(i.dtype), evals=c["evals"] + 1, stop=stop, redo=host_redo,
                    eager=eager,
                    blocked=blocked, loss=loss, err=err, drift=drift)

            zero = jnp.zeros(n, u.dtype)
            mesh = _retired(mesh, alive)
            c = dict(u=u, opt=opt_state, history=jnp.full((self.chunk, n), jnp.inf, u.dtype),
                     max_err=max_err.astype(u.dtype), pending=pending,
                     urgency=urgency.astype(u.dtype), done=jnp.zeros((), jnp.int32),
                     stop=jnp.zeros((), bool), redo=jnp.zeros((), bool), loss=zero,
                     err=zero, drift=zero, mesh=mesh, u_rec=u_rec, alive=alive,
                     fresh=jnp.zeros((), bool), blocked=jnp.zeros((), bool),
                     n_rec=jnp.zeros((), jnp.int32), evals=jnp.zeros((), jnp.int32),
                     eager=jnp.zeros((), jnp.int32), can_grow=can_grow,
                     per=jnp.zeros(n, jnp.int32))
            return jax.lax.while_loop(cond, body, c)

        self._steps = jax.jit(steps)
        self._row = jax.jit(lambda h, i: jax.lax.dynamic_index_in_dim(h, i, keepdims=False))
        # rows of a device mesh replaced (row counts padded to `_buckets`: few programs)
        self._put = jax.jit(lambda mesh, rows, sub: mesh.scatter(rows, sub))
        self.ragged = False  # set by `init` from the driver the replay runs on
        self.constrained = jax.jit(space.from_unconstrained)
        self.init_optimizer = jax.jit(optimizer.init)

    def _run(self, s: FitState, k: int, force: bool) -> dict:
        """The compiled loop of up to ``k`` steps from ``s`` (host arrays out, but for the
        optimiser state, the loss rows and the mesh, which stay on the device)."""
        put = to_device
        c = self._steps(put(s.u), s.opt_state, s.mesh, put(s.u_rec), put(s.alive),
                        put(s.max_error_ratio), put(s.urgency), put(s.pending),
                        put(np.int32(k)), put(np.bool_(force)),
                        put(np.bool_(self.in_place and self.step_limit(s) > s.mesh.capacity)))
        kept = {key: c.pop(key) for key in ("opt", "history", "mesh")}
        out = jax.device_get(c)
        out.update(kept)  # `advance` reads the rows of "history" it needs
        return out

    def _rows(self, history: jax.Array, done: int) -> tuple:
        """The first ``done`` rows of the loop's ``(chunk, n)`` loss buffer, as host rows:
        one at a time where the chunk ended early (at ensemble width a re-record ends
        most chunks after a step: the whole buffer would be ``chunk`` times the data)."""
        if done == len(history):
            return tuple(np.asarray(history))
        return tuple(np.asarray(self._row(history, i)) for i in range(done))

    def evaluate(self, s: FitState) -> _Eval:
        """Loss, gradient and Optax update at ``s`` (one compiled call: the loop of
        `advance` run for one step, committed whatever the policy's verdict)."""
        c = self._run(s, 1, True)
        return _Eval(np.array(c["u"]), c["opt"], c["loss"], c["err"], c["drift"])

    def advance(self, s: FitState, k: int) -> FitState:
        """Up to ``k >= 1`` optimisation steps, the same as ``k`` calls of `step`, in one
        compiled loop. Where the problem records in place, re-records and redone steps
        happen inside that loop, and it returns early only for what the host must do: a
        start that no longer fits the mesh capacity, or a step to redo on a mesh recorded
        just now (both done here). Otherwise the loop runs until the ``k`` steps are done,
        a step's verdict asks for a re-record (done here, on the host, at the next call),
        or the policy says a step must be redone on fresh meshes (re-recorded and redone
        here, as `step` does). The host sees each start's numbers once per call, not once
        per step."""
        if s.pending.any() and not self.in_place:
            s = self.rerecord(s, s.pending, s.urgency)
        c = self._run(s, min(int(k), self.chunk), False)
        done = int(c["done"])
        # evaluations in the loop; an uncommitted one handed to `_took` is counted there
        s = s._replace(n_grad_evals=s.n_grad_evals + int(c["evals"]) - bool(c["redo"]))
        if self.in_place:  # the loop's mesh: re-recorded rows, frozen starts' retired
            s = s._replace(mesh=c["mesh"], mesh_host=None)
        if int(c["n_rec"]):  # re-recorded in the loop
            s = s._replace(u_rec=np.array(c["u_rec"]),
                           u=np.array(c["u"]), alive=np.asarray(c["alive"]),
                           n_records=s.n_records + int(c["n_rec"]),
                           n_records_per_start=s.n_records_per_start + c["per"])
        if done:
            s = s._replace(
                u=np.array(c["u"]), opt_state=c["opt"], step=s.step + done,
                history=s.history + self._rows(c["history"], done),
                max_error_ratio=np.asarray(c["max_err"], s.max_error_ratio.dtype),
                urgency=np.asarray(c["urgency"], s.urgency.dtype))
        if done or self.in_place:
            s = s._replace(pending=np.asarray(c["pending"]))
        if c["blocked"]:  # starts the loop could not record at its capacity
            s = self.rerecord(s, s.pending, s.urgency)
            s = s._replace(pending=np.zeros_like(s.pending))
        if c["redo"]:  # the next step's evaluation, not committed: redo it
            s = self._took(s, _Eval(None, None, c["loss"], c["err"], c["drift"]))
        return s

    def record(self, u: np.ndarray, rows: np.ndarray, fill: np.ndarray | None = None
               ) -> tuple[gs.Mesh, np.ndarray]:
        """Record the starts ``rows`` as one sub-ensemble padded to a bucket size; the
        padding slots hold the starts ``fill`` (most urgent first), then repeats of
        ``rows[0]``. Returns the host mesh of the distinct starts and their indices."""
        size = next(b for b in _buckets(len(u)) if b >= len(rows))
        extra = np.zeros(0, rows.dtype) if fill is None else np.asarray(fill, rows.dtype)
        distinct = np.concatenate([rows, extra[~np.isin(extra, rows)][: size - len(rows)]])
        idx = np.concatenate([distinct, np.full(size - len(distinct), rows[0], rows.dtype)])
        mesh = self.problem.record(u[idx], self.policy.record_tol_factor).to_host()
        return mesh.select(np.arange(len(distinct))), distinct

    def merge(self, s: FitState, rows: np.ndarray, sub: gs.Mesh) -> dict:
        """The meshes of ``s`` with rows ``rows`` replaced by host mesh ``sub``, as
        `FitState` fields. Where the capacity stays (almost always) only ``sub``'s rows
        go to the device, scattered there into the device mesh (``mesh_host`` is then
        ``None``: `hosted` brings it back); a capacity change rebuilds the mesh on the
        host once."""
        if not len(rows):
            return dict(mesh=s.mesh, mesh_host=s.mesh_host)
        cap = s.mesh.capacity
        steps = np.array(s.mesh.n_steps if s.mesh_host is None else s.mesh_host.n_steps)
        steps[rows] = np.asarray(sub.n_steps)
        if self._capacity(steps, max(cap, sub.capacity), cap) == cap:
            size = next(b for b in _buckets(len(steps)) if b >= len(rows))
            pad = np.zeros(size - len(rows), np.int64)  # repeats of the first row
            idx = np.concatenate([rows, rows[pad]])
            sub = sub.select(np.concatenate([np.arange(len(rows)), pad])).with_capacity(cap)
            return dict(mesh=self._put(s.mesh, to_device(idx), sub.to_device()),
                        mesh_host=None)
        host = s.mesh.to_host() if s.mesh_host is None else s.mesh_host
        host = self.sized(host.scatter(rows, sub), cap)
        return dict(mesh=host.to_device(), mesh_host=host)

    @staticmethod
    def hosted(s: FitState) -> FitState:
        """``s`` with its ``mesh_host`` (for a checkpoint or a returned state)."""
        return s if s.mesh_host is not None else s._replace(mesh_host=s.mesh.to_host())

    def _capacity(self, n_steps: np.ndarray, merged: int, current: int) -> int:
        """The capacity `sized` gives a mesh of ``merged`` slots whose rows take
        ``n_steps`` steps, the compiled step's being ``current`` (`gs.Mesh.trim`'s rule)."""
        trimmed = gs.Mesh.trimmed_capacity(n_steps, merged)
        return trimmed if not self.ragged or trimmed >= current else current

    def sized(self, mesh: gs.Mesh, current: int | None = None) -> gs.Mesh:
        """``mesh`` at the step capacity the compiled step runs it at: trimmed to a power
        of two (`gs.Mesh.trim`). Each capacity is a compile (~0.5 s); on a replay whose
        cost is each trajectory's own steps (the compiled kernel) the capacity therefore
        never shrinks, so a fit whose starts cross several step counts compiles once per
        power of two reached, not at every crossing. (Room to grow beyond the next power
        of two is not given: the host-side row algebra of a 1,000-start mesh costs in
        proportion to its capacity, measured 15 -> 39 ms a step at 4x.)"""
        trimmed = mesh.trim()
        if not self.ragged or current is None or trimmed.capacity >= current:
            return trimmed
        return mesh.with_capacity(current)

    def rerecord(self, s: FitState, trig: np.ndarray, urgency: np.ndarray) -> FitState:
        """``s`` with the starts ``trig`` (and, in the padding, the most urgent others)
        re-recorded at their current parameters; a start whose record fails is frozen at
        the parameters of its last good mesh."""
        sub, rows = self.record(s.u, np.nonzero(trig)[0], self.policy.fill(s.alive, trig, urgency))
        ok = (sub.status == 0) & (np.asarray(sub.n_steps) <= self.step_limit(s))
        alive, u, u_rec = s.alive.copy(), s.u.copy(), s.u_rec.copy()
        alive[rows[~ok]] = False
        u[rows[~ok]] = s.u_rec[rows[~ok]]
        u_rec[rows[ok]] = s.u[rows[ok]]
        return s._replace(**self.merge(s, rows[ok], sub.select(ok)), alive=alive,
                          u=u, u_rec=u_rec, **self._counted(s, rows))

    def step_limit(self, s: FitState) -> float:
        """The most steps a start's mesh may take: unlimited where the replay's cost
        follows each trajectory's own steps (`ragged`); otherwise `STEP_RATIO` times the
        median of the live starts' steps (at least `MIN_STEP_LIMIT`, and at least the
        current capacity). Every start's mesh has the ensemble's capacity, and on such a
        replay every evaluation pays for it: on a TPU v5e, lynx–hare at 100,000 starts,
        the gradient and the record take 15.3 and 18.3 ms at capacity 512 but 69.2 and
        42.6 ms at 4,096, with the same trajectories. A start that needs many times the
        others' steps is in a region the fit does not come back from (at 4,096 starts on
        the CPU, every start still past 292 steps at the end had been frozen), so it is
        frozen and reported failed, as a start whose solve fails."""
        if self.ragged:
            return np.inf
        steps = np.asarray(s.mesh.n_steps if s.mesh_host is None else s.mesh_host.n_steps)
        live = steps[s.alive & (steps > 0)]
        median = float(np.median(live)) if live.size else 0.0
        return max(STEP_RATIO * median, MIN_STEP_LIMIT, s.mesh.capacity)

    @staticmethod
    def _counted(s: FitState, rows: np.ndarray) -> dict:
        """The record counters of ``s`` after one record of the starts ``rows``."""
        per = s.n_records_per_start.copy()
        per[rows] += 1
        return dict(n_records=s.n_records + 1, n_records_per_start=per)

    def init(self, u: np.ndarray, key, *, max_redraws: int, can_redraw: bool) -> FitState:
        """The state before the first step: one record of every start, re-drawing from
        the prior (up to ``max_redraws`` rounds) the starts whose record or loss fails."""
        n = len(u)
        u = np.array(u, dtype=np.result_type(float), copy=True)
        mesh, _ = self.record(u, np.arange(n))
        self.ragged = self.problem.ragged_replay(u[0], mesh.row(0))
        mesh = self.sized(mesh)
        s = FitState(u=u, u_rec=u.copy(), opt_state=self.init_optimizer(to_device(u)),
                     mesh=mesh.to_device(), mesh_host=mesh, alive=np.ones(n, bool),
                     pending=np.zeros(n, bool), urgency=np.zeros(n), step=0, history=(),
                     max_error_ratio=np.zeros(n), n_records=1,
                     n_records_per_start=np.ones(n, np.int64), n_grad_evals=0, n_redrawn=0,
                     elapsed=0.0)
        for rnd in range(max_redraws + 1):
            loss = self.evaluate(s).loss
            s = s._replace(n_grad_evals=s.n_grad_evals + 1)
            bad = ~np.isfinite(loss) | (np.asarray(s.mesh.status) != 0)
            if not bad.any() or rnd == max_redraws or not can_redraw:
                break
            key, kd = jax.random.split(key)
            u, rows = s.u.copy(), np.nonzero(bad)[0]
            u[rows] = np.asarray(self.problem.sample_starts(kd, n), float)[rows]
            sub, rows = self.record(u, rows)
            s = s._replace(u=u, **self.merge(s, rows, sub),
                           n_redrawn=s.n_redrawn + len(rows), **self._counted(s, rows))
        if bad.all():
            _no_start_left(bad, np.asarray(s.mesh.status) != 0, max_redraws, can_redraw)
        return s._replace(alive=~bad, u_rec=s.u.copy(),
                          opt_state=self.init_optimizer(to_device(s.u)))

    def step(self, s: FitState) -> FitState:
        """One optimisation step: the pending re-records, the loss and gradient on the
        meshes (redone at once on fresh meshes where `MeshPolicy.redo` says so), the
        update, and the policy's verdict for the next step."""
        if s.pending.any():
            s = self.rerecord(s, s.pending, s.urgency)
        return self._took(s, self.evaluate(s))

    def _took(self, s: FitState, e: _Eval) -> FitState:
        """``s`` after the step whose evaluation at ``s`` is ``e``: redone at once on
        fresh meshes where the policy says, then committed with the policy's verdict."""
        n_grad = s.n_grad_evals + 1
        redo = self.policy.redo(s.alive, e.loss, e.error_ratio)
        if redo.any():
            s = self.rerecord(s, redo, self.policy.urgency(e.drift, e.error_ratio))
            e, n_grad = self.evaluate(s), n_grad + 1
        seen = np.where(s.alive & np.isfinite(e.error_ratio), e.error_ratio, 0.0)
        return s._replace(
            u=e.u, opt_state=e.opt_state, step=s.step + 1, n_grad_evals=n_grad,
            history=s.history + (np.where(s.alive, e.loss, np.inf),),
            max_error_ratio=np.maximum(s.max_error_ratio, seen),
            pending=self.policy.rerecord_after(s.alive, e.drift, e.error_ratio),
            urgency=self.policy.urgency(e.drift, e.error_ratio))

    @staticmethod
    def summary(s: FitState) -> dict:
        """The progress bar's postfix: the best loss of the last step, the records made."""
        last = s.history[-1][np.isfinite(s.history[-1])]
        return dict(best=f"{last.min():.5g}" if last.size else "inf", records=s.n_records)

    def info(self, s: FitState) -> dict:
        """What a `fit` callback receives: the last step's ``losses (n,)``, the ``params``
        (constrained dict, leading axis ``n``) and ``n_records``."""
        return dict(losses=s.history[-1].copy(), params=self.constrained(jnp.asarray(s.u)),
                    n_records=s.n_records)

    def finish(self, s: FitState, wall_time: float) -> FitResult:
        """Every live start re-recorded at its final parameters and its loss evaluated on
        that fresh mesh (the adaptive solution's loss)."""
        s, losses, status = self.final(s)
        x = self.constrained(jnp.asarray(s.u))
        history = np.stack(s.history) if s.history else np.zeros((0, len(s.u)))
        return FitResult.of_starts(
            x, losses, loss_history=history, n_records=s.n_records,
            n_records_per_start=s.n_records_per_start, n_grad_evals=s.n_grad_evals,
            wall_time=wall_time, status=status, objective=self.objective,
            n_steps=s.step, max_error_ratio=s.max_error_ratio, n_redrawn=s.n_redrawn)

    def final(self, s: FitState) -> tuple[FitState, np.ndarray, np.ndarray]:
        """``(state, losses (n,), status (n,))``: every live start re-recorded at its final
        parameters and its loss evaluated on that fresh mesh (``inf`` and `FAILED` where
        the start was frozen or its record failed)."""
        n, live = len(s.u), np.nonzero(s.alive)[0]
        status = np.where(s.alive, 0, FAILED).astype(np.int32)
        losses = np.full(n, np.inf)
        if len(live):
            sub, rows = self.record(s.u, live)
            ok = sub.status == 0
            # the final record is counted in n_records, not per start (as re-records are)
            s = s._replace(**self.merge(s, rows[ok], sub.select(ok)),
                           n_records=s.n_records + 1)
            e = self.evaluate(s._replace(u_rec=s.u))
            s = s._replace(n_grad_evals=s.n_grad_evals + 1)
            losses[live] = np.where(ok & np.isfinite(e.loss[live]), e.loss[live], np.inf)
            status[live[~ok]] = FAILED
        return s, losses, status


def _no_start_left(bad, unsolved, max_redraws: int, can_redraw: bool):
    """The RuntimeError of a fit none of whose starts can begin, saying why."""
    n, k = len(bad), int(np.sum(unsolved))
    tried = (f"after {max_redraws} rounds of re-drawing from the priors" if can_redraw
             else "(a single given `init` is not re-drawn)")
    if k == n:
        why = (f"every start failed to solve {tried}; check the priors or `init`, try a "
               "stiff solver such as gs.Rodas5P(), a looser rtol or a larger max_steps.")
    else:
        why = (f"every start has a non-finite loss {tried}, though {n - k} of {n} solved: "
               "the likelihood is -inf or NaN there. Check the data against the noise model "
               "(e.g. LogNormal noise needs positive data and predictions; a missing "
               "observation is NaN) and `init`.")
    raise RuntimeError(f"inference.fit: {why}")



class Optax(AbstractOptimizer):
    """An Optax gradient transformation as an optimiser of any problem: all starts one
    ensemble, the gradient a replay of each start's kept mesh, re-recorded where the
    `MeshPolicy` says (module docstring). It takes ``max_iter`` steps (no convergence
    test: ``reason`` is ``"steps"``); a start whose first record fails is re-drawn from the
    problem's `sample_starts`.

    Args:
        transformation: an ``optax.GradientTransformation`` (default ``optax.adam(1e-2)``).
        max_iter: steps (a resumed run continues up to this number).
        rerecord, drift_tol, error_ratio_max, record_tol_factor: the mesh policy
            (`inference.MeshPolicy`, as `inference.fit` takes them).
        jacobian: add the coordinates' log-Jacobian to the MAP objective.
        max_redraws: rounds of re-drawing starts whose first record fails; redraw:
            ``False`` never re-draws (a single start the user gave).
        callback: ``callback(step, info)`` after every step; ``True`` stops the run (with
            a callback the steps run one per compiled call, so it sees each of them).
        chunk: steps per compiled call at most (`FitKernel.advance`): the loop runs on the
            device and returns to the host only to re-record, checkpoint, report progress
            or check the deadline (which is therefore checked every ``chunk`` steps at
            most).
        checkpoint, checkpoint_every: a file the run's `FitState` is saved to every
            ``checkpoint_every`` steps (and resumed from); ``checkpoint_tags``: what else a
            resumed run must share with the saved one (e.g. the seed and ``init``).
        seed: seeds the re-draws (the first key of ``jax.random.split(PRNGKey(seed))``;
            `inference.fit` draws its starts from the second).

    Example:
        >>> opt = inference.optimize.Optax(optax.adam(3e-2), max_iter=500)
        >>> inference.fit(model, data, optimizer=opt, n_starts=8)
    """

    name = "optax"
    waterfall = False  # the starts keep their order (a checkpoint resumes them)

    def __init__(self, transformation: optax.GradientTransformation | None = None,
                 max_iter: int = 1000, *, rerecord: str = "auto", drift_tol: float = 0.1,
                 error_ratio_max: float = 1.0, record_tol_factor: float = 0.5,
                 jacobian: bool = False, max_redraws: int = 10, redraw: bool = True,
                 callback: Callable[[int, dict], Any] | None = None, checkpoint=None,
                 checkpoint_every: int = 100, checkpoint_tags: dict | None = None,
                 seed: int = 0, chunk: int = 50):
        if transformation is None:
            transformation = optax.adam(1e-2)
        if not isinstance(transformation, optax.GradientTransformation):
            raise ValueError("`optimizer` must be an Optax GradientTransformation (with init "
                             f"and update), e.g. optax.adam(1e-2); got {transformation!r}")
        if not isinstance(jacobian, (bool, np.bool_)):
            raise ValueError(f"`jacobian` must be True or False, got {jacobian!r}")
        for name, v, lo in (("max_iter", max_iter, 0), ("checkpoint_every", checkpoint_every, 1),
                            ("max_redraws", max_redraws, 0), ("chunk", chunk, 1)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise ValueError(f"`{name}` must be an int >= {lo}, got {v!r}")
        if not (isinstance(record_tol_factor, (int, float, np.number))
                and 0 < record_tol_factor <= 1):
            raise ValueError(f"`record_tol_factor` must lie in (0, 1], got {record_tol_factor}")
        _checkpoint.check_path(checkpoint)
        self.transformation, self.max_iter = transformation, int(max_iter)
        self.policy = MeshPolicy.checked("fit", rerecord, drift_tol=drift_tol,
                                         error_ratio_max=error_ratio_max,
                                         record_tol_factor=record_tol_factor)
        self.jacobian, self.max_redraws, self.redraw = bool(jacobian), int(max_redraws), redraw
        self.callback, self.checkpoint = callback, checkpoint
        self.checkpoint_every, self.checkpoint_tags = int(checkpoint_every), checkpoint_tags
        self.seed, self.chunk = int(seed), int(chunk)

    def check(self, problem) -> None:
        """``ValueError`` where ``problem`` has no `ParamSpace` (Optax moves its
        unconstrained coordinates and replays its meshes)."""
        if getattr(problem, "space", None) is None:
            raise ValueError(
                f"Optax fits the unconstrained coordinates of a model or a program and "
                f"replays their meshes; this {type(problem).__name__} has neither: use "
                "method='lbfgs', 'bfgs' or 'lm'")

    def kernel(self, problem, *, prior: bool = True, mask=None) -> FitKernel:
        """The `FitKernel` this optimiser runs on ``problem``."""
        return FitKernel(problem, self.policy, self.transformation,
                         "map" if prior else "mle", self.jacobian, mask, chunk=self.chunk)

    def minimize(self, problem, x0, *, mask=None, deadline=None, progress=None,
                 prior: bool = True) -> OptimizeResult:
        """`AbstractOptimizer.minimize` by ``max_iter`` Optax steps; ``extra`` holds the
        final `FitState` (``"state"``), `inference.FitResult.status` (``"status"``) and the
        seconds of earlier resumed runs (``"elapsed"``)."""
        t_start = time.perf_counter()
        self.check(problem)
        mask = checked_mask(problem, mask)
        gs.ensure_compilation_cache()
        kernel = self.kernel(problem, prior=prior, mask=mask)
        objective = "map" if prior else "mle"
        # The optimizer is identified by the structure of its state (adam vs sgd, chained
        # transforms), not its hyperparameters: resuming with another learning rate is allowed.
        opt_structure = str(jax.tree_util.tree_structure(jax.eval_shape(
            self.transformation.init,
            jax.ShapeDtypeStruct((1, np.shape(x0)[-1]), jnp.result_type(float)))))
        fingerprint = _checkpoint.fingerprint(
            problem, self.policy, objective=objective, jacobian=self.jacobian,
            optimizer=opt_structure, **(self.checkpoint_tags or {}))
        state = _checkpoint.load(self.checkpoint, fingerprint, "fit")
        if state is None:
            # re-draws take the first half of the seed's split, `fit`'s starts the second
            key = jax.random.split(jax.random.PRNGKey(self.seed))[0]
            state = kernel.init(np.asarray(x0, float), key, max_redraws=self.max_redraws,
                                can_redraw=self.redraw)
        else:
            state = state._replace(opt_state=_checkpoint.to_device(state.opt_state),
                                   mesh=state.mesh.to_device())
            kernel.ragged = problem.ragged_replay(state.u[0], state.mesh_host.row(0))
        elapsed, steps = state.elapsed, self.max_iter

        def save(s):
            if self.checkpoint is not None:
                _checkpoint.save_or_warn(
                    self.checkpoint, fingerprint,
                    kernel.hosted(s)._replace(elapsed=elapsed + time.perf_counter() - t_start))

        bar = progress_bar(progress, total=steps, done=state.step,
                           desc=f"fit {getattr(problem.source, 'name', '')}".rstrip())
        late = False
        try:
            while state.step < steps:
                # a chunk ends at the next checkpoint, and after one step for a callback
                k = min(steps - state.step, 1 if self.callback is not None else self.chunk,
                        self.checkpoint_every - state.step % self.checkpoint_every)
                before = state.step
                state = kernel.advance(state, k)
                if state.step // 10 > before // 10 or state.step == steps:
                    bar.set_postfix(**kernel.summary(state))  # shown by the update
                bar.update(state.step - before)
                if state.step % self.checkpoint_every == 0 or state.step == steps:
                    save(state)
                if self.callback is not None and \
                        self.callback(state.step, kernel.info(state)) is True:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    late = True
                    break
        except BaseException:
            save(state)
            raise
        finally:
            bar.close()
        state, losses, status = kernel.final(state)
        state = kernel.hosted(state)
        n = len(state.u)
        history = np.stack(state.history) if state.history else np.zeros((0, n))
        return OptimizeResult(
            x=np.asarray(state.u), value=losses, converged=np.zeros(n, bool),
            n_iter=np.full(n, state.step), reason=np.full(n, "deadline" if late else "steps"),
            history=history, n_records=state.n_records,
            n_records_per_start=state.n_records_per_start, n_evals=state.n_grad_evals,
            max_error_ratio=state.max_error_ratio,
            extra=dict(state=state, status=status, n_redrawn=state.n_redrawn,
                       elapsed=elapsed))
