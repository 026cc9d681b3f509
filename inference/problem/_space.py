"""`ParamSpace`: a model's constrained parameter dict as one flat unconstrained vector.

Fits and samplers work on that vector ``u (..., D)``: positive parameters stay positive
whatever the optimiser or the leapfrog does, and every parameter is validated and flattened
once, when a run starts (`checked_init`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.transforms import biject_to

__all__ = ["ParamSpace", "checked_init", "check_support"]


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
            _check_interval(name, d.support)
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
        """Constrained dict (leaves ``(..., *shape)``) -> flat ``(..., D)``.

        Called on concrete values it runs one compiled program per shape (cached), not
        an operation at a time: eagerly, each operation would compile a program of its
        own for every new shape, which costs most on an accelerator."""
        params = {e.name: params[e.name] for e in self.entries}
        if any(isinstance(v, jax.core.Tracer) for v in jax.tree_util.tree_leaves(params)):
            return self._to_unconstrained(params)
        if getattr(self, "_jit_to_u", None) is None:
            self._jit_to_u = jax.jit(self._to_unconstrained)
        return self._jit_to_u(params)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_jit_to_u"}

    def _to_unconstrained(self, params: Mapping[str, Any]) -> jax.Array:
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

    def flat_constrained(self, u: jax.Array) -> jax.Array:
        """Flat ``(..., D)`` -> the constrained values, flattened the same way ``(..., D)``
        (what relative parameter drift is measured on)."""
        batch = jnp.shape(u)[:-1]
        x = self.from_unconstrained(u)
        return jnp.concatenate([jnp.reshape(x[e.name], batch + (e.size,))
                                for e in self.entries], axis=-1)

    def coords(self, name: str) -> np.ndarray:
        """The coordinates of the flat vector that hold parameter ``name``."""
        e = next(e for e in self.entries if e.name == name)
        return np.arange(e.offset, e.offset + e.size)


def _check_interval(name: str, support) -> None:
    """``ValueError`` naming parameter ``name`` when its prior's support is an interval
    whose lower bound is not below its upper one (reversed bounds: every value is outside
    it, the log density -inf everywhere and the transform NaN)."""
    lo, hi = getattr(support, "lower_bound", None), getattr(support, "upper_bound", None)
    if lo is None or hi is None:
        return
    try:
        lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    except (TypeError, jax.errors.ConcretizationTypeError,
            jax.errors.TracerArrayConversionError):
        return  # bounds that are traced values: checked by the distribution, if at all
    if np.any(~(lo < hi)):
        raise ValueError(f"parameter {name!r}: its prior's support has lower bound "
                         f"{lo.tolist()} not below its upper bound {hi.tolist()}; "
                         "swap the bounds")


def checked_init(model, space: ParamSpace, init) -> tuple[np.ndarray, int | None]:
    """A user's ``init`` parameter dict, validated (names, shapes, the priors' support) and
    flattened: ``u`` of shape ``(D,)`` or ``(n, D)`` (unconstrained, float), with the
    ensemble size ``n`` (``None`` for one point)."""
    if not isinstance(init, Mapping):
        raise ValueError(f"`init` must be None or a parameter dict, got {type(init).__name__}")
    names = list(space.names)
    unknown = [k for k in init if k not in space.shapes]
    missing = [k for k in names if k not in init]
    if unknown or missing:
        parts = ([f"unknown key(s) {unknown}"] if unknown else []) + (
            [f"missing parameters {missing}"] if missing else [])
        raise ValueError(f"`init` has {' and '.join(parts)}; the parameters are {names}")
    for k in names:
        v = np.asarray(init[k])
        if not np.issubdtype(v.dtype, np.number) and v.dtype != bool:
            raise ValueError(f"`init`[{k!r}] must be numbers, got {v.dtype} ({init[k]!r})")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"`init`[{k!r}] is not finite ({v.tolist()}); every starting "
                             "value must be a finite number")
    n = model.check_params(init)
    init = {k: jnp.asarray(init[k], dtype=jnp.result_type(float)) for k in model.priors}
    check_support(space, init, "init")
    return np.asarray(space.to_unconstrained(init)), n


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
