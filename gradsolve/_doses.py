"""Dose schedules as data: bolus doses and zero-order inputs, each a record type, turned
into the one event every driver already runs, a known-time additive jump.

A zero-order input (an infusion) adds a rate ``R`` to a compartment's derivative between
two times. The schedule carries every input compartment's current rate as an extra state
component ``R_c`` with ``dR_c/dt = 0``, and a change of rate at time ``tau`` is a jump of
``R_c`` there. So an infusion ``(start, rate, duration)`` is two jumps, ``+rate`` at
``start`` and ``-rate`` at ``start + duration``, and the vector field becomes
``(f(t, y, p) + B R, 0)``, ``B`` the input compartments' incidence. Why this form:

- Every driver (the compiled kernel, lanes, batched, and whatever is added next) runs it
  unchanged: jumps are the event they share, and each jump time is a mesh node the replay
  moves with the time, so the gradient w.r.t. a start, a duration, a lag time (their
  difference of node times) and a rate or amount (a jump size) is the exact discrete
  adjoint of the replayed steps, as for any jump. A record type is one class here.
- The rate is exactly piecewise constant on the mesh: a solver's stages never see a rate
  change inside a step (a stage at a node's time sees the state after the node's jump).

The extra components carry no error (their derivative is zero, and the error norm is the
RMS over all components), so the error test over ``d + m`` components is the one over the
``d`` states scaled by ``sqrt(d / (d + m))``: a slightly looser tolerance while an input
runs; pass a smaller ``rtol`` where that matters.

Record types (`AbstractDose` subclasses) say what they change, as `DoseChange` tuples: an
``"amount"`` (a jump of a state) or a ``"rate"`` (a jump of a compartment's input rate) at
times ``(n, K)``. `DoseSchedule` collects them, lays out the extra states and builds the
solve's vector field, initial state and jumps.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._caches import cache

__all__ = ["AbstractDose", "Bolus", "Infusion", "DoseChange", "DoseSchedule", "as_schedule"]

_FIELDS = cache("dosed vector fields")


class DoseChange(NamedTuple):
    """What a dose record does to the state, at known times.

    Attributes:
        kind: ``"amount"``: the state ``cmt`` jumps by ``values``; ``"rate"``: the input
            rate into ``cmt`` jumps by ``values`` (it stays until another change).
        cmt: the state index (0-based) the change applies to.
        times: ``(n, K)`` change times; ``+inf`` for none (padding).
        values: ``(n, K)`` the jumps.
        origin: ``(n, K)`` when the dose that makes the change was given (an infusion's
            end belongs to its start), or ``None``: ``times``. A reset stops what was
            given before it: a change whose dose came before a reset is dropped after it.

    Example:
        >>> gs.DoseChange("rate", 1, jnp.full((n, 1), 2.0), jnp.full((n, 1), 50.0))
    """

    kind: Literal["amount", "rate"]
    cmt: int
    times: jax.Array
    values: jax.Array
    origin: jax.Array | None = None


def _rows(x, n: int, name: str, where: str) -> jax.Array:
    """``x`` as ``(n, K)``: a scalar, ``(K,)`` shared by every trajectory, or ``(n, K)``;
    ``(n,)`` is one dose per trajectory only when the schedule says so (see `_per_row`)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(float)
    if x.ndim == 0:
        return jnp.broadcast_to(x, (n, 1))
    if x.ndim == 1:
        return jnp.broadcast_to(x, (n, x.shape[0]))
    if x.ndim == 2 and x.shape[0] == n:
        return x
    raise ValueError(f"{where}: `{name}` must be a scalar, (K,) (the same doses for every "
                     f"trajectory) or (n, K) with n={n}; got shape {x.shape}.")


class AbstractDose(eqx.Module):
    """A dose record type: what it changes, at which times (`changes`).

    Its fields are arrays: a scalar, ``(K,)`` (the same ``K`` doses for every trajectory)
    or ``(n, K)`` (per trajectory; ``+inf`` times pad ragged schedules). Every field is
    differentiable; ``cmt`` is a static state index (0-based).

    Example:
        >>> class Pulse(gs.AbstractDose):      # an input at ``rate`` for one hour
        ...     time: jax.Array
        ...     rate: jax.Array
        ...     cmt: int = 0
        ...     def changes(self, n):
        ...         t = jnp.broadcast_to(self.time, (n, 1))
        ...         r = jnp.broadcast_to(self.rate, (n, 1))
        ...         return [gs.DoseChange("rate", self.cmt, t, r),
        ...                 gs.DoseChange("rate", self.cmt, t + 1.0, -r)]
    """

    @abc.abstractmethod
    def changes(self, n: int) -> list[DoseChange]:
        """The record's `DoseChange` tuples for an ensemble of ``n`` trajectories."""


def _lagged(dose, n: int, where: str):
    """``(start (n, K), amount (n, K))``: ``time + lag`` and ``bioavailability * amount``
    of a record with those fields (lag and bioavailability default none and one)."""
    t = _rows(dose.time, n, "time", where)
    if dose.lag is not None:
        t = t + jnp.broadcast_to(_rows(dose.lag, n, "lag", where), t.shape)
    a = jnp.broadcast_to(_rows(dose.amount, n, "amount", where), t.shape)
    if dose.bioavailability is not None:
        a = a * jnp.broadcast_to(_rows(dose.bioavailability, n, "bioavailability", where),
                                 t.shape)
    return t, a


class Bolus(AbstractDose):
    """An instantaneous dose: state ``cmt`` jumps by ``bioavailability * amount`` at
    ``time + lag``.

    A lag time moves the jump, and the gradient w.r.t. it is exact: the jump's time is a
    node of the recorded mesh and the replay moves that node with it (the steps on either
    side stretch), so the derivative is the discrete adjoint of the replayed steps, which
    carries the jump-time sensitivity ``Phi(t, tau) (f(tau, y-) - f(tau, y+))`` of the
    exact solution (``Phi`` the flow's Jacobian, ``y-``/``y+`` the states before and after
    the jump) to the solver's accuracy. No extra correction term is needed.

    Attributes:
        time: dose times (a scalar, ``(K,)`` or ``(n, K)``; ``+inf`` pads).
        amount: the amounts, broadcast to ``time``'s shape.
        cmt: the state (0-based) the dose goes into.
        lag: a lag time added to ``time`` (NONMEM's ``ALAG``), broadcast likewise;
            ``None``: none.
        bioavailability: the fraction ``F`` of ``amount`` that reaches the state (NONMEM's
            ``F``), broadcast likewise; ``None``: one.

    Example:
        >>> gs.Bolus(time=jnp.array([0.0, 12.0]), amount=320.0, cmt=0, lag=0.4,
        ...          bioavailability=0.8)
    """

    time: jax.Array
    amount: jax.Array
    cmt: int = eqx.field(static=True, default=0)
    lag: jax.Array | None = None
    bioavailability: jax.Array | None = None

    def changes(self, n: int) -> list[DoseChange]:
        t, a = _lagged(self, n, "gs.Bolus")
        return [DoseChange("amount", self.cmt, t, a)]


class Infusion(AbstractDose):
    """A zero-order input of ``amount`` into state ``cmt`` from ``time`` on, at ``rate``
    (so for ``amount / rate``) or over ``duration`` (at ``amount / duration``): give exactly
    one of ``rate`` and ``duration``, as NONMEM's ``RATE`` and ``DUR``.

    A lag time delays the start (the whole input moves); a bioavailability ``F`` scales the
    amount, and as in NONMEM that changes the duration when ``rate`` is given (``F *
    amount / rate``) and the rate when ``duration`` is given (``F * amount / duration``).
    Gradients w.r.t. the start and end times are exact as for `Bolus`'s lag time.

    Attributes:
        time: start times (a scalar, ``(K,)`` or ``(n, K)``; ``+inf`` pads).
        amount: the amounts infused, broadcast to ``time``'s shape.
        rate: the input rates (amount per unit time), or ``None``.
        duration: the durations, or ``None``.
        cmt: the state (0-based) the input goes into.
        lag: a lag time added to ``time``; ``None``: none.
        bioavailability: the fraction ``F`` of ``amount`` infused; ``None``: one.

    Example:
        >>> gs.Infusion(time=0.0, amount=500.0, duration=2.0, cmt=1)
        >>> gs.Infusion(time=0.0, amount=500.0, rate=100.0, bioavailability=0.6)  # 3 h
    """

    time: jax.Array
    amount: jax.Array
    rate: jax.Array | None = None
    duration: jax.Array | None = None
    cmt: int = eqx.field(static=True, default=0)
    lag: jax.Array | None = None
    bioavailability: jax.Array | None = None

    def __check_init__(self):
        if (self.rate is None) == (self.duration is None):
            raise ValueError("gs.Infusion: give exactly one of `rate` and `duration` (the "
                             "other follows from `amount`).")

    def changes(self, n: int) -> list[DoseChange]:
        t, a = _lagged(self, n, "gs.Infusion")
        if self.rate is not None:
            r = jnp.broadcast_to(_rows(self.rate, n, "rate", "gs.Infusion"), t.shape)
            dur = a / r
        else:
            dur = jnp.broadcast_to(_rows(self.duration, n, "duration", "gs.Infusion"), t.shape)
            r = a / dur
        return [DoseChange("rate", self.cmt, t, r),
                DoseChange("rate", self.cmt, t + dur, -r, origin=t)]


def _check_values(doses: Sequence[AbstractDose]) -> None:
    """Concrete amounts, rates and durations: finite where the time is, rates and
    durations positive (a negative rate is not an infusion)."""
    for i, dose in enumerate(doses):
        for name in ("amount", "rate", "duration"):
            v = getattr(dose, name, None)
            if v is None or isinstance(v, jax.core.Tracer):
                continue
            v = np.asarray(v)
            if name != "amount" and np.any(v <= 0):
                raise ValueError(f"gs.DoseSchedule: dose {i} ({type(dose).__name__}) has a "
                                 f"non-positive `{name}`.")
        for name in ("lag", "bioavailability"):
            v = getattr(dose, name, None)
            if v is None or isinstance(v, jax.core.Tracer):
                continue
            if np.any(np.asarray(v) < 0):
                raise ValueError(f"gs.DoseSchedule: dose {i} ({type(dose).__name__}) has a "
                                 f"negative `{name}`.")


class DoseSchedule(eqx.Module):
    """Dose records of any types, as the vector field, initial state and jumps of a solve.

    Args:
        doses: `AbstractDose` records (`Bolus`, `Infusion`, or a type of your own), or
            one record.

    The solve runs on ``d + m`` states: the model's ``d``, then the current input rate of
    each of the ``m`` compartments that receive a zero-order input, in increasing state
    order. `solution` drops the extra ones again.

    Example:
        >>> sched = gs.DoseSchedule([gs.Bolus(0.0, 100.0, cmt=0),
        ...                          gs.Infusion(12.0, 50.0, duration=1.0, cmt=1)])
        >>> g, z0, jumps = sched.apply(f, y0, t1=24.0)
        >>> sol = sched.solution(gs.solve(g, 0.0, 24.0, z0, p, ts=ts, jumps=jumps), d=2)
    """

    doses: tuple[AbstractDose, ...]

    def __init__(self, doses: Sequence[AbstractDose] | AbstractDose):
        doses = (doses,) if isinstance(doses, AbstractDose) else tuple(doses)
        bad = [type(d).__name__ for d in doses if not isinstance(d, AbstractDose)]
        if bad:
            raise TypeError(f"gs.DoseSchedule: `doses` must be dose records (gs.Bolus, "
                            f"gs.Infusion, an AbstractDose subclass); got {bad}.")
        _check_values(doses)
        self.doses = doses

    def _changes(self, n: int, d: int) -> list[DoseChange]:
        out = [c for dose in self.doses for c in dose.changes(n)]
        for c in out:
            if not 0 <= c.cmt < d:
                raise ValueError(f"gs.DoseSchedule: a dose into state {c.cmt}, but the model "
                                 f"has {d} states (cmt is 0-based).")
        return out

    @staticmethod
    def field(f: Callable, d: int, inputs: tuple[int, ...]) -> Callable:
        """``g(t, z, p)``: ``f`` on ``z[:d]`` plus each input rate ``z[d + j]`` added to its
        state ``inputs[j]``; the rates' own derivatives are zero. One function per ``(f,
        d, inputs)`` (kept in a registered cache), so what gradsolve caches per vector
        field (checks, translations, compiled kernels) is found again at the next call."""
        if not inputs:
            return f
        key = (f, d, inputs)
        if key in _FIELDS:
            return _FIELDS[key]
        where = {c: j for j, c in enumerate(inputs)}

        def g(t, z, p):
            dy = f(t, z[:d], p)
            parts = [dy[i] + z[d + where[i]] if i in where else dy[i] for i in range(d)]
            return jnp.concatenate([jnp.stack(parts), jnp.zeros_like(z[d:])])

        g.__name__ = getattr(f, "__name__", "field") + "_dosed"
        _FIELDS[key] = g
        return g

    def apply(self, f: Callable, y0, *, t1=None, jumps=None):
        """The solve's ``(vector field, initial state, jumps)``.

        Args:
            f: the model's vector field ``f(t, y, p)`` for one trajectory (``y (d,)``).
            y0: ``(d,)`` or ``(n, d)``.
            t1: the end of the solve: changes after it are dropped (an infusion running past
                the end), as the solve never reaches them.
            jumps: other jumps ``(times, sizes (.., d))`` to merge in, or ``None``.

        Returns:
            ``(g, z0, (times, sizes))``: ``z0 (n, d + m)`` (``(d + m,)`` for one
            trajectory), jump times ``(n, J)`` sorted per row with ``+inf`` padding at the
            end, sizes ``(n, J, d + m)``; pass them to `gradsolve.solve`, `record` or
            `replay` as ``f``, ``y0`` and ``jumps``.
        """
        y0 = jnp.asarray(y0)
        single = y0.ndim == 1
        Y = y0[None] if single else y0
        n, d = Y.shape
        changes = self._changes(n, d)
        inputs = tuple(sorted({c.cmt for c in changes if c.kind == "rate"}))
        D = d + len(inputs)
        col = {("amount", c): c for c in range(d)}
        col.update({("rate", c): d + j for j, c in enumerate(inputs)})
        times, sizes = [], []
        for c in changes:
            t = c.times.astype(Y.dtype)
            v = jnp.where(jnp.isfinite(t), c.values.astype(Y.dtype), 0.0)
            if t1 is not None:
                v = jnp.where(t > t1, 0.0, v)
                t = jnp.where(t > t1, jnp.inf, t)
            times.append(t)
            sizes.append(v[..., None] * jax.nn.one_hot(col[(c.kind, c.cmt)], D, dtype=Y.dtype))
        if jumps is not None:
            jt, js = jnp.asarray(jumps[0], Y.dtype), jnp.asarray(jumps[1], Y.dtype)
            jt = jnp.broadcast_to(jt, (n,) + jt.shape[-1:])
            js = jnp.broadcast_to(js, (n,) + js.shape[-2:])
            times.append(jt)
            sizes.append(jnp.concatenate([js, jnp.zeros(js.shape[:-1] + (D - d,), Y.dtype)], -1))
        Z0 = jnp.concatenate([Y, jnp.zeros((n, D - d), Y.dtype)], axis=1)
        if not times:
            return f, (Z0[0] if single else Z0), None
        T, S = jnp.concatenate(times, axis=1), jnp.concatenate(sizes, axis=1)
        order = jnp.argsort(T, axis=1, stable=True)
        T = jnp.take_along_axis(T, order, axis=1)
        S = jnp.take_along_axis(S, order[..., None], axis=1)
        g = self.field(f, d, inputs)
        if single:
            return g, Z0[0], (T[0], S[0])
        return g, Z0, (T, S)

    @staticmethod
    def solution(sol, d: int):
        """``sol``, a `gradsolve.Solution` of the dosed solve, with the extra rate
        components dropped from ``ys`` and ``y1`` (``d``: the model's states)."""
        return eqx.tree_at(lambda s: (s.ys, s.y1), sol, (sol.ys[..., :d], sol.y1[..., :d]))


def as_schedule(doses, where: str) -> DoseSchedule:
    """``doses`` as a `DoseSchedule`: one already, or a sequence of dose records."""
    if isinstance(doses, DoseSchedule):
        return doses
    if isinstance(doses, (AbstractDose, list, tuple)):
        return DoseSchedule(doses)
    raise TypeError(f"{where}: `doses` must be a gs.DoseSchedule or a list of dose records "
                    f"(gs.Bolus, gs.Infusion, ...); got {type(doses).__name__}.")
