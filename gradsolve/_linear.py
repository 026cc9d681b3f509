"""``linear_apply``: a linear map with a user-given transpose, usable under every transform.

JAX's ``jax.custom_derivatives.linear_call`` does the same but has no batching rule, so
``jacfwd``/``jacrev`` (which ``vmap``) fail through it. This primitive keeps the two
functions as parameters and defines:

- evaluation: ``fun(res, lin)``;
- transposition: ``fun_t(res, ct)``;
- batching: the same primitive with ``vmap``-ed ``fun``/``fun_t`` (linear arguments are
  broadcast to the batch, so the transpose of the batched map is the batched transpose);
- JVP: linear in ``lin``; tangents of the residuals go through ``jax.jvp`` of ``fun``.

``fun`` and ``fun_t`` must take and return flat tuples of arrays and close over no tracers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_NOT_MAPPED = getattr(batching, "not_mapped", None)

linear_p = Primitive("gradsolve_linear_apply")
linear_p.multiple_results = True


def linear_apply(fun, fun_t, res, lin, out_shapes=None):
    """``fun(res, lin)``, linear in ``lin``, whose transpose in ``lin`` is ``fun_t(res, ct)``.

    ``out_shapes`` (``ShapeDtypeStruct``s of the outputs) spares tracing ``fun`` for shapes.
    """
    res, lin = tuple(res), tuple(lin)
    if out_shapes is None:
        out_shapes = jax.eval_shape(lambda r, l: tuple(fun(r, l)), res, lin)
    avals = tuple(jax.core.ShapedArray(tuple(o.shape), o.dtype) for o in out_shapes)
    return linear_p.bind(*res, *lin, fun=fun, fun_t=fun_t, n_res=len(res), avals=avals)


def _split(args, n_res):
    return tuple(args[:n_res]), tuple(args[n_res:])


def _impl(*args, fun, fun_t, n_res, avals):
    res, lin = _split(args, n_res)
    return list(fun(res, lin))


def _abstract(*in_avals, fun, fun_t, n_res, avals):
    return list(avals)


def _transpose(cts, *args, fun, fun_t, n_res, avals):
    res, _ = _split(args, n_res)
    if any(ad.is_undefined_primal(r) for r in res):
        raise NotImplementedError("gradsolve linear_apply: residuals must be known")
    out = fun_t(res, tuple(ad.instantiate_zeros(ct) for ct in cts))
    return [None] * n_res + list(out)


def _batch(args, dims, fun, fun_t, n_res, avals):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None and d is not _NOT_MAPPED)
    res, lin = _split(args, n_res)
    res_dims, lin_dims = _split(dims, n_res)
    lin = tuple(
        jnp.broadcast_to(x, (size,) + x.shape) if dm is None or dm is _NOT_MAPPED
        else jnp.moveaxis(x, dm, 0)
        for x, dm in zip(lin, lin_dims)
    )
    res_axes = tuple(None if dm is None or dm is _NOT_MAPPED else dm for dm in res_dims)

    def bfun(r, l):
        return tuple(jax.vmap(lambda r_, l_: tuple(fun(r_, l_)), in_axes=(res_axes, 0))(r, l))

    def bfun_t(r, c):
        return tuple(jax.vmap(lambda r_, c_: tuple(fun_t(r_, c_)), in_axes=(res_axes, 0))(r, c))

    bavals = tuple(jax.core.ShapedArray((size,) + a.shape, a.dtype) for a in avals)
    out = linear_p.bind(*res, *lin, fun=bfun, fun_t=bfun_t, n_res=n_res, avals=bavals)
    return out, [0] * len(out)


def _jvp(primals, tangents, fun, fun_t, n_res, avals):
    res, lin = _split(primals, n_res)
    dres, dlin = _split(tangents, n_res)
    out = linear_p.bind(*primals, fun=fun, fun_t=fun_t, n_res=n_res, avals=avals)
    dlin = tuple(jnp.zeros_like(x) if type(t) is ad.Zero else t for x, t in zip(lin, dlin))
    tan = linear_p.bind(*res, *dlin, fun=fun, fun_t=fun_t, n_res=n_res, avals=avals)
    if any(type(t) is not ad.Zero for t in dres):
        dres = tuple(ad.instantiate_zeros(t) for t in dres)
        extra = jax.jvp(lambda r: tuple(fun(r, lin)), (res,), (dres,))[1]
        tan = [a + b for a, b in zip(tan, extra)]
    return out, tan


linear_p.def_impl(_impl)
linear_p.def_abstract_eval(_abstract)
ad.primitive_jvps[linear_p] = _jvp
ad.primitive_transposes[linear_p] = _transpose
batching.primitive_batchers[linear_p] = _batch
mlir.register_lowering(linear_p, mlir.lower_fun(_impl, multiple_results=True))
