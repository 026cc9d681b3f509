"""Gradient-based fits (MAP / maximum likelihood) of many starts at once, reusing meshes.

How `fit` works:

1. The ``n_starts`` starting points form ONE ensemble: every parameter leaf gets a leading
   axis ``n`` and a single ``gs.record`` call records a mesh for all of them.
2. Each optimisation step evaluates the loss and its gradient by replaying the recorded
   meshes (``gs.replay``; one jitted function, compiled once per mesh capacity, which is
   rounded up to a power of two so it rarely changes), then applies the Optax update in the
   same compiled call. The optimisation variable is the flat unconstrained vector of
   `inference.ParamSpace`, so positive parameters stay positive.
3. Each step also measures, per start, the parameter drift since its mesh was recorded
   (relative, in constrained space) and the replay's ``error_ratio`` (in units of
   ``rtol``/``atol``: ``> 1`` means the controller would no longer accept that mesh at the
   requested tolerance). A start whose drift exceeds ``drift_tol`` or whose error ratio
   exceeds ``error_ratio_max`` is re-recorded at its updated parameters, so the next step
   runs on a fresh mesh (the step that detected it used a mesh at most one step past the
   bound; a start whose replay is not finite or whose error ratio exceeds
   ``4 * error_ratio_max`` is re-recorded at once and its step recomputed, so no gradient
   is taken on a mesh worse than that). With ``rerecord="always"`` every start is re-recorded every step: the
   plain adaptive-solve gradient, as ``gs.solve`` gives. Meshes are recorded
   ``record_tol_factor`` (0.5) times tighter than requested, so a fresh mesh starts at
   ``error_ratio <= 0.5`` instead of just under 1. Only the triggering starts are
   re-recorded, as a sub-ensemble padded to one of a few fixed sizes (``n, n/4, n/16, ...``,
   so few record programs are compiled); the padding slots re-record, for free, the starts
   closest to triggering. The other starts keep their meshes.
4. Starts whose initial record fails (or whose initial loss is not finite) are re-drawn from
   the prior; a start whose re-record fails later is frozen at its last good parameters and
   reported with ``loss = inf`` (``FitResult.status == 1``).
5. At the end every start is re-recorded at its final parameters and its loss evaluated on
   that fresh mesh: ``FitResult.losses`` are losses of the adaptive solution.

Between re-records the optimiser minimises the fixed-mesh (fixed-step) discretisation of the
loss, whose gradient is exact for it; the re-record rule keeps that discretisation within the
solver's tolerance of the adaptive one.

`fit_least_squares` solves the least-squares problem (log-residuals for LogNormal
noise) with Optimistix's Levenberg–Marquardt on forward-mode Jacobians of the replay,
re-recording between LM solves until the mesh holds at the solution.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._density import ParamSpace, SolveOptions, _Problem, checked_init, digest, observe

__all__ = ["fit", "fit_least_squares", "FitResult"]

_CKPT_VERSION = 2
_FAILED = 1


@dataclasses.dataclass(frozen=True, repr=False)
class FitResult:
    """Result of `fit` / `fit_least_squares`.

    Attributes:
        params: the best start's constrained parameter dict.
        all_params: every start's parameters (leaves with a leading axis ``n_starts``).
        losses: ``(n_starts,)`` final loss of each start (negative log posterior for
            ``"map"``, negative log likelihood for ``"mle"``, half the residual sum of
            squares for least squares), evaluated on a fresh adaptive solve; ``inf`` for
            failed starts.
        loss_history: ``(steps, n_starts)`` loss at each step (on the mesh in use).
        n_records: number of (ensemble) ``gs.record`` calls.
        n_records_per_start: ``(n_starts,)`` how often each start was re-recorded.
        n_grad_evals: number of (ensemble) loss-and-gradient evaluations.
        wall_time: seconds (summed over resumed runs).
        best_index: index of the best start.
        status: ``(n_starts,)`` 0 ok, 1 failed (its solve failed; frozen, loss ``inf``).
        objective: ``"map"``, ``"mle"`` or ``"least_squares"``.
        n_steps: optimisation steps done.
        max_error_ratio: ``(n_starts,)`` largest replay ``error_ratio`` met per start (in
            units of ``rtol``/``atol``).
        n_redrawn: starts re-drawn from the prior because their first solve failed.

    Example:
        >>> res = inference.fit(model, data, n_starts=8, steps=500)
        >>> res.params                       # the best start's parameter dict
        >>> res.losses.shape                 # (8,)
        >>> res.loss_history.shape           # (500, 8)
        >>> res.n_records, res.n_grad_evals  # meshes recorded vs gradients taken
    """

    params: dict
    all_params: dict
    losses: np.ndarray
    loss_history: np.ndarray
    n_records: int
    n_records_per_start: np.ndarray
    n_grad_evals: int
    wall_time: float
    best_index: int
    status: np.ndarray
    objective: str
    n_steps: int
    max_error_ratio: np.ndarray
    n_redrawn: int = 0

    @property
    def loss(self) -> float:
        """The best start's final loss."""
        return float(self.losses[self.best_index])

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={np.round(np.asarray(v), 5).tolist()}" for k, v in self.params.items())
        n_failed = int(np.sum(self.status != 0))
        return (
            f"FitResult(objective={self.objective!r}, loss={self.loss:.6g}, params={{{ps}}}, "
            f"n_starts={len(self.losses)}, failed={n_failed}, best_index={self.best_index}, "
            f"n_steps={self.n_steps}, n_records={self.n_records}, "
            f"n_grad_evals={self.n_grad_evals}, wall_time={self.wall_time:.2f}s)"
        )


# ----------------------------------------------------------------------------- mesh helpers

_PER_TRAJ = ("times", "n_steps", "n_rejected", "status", "save_index", "ts", "dt_next",
             "y_last", "y0")


def _mesh_np(mesh):
    """A host (numpy) copy of a mesh, its padding slots filled (a mesh recorded under
    ``jit`` leaves them unspecified): merging and trimming happen there, never as eager JAX
    ops (whose varying shapes would each compile a program)."""
    return jax.tree_util.tree_map(np.asarray, mesh).padded()


def _trim_np(mesh):
    used = max(1, int(np.max(mesh.n_steps)) if mesh.n_steps.size else 1)
    cap = max(16, 1 << (used - 1).bit_length())
    if cap >= mesh.capacity:
        return mesh
    return eqx.tree_at(lambda m: m.times, mesh, mesh.times[..., : cap + 1])


def _pad_np(mesh, cap: int):
    extra = cap - mesh.capacity
    if extra <= 0:
        return mesh
    t = mesh.times
    times = np.concatenate([t, np.repeat(t[..., -1:], extra, axis=-1)], axis=-1)
    return eqx.tree_at(lambda m: m.times, mesh, times)


def _scatter_mesh(old, new, idx: np.ndarray, take: np.ndarray):
    """Host meshes: rows ``idx[take]`` of ``old`` replaced by rows ``take`` of ``new``."""
    cap = max(old.capacity, new.capacity)
    old, new = _pad_np(old, cap), _pad_np(new, cap)
    rows_new = np.nonzero(take)[0]
    rows_old = idx[take]

    def put(a, b):
        a = np.array(a, copy=True)
        a[rows_old] = b[rows_new]
        return a

    vals = tuple(put(getattr(old, k), getattr(new, k)) for k in _PER_TRAJ)
    params = jax.tree_util.tree_map(put, old.params, new.params)
    out = eqx.tree_at(lambda m: tuple(getattr(m, k) for k in _PER_TRAJ), old, vals)
    out = eqx.tree_at(lambda m: m.params, out, params)
    return _trim_np(out)


def _buckets(n: int, smallest: int = 4) -> list[int]:
    """Sub-ensemble sizes for partial re-records: n, n/4, n/16, ... (>= smallest)."""
    out = [n]
    m = n // 4
    while m >= smallest:
        out.append(m)
        m //= 4
    return sorted(out)


def _to_numpy(tree):
    return jax.tree_util.tree_map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def _to_jax(tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree)


def _save_atomic(path: str, obj: Any) -> None:
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _load(path: str) -> Any:
    with open(path, "rb") as fh:
        return pickle.load(fh)


def _load_checkpoint(path, fingerprint: dict, what: str) -> Any:
    """Saved state at ``path`` (``None`` if absent); refuse one saved with other settings."""
    if path is None or not os.path.exists(path):
        return None
    ckpt = _load(path)
    got = ckpt.get("fingerprint", {})
    diff = {k: (got.get(k), v) for k, v in fingerprint.items() if got.get(k) != v}
    if diff:
        raise ValueError(
            f"checkpoint {os.fspath(path)!r} belongs to a different {what} "
            f"(saved vs requested: {diff}); remove it or pass another path."
        )
    return ckpt


def _want_progress(progress) -> bool:
    if progress is None:
        try:
            return sys.stderr.isatty()
        except Exception:
            return False
    return bool(progress)


# ----------------------------------------------------------------------------- the engine


class _Engine:
    """Compiled pieces of one fit: record (sub-)ensembles, and a fused loss/grad/update.

    Host state (numpy): the unconstrained parameters ``u (n, D)``, the parameters each
    start's mesh was recorded at, the alive mask and a host copy of the mesh. One jitted
    ``step`` (compiled once per mesh capacity) does loss, gradient and Optax update.
    """

    def __init__(self, prob: _Problem, n: int, optimizer, objective: str, jacobian: bool,
                 tol_factor: float):
        self.prob = prob
        self.space: ParamSpace = prob.space
        self.n = n
        self.tol_factor = float(tol_factor)
        space = self.space

        def per_start_loss(u, mesh):
            x = space.from_unconstrained(u)
            sol = prob.replay(mesh, x, n)
            ll = prob.log_lik_from_states(x, sol.ys, n)
            if objective == "map":
                lp = prob.log_prior(x)
                if jacobian:
                    lp = lp + space.log_abs_det_jacobian(u)
                ll = ll + lp
            loss = -ll
            loss = jnp.where(jnp.isfinite(loss), loss, jnp.inf)
            return loss, sol.error_ratio

        def flat_constrained(u):
            x = space.from_unconstrained(u)
            return jnp.concatenate(
                [jnp.reshape(x[e.name], (u.shape[0], -1)) for e in space.entries], axis=-1
            )

        def step(u, opt_state, mesh, u_rec, alive):
            def total(u):
                loss, err = per_start_loss(u, mesh)
                return jnp.sum(jnp.where(jnp.isfinite(loss), loss, 0.0)), (loss, err)

            (_, (loss, err)), g = jax.value_and_grad(total, has_aux=True)(u)
            okrow = alive & jnp.isfinite(loss)
            g = jnp.where(okrow[:, None] & jnp.isfinite(g), g, 0.0)
            updates, new_state = optimizer.update(g, opt_state, u)
            u_new = jnp.where(alive[:, None], optax.apply_updates(u, updates), u)
            xc, xr = flat_constrained(u), flat_constrained(u_rec)
            drift = jnp.max(jnp.abs(xc - xr) / jnp.maximum(jnp.abs(xr), 1e-12), axis=-1)
            # error ratio in units of the user's tolerances (the mesh is recorded tighter)
            return u_new, new_state, loss, err * self.tol_factor, drift

        self._step = jax.jit(step)
        self._from_u = jax.jit(space.from_unconstrained)
        self._init_opt = jax.jit(optimizer.init)

    def record_rows(self, u: np.ndarray, rows: np.ndarray, fill: np.ndarray | None = None):
        """Record the starts ``rows`` as one sub-ensemble padded to a bucket size.

        The padding slots are filled with the starts listed in ``fill`` (most urgent first;
        re-recording them costs nothing extra), then with repeats of ``rows[0]``. Returns
        ``(host_mesh, idx, take)``: ``idx`` the padded row indices recorded, ``take`` marks
        the distinct starts (the first ``len(rows) + len(filled)`` slots).
        """
        k = len(rows)
        size = next(b for b in _buckets(self.n) if b >= k)
        extra = np.zeros(0, rows.dtype) if fill is None else np.asarray(fill, rows.dtype)
        extra = extra[~np.isin(extra, rows)][: size - k]
        k2 = k + len(extra)
        idx = np.concatenate([rows, extra, np.full(size - k2, rows[0], dtype=rows.dtype)])
        take = np.zeros(size, bool)
        take[:k2] = True
        x = self._from_u(jnp.asarray(u[idx]))
        o = self.prob.opts
        mesh = self.prob.record(x, size, rtol=o.rtol * self.tol_factor,
                                atol=o.atol * self.tol_factor)
        return _mesh_np(mesh), idx, take

    def step(self, u, opt_state, mesh_d, u_rec, alive):
        u_new, st, loss, err, drift = self._step(
            jnp.asarray(u), opt_state, mesh_d, jnp.asarray(u_rec), jnp.asarray(alive)
        )
        return (np.array(u_new), st, np.asarray(loss), np.asarray(err), np.asarray(drift))


def _device(mesh_h):
    return jax.tree_util.tree_map(jnp.asarray, mesh_h)


def _initial_u(model, space: ParamSpace, init, n_starts: int, key) -> tuple[np.ndarray, int]:
    """Unconstrained starting points ``(n, D)`` and the number of starts."""
    if init is None:
        draws = model.sample_prior(key, n_starts)
        return np.asarray(space.to_unconstrained(draws)), n_starts
    init, n_init = checked_init(model, space, init)
    if n_init is None:
        u0 = np.asarray(space.to_unconstrained(init))[None]
        if n_starts > 1:
            draws = np.asarray(space.to_unconstrained(model.sample_prior(key, n_starts)))
            u0 = np.concatenate([u0, draws[1:]], axis=0)
        return u0, max(1, n_starts)
    if n_starts not in (1, n_init):
        raise ValueError(
            f"`init` is an ensemble of {n_init} starts but n_starts={n_starts}; pass "
            f"n_starts={n_init} (or 1)."
        )
    return np.asarray(space.to_unconstrained(init)), n_init


def fit(
    model,
    data,
    init: Mapping[str, Any] | None = None,
    *,
    optimizer: optax.GradientTransformation | None = None,
    steps: int = 1000,
    n_starts: int = 1,
    objective: str = "map",
    rerecord: str = "auto",
    drift_tol: float = 0.1,
    error_ratio_max: float = 1.0,
    seed: int = 0,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 100,
    progress: bool | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    solver=None,
    max_steps: int = 4096,
    record_tol_factor: float = 0.5,
    jacobian: bool = False,
    max_redraws: int = 10,
    callback: Callable[[int, dict], Any] | None = None,
) -> FitResult:
    """Fit ``model`` to ``data`` by gradient descent (Optax) from one or many starts.

    The starts form one ensemble recorded by one ``gs.record``; the loss gradient comes
    from replaying the recorded mesh (``gs.replay``), re-recorded only where the parameters
    drift (see the module docstring).

    Args:
        model: a `models.ODEModel`.
        data: a `models.Dataset`.
        init: ``None`` (starts drawn from the priors), a parameter dict (the first start;
            others are prior draws), or an ensemble dict (leaves with leading axis ``n``).
        optimizer: an Optax transformation on the flat unconstrained vector (default
            ``optax.adam(1e-2)``).
        steps: total optimisation steps (a resumed fit continues up to this number).
        n_starts: number of starts.
        objective: ``"map"`` (log prior + log likelihood; the constrained-space mode unless
            ``jacobian=True``) or ``"mle"`` (log likelihood only).
        rerecord: ``"auto"`` (on drift / error ratio), ``"always"`` (every step: the plain
            adaptive-solve gradient) or ``"never"`` (one mesh throughout).
        drift_tol: relative parameter change since a start's last record that triggers a
            re-record.
        error_ratio_max: re-record a start whose replay ``error_ratio`` (in units of
            ``rtol``/``atol``) exceeds this.
        seed: seeds the prior draws.
        checkpoint: a file path. The fit state is saved there atomically every
            ``checkpoint_every`` steps, at the end and when an exception (e.g.
            ``KeyboardInterrupt``) stops the fit; a later call with the same path resumes
            from it and ends at the same result as an uninterrupted run.
        progress: show a tqdm bar (default: only when stderr is a terminal).
        rtol, atol, solver, max_steps: the ODE solve (``solver=None``: the model's).
        record_tol_factor: meshes are recorded at ``rtol * record_tol_factor``,
            ``atol * record_tol_factor``, so a fresh mesh starts at ``error_ratio <=
            record_tol_factor`` and parameters can move before it must be re-recorded
            (a mesh recorded at the tolerance itself has steps accepted at ratio ~0.99 and
            would trigger at once).
        jacobian: add the unconstrained transform's log-Jacobian to the MAP objective (the
            mode in unconstrained space, as a Laplace approximation there would use).
        max_redraws: rounds of re-drawing starts whose first record fails.
        callback: ``callback(step, info)`` after every step (``info`` has ``losses``,
            ``params``, ``n_records``); returning ``True`` stops the fit early.

    Returns:
        `FitResult`.

    Example:
        >>> res = inference.fit(models.lynx_hare(), models.load_dataset("lynx_hare"),
        ...                     n_starts=16, steps=1000)
        >>> res.params["theta"], res.n_records, res.n_grad_evals
    """
    if objective not in ("map", "mle"):
        raise ValueError(f"`objective` must be 'map' or 'mle', got {objective!r}")
    if rerecord not in ("auto", "always", "never"):
        raise ValueError(f"`rerecord` must be 'auto', 'always' or 'never', got {rerecord!r}")
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"`steps` must be a non-negative int, got {steps!r}")
    if not isinstance(n_starts, (int, np.integer)) or n_starts < 1:
        raise ValueError(f"`n_starts` must be a positive int, got {n_starts!r}")
    if checkpoint_every < 1:
        raise ValueError(f"`checkpoint_every` must be >= 1, got {checkpoint_every}")
    if not 0 < record_tol_factor <= 1:
        raise ValueError(f"`record_tol_factor` must lie in (0, 1], got {record_tol_factor}")
    for name, v in (("drift_tol", drift_tol), ("error_ratio_max", error_ratio_max)):
        if not (isinstance(v, (int, float, np.number)) and v > 0):
            raise ValueError(f"`{name}` must be a positive number, got {v!r}")
    if not isinstance(max_redraws, (int, np.integer)) or max_redraws < 0:
        raise ValueError(f"`max_redraws` must be a non-negative int, got {max_redraws!r}")
    if optimizer is None:
        optimizer = optax.adam(1e-2)
    elif not (callable(getattr(optimizer, "init", None))
              and callable(getattr(optimizer, "update", None))):
        raise ValueError(
            "`optimizer` must be an Optax GradientTransformation (with init and update), "
            f"e.g. optax.adam(1e-2); got {optimizer!r}"
        )
    t_start = time.perf_counter()
    prob = _Problem(model, data, SolveOptions(solver, rtol, atol, max_steps))
    space = prob.space

    # The optimizer is identified by the structure of its state (adam vs sgd, chained
    # transforms), not its hyperparameters: resuming with another learning rate is allowed.
    opt_structure = str(jax.tree_util.tree_structure(jax.eval_shape(
        optimizer.init, jax.ShapeDtypeStruct((1, space.dim), jnp.result_type(float)))))
    fingerprint = dict(
        version=_CKPT_VERSION, model=model.name, dim=space.dim, objective=objective,
        rerecord=rerecord, drift_tol=float(drift_tol), error_ratio_max=float(error_ratio_max),
        seed=int(seed), jacobian=bool(jacobian), rtol=float(rtol), atol=float(atol),
        record_tol_factor=float(record_tol_factor), n_starts=int(n_starts),
        init=digest(None if init is None else dict(init)), optimizer=opt_structure,
        **prob.fingerprint(),
    )
    ckpt = _load_checkpoint(checkpoint, fingerprint, "fit")

    key = jax.random.PRNGKey(seed)
    if ckpt is None:
        key, k0 = jax.random.split(key)
        u, n = _initial_u(model, space, init, int(n_starts), k0)
        u = np.array(u, dtype=np.result_type(float), copy=True)
    else:
        n = int(ckpt["n"])
        u = np.asarray(ckpt["u"]).copy()
    eng = _Engine(prob, n, optimizer, objective, jacobian, record_tol_factor)
    all_rows = np.arange(n)

    if ckpt is None:
        # --- first record, re-drawing failed starts -------------------------------------
        mesh_h, _, _ = eng.record_rows(u, all_rows)
        mesh_d = _device(mesh_h)
        n_records = 1
        per_start = np.ones(n, np.int64)
        alive = np.ones(n, bool)
        opt_state = eng._init_opt(jnp.asarray(u))
        n_grad = 0
        can_redraw = not (init is not None and n == 1)
        n_redrawn = 0
        for rnd in range(max_redraws + 1):
            _, _, loss, _, _ = eng.step(u, opt_state, mesh_d, u, alive)
            n_grad += 1
            bad = ~np.isfinite(loss) | (mesh_h.status != 0)
            if not bad.any() or rnd == max_redraws or not can_redraw:
                break
            key, kd = jax.random.split(key)
            draws = np.asarray(space.to_unconstrained(model.sample_prior(kd, n)))
            rows = np.nonzero(bad)[0]
            n_redrawn += len(rows)
            u[rows] = draws[rows]
            sub, idx, take = eng.record_rows(u, rows)
            mesh_h = _scatter_mesh(mesh_h, sub, idx, take)
            mesh_d = _device(mesh_h)
            n_records += 1
            per_start[rows] += 1
        bad = ~np.isfinite(loss) | (mesh_h.status != 0)
        alive &= ~bad
        if not alive.any():
            tried = (f"after {max_redraws} rounds of re-drawing from the priors" if can_redraw
                     else "(a single given `init` is not re-drawn)")
            unsolved = int(np.sum(mesh_h.status != 0))
            if unsolved == n:
                why = (f"every start failed to solve {tried}; check the priors or `init`, try "
                       "a stiff solver such as gs.Rodas5P(), a looser rtol or a larger "
                       "max_steps.")
            else:
                why = (f"every start has a non-finite loss {tried}, though {n - unsolved} of "
                       f"{n} solved: the likelihood is -inf or NaN there. Check the data "
                       "against the noise model (e.g. LogNormal noise needs positive data "
                       "and predictions; a missing observation is NaN) and `init`.")
            raise RuntimeError(f"inference.fit: {why}")
        opt_state = eng._init_opt(jnp.asarray(u))
        u_rec = u.copy()
        step_i = 0
        history = np.full((steps, n), np.nan)
        max_err = np.zeros(n)
        elapsed_before = 0.0
    else:
        mesh_h = ckpt["mesh"]
        mesh_d = _device(mesh_h)
        opt_state = _to_jax(ckpt["opt_state"])
        u_rec = np.asarray(ckpt["u_rec"]).copy()
        alive = np.asarray(ckpt["alive"]).copy()
        step_i = int(ckpt["step"])
        key = jnp.asarray(ckpt["key"])
        n_records = int(ckpt["n_records"])
        per_start = np.asarray(ckpt["per_start"]).copy()
        n_grad = int(ckpt["n_grad"])
        old_hist = np.asarray(ckpt["history"])
        history = np.full((max(steps, step_i), n), np.nan)
        history[: old_hist.shape[0]] = old_hist[: history.shape[0]]
        max_err = np.asarray(ckpt["max_err"]).copy()
        elapsed_before = float(ckpt["elapsed"])
        n_redrawn = int(ckpt["n_redrawn"])

    def snapshot():
        return dict(
            fingerprint=fingerprint, n=n, u=u.copy(), u_rec=u_rec.copy(),
            opt_state=_to_numpy(opt_state), mesh=mesh_h, alive=alive.copy(),
            step=step_i, key=np.asarray(key), n_records=n_records, per_start=per_start.copy(),
            n_grad=n_grad, history=history[:step_i].copy(), max_err=max_err.copy(),
            n_redrawn=n_redrawn,
            elapsed=elapsed_before + time.perf_counter() - t_start,
        )

    bar = None
    if _want_progress(progress) and step_i < steps:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=step_i, desc=f"fit {model.name}", leave=False)
    def rerecord_rows(u, trig, urgency):
        """Re-record the starts ``trig`` at ``u`` (plus, in the padding slots of the record,
        the most urgent others). Starts whose record fails are frozen at their last good
        parameters. Returns the new (mesh_h, mesh_d, alive, u, u_rec, rows)."""
        urgency = np.where(alive & ~trig, urgency, -1.0)
        order = np.argsort(-urgency, kind="stable")
        fill = order[urgency[order] > 0.25]
        sub, idx, take = eng.record_rows(u, np.nonzero(trig)[0], fill)
        rows = idx[take]
        ok_sub = sub.status[: len(rows)] == 0
        ok_rows, bad_rows = rows[ok_sub], rows[~ok_sub]
        take_ok = take.copy()
        take_ok[: len(rows)] = ok_sub
        new_mesh_h = _scatter_mesh(mesh_h, sub, idx, take_ok) if ok_sub.any() else mesh_h
        new_alive, new_u, new_u_rec = alive.copy(), u.copy(), u_rec.copy()
        new_alive[bad_rows] = False  # freeze at the last good parameters
        new_u[bad_rows] = u_rec[bad_rows]
        new_u_rec[ok_rows] = u[ok_rows]
        return new_mesh_h, _device(new_mesh_h), new_alive, new_u, new_u_rec, rows

    try:
        while step_i < steps:
            u_new, opt_new, loss, err, drift = eng.step(u, opt_state, mesh_d, u_rec, alive)
            n_grad_i = n_grad + 1
            broken = alive & (~np.isfinite(loss) | ~(err <= 4 * error_ratio_max))
            if broken.any() and rerecord != "never":
                # the mesh is far off for these starts (non-finite replay, or error ratio
                # beyond 4x its bound after one step): re-record them here, redo the step
                mesh_h, mesh_d, alive, u, u_rec, rows = rerecord_rows(
                    u, broken, np.maximum(drift / drift_tol, err / error_ratio_max))
                n_records += 1
                per_start[rows] += 1
                u_new, opt_new, loss, err, drift = eng.step(u, opt_state, mesh_d, u_rec, alive)
                n_grad_i += 1
            # commit the step
            history[step_i] = np.where(alive, loss, np.inf)
            max_err = np.maximum(max_err, np.where(alive & np.isfinite(err), err, 0.0))
            u, opt_state, n_grad = u_new, opt_new, n_grad_i
            step_i += 1
            # re-record, at the new parameters, the starts whose mesh stopped holding (drift
            # or error ratio measured at this step): the next step runs on fresh meshes
            if rerecord == "auto":
                trig = alive & ((drift > drift_tol) | ~(err <= error_ratio_max))
            elif rerecord == "always":
                trig = alive.copy()
            else:
                trig = np.zeros(n, bool)
            if trig.any() and step_i < steps:
                mesh_h, mesh_d, alive, u, u_rec, rows = rerecord_rows(
                    u, trig, np.maximum(drift / drift_tol, err / error_ratio_max))
                n_records += 1
                per_start[rows] += 1
            if bar is not None:
                bar.update(1)
                if step_i % 10 == 0 or step_i == steps:
                    fin = history[step_i - 1][np.isfinite(history[step_i - 1])]
                    bar.set_postfix(best=f"{fin.min():.5g}" if fin.size else "inf",
                                    records=n_records)
            if checkpoint is not None and (step_i % checkpoint_every == 0 or step_i == steps):
                _save_atomic(checkpoint, snapshot())
            if callback is not None:
                stop = callback(step_i, dict(losses=history[step_i - 1].copy(),
                                             params=eng._from_u(jnp.asarray(u)),
                                             n_records=n_records))
                if stop is True:
                    break
    except BaseException:
        if checkpoint is not None:
            _save_atomic(checkpoint, snapshot())
        raise
    finally:
        if bar is not None:
            bar.close()

    # --- final: fresh record at the final parameters, exact losses --------------------------
    live = np.nonzero(alive)[0]
    final_loss = np.full(n, np.inf)
    status = np.where(alive, 0, _FAILED).astype(np.int32)
    if len(live):
        sub, idx, take = eng.record_rows(u, live)
        n_records += 1
        st = sub.status[: len(live)]
        take_ok = take.copy()
        take_ok[: len(live)] = st == 0
        fmesh = _device(_scatter_mesh(mesh_h, sub, idx, take_ok))
        _, _, loss, _, _ = eng.step(u, opt_state, fmesh, u, alive)
        n_grad += 1
        final_loss[live] = np.where(st == 0, loss[live], np.inf)
        status[live[st != 0]] = _FAILED
    final_loss = np.where(np.isfinite(final_loss), final_loss, np.inf)
    if np.all(~np.isfinite(final_loss)):
        warnings.warn("inference.fit: no start ended with a finite loss", RuntimeWarning,
                      stacklevel=2)
        best = 0
    else:
        best = int(np.argmin(final_loss))
    x_all = eng._from_u(jnp.asarray(u))
    params = {k: v[best] for k, v in x_all.items()}
    return FitResult(
        params=params,
        all_params=x_all,
        losses=final_loss,
        loss_history=history[:step_i],
        n_records=n_records,
        n_records_per_start=per_start,
        n_grad_evals=n_grad,
        wall_time=elapsed_before + time.perf_counter() - t_start,
        best_index=best,
        status=status,
        objective=objective,
        n_steps=step_i,
        max_error_ratio=max_err,
        n_redrawn=n_redrawn,
    )


# ----------------------------------------------------------------------------- least squares


def _is_lognormal(model, params) -> bool:
    import numpyro.distributions as dist

    k, m = 2, len(model.observed)
    d = model.noise(params, jnp.ones((k, m)))
    while isinstance(d, (dist.Independent, dist.ExpandedDistribution)):
        d = d.base_dist
    return isinstance(d, dist.LogNormal)


def fit_least_squares(
    model,
    data,
    init: Mapping[str, Any] | None = None,
    *,
    n_starts: int = 1,
    seed: int = 0,
    max_iter: int = 200,
    max_rerecords: int = 20,
    drift_tol: float = 0.1,
    error_ratio_max: float = 1.0,
    lm_rtol: float = 1e-10,
    lm_atol: float = 1e-10,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    solver=None,
    max_steps: int = 4096,
    record_tol_factor: float = 0.5,
) -> FitResult:
    """Least-squares fit with Levenberg–Marquardt (Optimistix) on the replayed mesh.

    Residuals are ``ys - y_pred`` (``log ys - log y_pred`` when the model's noise is
    LogNormal), unweighted. Only the parameters that change the predictions are fitted (the
    others, e.g. ``sigma``, are found by a forward-mode Jacobian at the start and held);
    afterwards a ``sigma`` parameter of shape ``()`` or ``(m,)`` is set to the residuals'
    RMS (per observed state). The Jacobians are forward mode (``jax.jacfwd`` through
    ``gs.replay``); each LM solve runs on a fixed mesh, which is re-recorded at the LM
    solution until that solution's drift and ``error_ratio`` are within bounds.

    Args:
        model, data: as `fit`.
        init: ``None`` (prior draws; the first start is ``model.defaults`` when
            ``n_starts == 1``) or a parameter dict (the first start).
        n_starts: starts, solved one after another with the same compiled solver.
        seed: seeds the prior draws of the starts.
        max_iter: LM steps per mesh; max_rerecords: LM solves per start.
        lm_rtol, lm_atol: Optimistix LM tolerances.
        drift_tol, error_ratio_max, rtol, atol, solver, max_steps, record_tol_factor: as
            `fit`.

    Returns:
        `FitResult` with ``objective="least_squares"`` and ``losses`` half the
        residual sum of squares; ``n_grad_evals`` counts LM steps (Jacobians).

    Example:
        >>> res = inference.fit_least_squares(models.lynx_hare(),
        ...                                   models.load_dataset("lynx_hare"))
        >>> res.params["theta"], res.losses      # (4,), (1,)
    """
    import optimistix as optx

    t_start = time.perf_counter()
    prob = _Problem(model, data, SolveOptions(solver, rtol, atol, max_steps))
    space = prob.space
    defaults = {k: jnp.asarray(v) for k, v in model.defaults.items()}
    u_def = space.to_unconstrained(defaults)
    log_res = _is_lognormal(model, defaults)
    obs = prob.ys_obs
    missing = jnp.isnan(obs)  # missing observations carry no residual
    obs_t = jnp.log(obs) if log_res else obs

    def predict_u(u, mesh=None):
        x = space.from_unconstrained(u)
        sol = prob.solve(x, None) if mesh is None else prob.replay(mesh, x, None)
        return observe(model, sol.ys), sol.error_ratio

    # which coordinates move the predictions
    jac = jax.jit(jax.jacfwd(lambda u: predict_u(u)[0]))(u_def)
    moves = np.asarray(jnp.any(jnp.abs(jnp.reshape(jac, (-1, space.dim))) > 0, axis=0))
    dyn = np.nonzero(moves)[0]
    if dyn.size == 0:
        raise ValueError("fit_least_squares: no parameter changes the predictions")
    dyn_j = jnp.asarray(dyn)

    key = jax.random.PRNGKey(seed)
    if init is None:
        starts = space.to_unconstrained(model.sample_prior(key, max(n_starts, 1)))
        if n_starts == 1:
            starts = u_def[None]
    else:
        init, n_init = checked_init(model, space, init)
        if n_init is not None:
            raise ValueError("`init` of fit_least_squares is one parameter dict (no ensemble "
                             "axis); use `n_starts` for more starts")
        u0 = space.to_unconstrained(init)
        starts = space.to_unconstrained(model.sample_prior(key, max(n_starts, 1)))
        starts = starts.at[0].set(u0)
    fixed_base = u_def

    def full_u(v, base):
        return base.at[dyn_j].set(v)

    def residuals(v, args):
        mesh, base = args
        yp, _ = predict_u(full_u(v, base), mesh)
        yt = jnp.log(yp) if log_res else yp
        r = jnp.where(missing, 0.0, obs_t - yt)
        r = jnp.reshape(r, (-1,))
        return jnp.where(jnp.isfinite(r), r, 1e6)

    lm = optx.LevenbergMarquardt(rtol=lm_rtol, atol=lm_atol)

    @eqx.filter_jit
    def lm_solve(v, mesh, base):
        sol = optx.least_squares(residuals, lm, v, args=(mesh, base), max_steps=max_iter,
                                 throw=False)
        yp, err = predict_u(full_u(sol.value, base), mesh)
        return sol.value, sol.stats["num_steps"], err, residuals(sol.value, (mesh, base))

    def record(u):
        return prob.record(space.from_unconstrained(u), None, rtol=rtol * record_tol_factor,
                           atol=atol * record_tol_factor)

    n_records = 0
    n_grad = 0
    per_start = np.zeros(n_starts, np.int64)
    out_u, losses, status, max_err = [], [], [], []
    for s in range(n_starts):
        base = starts[s].at[jnp.asarray(np.nonzero(~moves)[0])].set(
            fixed_base[jnp.asarray(np.nonzero(~moves)[0])]
        ) if (~moves).any() else starts[s]
        v = starts[s][dyn_j]
        st, merr, r = _FAILED, 0.0, None
        for _ in range(max_rerecords):
            u_rec = full_u(v, base)
            mesh = record(u_rec)
            n_records += 1
            per_start[s] += 1
            if int(mesh.status) != 0:
                break
            v_new, nsteps, err, r = lm_solve(v, mesh, base)
            n_grad += int(nsteps)
            err = float(err) * record_tol_factor  # in units of rtol/atol
            merr = max(merr, err if np.isfinite(err) else 0.0)
            x_old = np.concatenate([np.ravel(a) for a in space.from_unconstrained(u_rec).values()])
            x_new = np.concatenate(
                [np.ravel(a) for a in space.from_unconstrained(full_u(v_new, base)).values()]
            )
            drift = float(np.max(np.abs(x_new - x_old) / np.maximum(np.abs(x_old), 1e-12)))
            v = v_new
            if err <= error_ratio_max and drift <= drift_tol * 0.1:
                st = 0
                break
        u_fin = full_u(v, base)
        # exact residuals on a fresh record at the solution
        mesh = record(u_fin)
        n_records += 1
        per_start[s] += 1
        if int(mesh.status) == 0:
            yp, _ = predict_u(u_fin, mesh)
            yt = jnp.log(yp) if log_res else yp
            seen = ~np.asarray(missing)
            rr = np.where(seen, np.asarray(obs_t - yt), 0.0)
            loss = 0.5 * float(np.sum(rr**2))
            if not np.isfinite(loss):
                st = _FAILED
            elif st != 0:  # LM ran out of re-records but the point is valid
                st = 0
            # sigma from the residuals
            if "sigma" in model.priors and not moves[_coords(space, "sigma")].any():
                shp = space.shapes["sigma"]
                m = len(model.observed)
                if shp == ():
                    sig = np.sqrt(np.sum(rr**2) / np.sum(seen))
                elif shp == (m,):
                    sig = np.sqrt(np.sum(rr**2, axis=0) / np.maximum(np.sum(seen, axis=0), 1))
                else:
                    sig = None
                if sig is not None:
                    x = space.from_unconstrained(u_fin)
                    x = dict(x, sigma=jnp.asarray(sig, dtype=jnp.result_type(float)))
                    u_fin = space.to_unconstrained(x)
        else:
            loss, st = np.inf, _FAILED
        out_u.append(u_fin)
        losses.append(loss if st == 0 else np.inf)
        status.append(st)
        max_err.append(merr)
    u_all = jnp.stack(out_u)
    losses = np.asarray(losses, float)
    best = int(np.argmin(losses)) if np.isfinite(losses).any() else 0
    x_all = space.from_unconstrained(u_all)
    return FitResult(
        params={k: v[best] for k, v in x_all.items()},
        all_params=x_all,
        losses=losses,
        loss_history=losses[None].copy(),
        n_records=n_records,
        n_records_per_start=per_start,
        n_grad_evals=n_grad,
        wall_time=time.perf_counter() - t_start,
        best_index=best,
        status=np.asarray(status, np.int32),
        objective="least_squares",
        n_steps=n_grad,
        max_error_ratio=np.asarray(max_err),
    )


def _coords(space: ParamSpace, name: str) -> np.ndarray:
    e = next(e for e in space.entries if e.name == name)
    return np.arange(e.offset, e.offset + e.size)
