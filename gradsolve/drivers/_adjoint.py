"""A replay with a hand-written adjoint, made differentiable under every transform.

Two drivers compute the forward pass and its exact discrete adjoint by hand: the compiled
CPU kernel (`gradsolve.drivers.kernel`, C++ through ``jax.ffi``) and the lanes replay
(`gradsolve.drivers.lanes`, XLA in structure-of-arrays form). Both provide the same pair of
functions, on batched inputs (``n`` trajectories, ``S1`` mesh nodes, ``k`` save slots,
``P`` flattened parameters per trajectory):

- ``fwd(times, n_eff, y0, pflat, save, tol, tsave, subst) -> (ys, y1, err, states, cost)``
  with ``ys (n, k, d)``, ``y1 (n, d)``, ``err (n,)``, ``states`` (whatever the backward pass
  needs, a function of the inputs: an array or a tuple of arrays) and ``cost (n,)`` int32
  steps computed;
- ``bwd(times, n_eff, pflat, save, states, ct_ys, ct_y1, tsave, subst, with_times)
  -> (ct_tsave (n, k), ct_y0 (n, d), ct_pflat (n, P))``; ``with_times`` (static) says
  whether ``ct_tsave`` is needed: without it the adjoint skips the node-time cotangents
  (zeros are returned), which costs the kernel a leaner compiled variant and the lanes
  replay a carry.

`adjoint_replay` wraps them (why it is built this way):

- ``forward`` is a ``custom_jvp`` function. Its JVP rule returns the values and a tangent
  built with `gradsolve._linear.linear_apply` (a linear map with a given transpose):
  forward mode evaluates the tangent with the batched driver's own JVP
  (`gradsolve.drivers.batched.replay_nodes`, the same steps differentiated by JAX), reverse
  mode transposes it into ``bwd``. So ``grad``/``vjp`` get the fast adjoint while
  ``jvp``/``jacfwd`` keep working, which a ``custom_vjp`` would forbid.
- ``backward`` is itself a ``custom_jvp`` function whose rule differentiates the batched
  replay's VJP, so second derivatives (``hessian``, ``jacfwd(jacrev(...))``) work too.
- Which adjoint runs follows the tangents that are live (JAX's symbolic zeros): save
  times that carry no derivative (concrete ``ts``, or traced but not differentiated) take
  the adjoint without node-time cotangents, as cheap as a replay without ``ts``.
- ``states`` travel from ``forward`` to ``backward`` as residuals. They are a function of
  the differentiable inputs, and ``backward``'s rule differentiates through those inputs
  only, so their own tangent is never needed (it is returned as zero).
- Every array reaches the rules as an argument, never a closure: the transposed and
  differentiated rules are traced lazily, outside the trace that created them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._flat import flat_params, flatten_spec, per_trajectory, unflatten_one
from .._linear import linear_apply
from .base import ReplayLayout, ReplayNodes, ReplayOutput


def _zero_tangent(x):
    """The zero tangent of a non-differentiable output: float0 for integer arrays, as JAX
    requires."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


class _Inputs(NamedTuple):
    """What the replay's differentiable inputs are unflattened and evaluated with."""

    fwd: Callable
    bwd: Callable
    f: Callable
    solver: Any
    spec: tuple          # (treedef, shapes, dtypes) of the parameters
    layout: ReplayLayout
    moved: bool
    has_events: bool
    before_bwd: Callable | None

    @property
    def n_diff(self) -> int:
        # (tsave, y0, pflat) and, with events, (jump_times, jump_sizes)
        return 5 if self.has_events else 3


def _events_of(c: _Inputs, diff, aux):
    """The replay's events from the differentiable (jump times and sizes) and auxiliary
    (jump, landing and reset indices) inputs; ``()`` without events."""
    if not c.has_events:
        return ()
    from .._events import ReplayEvents

    jidx, land, reset = aux[5:]
    return (ReplayEvents(jidx, land, diff[3], diff[4], reset),)


def _xla(c: _Inputs, diff, aux):
    """``(ys, y1)`` by the batched driver on the same inputs: the rule for tangents."""
    from .batched import replay_nodes  # the tangent rule: same steps, JAX's AD

    tm, y, pf = diff[:3]
    params = jax.vmap(lambda q: unflatten_one(q, *c.spec))(pf)
    times, n_eff, save, tol, subst = aux[:5]
    out = replay_nodes(c.f, c.solver, ReplayNodes(times, n_eff, save, tm, subst,
                                                  *_events_of(c, diff, aux)),
                       y, params, tol[0, 0], tol[0, 1], c.moved, c.layout)
    return out.ys, out.y1


def _vjp_xla(c: _Inputs, diff, ct_ys, ct_y1, aux):
    _, back = jax.vjp(lambda d: _xla(c, d, aux), diff)
    return back((ct_ys, ct_y1))[0]


def _backward(c: _Inputs, with_times: bool):
    """The hand-written adjoint as a ``custom_jvp`` function whose rule differentiates the
    batched replay's VJP (second derivatives)."""

    @jax.custom_jvp
    def backward(diff, states, ct_ys, ct_y1, aux):
        tm, y, pf = diff[:3]
        times, n_eff, save, _, subst = aux[:5]
        if c.before_bwd is not None and not c.before_bwd(with_times):
            # The hand-written adjoint could not be built: the batched one, same values.
            return _vjp_xla(c, diff, ct_ys, ct_y1, aux)
        return tuple(c.bwd(times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst,
                           with_times, *_events_of(c, diff, aux)))

    def backward_jvp(primals, tangents):
        diff, states, ct_ys, ct_y1, aux = primals
        ddiff, _, dct_ys, dct_y1, _ = tangents
        out = backward(*primals)
        _, dout = jax.jvp(lambda a, b, d: _vjp_xla(c, a, b, d, aux), (diff, ct_ys, ct_y1),
                          (ddiff, dct_ys, dct_y1))
        return out, dout

    backward.defjvp(backward_jvp)
    return backward


def _forward(c: _Inputs):
    """The forward replay ``(diff, aux) -> (ys, y1, err, states, cost)`` as a
    ``custom_jvp`` function (see the module docstring)."""
    backwards = {True: _backward(c, True), False: _backward(c, False)}
    n_diff = c.n_diff

    @jax.custom_jvp
    def forward(diff, aux):
        tm, y, pf = diff[:3]
        times, n_eff, save, tol, subst = aux[:5]
        return c.fwd(times, n_eff, y, pf, save, tol, tm, subst, *_events_of(c, diff, aux))

    def forward_jvp(primals, tangents):
        diff, aux = primals
        ys, y1, err, states, cost = forward(diff, aux)
        # Only non-zero tangents are linear arguments: the transpose returns cotangents
        # for exactly those.
        live = [not isinstance(t, jax.custom_derivatives.SymbolicZero) for t in tangents[0]]
        times_live = (c.moved and live[0]) or (c.has_events and live[3])

        def full(tans, like):
            it = iter(tans)
            return tuple(next(it) if lv else jnp.zeros_like(x) for lv, x in zip(live, like))

        # linear_apply's residuals are flat: diff, the states' leaves, aux.
        st_leaves, st_def = jax.tree_util.tree_flatten(states)
        n_st = len(st_leaves)
        unpack = lambda res: (res[:n_diff],
                              jax.tree_util.tree_unflatten(st_def, res[n_diff:n_diff + n_st]),
                              res[n_diff + n_st:])

        def lin(res, tans):
            diff, _, aux = unpack(res)
            return jax.jvp(lambda d: _xla(c, d, aux), (diff,), (full(tans, diff),))[1]

        def lin_t(res, cts):
            diff, states, aux = unpack(res)
            out = backwards[times_live](diff, states, *cts, aux)
            return [o for lv, o in zip(live, out) if lv]

        tans = [t for lv, t in zip(live, tangents[0]) if lv]
        if tans:
            dys, dy1 = linear_apply(lin, lin_t, (*diff, *st_leaves, *aux), tans,
                                    out_shapes=(ys, y1))
        else:
            dys, dy1 = jnp.zeros_like(ys), jnp.zeros_like(y1)
        return ((ys, y1, err, states, cost),
                (dys, dy1, jnp.zeros_like(err), jax.tree_util.tree_map(_zero_tangent, states),
                 _zero_tangent(cost)))

    forward.defjvp(forward_jvp, symbolic_zeros=True)
    return forward


def adjoint_replay(fwd, bwd, f, solver, nodes: ReplayNodes, y0, params, rtol, atol,
                   layout: ReplayLayout, moved: bool, before_bwd=None) -> ReplayOutput:
    """The replay of ``nodes`` computed by ``fwd``, differentiated by ``bwd``.

    ``fwd``/``bwd`` as in the module docstring; forward-mode and second derivatives are the
    batched driver's on the same ``f``, ``solver`` and ``layout``; ``before_bwd()`` runs
    when the backward pass is traced, as ``before_bwd(with_times)`` (e.g. to build that
    variant), and returns whether ``bwd`` can run; if not, reverse mode is the batched
    driver's too.

    With known-time events (``nodes.events``, `gradsolve._events.ReplayEvents`) the jump
    times and sizes are differentiable inputs too: ``fwd`` and ``bwd`` then take the
    events as a last argument ``ev`` and ``bwd`` also returns ``ct_jump_times (n, J)`` and
    ``ct_jump_sizes (n, J, d)``; ``with_times`` is then true where save times or jump times
    carry a derivative (a jump time moves its nodes).
    """
    dtype = jnp.result_type(y0)
    n = y0.shape[0]
    leaves, treedef, shapes, dtypes = flatten_spec(params)
    ev = nodes.events
    c = _Inputs(fwd, bwd, f, solver, (treedef, shapes, dtypes), layout, moved, ev is not None,
                before_bwd)
    # Differentiable inputs: (tsave, y0, pflat) and, with events, (jump_times, jump_sizes).
    # ``aux``: (times, n_eff, save_index, tol, subst) and, with events, the event indices
    # (jump_index, land_index, reset_index).
    diff = (nodes.tsave.astype(dtype), y0, flat_params(leaves, n, dtype))
    aux = (nodes.times, nodes.n_eff.astype(jnp.int32), nodes.save_index.astype(jnp.int32),
           per_trajectory((rtol, atol), n, dtype), nodes.subst.astype(jnp.int32))
    if c.has_events:
        diff += (ev.jump_times.astype(dtype), ev.jump_sizes.astype(dtype))
        aux += (ev.jump_index.astype(jnp.int32), ev.land_index.astype(jnp.int32),
                ev.reset_index.astype(jnp.int32))
    ys, y1, err, _, cost = _forward(c)(diff, aux)
    # Lane-steps computed, idle lanes included.
    work = jnp.sum(cost).astype(dtype)
    return ReplayOutput(ys, y1, jax.lax.stop_gradient(err), work)
