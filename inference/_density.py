"""Log densities of an `models.ODEModel` given data, its NumPyro program, and the
map between constrained parameter dicts and one flat unconstrained vector.

Everything here is jittable and differentiable. Two ways to get the ODE solution:

- `log_density` (and `numpyro_model`) solve with ``gs.solve`` (record + replay
  in one call): the value and gradient are those of the adaptive solution, exactly what
  Diffrax's default adjoint would give.
- The internal ``_Problem`` also evaluates the likelihood on a *given* recorded mesh (a
  fixed-step replay), which is what `inference.fit` and `inference.sample` use
  to reuse one mesh across many gradient evaluations.

A solver failure (max_steps reached, non-finite state, step underflow) or a non-finite
likelihood gives ``-inf`` log density with a zero (not NaN) gradient.
"""

from __future__ import annotations

import functools

import hashlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions.transforms import biject_to

import gradsolve as gs

__all__ = ["log_density", "numpyro_model", "ParamSpace", "SolveOptions"]


# ----------------------------------------------------------------------------- parameters


class _Entry(NamedTuple):
    name: str
    shape: tuple[int, ...]
    size: int
    offset: int
    transform: Any
    support: Any


class ParamSpace:
    """Bijection between a model's constrained parameter dict and a flat unconstrained vector.

    Each parameter is mapped by ``numpyro.distributions.transforms.biject_to(prior.support)``
    (e.g. ``exp`` for positive parameters), flattened, and concatenated in the order of
    ``priors``. All methods accept extra leading batch axes: ``u`` of shape ``(..., D)``
    corresponds to parameter leaves of shape ``(..., *shape)``.

    Args:
        priors: dict parameter name -> NumPyro distribution (``ODEModel.priors``); the
            flat vector has length ``D``, the total size of all parameters.

    Example:
        >>> space = ParamSpace(model.priors)
        >>> u = space.to_unconstrained(model.defaults)          # (D,)
        >>> params = space.from_unconstrained(u)                 # the dict again
        >>> lp = model.log_prior(params) + space.log_abs_det_jacobian(u)
    """

    def __init__(self, priors: Mapping[str, dist.Distribution]):
        entries = []
        off = 0
        for name, d in priors.items():
            shape = tuple(d.batch_shape) + tuple(d.event_shape)
            size = int(np.prod(shape)) if shape else 1
            entries.append(_Entry(name, shape, size, off, biject_to(d.support), d.support))
            off += size
        self.entries = tuple(entries)
        self.dim = off
        self.names = tuple(e.name for e in entries)
        self.shapes = {e.name: e.shape for e in entries}

    def __repr__(self) -> str:
        parts = ", ".join(f"{e.name}{list(e.shape)}" for e in self.entries)
        return f"ParamSpace(dim={self.dim}: {parts})"

    def labels(self) -> list[str]:
        """A name per coordinate of the flat vector, e.g. ``theta[0]``."""
        out = []
        for e in self.entries:
            if not e.shape:
                out.append(e.name)
            else:
                out.extend(f"{e.name}{list(ix)}" for ix in np.ndindex(*e.shape))
        return out

    def _batch(self, params: Mapping[str, Any]) -> tuple[int, ...]:
        e = self.entries[0]
        s = jnp.shape(params[e.name])
        return tuple(s[: len(s) - len(e.shape)])

    def to_unconstrained(self, params: Mapping[str, Any]) -> jax.Array:
        """Constrained dict (leaves ``(..., *shape)``) -> flat ``(..., D)``."""
        batch = self._batch(params)
        parts = []
        for e in self.entries:
            x = jnp.asarray(params[e.name], dtype=jnp.result_type(float))
            x = jnp.broadcast_to(x, batch + e.shape)
            u = e.transform.inv(x)
            parts.append(jnp.reshape(u, batch + (e.size,)))
        return jnp.concatenate(parts, axis=-1)

    def outside(self, params: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Per parameter name, a bool of the batch shape (``()`` or ``(n,)``): True where
        the value lies outside its prior's support (where the log density is ``-inf``)."""
        batch = self._batch(params)
        out = {}
        for e in self.entries:
            x = jnp.broadcast_to(jnp.asarray(params[e.name]), batch + e.shape)
            ok = jnp.reshape(jnp.asarray(e.support(x)), batch + (-1,))
            out[e.name] = ~jnp.all(ok, axis=-1)
        return out

    def split(self, u: jax.Array) -> dict[str, jax.Array]:
        """Flat ``(..., D)`` -> unconstrained pieces, shaped like the parameters."""
        batch = jnp.shape(u)[:-1]
        return {
            e.name: jnp.reshape(u[..., e.offset : e.offset + e.size], batch + e.shape)
            for e in self.entries
        }

    def from_unconstrained(self, u: jax.Array) -> dict[str, jax.Array]:
        """Flat ``(..., D)`` -> constrained dict."""
        pieces = self.split(u)
        return {e.name: e.transform(pieces[e.name]) for e in self.entries}

    def log_abs_det_jacobian(self, u: jax.Array) -> jax.Array:
        """``log |d params / d u|`` summed over parameters: shape ``u.shape[:-1]``."""
        batch = jnp.shape(u)[:-1]
        pieces = self.split(u)
        total = jnp.zeros(batch, dtype=jnp.result_type(u))
        for e in self.entries:
            x = e.transform(pieces[e.name])
            ldj = e.transform.log_abs_det_jacobian(pieces[e.name], x)
            ldj = jnp.broadcast_to(ldj, jnp.shape(ldj))
            total = total + jnp.sum(jnp.reshape(ldj, batch + (-1,)), axis=-1)
        return total

    def constrained_and_ldj(self, u: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        return self.from_unconstrained(u), self.log_abs_det_jacobian(u)


def checked_init(model, space: "ParamSpace", init) -> tuple[dict[str, jax.Array], int | None]:
    """A user's ``init`` parameter dict, validated (names, shapes, the priors' support) and
    as float arrays, with its ensemble size (``None`` for one point)."""
    if not isinstance(init, Mapping):
        raise ValueError(f"`init` must be None or a parameter dict, got {type(init).__name__}")
    n = model.check_params(init)
    init = {k: jnp.asarray(init[k], dtype=jnp.result_type(float)) for k in model.priors}
    check_support(space, init, "init")
    return init, n


def check_support(space: ParamSpace, params: Mapping[str, Any], argname: str) -> None:
    """``ValueError`` naming the entries of a concrete parameter dict that lie outside their
    prior's support (their log density is -inf, their unconstrained value NaN)."""
    bad = [k for k, out in space.outside(params).items() if bool(np.any(np.asarray(out)))]
    if bad:
        shown = ", ".join(f"{k}={np.asarray(params[k]).tolist()}" for k in bad)
        raise ValueError(
            f"`{argname}` lies outside the priors' support (log density -inf): {shown}; "
            f"every value must be one the prior can draw (e.g. a positive scale)."
        )


# ----------------------------------------------------------------------------- solving


def digest(tree) -> str | None:
    """A short hash of a pytree of arrays (structure, shapes, dtypes and values), for
    checkpoint fingerprints; ``None`` for ``None``; strings and numbers by value."""
    if tree is None:
        return None
    h = hashlib.sha1()
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    h.update(str(treedef).encode())
    for leaf in leaves:
        if isinstance(leaf, (str, bool, int, float)):
            h.update(repr(leaf).encode())
            continue
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


class SolveOptions(NamedTuple):
    """How the ODE is solved: solver (``None``: the model's), tolerances, step capacity."""

    solver: Any = None
    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = 4096


class _Problem:
    """A model, its data and solver options, with the batched pieces the fitters need.

    Parameters are constrained dicts whose leaves have a leading ensemble axis ``n``.
    """

    def __init__(self, model, data, opts: SolveOptions):
        if not hasattr(model, "priors") or not hasattr(model, "vector_field"):
            raise ValueError(
                f"`model` must be a models.ODEModel (with priors and vector_field), got "
                f"{type(model).__name__}"
            )
        try:
            ts_np, ys = data.ts, data.ys
        except AttributeError:
            raise ValueError(
                f"`data` must be a models.Dataset (with .ts and .ys), got {type(data).__name__}"
            ) from None
        if isinstance(ts_np, jax.core.Tracer):
            raise ValueError(
                "`data.ts` is traced (the Dataset was passed through jax.jit/vmap): the "
                "observation times fix the solve's mesh points and must be concrete; close "
                "over the Dataset instead (its `ys` may be traced)"
            )
        ts_np = np.asarray(ts_np, dtype=float)
        m_obs = len(model.observed)
        if np.ndim(ys) != 2 or np.shape(ys) != (ts_np.shape[0], m_obs):
            raise ValueError(
                f"`data.ys` has shape {np.shape(ys)}; expected ({ts_np.shape[0]}, {m_obs}) for "
                f"the observed states {tuple(model.observed)} of model {model.name!r}"
            )
        if ts_np.ndim != 1 or ts_np.size == 0:
            raise ValueError(f"`data.ts` must have shape (k,) with k >= 1, got {ts_np.shape}")
        if np.any(np.diff(ts_np) < 0):
            raise ValueError("`data.ts` must be sorted")
        if ts_np[0] < model.t0:
            raise ValueError(
                f"`data.ts` starts at {ts_np[0]}, before the model's t0 = {model.t0}"
            )
        if not ts_np[-1] > model.t0:
            raise ValueError(f"`data.ts` must reach past the model's t0 = {model.t0}")
        for name in ("rtol", "atol"):
            v = getattr(opts, name)
            if not (isinstance(v, (int, float, np.floating, np.integer)) and v > 0):
                raise ValueError(f"`{name}` must be a positive number, got {v!r}")
        if opts.max_steps is not None and (
            not isinstance(opts.max_steps, (int, np.integer)) or opts.max_steps < 1
        ):
            raise ValueError(f"`max_steps` must be a positive int, got {opts.max_steps!r}")
        self.model = model
        self.data = data
        self.opts = opts
        self.solver = model.solver if opts.solver is None else opts.solver
        self.f = model.vector_field
        self.t0 = float(model.t0)
        self.t1 = float(ts_np[-1])
        self.ts_np = ts_np
        self.ys_obs = jnp.asarray(ys, dtype=jnp.result_type(float))
        self.space = ParamSpace(model.priors)

    def fingerprint(self) -> dict:
        """What a checkpoint must share with this problem to be resumed by it: the data
        (a digest of ``ts`` and ``ys``), the solver and the step capacity."""
        return dict(data=digest((self.ts_np, np.asarray(self.ys_obs))),
                    solver=repr(self.solver), max_steps=self.opts.max_steps)

    @property
    def ts(self) -> jax.Array:
        return jnp.asarray(self.ts_np, dtype=jnp.result_type(float))

    def y0(self, params: dict, n: int | None) -> jax.Array:
        return self.model.initial_state(params)

    # --- pieces ------------------------------------------------------------------------
    def log_prior(self, params: dict) -> jax.Array:
        return self.model.log_prior(params)

    def log_lik_from_states(self, params: dict, ys: jax.Array, n: int | None) -> jax.Array:
        """Log likelihood from all predicted states ``ys`` (``(n, k, d)`` or ``(k, d)``).

        Non-finite predictions (failed solve) give ``-inf`` with a zero gradient.
        """
        y_pred = observe(self.model, ys)
        axes = (-2, -1)
        ok = jnp.all(jnp.isfinite(y_pred), axis=axes)
        okb = ok[..., None, None]
        y_safe = jnp.where(okb, y_pred, 1.0)
        ll = self.model.log_likelihood_from_prediction(params, y_safe, self.ys_obs)
        good = ok & jnp.isfinite(ll)
        return jnp.where(good, jnp.where(good, ll, 0.0), -jnp.inf)

    def _args(self, params: dict, n: int | None, rtol, atol, max_steps) -> tuple[tuple, dict]:
        """Positional and keyword arguments of gs.solve/gs.record, options defaulted."""
        o = self.opts
        kwargs = dict(
            ts=self.ts, solver=self.solver, rtol=o.rtol if rtol is None else rtol,
            atol=o.atol if atol is None else atol,
            max_steps=o.max_steps if max_steps is None else max_steps, throw=False,
        )
        return (self.f, self.t0, self.t1, self.y0(params, n), params), kwargs

    def solve(self, params: dict, n: int | None, *, rtol=None, atol=None, max_steps=None):
        args, kwargs = self._args(params, n, rtol, atol, max_steps)
        return gs.solve(*args, **kwargs)

    def record(self, params: dict, n: int | None, *, rtol=None, atol=None, max_steps=None):
        args, kwargs = self._args(params, n, rtol, atol, max_steps)
        return gs.record(*args, **kwargs)

    def replay(self, mesh, params: dict, n: int | None):
        # Ragged ensembles (many starts from the prior) rely on the core's length-sorted
        # groups (see `gradsolve._replay.default_group_size`).
        return gs.replay(self.f, mesh, self.y0(params, n), params)

    def log_density_solve(self, params: dict, n: int | None, **kw) -> jax.Array:
        # Outside the priors' support the density is -inf; the solve and the noise model
        # run at the defaults there, so no NaN (nor NumPyro's argument check) escapes.
        outside = self.space.outside(params)
        bad = functools.reduce(jnp.logical_or, outside.values())
        safe = {k: jnp.where(jnp.reshape(bad, bad.shape + (1,) * (v.ndim - bad.ndim)),
                             jnp.asarray(self.model.defaults[k], v.dtype), v)
                for k, v in params.items()}
        sol = self.solve(safe, n, **kw)
        lp = self.log_prior(safe) + self.log_lik_from_states(safe, sol.ys, n)
        return jnp.where(bad, -jnp.inf, lp)


def observe(model, ys: jax.Array) -> jax.Array:
    """The observed states (``model.observed``) of predicted states ``ys (..., d)``."""
    idx = tuple(model.observed)
    if idx == tuple(range(ys.shape[-1])):
        return ys
    return ys[..., np.asarray(idx)]


def _ensemble_size(model, params) -> int | None:
    return model.check_params(params)


# ----------------------------------------------------------------------------- public


def log_density(
    model,
    data,
    params: Mapping[str, Any],
    *,
    solver=None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 4096,
) -> jax.Array:
    """Unnormalised log posterior ``log p(params) + log p(data | params)``.

    Args:
        model: a `models.ODEModel`.
        data: a `models.Dataset` (``ts (k,)``, ``ys (k, m)``).
        params: a constrained parameter dict (the keys of ``model.priors``); with every leaf
            carrying a leading axis ``n`` it is an ensemble and the result has shape ``(n,)``.
        solver, rtol, atol, max_steps: how the ODE is solved (``gs.solve``; default solver
            the model's, ``gs.Tsit5()`` or ``gs.Rodas5P()``).

    Returns:
        A scalar (or ``(n,)``). ``-inf`` where a parameter lies outside its prior's
        support, where the solve fails or where the likelihood is not finite. Jittable and differentiable (the gradient is the discrete adjoint of the
        adaptive solve's accepted steps, as Diffrax's default).

    Example:
        >>> lp = jax.jit(lambda p: inference.log_density(model, data, p))(model.defaults)
    """
    prob = _Problem(model, data, SolveOptions(solver, rtol, atol, max_steps))
    n = _ensemble_size(model, params)
    params = {k: jnp.asarray(params[k]) for k in model.priors}
    return prob.log_density_solve(params, n)


def numpyro_model(
    model,
    data=None,
    *,
    solver=None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 4096,
):
    """The NumPyro program of ``model`` given ``data``, solving the ODE with gradsolve.

    Returns a function ``program(ts=data.ts, ys=data.ys)`` that samples each parameter from
    its prior (``numpyro.sample(name, prior)``), solves with ``gs.solve`` and observes
    ``numpyro.sample("obs", model.observations(params, y_pred), obs=ys)`` (the model's
    ``noise``, skipping missing observations: NaN in ``ys``). Pass ``ys=None`` for
    predictive simulation. A failed solve adds ``numpyro.factor("solver_failure", -inf)``.
    ``numpyro.infer.util.log_density`` of it equals `log_density`.

    Args:
        model: a `models.ODEModel`.
        data: a `models.Dataset` (``ts (k,)``, ``ys (k, m)``) giving the program's
            default ``ts`` and ``ys``; ``None``: pass ``ts`` (and ``ys``) when calling it.
        solver, rtol, atol, max_steps: how the ODE is solved (``gs.solve``; default solver
            the model's).

    Returns:
        The NumPyro program ``program(ts=..., ys=...)``; its ``"obs"`` site has shape
        ``(k, m)``.

    Example:
        >>> mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(inference.numpyro_model(m, data)),
        ...                           num_warmup=500, num_samples=500)
    """
    opts = SolveOptions(solver, rtol, atol, max_steps)
    default_ts = None if data is None else np.asarray(data.ts, dtype=float)
    default_ys = None if data is None else jnp.asarray(data.ys)
    f = model.vector_field
    solver_ = model.solver if solver is None else solver

    def program(ts=default_ts, ys=default_ys):
        if ts is None:
            raise ValueError("numpyro_model: pass `ts` (no data given)")
        ts_arr = np.asarray(ts, dtype=float)
        params = {k: numpyro.sample(k, d) for k, d in model.priors.items()}
        y0 = model.initial_state(params)
        sol = gs.solve(
            f, float(model.t0), float(ts_arr[-1]), y0, params, ts=jnp.asarray(ts_arr),
            solver=solver_, rtol=opts.rtol, atol=opts.atol, max_steps=opts.max_steps,
            throw=False,
        )
        y_pred = observe(model, sol.ys)
        ok = jnp.all(jnp.isfinite(y_pred))
        y_safe = jnp.where(ok, y_pred, 1.0)
        numpyro.deterministic("y_pred", y_pred)
        numpyro.factor("solver_failure", jnp.where(ok, 0.0, -jnp.inf))
        numpyro.sample("obs", model.observations(params, y_safe), obs=ys)

    program.__doc__ = f"NumPyro program of model {model.name!r} (gradsolve ODE solve)."
    return program
