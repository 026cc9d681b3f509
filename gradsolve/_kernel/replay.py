"""The compiled replay as a differentiable JAX function.

``kernel_replay`` returns the same ``(ys, y1, err, work)`` as
`gradsolve._replay.replay_batched`, computed by the generated C++ kernel, or ``None`` when the
kernel does not apply (not on CPU, not an explicit Runge–Kutta solver, a vector field the
translator does not handle, no compiler); the caller then runs the XLA replay.

Differentiation (why it is built this way):

- ``forward`` is a ``custom_jvp`` function. Its JVP rule returns the kernel's values and a
  tangent built with `gradsolve._kernel.linear.linear_apply` (a linear map with a given
  transpose): forward mode evaluates the tangent with the XLA replay's own JVP, reverse
  mode transposes it into ``backward``, the compiled adjoint. So ``grad``/``vjp`` get the
  fast adjoint while ``jvp``/``jacfwd`` keep working, which a ``custom_vjp`` would forbid.
- ``backward`` is itself a ``custom_jvp`` function whose rule differentiates the XLA
  replay's VJP, so second derivatives (``hessian``, ``jacfwd(jacrev(...))``) work too.
- The stored node states travel from ``forward`` to ``backward`` as residuals. They are a
  function of the differentiable inputs, and ``backward``'s rule differentiates through
  those inputs only, so the states' own tangent is never needed (it is returned as zero).
- Every array reaches the rules as an argument, never a closure: the transposed and
  differentiated rules are traced lazily, outside the trace that created them.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .._solver.base import AbstractExplicitRK
from . import build
from .codegen import Unsupported
from .linear import linear_apply
from .source import generate

_sources: dict = {}


def _flatten_spec(params):
    """Leaves, treedef, per-trajectory leaf shapes and dtypes of batched ``params``."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    shapes = tuple(tuple(leaf.shape[1:]) for leaf in leaves)
    dtypes = tuple(jnp.result_type(leaf) for leaf in leaves)
    return leaves, treedef, shapes, dtypes


def flat_params(leaves, n: int, dtype):
    """Per-trajectory parameters as one ``(n, P)`` matrix of the state dtype."""
    if not leaves:
        return jnp.zeros((n, 0), dtype)
    return jnp.concatenate([leaf.reshape(n, -1).astype(dtype) for leaf in leaves], axis=1)


def per_trajectory(values, n: int, dtype):
    """Scalars (or a vector) repeated as one ``(n, len(values))`` row per trajectory: every
    kernel operand leads with the ensemble axis, so it shards and vmaps like the others."""
    row = jnp.stack([jnp.asarray(v, dtype) for v in values])
    return jnp.broadcast_to(row, (n,) + row.shape)


def _unflatten_one(pflat, treedef, shapes, dtypes):
    out, i = [], 0
    for shape, dt in zip(shapes, dtypes):
        size = int(np.prod(shape))
        out.append(pflat[i:i + size].reshape(shape).astype(dt))
        i += size
    return jax.tree_util.tree_unflatten(treedef, out)


def _prefix_for(f, solver, d: int, treedef, shapes, dtypes, dtype):
    key = None
    try:
        key = (f, type(solver), d, treedef, shapes, tuple(map(str, dtypes)), str(dtype))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _sources:
        return _sources[key]
    p_size = int(sum(int(np.prod(s)) for s in shapes))

    def f_flat(t, y, pflat):
        return f(t, y, _unflatten_one(pflat, treedef, shapes, dtypes))

    try:
        source = generate(f_flat, d, p_size, dtype, solver)
    except Unsupported:
        prefix = None
    else:
        variant_key = (type(solver), d, treedef, shapes, tuple(map(str, dtypes)), str(dtype))
        prefix = None if _too_many_variants(f, variant_key, source) else build.load(source)
    if key is not None:
        _sources[key] = prefix
    return prefix


# Distinct kernel sources generated per vector-field code object in this process. Values a
# vector field closes over are compiled into its kernel as constants, so
# ``gs.solve(lambda t, y, p: -k * y, ...)`` in a loop over ``k`` would compile a new kernel
# (seconds) for every ``k``; past `_MAX_VARIANTS` such variants new ones use the XLA driver.
_variants: dict = {}
_MAX_VARIANTS = 4


def _too_many_variants(f, variant_key, source: str) -> bool:
    """Whether ``f``'s code already compiled `_MAX_VARIANTS` other kernels for the same
    solver and shapes (so the sources differ only by closed-over values)."""
    code = getattr(f, "__code__", None)
    if code is None:
        return False
    seen = _variants.setdefault((code, variant_key), set())
    digest = hash(source)
    if digest in seen:
        return False
    if len(seen) >= _MAX_VARIANTS:
        if len(seen) == _MAX_VARIANTS:
            seen.add(None)  # warn once per code object
            warnings.warn(
                f"gradsolve: the vector field {getattr(f, '__qualname__', f)!r} closes over "
                f"values that change between calls; each new value compiles a new CPU kernel "
                f"(seconds), so after {_MAX_VARIANTS} of them it runs on the XLA driver "
                "(same results, slower). Pass such values through `params` to reuse one "
                "compiled kernel.", RuntimeWarning, stacklevel=6)
        return True
    seen.add(digest)
    return False


def spread(make_call, n: int):
    """``make_call(n_local)`` (an FFI call on ``n_local`` trajectories) run on every device's
    share of the ensemble axis (``shard_map`` over `gradsolve.ensemble_sharding`'s mesh), so
    a sharded ensemble stays where it lives and every device works; with one device (or
    ``n`` not divisible by the device count) the plain call."""
    devices = jax.devices()
    if len(devices) <= 1 or n % len(devices):
        return make_call(n)
    from jax.sharding import PartitionSpec

    from .._sharding import ensemble_sharding

    mesh = ensemble_sharding().mesh
    return jax.shard_map(make_call(n // len(devices)), mesh=mesh,
                         in_specs=PartitionSpec("ensemble"), out_specs=PartitionSpec("ensemble"),
                         check_vma=False)


def kernel_target(f, solver, y0, params) -> str | None:
    """FFI target prefix of the compiled kernel for this problem, or ``None`` if it does not
    apply (not on CPU, not an explicit Runge–Kutta solver, non-float inputs, a vector field
    the translator does not handle, no compiler). Works on abstract values (under ``jit``)."""
    if jax.default_backend() != "cpu" or not isinstance(solver, AbstractExplicitRK):
        return None
    dtype = jnp.result_type(y0)
    if dtype not in (jnp.float64, jnp.float32) or jnp.ndim(y0) != 2:
        return None
    leaves, treedef, shapes, dtypes = _flatten_spec(params)
    if any(not jnp.issubdtype(dt, jnp.floating) for dt in dtypes):
        return None
    return _prefix_for(f, solver, jnp.shape(y0)[1], treedef, shapes, dtypes, dtype)


def kernel_replay(f, solver, times, n_eff, y0, params, save_index, rtol, atol, tsave, subst,
                  xla_replay, moved: bool):
    """Compiled replay, or ``None`` if it does not apply (see `kernel_target`).

    ``times (n, S+1)`` are the recorded nodes (no gradient); save slot ``m`` with
    ``subst[:, m]`` moves node ``save_index[:, m]`` to ``tsave[:, m]`` (differentiable), as
    `gradsolve.replay` does for interior save times. Doing that inside the kernel keeps
    every differentiable input and cotangent at ``(n, k)``, not ``(n, S+1)``.
    ``xla_replay(tsave, y0, params, times, n_eff, save_index, tol, subst)`` returns
    ``(ys, y1, err, work)`` by the XLA path; it defines forward-mode and second derivatives.
    ``moved`` (static: ``ts`` was given) selects the adjoint that carries node-time
    cotangents, built on first use (`gradsolve._kernel.build.load_part`).
    """
    prefix = kernel_target(f, solver, y0, params)
    if prefix is None:
        return None
    dtype = jnp.result_type(y0)
    n, d = y0.shape
    leaves, treedef, shapes, dtypes = _flatten_spec(params)

    pflat = flat_params(leaves, n, dtype)
    tol = per_trajectory((rtol, atol), n, dtype)
    subst = subst.astype(jnp.int32)
    tsave = tsave.astype(dtype)
    n_eff = n_eff.astype(jnp.int32)
    save_index = save_index.astype(jnp.int32)
    k = save_index.shape[1]
    s1 = times.shape[1]
    p_size = pflat.shape[1]

    fwd_call = spread(lambda m: jax.ffi.ffi_call(
        f"{prefix}_fwd",
        (jax.ShapeDtypeStruct((m, k, d), dtype), jax.ShapeDtypeStruct((m, d), dtype),
         jax.ShapeDtypeStruct((m,), dtype), jax.ShapeDtypeStruct((m, s1, d), dtype),
         jax.ShapeDtypeStruct((m,), jnp.int32)),
        vmap_method="broadcast_all",
    ), n)
    bwd_part = "bwdt" if moved else "bwd"
    bwd_call = spread(lambda m: jax.ffi.ffi_call(
        f"{prefix}_{bwd_part}",
        (jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((m, d), dtype),
         jax.ShapeDtypeStruct((m, p_size), dtype)),
        vmap_method="broadcast_all",
    ), n)

    def xla(tm, y, pf, aux):
        params = jax.vmap(lambda q: _unflatten_one(q, treedef, shapes, dtypes))(pf)
        ys, y1 = xla_replay(tm, y, params, *aux)[:2]
        return ys, y1

    # ``tm`` below is ``tsave``; ``aux = (times, n_eff, save_index, tol, subst)``.
    @jax.custom_jvp
    def forward(tm, y, pf, aux):
        times, n_eff, save, tol, subst = aux
        return fwd_call(times, n_eff, y, pf, save, tol, tm, subst)

    @jax.custom_jvp
    def backward(tm, y, pf, states, ct_ys, ct_y1, aux):
        times, n_eff, save, _, subst = aux
        build.load_part(prefix, bwd_part)
        return bwd_call(times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst)

    def backward_jvp(primals, tangents):
        tm, y, pf, states, ct_ys, ct_y1, aux = primals
        dtm, dy, dpf, _, dct_ys, dct_y1, _ = tangents
        out = backward(*primals)

        def vjp_xla(tm, y, pf, ct_ys, ct_y1):
            _, back = jax.vjp(lambda a, b, c: xla(a, b, c, aux), tm, y, pf)
            return back((ct_ys, ct_y1))

        _, dout = jax.jvp(vjp_xla, (tm, y, pf, ct_ys, ct_y1), (dtm, dy, dpf, dct_ys, dct_y1))
        return out, dout

    backward.defjvp(backward_jvp)

    def forward_jvp(primals, tangents):
        tm, y, pf, aux = primals
        ys, y1, err, states, cost = forward(tm, y, pf, aux)
        # Only non-zero tangents are linear arguments: the transpose returns cotangents
        # for exactly those.
        live = [not isinstance(t, jax.custom_derivatives.SymbolicZero) for t in tangents[:3]]

        def full(tans, like):
            it = iter(tans)
            return tuple(next(it) if lv else jnp.zeros_like(x) for lv, x in zip(live, like))

        def lin(res, tans):
            tm, y, pf, _, *aux = res
            return jax.jvp(lambda a, b, c: xla(a, b, c, tuple(aux)), (tm, y, pf),
                           full(tans, (tm, y, pf)))[1]

        def lin_t(res, cts):
            tm, y, pf, states, *aux = res
            ct_ys, ct_y1 = cts
            out = backward(tm, y, pf, states, ct_ys, ct_y1, tuple(aux))
            return [o for lv, o in zip(live, out) if lv]

        tans = [t for lv, t in zip(live, tangents[:3]) if lv]
        if tans:
            dys, dy1 = linear_apply(lin, lin_t, (tm, y, pf, states, *aux), tans,
                                    out_shapes=(ys, y1))
        else:
            dys, dy1 = jnp.zeros_like(ys), jnp.zeros_like(y1)
        return ((ys, y1, err, states, cost),
                (dys, dy1, jnp.zeros_like(err), jnp.zeros_like(states),
                 np.zeros(cost.shape, jax.dtypes.float0)))

    forward.defjvp(forward_jvp, symbolic_zeros=True)

    ys, y1, err, _, cost = forward(tsave, y0, pflat, (times, n_eff, save_index, tol, subst))
    # Lane-steps computed, idle lanes included (the kernel refills lanes as trajectories end).
    work = jnp.sum(cost).astype(dtype)
    return ys, y1, jax.lax.stop_gradient(err), work
