"""`fit`: gradient-based fits (MAP / maximum likelihood) of many starts at once, reusing
recorded meshes.

How it works:

1. The ``n_starts`` starting points form ONE ensemble: a single ``gs.record`` call records
   a mesh for all of them.
2. Each step (`FitKernel.step`) evaluates the loss and its gradient by replaying the
   meshes (``gs.replay``; one jitted function, compiled once per mesh capacity, which is
   rounded up to a power of two so it rarely changes) and applies the Optax update in the
   same compiled call. The optimisation variable is the flat unconstrained vector of
   `inference.ParamSpace`, so positive parameters stay positive.
3. Each step also measures, per start, the parameter drift since its mesh was recorded and
   the replay's ``error_ratio``; `MeshPolicy` says which starts to re-record before the
   next step and which steps to redo at once on a fresh mesh (``rerecord="always"``:
   every start every step, the plain adaptive-solve gradient). Only those starts are
   re-recorded, as a sub-ensemble padded to one of a few fixed sizes (``n, n/4, n/16,
   ...``, so few record programs are compiled); the padding slots re-record, for free, the
   starts closest to triggering.
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

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Bool, Float, Int

import gradsolve as gs

from .. import _checkpoint
from ..problem._policy import MeshPolicy
from ..petab._petab import fit_petab
from ..petab._problem import is_petab, problem_of
from ..problem._abstract import AbstractProblem
from .._progress import progress_bar
from .._result import FAILED, FitResult
from ..problem._starts import fit_starts, prior_draws

__all__ = ["fit", "FitState", "FitKernel"]


class FitState(NamedTuple):
    """Everything a fit carries from one step to the next (host values; ``n`` starts,
    ``D`` unconstrained coordinates). A checkpoint is this state.

    Attributes:
        u: ``(n, D)`` current parameters (unconstrained).
        u_rec: ``(n, D)`` the parameters each start's mesh was recorded at.
        opt_state: the Optax state.
        mesh: the ensemble's mesh (JAX arrays).
        mesh_host: the same mesh on the host (NumPy): re-records are merged into it, so a
            re-record copies only the new rows to the device, not the whole mesh back.
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
    mesh_host: gs.Mesh
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
    """

    def __init__(self, problem: AbstractProblem, policy: MeshPolicy, optimizer, objective: str,
                 jacobian: bool):
        self.problem, self.policy, self.objective = problem, policy, objective
        space = problem.space
        prior = objective == "map"

        def evaluate(u, opt_state, mesh, u_rec, alive):
            def total(u):
                lp, sol = problem.log_density(u, mesh, prior=prior, jacobian=prior and jacobian)
                loss = jnp.where(jnp.isfinite(lp), -lp, jnp.inf)
                return jnp.sum(jnp.where(jnp.isfinite(loss), loss, 0.0)), (loss, sol.error_ratio)

            (_, (loss, err)), g = jax.value_and_grad(total, has_aux=True)(u)
            g = jnp.where((alive & jnp.isfinite(loss))[:, None] & jnp.isfinite(g), g, 0.0)
            updates, new_state = optimizer.update(g, opt_state, u)
            u_new = jnp.where(alive[:, None], optax.apply_updates(u, updates), u)
            drift = policy.drift(space.flat_constrained(u), space.flat_constrained(u_rec))
            return u_new, new_state, loss, policy.error_ratio(err), drift

        self._evaluate = jax.jit(evaluate)
        self.ragged = False  # set by `init` from the driver the replay runs on
        self.constrained = jax.jit(space.from_unconstrained)
        self.init_optimizer = jax.jit(optimizer.init)

    def evaluate(self, s: FitState) -> _Eval:
        """Loss, gradient and Optax update at ``s`` (one compiled call)."""
        u, opt, loss, err, drift = self._evaluate(jnp.asarray(s.u), s.opt_state, s.mesh,
                                                  jnp.asarray(s.u_rec), jnp.asarray(s.alive))
        return _Eval(np.array(u), opt, np.asarray(loss), np.asarray(err), np.asarray(drift))

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
        """The meshes of ``s`` (host and device) with rows ``rows`` replaced by host mesh
        ``sub``, as `FitState` fields."""
        if not len(rows):
            return dict(mesh=s.mesh, mesh_host=s.mesh_host)
        host = self.sized(s.mesh_host.scatter(rows, sub), s.mesh_host.capacity)
        return dict(mesh=host.to_device(), mesh_host=host)

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
        ok = sub.status == 0
        alive, u, u_rec = s.alive.copy(), s.u.copy(), s.u_rec.copy()
        alive[rows[~ok]] = False
        u[rows[~ok]] = s.u_rec[rows[~ok]]
        u_rec[rows[ok]] = s.u[rows[ok]]
        return s._replace(**self.merge(s, rows[ok], sub.select(ok)), alive=alive,
                          u=u, u_rec=u_rec, **self._counted(s, rows))

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
        s = FitState(u=u, u_rec=u.copy(), opt_state=self.init_optimizer(jnp.asarray(u)),
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
            u[rows] = prior_draws(self.problem.model, self.problem.space, kd, n)[rows]
            sub, rows = self.record(u, rows)
            s = s._replace(u=u, **self.merge(s, rows, sub),
                           n_redrawn=s.n_redrawn + len(rows), **self._counted(s, rows))
        if bad.all():
            _no_start_left(bad, np.asarray(s.mesh.status) != 0, max_redraws, can_redraw)
        return s._replace(alive=~bad, u_rec=s.u.copy(),
                          opt_state=self.init_optimizer(jnp.asarray(s.u)))

    def step(self, s: FitState) -> FitState:
        """One optimisation step: the pending re-records, the loss and gradient on the
        meshes (redone at once on fresh meshes where `MeshPolicy.redo` says so), the
        update, and the policy's verdict for the next step."""
        if s.pending.any():
            s = self.rerecord(s, s.pending, s.urgency)
        e = self.evaluate(s)
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
        x = self.constrained(jnp.asarray(s.u))
        history = np.stack(s.history) if s.history else np.zeros((0, n))
        return FitResult.of_starts(
            x, losses, loss_history=history, n_records=s.n_records,
            n_records_per_start=s.n_records_per_start, n_grad_evals=s.n_grad_evals,
            wall_time=wall_time, status=status, objective=self.objective,
            n_steps=s.step, max_error_ratio=s.max_error_ratio, n_redrawn=s.n_redrawn)


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


_GLOBAL_OPTIONS = ("max_generations", "local")
"""The global search's own keyword arguments `fit` passes on (``method="global"``)."""


_OPTAX_ONLY = ("optimizer", "callback", "rerecord", "drift_tol", "error_ratio_max",
               "record_tol_factor", "jacobian", "max_redraws")
"""`fit`'s arguments of the Optax fit, which a PEtab problem's fit does not use."""


def _fit_defaults() -> dict:
    import inspect

    return {k: p.default for k, p in inspect.signature(fit).parameters.items()
            if k not in ("model", "data", "options")}


def _refuse_optax_args(given: dict) -> None:
    """``ValueError`` naming an argument of the Optax fit given to a PEtab problem's fit
    with a value other than its default (it would be ignored)."""
    defaults = _fit_defaults()
    for name, v in given.items():
        if v is not defaults[name] and v != defaults[name]:
            raise ValueError(f"`{name}` does not apply to a PEtab problem (it is fitted "
                             "by a multistart least-squares optimiser or a global search; "
                             f"got {name}={v!r})")


def _refuse_options(options: Mapping, what: str, extra: tuple[str, ...],
                    petab: bool = False) -> None:
    """``ValueError`` naming the keyword arguments in ``options`` that `fit` does not take
    for ``what`` (its own arguments, but the Optax fit's for a PEtab problem, and
    ``extra``), listing those it takes."""
    if options:
        own = [p for p in _fit_defaults() if not (petab and p in _OPTAX_ONLY)]
        raise ValueError(
            f"inference.fit: unknown keyword argument(s) {sorted(options)} for {what}; "
            f"fit takes {own + list(extra)}")


def _checked_petab_args(method, steps, n_starts, options: dict) -> tuple[int, str]:
    """``ValueError`` naming the first bad argument of `fit` for a PEtab problem (the
    names the user wrote: ``steps`` is the LM's ``max_iter`` and the global search's
    ``max_generations``); ``(steps, local)`` with the global search's own options
    (``max_generations``, ``local``) settled."""
    if method not in ("auto", "lm", "lbfgs", "global"):
        raise ValueError(f"`method` must be 'auto', 'lm', 'lbfgs' or 'global', got "
                         f"{method!r}")
    options = dict(options)
    if method == "global":
        _refuse_options({k: v for k, v in options.items() if k not in _GLOBAL_OPTIONS},
                        "method='global'", _GLOBAL_OPTIONS, petab=True)
        if "max_generations" in options:
            gens = options.pop("max_generations")
            if steps not in (1000, gens):  # 1000: `steps`' default
                raise ValueError(f"`steps`={steps!r} and `max_generations`={gens!r}: both "
                                 "count the global search's generations; pass one")
            name, steps = "max_generations", gens
        else:
            name = "steps"
    else:
        _refuse_options(options, f"a PEtab problem with method={method!r}", (),
                        petab=True)
        name = "steps"
    for arg, v in ((name, steps), ("n_starts", n_starts)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"`{arg}` must be an int >= 1, got {v!r}")
    local = options.get("local", "auto")
    if local not in ("auto", "lm", "lbfgs"):
        raise ValueError(f"`local` must be 'auto', 'lm' or 'lbfgs', got {local!r}")
    return int(steps), local


def _checked_fit_args(objective, steps, n_starts, checkpoint_every, record_tol_factor,
                      max_redraws, optimizer, jacobian):
    """``ValueError`` naming the first bad argument of `fit`; the optimizer (default Adam)."""
    if objective not in ("map", "mle"):
        raise ValueError(f"`objective` must be 'map' or 'mle', got {objective!r}")
    if not isinstance(jacobian, (bool, np.bool_)):
        raise ValueError(f"`jacobian` must be True or False, got {jacobian!r}")
    for name, v, lo in (("steps", steps, 0), ("n_starts", n_starts, 1),
                        ("checkpoint_every", checkpoint_every, 1),
                        ("max_redraws", max_redraws, 0)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            raise ValueError(f"`{name}` must be an int >= {lo}, got {v!r}")
    if not (isinstance(record_tol_factor, (int, float, np.number))
            and 0 < record_tol_factor <= 1):
        raise ValueError(f"`record_tol_factor` must lie in (0, 1], got {record_tol_factor}")
    if optimizer is None:
        return optax.adam(1e-2)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError("`optimizer` must be an Optax GradientTransformation (with init and "
                         f"update), e.g. optax.adam(1e-2); got {optimizer!r}")
    return optimizer


def fit(
    model, data=None, init: Mapping[str, Any] | None = None, *,
    optimizer: optax.GradientTransformation | None = None, steps: int = 1000,
    n_starts: int = 1, objective: str = "map", rerecord: str = "auto",
    drift_tol: float = 0.1, error_ratio_max: float = 1.0, seed: int = 0,
    checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 100,
    progress: bool | None = None, rtol: float | None = None,
    atol: float | None = None, solver=None, max_steps: int | None = None,
    record_tol_factor: float = 0.5, jacobian: bool = False, max_redraws: int = 10,
    callback: Callable[[int, dict], Any] | None = None, method: str = "auto",
    max_time: float | None = None, **options,
) -> FitResult:
    """Fit ``model`` to ``data`` by gradient descent (Optax) from one or many starts.

    The starts form one ensemble recorded by one ``gs.record``; the loss gradient comes
    from replaying the recorded mesh (``gs.replay``), re-recorded only where the parameters
    drift (see the module docstring).

    A `models.PetabProblem` (which carries its data: ``data=None``) is fitted by a
    multistart local optimiser instead: starts by Latin hypercube inside the bounds on the
    parameter scale, all starts and conditions one ensemble, Levenberg–Marquardt on the
    noise-weighted residuals where every noise model is normal (Fisher scoring when noise
    parameters are estimated), SciPy's L-BFGS-B otherwise; ``steps`` caps the iterations
    per start, ``objective="map"`` adds the priors the parameter table gives, and the
    result's starts are sorted by final objective (`FitResult.plot_waterfall`). With
    ``method="global"`` it is fitted by a global search instead (where bounds span many
    decades and local starts stall far from the optimum): CMA-ES restarts with a growing
    population, every generation one ensemble, each run's best polished by the
    Levenberg–Marquardt, and the ``n_starts`` best distinct points found refined by it at
    the end (``inference/petab/_global.py``).

    Args:
        model: a `models.ODEModel` (or a NumPyro program, a population model, a
            `models.PetabProblem`); data: a `models.Dataset` (``None`` for a PEtab problem).
        init: ``None`` (starts drawn from the priors), a parameter dict (the first start;
            others are prior draws), or an ensemble dict (leaves with leading axis ``n``).
            For a PEtab problem: a dict by parameter id, a vector or rows on the parameter
            scale (the first starts; the others Latin hypercube draws).
        optimizer: an Optax transformation of the flat unconstrained vector (default
            ``optax.adam(1e-2)``).
        steps: total optimisation steps (a resumed fit continues up to this number); for
            a PEtab problem the LM's iterations per start, or with ``method="global"`` the
            search's generations (all its runs together).
        n_starts: number of starts (``method="global"``: the best distinct points found
            that are refined at the end, the rows of the result).
        objective: ``"map"`` (log prior + log likelihood; the constrained-space mode unless
            ``jacobian=True``) or ``"mle"`` (log likelihood only).
        rerecord, drift_tol, error_ratio_max, record_tol_factor: the mesh policy
            (`MeshPolicy`): ``"auto"`` re-records a start whose parameters moved by more
            than ``drift_tol`` (relative) since its record or whose replay ``error_ratio``
            (units of ``rtol``/``atol``) exceeds ``error_ratio_max``; ``"always"`` every
            step (the plain adaptive-solve gradient); ``"never"`` keeps one mesh. Meshes
            are recorded at ``record_tol_factor`` times ``rtol``/``atol``.
        seed: seeds the prior draws.
        checkpoint: a file path. The fit state is saved there atomically every
            ``checkpoint_every`` steps, at the end and when an exception (e.g.
            ``KeyboardInterrupt``) stops the fit; a later call with the same path resumes
            from it and ends at the same result as an uninterrupted run. A path that
            cannot be written is a ``ValueError`` before the fit starts; a save that fails
            later (a full disk) is a ``RuntimeWarning`` and the fit goes on. For a PEtab
            problem only with ``method="global"`` (the search's state, saved every
            ``checkpoint_every`` generations and after each polish).
        progress: ``None`` (default): a tqdm bar when stderr is a terminal, else a plain
            line on stderr now and then (steps, seconds, best loss); ``True``: the
            bar; ``False``: nothing.
        rtol, atol, solver, max_steps: the ODE solve (``None``: ``rtol = 1e-6``,
            ``atol = 1e-8``, the model's solver; ``max_steps=None``: 4,096 steps, or 16,384
            for the ode sites of a population model or program; a PEtab problem's own
            settings for one).
        jacobian: add the unconstrained transform's log-Jacobian to the MAP objective (the
            mode in unconstrained space, as a Laplace approximation there would use).
        max_redraws: rounds of re-drawing starts whose first record fails.
        callback: ``callback(step, info)`` after every step (``info`` has ``losses``,
            ``params``, ``n_records``); returning ``True`` stops the fit early.
        method: PEtab problems only: ``"auto"`` (the Levenberg–Marquardt multistart where
            every noise model is normal, else L-BFGS-B), ``"lm"``, ``"lbfgs"``, or
            ``"global"`` (the global search above; ``FitResult.method`` says which ran).
        max_time: PEtab problems with ``method="global"`` only: seconds after which the
            search stops (``None``: none; a resumed search counts its earlier seconds);
            the final refinement runs after it.
        **options: PEtab problems with ``method="global"`` only, the global search's own:
            ``max_generations`` (another name for ``steps`` there) and ``local`` (its
            polisher: ``"lm"``, ``"lbfgs"`` or ``"auto"``, the LM where every noise model
            is normal). Any other keyword is a ``ValueError`` listing those `fit` takes.

    Returns:
        `FitResult`.

    Example:
        >>> res = inference.fit(models.lynx_hare(), models.load_dataset("lynx_hare"),
        ...                     n_starts=16, steps=1000)
        >>> res.params["theta"], res.n_records, res.n_grad_evals
        >>> res = inference.fit(models.load_petab("Boehm_JProteomeRes2014"), n_starts=20)
        >>> res.losses, res.params                 # sorted objectives; best by parameter id
        >>> res = inference.fit(models.load_petab("Fujita_SciSignal2010"),
        ...                     method="global", max_time=1800, n_starts=5, seed=1)
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"`seed` must be an int, got {seed!r}")
    if is_petab(model):
        # a problem of noise-weighted residuals: the least-squares multistart, or the
        # global search (`fit_petab` refuses `checkpoint` and `max_time` for the former)
        _refuse_optax_args(dict(
            optimizer=optimizer, callback=callback, rerecord=rerecord, drift_tol=drift_tol,
            error_ratio_max=error_ratio_max, record_tol_factor=record_tol_factor,
            jacobian=jacobian, max_redraws=max_redraws))
        steps, local = _checked_petab_args(method, steps, n_starts, options)
        problem = problem_of(model, data, solver=solver, rtol=rtol, atol=atol,
                             max_steps=max_steps)
        return fit_petab(problem.petab, init=init, n_starts=n_starts, seed=seed,
                         objective=objective, max_iter=steps, progress=progress,
                         method=method, max_time=max_time, checkpoint=checkpoint,
                         checkpoint_every=checkpoint_every, local=local)
    _refuse_options(options, f"`model` of type {type(model).__name__} (fitted by Optax; "
                    f"{list(_GLOBAL_OPTIONS)} are a PEtab global search's)", ())
    for name, v, default in (("method", method, "auto"), ("max_time", max_time, None)):
        if v != default:
            raise ValueError(f"`{name}` applies to PEtab problems only (got {name}={v!r}); "
                             f"a {type(model).__name__} is fitted by Optax (`optimizer`, `steps`)")
    optimizer = _checked_fit_args(objective, steps, n_starts, checkpoint_every,
                                  record_tol_factor, max_redraws, optimizer, jacobian)
    _checkpoint.check_path(checkpoint)
    policy = MeshPolicy.checked("fit", rerecord, drift_tol=drift_tol,
                                error_ratio_max=error_ratio_max,
                                record_tol_factor=record_tol_factor)
    t_start = time.perf_counter()
    gs.ensure_compilation_cache()
    problem = problem_of(model, data, solver=solver, rtol=rtol, atol=atol,
                         max_steps=max_steps)
    kernel = FitKernel(problem, policy, optimizer, objective, jacobian)
    # The optimizer is identified by the structure of its state (adam vs sgd, chained
    # transforms), not its hyperparameters: resuming with another learning rate is allowed.
    opt_structure = str(jax.tree_util.tree_structure(jax.eval_shape(
        optimizer.init, jax.ShapeDtypeStruct((1, problem.space.dim), jnp.result_type(float)))))
    fingerprint = _checkpoint.fingerprint(
        problem, policy, seed=seed, objective=objective, jacobian=jacobian, n_starts=n_starts,
        init=_checkpoint.digest(None if init is None else dict(init)), optimizer=opt_structure)
    state = _checkpoint.load(checkpoint, fingerprint, "fit")
    if state is None:
        key, k0 = jax.random.split(jax.random.PRNGKey(seed))
        u0 = fit_starts(problem.model, problem.space, init, int(n_starts), k0)
        state = kernel.init(u0, key, max_redraws=max_redraws,
                            can_redraw=not (init is not None and len(u0) == 1))
    else:
        state = state._replace(opt_state=_checkpoint.to_device(state.opt_state),
                               mesh=state.mesh.to_device())
        kernel.ragged = problem.ragged_replay(state.u[0], state.mesh_host.row(0))
    elapsed = state.elapsed

    def save(s):
        if checkpoint is not None:
            _checkpoint.save_or_warn(checkpoint, fingerprint,
                                     s._replace(elapsed=elapsed + time.perf_counter() - t_start))

    bar = progress_bar(progress, total=steps, done=state.step, desc=f"fit {problem.model.name}")
    try:
        while state.step < steps:
            state = kernel.step(state)
            bar.update(1)
            if state.step % 10 == 0 or state.step == steps:
                bar.set_postfix(**kernel.summary(state))
            if state.step % checkpoint_every == 0 or state.step == steps:
                save(state)
            if callback is not None and callback(state.step, kernel.info(state)) is True:
                break
    except BaseException:
        save(state)
        raise
    finally:
        bar.close()
    return kernel.finish(state, elapsed + time.perf_counter() - t_start)
