"""The vector field over a block of trajectories, as code a Pallas TPU kernel can hold.

Inside the kernels every state component and every parameter is one ``(rows, 128)`` block
(trajectories on sublanes and lanes), so the field is evaluated entry by entry with the
shared translator (`gradsolve._jaxpr.Scalarizer`), as the lanes replay does over ``(n,)``
arrays: each entry of every jaxpr variable becomes one block and each elementwise primitive
one vector operation, with no gathers, slices or reshapes left for Mosaic to lower.

Mosaic (the TPU Pallas compiler) lowers fewer primitives than XLA: `pallas_field` lists the
field's primitives (and those of the solver step and its adjoint built on it) that have no
Mosaic lowering rule, so the driver can refuse the field with a reason rather than fail to
compile.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._caches import cache
from ..._flat import cache_key, flat_field, flatten_spec
from ..._jaxpr import Unsupported
from ..._solver.base import AbstractExplicitRK
from ..._solver.rosenbrock import AbstractRosenbrock, jacobians
from ..lanes import LaneArray, _LaneScalarizer
from ._rosenbrock import BlockRosenbrock, rosenbrock_reason


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer))


class _BlockScalarizer(_LaneScalarizer):
    """The lanes driver's `Scalarizer` with entries that are blocks of one ``shape`` (JAX
    values inside a kernel) instead of ``(n,)`` rows; constants are concrete numpy scalars,
    folded at translation time. A custom derivative rule is refused as there: it would be
    lost by differentiating its primal entry by entry (the adjoint kernel differentiates
    the translated step)."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)


def _objects(entries) -> np.ndarray:
    out = np.empty((len(entries),), dtype=object)
    for i, e in enumerate(entries):
        out[i] = e
    return out


class BlockField:
    """``f(t, y, params)`` (one trajectory) over blocks: ``field(t, y: LaneArray (d),
    p: LaneArray (P)) -> LaneArray (d)``, every entry (and ``t``) of one block shape, ``p``
    the flattened per-trajectory parameters (`gradsolve._flat.flat_params`). For a
    Rosenbrock solver ``jac_closed`` is the jaxpr of its value, Jacobian and time
    derivative (`jacobians`)."""

    def __init__(self, closed, d: int, p_size: int, dtype, jac_closed=None):
        self.closed, self.d, self.p_size, self.dtype = closed, d, p_size, dtype
        self.jac_closed = jac_closed

    def _run(self, closed, t, y: LaneArray, p: LaneArray) -> list[np.ndarray]:
        shape = jnp.shape(t)
        outs = _BlockScalarizer(shape).run(closed, [_objects([t]).reshape(()), _objects(y.rows),
                                                    _objects(p.rows[:self.p_size])])
        blocks = []
        for out in outs:
            out = np.asarray(out, dtype=object)
            entries = [o if _is_array(o) else jnp.full(shape, o, self.dtype)
                       for o in out.reshape(-1)]
            blocks.append(_objects(entries).reshape(out.shape))
        return blocks

    def __call__(self, t, y: LaneArray, p: LaneArray) -> LaneArray:
        (out,) = self._run(self.closed, t, y, p)
        return LaneArray(out.reshape(-1))

    def jacobians(self, t, y: LaneArray, p: LaneArray):
        """``(f(t, y), J, f_t)`` over blocks, as `gradsolve._solver.rosenbrock.jacobians`
        computes them: ``J`` a list of ``d`` rows of ``d`` blocks."""
        f0, jac, f_t = self._run(self.jac_closed, t, y, p)
        return (LaneArray(f0.reshape(-1)), [list(row) for row in jac],
                LaneArray(f_t.reshape(-1)))


class Field(NamedTuple):
    """The block form of a vector field (``field``), or ``None`` and why not."""

    field: BlockField | None
    reason: str | None


def mosaic_primitives() -> frozenset[str] | None:
    """Names of the primitives Mosaic (Pallas on TPU) has lowering rules for in this JAX,
    or ``None`` where the table cannot be read (then nothing is refused for it)."""
    try:
        from jax._src.pallas.mosaic import lowering
        from jax.experimental.pallas import tpu as pltpu

        return frozenset(p.name for p in lowering.lowering_rules[pltpu.CoreType.TC])
    except Exception:  # noqa: BLE001 - a private table; its absence refuses nothing
        return None


def _primitives(jaxpr, seen: set[str]) -> set[str]:
    """Every primitive name in ``jaxpr`` and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        seen.add(eqn.primitive.name)
        for sub in _subjaxprs(eqn):
            _primitives(sub, seen)
    return seen


def _subjaxprs(eqn):
    """The jaxprs in ``eqn``'s parameters (a ``cond``'s branches, a ``jit``'s body)."""
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                yield x.jaxpr
            elif hasattr(x, "eqns"):
                yield x


# (f, shapes, dtypes, solver) -> Field
_fields = cache("pallas fields")


def kernel_solver(solver):
    """What the kernels call as ``solver``: an explicit Runge–Kutta solver itself, a
    Rosenbrock method's step on blocks (`BlockRosenbrock`)."""
    return BlockRosenbrock(solver) if isinstance(solver, AbstractRosenbrock) else solver


def pallas_field(f, solver, y0, params) -> Field:
    """The block form of ``f`` for batched ``y0 (n, d)``, ``params``, or why the Pallas
    kernels cannot run it: not an explicit Runge–Kutta solver with an error estimate or a
    Rosenbrock method on at most `_rosenbrock.MAX_STATES` states, non-float inputs, a field
    the translator does not handle, or a primitive in one step or its adjoint that Mosaic
    does not lower. Works on abstract values."""
    rosenbrock = isinstance(solver, AbstractRosenbrock)
    if not rosenbrock and (not isinstance(solver, AbstractExplicitRK)
                           or not np.any(np.asarray(solver.b_error) != 0)):
        return Field(None, "the Pallas kernels run explicit Runge–Kutta solvers with an "
                           "error estimate (gs.Tsit5, gs.Dopri5, gs.Vern7) and Rosenbrock "
                           f"methods (gs.Rodas5P, gs.Rosenbrock23), not "
                           f"{type(solver).__name__}.")
    dtype = jnp.result_type(y0)
    if dtype not in (jnp.float64, jnp.float32) or jnp.ndim(y0) != 2:
        return Field(None, f"the Pallas kernels run float32 (or, interpreted, float64) "
                           f"states, not {dtype}.")
    if rosenbrock:
        reason = rosenbrock_reason(solver, jnp.shape(y0)[1])
        if reason is not None:
            return Field(None, reason)
    _, treedef, shapes, dtypes = flatten_spec(params)
    if any(not jnp.issubdtype(dt, jnp.floating) for dt in dtypes):
        return Field(None, "every params leaf must be floating point for the Pallas kernels.")
    d = jnp.shape(y0)[1]
    key = cache_key(f, d, treedef, shapes, tuple(map(str, dtypes)), str(dtype), solver)
    if key is not None and key in _fields:
        return _fields[key]
    f_rows, p_size = flat_field(f, treedef, shapes, dtypes)

    def f_flat(t, y, pflat):
        return f_rows(t, y, pflat).astype(dtype)

    try:
        probe = (jnp.zeros((), dtype), jnp.zeros((d,), dtype), jnp.zeros((p_size,), dtype))
        closed = jax.make_jaxpr(f_flat)(*probe)
        jac_closed = None
        if rosenbrock:
            jac_closed = jax.make_jaxpr(lambda t, y, q: jacobians(f_flat, t, y, q))(*probe)
        field = BlockField(closed, d, p_size, dtype, jac_closed)
        found = Field(field, _lowering_reason(field, kernel_solver(solver), d, p_size, dtype))
        if found.reason is not None:
            found = Field(None, found.reason)
    except Unsupported as e:
        found = Field(None, f"the translator does not handle this vector field ({e}).")
    except Exception as e:  # noqa: BLE001 - anything untranslatable: another driver
        found = Field(None, f"the vector field could not be evaluated entry by entry "
                            f"({type(e).__name__}: {e}).")
    if key is not None:
        _fields[key] = found
    return found


def _lowering_reason(field: BlockField, solver, d: int, p_size: int, dtype) -> str | None:
    """Why Mosaic cannot lower one step of ``solver`` on ``field`` with its adjoint (the
    primitives it has no rule for), or ``None``."""
    known = mosaic_primitives()
    if known is None:
        return None
    block = jnp.zeros((8, 128), dtype)

    def step_and_adjoint(t, h, y, p, ct):
        y1, err, _ = solver.step(field, t, h, LaneArray(y), LaneArray(p),
                                 field(t, LaneArray(y), LaneArray(p)) if solver.fsal else None)
        _, back = jax.vjp(lambda y, p, t, h: solver.step(field, t, h, y, p, None if not solver.fsal
                                                         else field(t, y, p))[0],
                          LaneArray(y), LaneArray(p), t, h)
        return y1.rows, err.rows, back(LaneArray(ct))

    closed = jax.make_jaxpr(step_and_adjoint)(block, block, [block] * d,
                                              [block] * max(p_size, 1), [block] * d)
    missing = sorted(_primitives(closed.jaxpr, set()) - known)
    if missing:
        names = ", ".join(f"`{m}`" for m in missing)
        return (f"the vector field uses {names}, which Mosaic (Pallas on TPU) does not lower; "
                "gs.drivers.Auto() runs it through XLA instead.")
    return None
