"""The lanes replay: the XLA replay of explicit Runge–Kutta solvers in structure-of-arrays
form, with a hand-written discrete adjoint.

Where the compiled CPU kernel does not apply (GPU and TPU, no C++ compiler, the kernel
switched off), explicit Runge–Kutta replays run here. Two things make it several times
faster than AD through the batched (``jax.vmap``-ed) step of `gradsolve._replay`:

- **Structure of arrays.** The vector field's jaxpr is evaluated entry by entry
  (`gradsolve._jaxpr.Scalarizer`, the same translator the C++ kernel uses): each
  state component and each parameter is one ``(n,)`` array over the ensemble, so a whole
  Runge–Kutta step is elementwise arithmetic on ``(n,)`` arrays with no slices, pads or
  concatenations, which XLA fuses into a handful of loops (one step of Lotka–Volterra on
  XLA:CPU: ~8 fusions for the forward and ~7 for the reverse step, against ~46 and ~64
  through AD of the batched step; on a GPU each fusion is a kernel launch). The state is a `LaneArray`
  value, on which the solver's own ``step`` runs unchanged.
- **Hand-written adjoint.** The forward pass stores the state at every node; the reverse
  pass walks the steps backwards, applying ``jax.vjp`` of one step (stages recomputed from
  the stored state, as in the C++ kernel) to the adjoint state, instead of AD through
  rematerialised ``scan`` chunks. With FSAL the carried first stage is recomputed as the
  function of the node state that the previous step computed.
- **Known-time events.** After the step into a jump's node the state jumps, and after a
  jump or tstop node the carried stage is recomputed there, as in the record. The stored
  node state is the one before its jump (what a save there reads); the reverse sweep adds
  the jump again (the same arithmetic, so bitwise the forward's state) and keeps the
  cotangent of the state after each node: a jump size's cotangent is the one at its node,
  and a jump time's comes from the cotangents of the node times it sets.

`gradsolve.drivers._adjoint.adjoint_replay` makes the pair differentiable in every mode: ``grad``
runs the adjoint here, forward mode and second derivatives the batched driver.
Trajectories are sorted by step count into groups (`default_group_size`) and each group
runs only as many steps as its longest member.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
from typing import ClassVar, NamedTuple

from jaxtyping import Array, Float

from ._adjoint import adjoint_replay
from .._flat import cache_key, flat_field, flatten_spec
from .._caches import cache
from .._jaxpr import Scalarizer, Unsupported, unsupported_primitive
from .._misc import length_groups, shared_any, shared_max
from .._mesh import Mesh
from .._sharding import platform
from .._events import jump_node_times
from .._savetimes import node_times
from .._solver.base import AbstractExplicitRK
from .base import AbstractDriver, ReplayLayout, ReplayNodes, ReplayOutput
from .batched import record_loop


@jax.tree_util.register_pytree_node_class
class LaneArray:
    """``d`` components of a state over an ensemble, each an ``(n,)`` array.

    Supports the arithmetic a Runge–Kutta step uses (``+``, ``-``, ``*``, ``/`` with
    scalars, ``(n,)`` arrays and other `LaneArray`), so ``solver.step`` runs on it unchanged.
    """

    __slots__ = ("rows",)

    def __init__(self, rows):
        self.rows = tuple(rows)

    def tree_flatten(self):
        return self.rows, None

    @classmethod
    def tree_unflatten(cls, aux, rows):
        return cls(rows)

    @classmethod
    def from_matrix(cls, x: Float[Array, "n d"]) -> "LaneArray":
        return cls(x[:, j] for j in range(x.shape[1]))

    def matrix(self) -> Float[Array, "n d"]:
        return jnp.stack(self.rows, axis=1)

    def _apply(self, other, op):
        if isinstance(other, LaneArray):
            return LaneArray(op(a, b) for a, b in zip(self.rows, other.rows))
        return LaneArray(op(a, other) for a in self.rows)

    def __add__(self, other):
        return self._apply(other, operator.add)

    def __radd__(self, other):
        return self._apply(other, lambda a, b: b + a)

    def __sub__(self, other):
        return self._apply(other, operator.sub)

    def __rsub__(self, other):
        return self._apply(other, lambda a, b: b - a)

    def __mul__(self, other):
        return self._apply(other, operator.mul)

    def __rmul__(self, other):
        return self._apply(other, lambda a, b: b * a)

    def __truediv__(self, other):
        return self._apply(other, operator.truediv)

    def __neg__(self):
        return LaneArray(-a for a in self.rows)


def _objects(entries) -> np.ndarray:
    """A 1-d numpy object array holding ``entries`` as they are (no conversion)."""
    out = np.empty((len(entries),), dtype=object)
    for i, e in enumerate(entries):
        out[i] = e
    return out


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer))


class _LaneScalarizer(Scalarizer):
    """`Scalarizer` whose entries are ``(n,)`` JAX arrays (or concrete numpy scalars for
    constants, folded at translation time)."""

    def __init__(self, n: int):
        self.n = n
        self.shape = (n,)  # the shape of one entry (a subclass's blocks have others)

    def constant(self, value, dtype) -> np.ndarray:
        arr = self._concrete(value)
        out = np.empty(arr.shape, dtype=object)
        for idx in np.ndindex(arr.shape):
            out[idx] = np.asarray(arr[idx], dtype)
        return out

    def constant_value(self, entry):
        return None if _is_array(entry) else entry

    def _bind(self, prim, args, dtypes, params):
        return self._apply(lambda *xs: prim.bind(*xs, **params), args, dtypes,
                           prim.multiple_results)

    def _apply(self, fn, args, dtypes, multiple=False):
        if not any(_is_array(a) for a in args):  # constants: fold now
            with jax.ensure_compile_time_eval():
                outs = fn(*[jnp.asarray(a, dt) for a, dt in zip(args, dtypes)])
            return [np.asarray(o) for o in outs] if multiple else np.asarray(outs)
        args = [a if _is_array(a) else jnp.full(self.shape, a, dt) for a, dt in zip(args, dtypes)]
        return fn(*args)

    def elementwise(self, eqn, ins):
        shape = tuple(eqn.outvars[0].aval.shape)
        dtypes = [v.aval.dtype for v in eqn.invars]
        ins = [np.broadcast_to(a, shape) for a in ins]
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = self._bind(eqn.primitive, [a[idx] for a in ins], dtypes, eqn.params)
        return [out]

    def primitive(self, eqn, ins):
        # A custom derivative rule would be lost by differentiating its primal entry by
        # entry: such vector fields use the batched replay instead.
        if eqn.primitive.name.startswith("custom_"):
            raise unsupported_primitive(eqn.primitive.name)
        return super().primitive(eqn, ins)


class LaneField:
    """A vector field ``f(t, y, params)`` (one trajectory) evaluated over lanes:
    ``field(t (n,), y: LaneArray (d), p: LaneArray (P)) -> LaneArray (d)``, with ``p`` the flattened
    per-trajectory parameters (`gradsolve._flat.flat_params`)."""

    def __init__(self, closed, d: int, dtype):
        self.closed, self.d, self.dtype = closed, d, dtype

    def __call__(self, t, y: LaneArray, p: LaneArray) -> LaneArray:
        n = jnp.shape(t)[0]
        sc = _LaneScalarizer(n)
        targ, yarg, parg = _objects([t]).reshape(()), _objects(y.rows), _objects(p.rows)
        (out,) = sc.run(self.closed, [targ, yarg, parg])
        rows = [o if _is_array(o) else jnp.full((n,), o, self.dtype)
                for o in np.asarray(out, dtype=object).reshape(-1)]
        return LaneArray(rows)


# (f, shapes, dtypes) -> the lanes form of f, or the reason there is none
_fields = cache("lanes fields")

# Where the lanes replay pays (XLA:CPU, kernel off, Tsit5 gradient, n = 1,000, against the
# batched replay, measured side by side in one process): Lotka–Volterra (d = 2, 9 lane ops per field
# evaluation) 1.7x faster, Lorenz-96 at d = 8 (32 ops) 3.8x and d = 20 (80 ops) 3.2x; but
# Lorenz-96 at d = 30 5x slower and at d = 40 50x slower (XLA fuses each of the reverse
# step's d + P outputs separately, each with the whole step in it: quadratic in d, and
# past d ~ 20-30 its fusion gives up), and a dense field tanh(A y) at d = 4 (56 ops) 1.8x
# slower, at d = 12 (~500 ops) 10x slower with a 215 s compile. The rule keeps the first
# group and leaves the rest to the batched replay.
_LANES_MAX_STATES = 16
_LANES_MAX_OPS_PER_STATE = 8


def lanes_pays(d: int, ops: int) -> bool:
    """Whether a field of ``d`` states costing ``ops`` lane operations per evaluation runs
    the lanes replay: few states, each with a short expression (not dense coupling)."""
    return d <= _LANES_MAX_STATES and ops <= _LANES_MAX_OPS_PER_STATE * d


class Field(NamedTuple):
    """The lanes form of a vector field (``field``), or ``None`` and the reason why not;
    ``untranslated``: what the translator did not handle, where that is the reason."""

    field: "LaneField | None"
    reason: str | None
    untranslated: str | None = None


def lane_field(f, solver, y0, params) -> Field:
    """The lanes form of ``f`` for batched ``y0 (n, d)``, ``params``, or why the lanes
    replay does not apply (not an explicit Runge–Kutta solver with an error estimate,
    non-float inputs, a vector field the translator does not handle or that would not pay).
    Works on abstract values."""
    if not isinstance(solver, AbstractExplicitRK) or not np.any(np.asarray(solver.b_error) != 0):
        return Field(None, f"it runs explicit Runge–Kutta solvers with an error estimate "
                           f"(gs.Tsit5, gs.Dopri5, gs.Vern7), not {type(solver).__name__}.")
    dtype = jnp.result_type(y0)
    if dtype not in (jnp.float64, jnp.float32, jnp.float16, jnp.bfloat16) or jnp.ndim(y0) != 2:
        return Field(None, f"it runs floating-point states, not {dtype}.")
    _, treedef, shapes, dtypes = flatten_spec(params)
    if any(not jnp.issubdtype(dt, jnp.floating) for dt in dtypes):
        return Field(None, "every params leaf must be floating point for it.")
    d = jnp.shape(y0)[1]
    key = cache_key(f, d, treedef, shapes, tuple(map(str, dtypes)), str(dtype))
    if key is not None and key in _fields:
        return _fields[key]
    f_rows, p_size = flat_field(f, treedef, shapes, dtypes)

    def f_flat(t, y, pflat):
        return f_rows(t, y, pflat).astype(dtype)

    try:
        closed = jax.make_jaxpr(f_flat)(jnp.zeros((), dtype), jnp.zeros((d,), dtype),
                                        jnp.zeros((p_size,), dtype))
        field = LaneField(closed, d, dtype)
        probe = LaneArray([jnp.zeros((1,), dtype)] * d)
        lanes_jaxpr = jax.make_jaxpr(field)(jnp.zeros((1,), dtype), probe,
                                            LaneArray([jnp.zeros((1,), dtype)] * p_size))
        ops = len(lanes_jaxpr.jaxpr.eqns)
        found = Field(field, None) if lanes_pays(d, ops) else Field(
            None, f"it pays only for at most {_LANES_MAX_STATES} states with at most "
                  f"{_LANES_MAX_OPS_PER_STATE} operations each; this field has {d} states "
                  f"and {ops} operations.")
    except Unsupported as e:
        found = Field(None, f"the translator does not handle this vector field ({e}).", str(e))
    except Exception as e:  # noqa: BLE001 - anything untranslatable: another driver
        found = Field(None, f"the vector field could not be evaluated entry by entry "
                            f"({type(e).__name__}: {e}).",
                      f"something it could not evaluate entry by entry ({type(e).__name__})")
    if key is not None:
        _fields[key] = found
    return found


def _error_norm(y_err: LaneArray, y0: LaneArray, y1: LaneArray, rtol, atol):
    """`gradsolve._controller.error_norm` over lanes. Not that function on stacked ``(g, d)``
    matrices: the stack splits the step's fusion (LV n = 1,000 forward 3.4 -> 8.3 ms)."""
    acc = 0.0
    finite = True
    for e, a, b in zip(y_err.rows, y0.rows, y1.rows):
        r = e / (atol + rtol * jnp.maximum(jnp.abs(a), jnp.abs(b)))
        acc = acc + r * r
        finite = finite & jnp.isfinite(b)
    err = jnp.sqrt(acc / len(y_err.rows))
    return jnp.where(finite & jnp.isfinite(err), err, jnp.inf)


def _where(c, a: LaneArray, b: LaneArray) -> LaneArray:
    return LaneArray(jnp.where(c, x, y) for x, y in zip(a.rows, b.rows))


def _column(x, i):
    return jax.lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False)


def _stage(field, solver, t_prev, ta, y: LaneArray, p: LaneArray):
    """The carried first stage at node ``ta``: ``f`` at the time the previous step used
    (``t_prev + c_s (ta - t_prev)``, so bitwise the value it carried), ``None`` without FSAL."""
    if not solver.fsal:
        return None
    return field(t_prev + float(solver.c[-1]) * (ta - t_prev), y, p)


def _chunked_loop(n, body, carry, chunk: int = 8):
    """``body(i, carry)`` for ``i`` in ``[0, ceil(n / chunk) * chunk)``: a loop of dynamic
    length over chunks of a fixed-length loop, so a GPU checks the loop condition on the
    host once per chunk, not once per step. ``body`` must be an identity past ``n``."""
    def one_chunk(c, carry):
        return jax.lax.fori_loop(0, chunk, lambda k, cr: body(c * chunk + k, cr), carry)

    return jax.lax.fori_loop(0, (n + chunk - 1) // chunk, one_chunk, carry)


def recomputed_step(field, solver):
    """``unit(y, p, t_prev, ta, tb, reset) -> y1``: one step from node ``ta`` to ``tb`` as
    the forward took it, for an adjoint that recomputes steps from stored node states. An
    FSAL solver's carried stage is recomputed where the forward had it: at the previous
    step's last stage time, or at the node itself after a jump or tstop (``reset``;
    ``None`` without events)."""
    c_last = float(solver.c[-1])

    def unit(y, p, t_prev, ta, tb, reset):
        if solver.fsal:
            # The carried stage as the forward computed it: at the previous step's last
            # stage time, or recomputed at the node after a jump or tstop.
            ts = t_prev + c_last * (ta - t_prev)
            st = field(ts if reset is None else jnp.where(reset, ta, ts), y, p)
        else:
            st = None
        return solver.step(field, ta, tb - ta, y, p, st)[0]
    return unit


def _jumped(y: LaneArray, node, active, ev) -> LaneArray:
    """``y`` after the jumps at ``node`` on ``active`` lanes (`gradsolve._events.apply_jumps`
    over lanes); the forward and the reverse sweep both call it, so they agree bitwise."""
    jump_index, jump_sizes, _ = ev
    hit = (jump_index == node) & active[:, None]
    any_hit = jnp.any(hit, axis=1)
    return LaneArray(jnp.where(any_hit, r + jnp.sum(jnp.where(hit, jump_sizes[:, :, j], 0.0), axis=1), r)
                     for j, r in enumerate(y.rows))


def _is_reset(node, ev):
    """``(g,)``: is ``node`` a jump or tstop node, after which the carried stage is
    recomputed (the record does so)."""
    return jnp.any(ev[2] == node, axis=1)


def _forward_group(field, solver, nodes, n_eff, y0, pflat, save, tol, ev=None):
    """Replay one group. ``nodes (g, S1)`` (moved save and jump nodes included), ``n_eff
    (g,)``, ``y0 (g, d)``, ``pflat (g, P)``, ``save (g, k)``, ``tol (g, 2)``; ``ev``
    ``None`` or ``(jump_index (g, J), jump_sizes (g, J, d), reset_index (g, R))``.
    Returns ``ys (g, k, d)``, ``y1 (g, d)``, ``err (g,)``, ``states (S1, d, g)`` (node
    states, before the node's jump) and ``cost (g,)``."""
    g, d = y0.shape
    s1 = nodes.shape[1]
    p = LaneArray.from_matrix(pflat)
    rtol, atol = tol[:, 0], tol[:, 1]
    n_max = shared_max(n_eff)
    y = LaneArray.from_matrix(y0)
    states = jnp.zeros((s1, d, g), y0.dtype).at[0].set(y0.T)
    st = solver.init(field, nodes[:, 0], y, p)

    def body(i, carry):
        y, st, emax, states = carry
        ta, tb = _column(nodes, i), _column(nodes, jnp.minimum(i + 1, s1 - 1))
        active = i < n_eff
        h = jnp.where(active, tb - ta, 0.0)
        y1, y_err, st1 = solver.step(field, ta, h, y, p, st)
        err = _error_norm(y_err, y, y1, rtol, atol)
        emax = jnp.maximum(emax, jnp.where(active, err, 0.0))
        y = _where(active, y1, y)
        st = st1 if st is None else _where(active, st1, st)
        states = jax.lax.dynamic_update_index_in_dim(states, jnp.stack(y.rows), i + 1, axis=0)
        if ev is not None:
            # After the step into a jump's node the state jumps; after a jump or tstop node
            # the carried stage is recomputed at the node (as the record does).
            y = _jumped(y, i + 1, active, ev)
            if st is not None:
                reset = _is_reset(i + 1, ev) & active
                st = jax.lax.cond(shared_any(reset),
                                  lambda: _where(reset, solver.init(field, tb, y, p), st),
                                  lambda: st)
        return y, st, emax, states

    # Steps past n_max (the last chunk's tail) are inactive everywhere; their clamped state
    # write only repeats each lane's final state into a slot past its n_eff, or its own.
    y, _, emax, states = _chunked_loop(n_max, body, (y, st, jnp.zeros((g,), y0.dtype), states))
    node = jnp.minimum(save, n_eff[:, None])
    ys = states[node, :, jnp.arange(g)[:, None]]
    cost = jnp.broadcast_to(n_max, (g,)).astype(jnp.int32)
    return ys, y.matrix(), emax, states, cost


def _backward_group(field, solver, nodes, n_eff, pflat, save, states, ct_ys, ct_y1,
                    with_times, ev=None):
    """Exact discrete adjoint of `_forward_group`'s steps. Returns ``ct_y0 (g, d)``,
    ``ct_pflat (g, P)``, the node-time cotangents ``(S1, g)`` if ``with_times`` (else None)
    and, with events, the jump sizes' cotangents ``(g, J, d)``: the cotangent of the state
    after the jump's node (else None; padded jumps' entries are meaningless)."""
    s1, d, g = states.shape
    rows = jnp.arange(g)
    node = jnp.minimum(save, n_eff[:, None])
    # Cotangents of the saved states, per node (equal save times share a node and add).
    inject = jnp.zeros_like(states).at[node, :, rows[:, None]].add(ct_ys)
    p = LaneArray.from_matrix(pflat)
    n_max = shared_max(n_eff)
    unit = recomputed_step(field, solver)

    def body(j, carry):
        lam, gp, ct_t, ct_js = carry  # lam: cotangent of the state after node i + 1
        i = n_max - 1 - j
        active = (i >= 0) & (i < n_eff)
        t_prev = _column(nodes, jnp.maximum(i - 1, 0))
        ta, tb = _column(nodes, i), _column(nodes, i + 1)
        y = LaneArray(jax.lax.dynamic_index_in_dim(states, i, axis=0, keepdims=False))
        reset = None
        if ev is not None:
            hit = ev[0] == i + 1                                          # (g, J)
            ct_js = jnp.where(hit[..., None], jnp.stack(lam.rows, -1)[:, None, :], ct_js)
            y = _jumped(y, i, active, ev)
            reset = _is_reset(i, ev)
        # The state at node i + 1 before its jump feeds the saves there and the next step.
        at_next = LaneArray(jax.lax.dynamic_index_in_dim(inject, i + 1, axis=0, keepdims=False))
        _, vjp = jax.vjp(lambda *a: unit(*a, reset), y, p, t_prev, ta, tb)
        dy, dp, dt_prev, dta, dtb = vjp(lam + at_next)
        lam = _where(active, dy, lam)
        gp = _where(active, gp + dp, gp)
        if with_times:
            zero = jnp.zeros_like(ta)
            upd = lambda c, idx, v: c.at[idx].add(jnp.where(active, v, zero))
            ct_t = upd(upd(upd(ct_t, i + 1, dtb), i, dta), jnp.maximum(i - 1, 0), dt_prev)
        return lam, gp, ct_t, ct_js

    # Carries are `LaneArray` (one array per component), not (g, d) matrices: XLA would fuse
    # each output entry's whole reverse step separately and compute it d times.
    ct_t0 = jnp.zeros((s1, g), states.dtype) if with_times else None
    # Jump sizes' cotangents are kept per jump, not per node: an (S1, d, g) buffer would
    # cost the mesh capacity in memory traffic on every call.
    ct_js0 = jnp.zeros(ev[1].shape, states.dtype) if ev is not None else None
    lam, gp, ct_t, ct_js = _chunked_loop(
        n_max, body, (LaneArray.from_matrix(ct_y1), LaneArray.from_matrix(jnp.zeros_like(pflat)),
                      ct_t0, ct_js0))
    ct_y0 = lam.matrix() + inject[0].T
    return ct_y0, gp.matrix(), ct_t, ct_js


def lanes_replay(field: LaneField, f, solver, nodes: ReplayNodes, y0, params, rtol, atol,
                 moved: bool, layout: ReplayLayout) -> ReplayOutput:
    """The lanes replay of ``nodes`` (known-time events included), differentiable in every
    mode (`gradsolve.drivers._adjoint.adjoint_replay`)."""
    group_size = layout.group_size or default_group_size(layout.backend)

    def node_fn(times, save, tm, subst, ev):
        nodes = node_times(times, save, tm, subst)[0]
        return nodes if ev is None else jump_node_times(nodes, ev)

    def lane_events(ev):
        return None if ev is None else (ev.jump_index, ev.jump_sizes, ev.reset_index)

    def fwd(times, n_eff, y, pf, save, tol, tm, subst, ev=None):
        nodes = node_fn(times, save, tm, subst, ev)
        group, ungroup, _ = length_groups(n_eff, group_size)
        ys, y1, err, states, cost = jax.lax.map(
            lambda a: _forward_group(field, solver, *a),
            jax.tree_util.tree_map(group, (nodes, n_eff, y, pf, save, tol, lane_events(ev))))
        return ungroup(ys), ungroup(y1), ungroup(err), states, ungroup(cost)

    def bwd(times, n_eff, pf, save, states, ct_ys, ct_y1, tm, subst, with_times, ev=None):
        nodes = node_fn(times, save, tm, subst, ev)
        group, ungroup, _ = length_groups(n_eff, group_size)
        args = jax.tree_util.tree_map(group, (nodes, n_eff, pf, save, ct_ys, ct_y1,
                                              lane_events(ev)))

        def one(a):
            (nodes, n_eff, pf, save, ct_ys, ct_y1, lev), st = a
            return _backward_group(field, solver, nodes, n_eff, pf, save, st, ct_ys, ct_y1,
                                   with_times, lev)

        ct_y0, ct_pf, ct_t, ct_js = jax.lax.map(one, (args, states))
        ct_y0, ct_pf = ungroup(ct_y0), ungroup(ct_pf)
        if with_times:
            ct_t = ungroup(jnp.swapaxes(ct_t, 1, 2))  # (n, S1)
        if ev is None:
            if with_times:
                owner = node_times(times, save, tm, subst)[1]
                rows = jnp.arange(ct_t.shape[0])[:, None]
                ct_tm = jnp.where(owner, ct_t[rows, save], 0.0)
            else:
                ct_tm = jnp.zeros(save.shape, ct_y1.dtype)
            return ct_tm, ct_y0, ct_pf
        # A jump size's cotangent is that of the state after its node; padded jumps
        # (index 0) get none.
        live = ev.jump_index > 0
        ct_js = jnp.where(live[..., None], ungroup(ct_js), 0.0)
        if with_times:
            # Node-time cotangents back to the save times and jump times that set them.
            _, back = jax.vjp(lambda a, b: node_fn(times, save, a, subst, ev._replace(jump_times=b)),
                              tm, ev.jump_times)
            ct_tm, ct_jt = back(ct_t)
        else:
            ct_tm = jnp.zeros(save.shape, ct_y1.dtype)
            ct_jt = jnp.zeros(ev.jump_times.shape, ct_y1.dtype)
        return ct_tm, ct_y0, ct_pf, ct_jt, ct_js

    return adjoint_replay(fwd, bwd, f, solver, nodes, y0, params, rtol, atol, layout, moved)


_GROUP_SIZE_CPU = 1024
_GROUP_SIZE_ACCELERATOR = 1 << 17


def default_group_size(backend: str | None = None) -> int:
    """Trajectories per length-sorted group of the lanes replay on ``backend`` (default
    the default device's platform, `gradsolve._sharding.platform`): 1,024 on CPU, whose steps are a few large fusions that
    prefer wider groups than the batched driver's (LV n = 1,000 gradient: 18 ms against
    24 ms at 256); one group of up to 131,072 on GPU/TPU, where groups run one after
    another and would only multiply kernel launches."""
    backend = platform() if backend is None else backend
    return _GROUP_SIZE_CPU if backend == "cpu" else _GROUP_SIZE_ACCELERATOR


class Lanes(AbstractDriver):
    """The XLA replay of explicit Runge–Kutta solvers in structure-of-arrays form, with a
    hand-written discrete adjoint (this module's docstring says how and why).

    Applies to explicit solvers with an error estimate on any backend, where the vector
    field translates entry by entry and has few states with short expressions (it pays
    there: up to 16 states, at most 8 lane operations each); the fastest replay off the
    compiled kernel (GPU, TPU, no compiler), known-time events (``jumps=``, ``tstops=``)
    included. Records with the XLA loop of
    `gradsolve.drivers.Batched`. ``Solution.route == "gradsolve-lanes"``.

    Example:
        >>> sol = gs.replay(f, mesh, y0, p, driver=gs.drivers.Lanes())
    """

    name: ClassVar[str] = "gradsolve-lanes"

    def record_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return None

    def replay_reason(self, f, solver, y0, params, *, events: bool = False) -> str | None:
        return lane_field(f, solver, y0, params).reason

    def record(self, f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
               max_steps: int, fill: bool, events=None) -> Mesh:
        return record_loop(f, solver, controller, t0, t1, y0, params, ts, rtol, atol, dt0,
                           max_steps, fill, events)

    def replay(self, f, solver, nodes, y0, params, rtol, atol, *, moved, layout):
        field = lane_field(f, solver, y0, params).field
        return lanes_replay(field, f, solver, nodes, y0, params, rtol, atol, moved, layout)
