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
``"amount"`` (a jump of a state), a ``"rate"`` (a jump of a compartment's input rate), a
``"state"`` (a jump of every state, e.g. a steady state added) or a ``"restart"`` (a reset
to zero or to a steady state) at times ``(n, K)``. `DoseSchedule` collects them, lays out
the extra states and builds the solve's vector field, initial state and jumps.

A restart is not an additive jump, and no driver needs to learn it: after a restart the
solution does not depend on what came before, so `DoseSchedule.plan` runs each stretch
between restarts as its own trajectory of the ensemble, on a local time that starts at
the restart, and reads every save time from its stretch (`Reset`, `SteadyState`).
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

__all__ = ["AbstractDose", "Bolus", "Infusion", "Reset", "DoseChange", "DoseSchedule",
           "DosedSolve", "as_schedule"]

_FIELDS = cache("dosed vector fields")


class DoseChange(NamedTuple):
    """What a dose record does to the state, at known times.

    Attributes:
        kind: ``"amount"``: the state ``cmt`` jumps by ``values``; ``"rate"``: the input
            rate into ``cmt`` jumps by ``values`` (it stays until another change);
            ``"state"``: every model state jumps by ``values (n, K, d)``; ``"restart"``:
            the trajectory restarts at ``values (n, K, d)`` (every input stopped), or at
            zero for ``values=None`` (a reset).
        cmt: the state index (0-based) the change applies to (unused by ``"state"`` and
            ``"restart"``).
        times: ``(n, K)`` change times; ``+inf`` for none (padding).
        values: ``(n, K)`` the jumps (``(n, K, d)`` for ``"state"`` and ``"restart"``), or,
            for those two, a function ``values(f, params, options) -> (n, K, d)`` of the
            model's vector field, its ensemble's parameters (leading axis ``n``) and the
            solve's ``options`` (``solver``, ``rtol``, ``atol``, ``driver``; ``d`` the
            model's states), evaluated
            when the schedule is planned: a state that needs the model, e.g. a steady
            state.
        origin: ``(n, K)`` when the dose that makes the change was given (an infusion's
            end belongs to its start), or ``None``: ``times``. A reset stops what was
            given before it: a change whose dose came before a reset is dropped after it.

    Example:
        >>> gs.DoseChange("rate", 1, jnp.full((n, 1), 2.0), jnp.full((n, 1), 50.0))
    """

    kind: Literal["amount", "rate", "state", "restart"]
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


class Reset(AbstractDose):
    """Every compartment to zero at ``time``, and every input running then stopped
    (NONMEM's ``EVID 3``; with a dose at the same time, ``EVID 4``: a dose at a reset's
    time comes after it).

    A reset restarts the trajectory: what happens after it does not depend on what came
    before, so the solve runs each stretch between resets as its own trajectory of the
    ensemble, started at zero at the reset time (see `DoseSchedule.plan`). No driver
    applies anything but additive jumps, and none needs to.

    Attributes:
        time: reset times (a scalar, ``(K,)`` or ``(n, K)``; ``+inf`` pads).

    Example:
        >>> gs.DoseSchedule([gs.Bolus(0.0, 100.0), gs.Reset(24.0), gs.Bolus(24.0, 50.0)])
    """

    time: jax.Array

    def changes(self, n: int) -> list[DoseChange]:
        t = _rows(self.time, n, "time", "gs.Reset")
        return [DoseChange("restart", 0, t, None)]


class _Given(AbstractDose):
    """Changes given as they are (a steady state's interval: one dose's changes)."""

    given: tuple

    def changes(self, n: int) -> list[DoseChange]:
        return list(self.given)


def _check_values(doses: Sequence[AbstractDose]) -> None:
    """Concrete fields: rates, durations and steady-state intervals positive (a negative
    rate is not an infusion), lag times and bioavailabilities not negative."""
    for i, dose in enumerate(doses):
        inner = [dose.dose] if isinstance(getattr(dose, "dose", None), AbstractDose) else []
        for rec in [dose] + inner:
            for name, ok, what in (("rate", np.greater, "non-positive"),
                                   ("duration", np.greater, "non-positive"),
                                   ("interval", np.greater, "non-positive"),
                                   ("lag", np.greater_equal, "negative"),
                                   ("bioavailability", np.greater_equal, "negative")):
                v = getattr(rec, name, None)
                if v is None or isinstance(v, jax.core.Tracer):
                    continue
                if not np.all(ok(np.asarray(v), 0)):
                    raise ValueError(f"gs.DoseSchedule: dose {i} ({type(dose).__name__}) has "
                                     f"a {what} `{name}`.")


class DosedSolve(NamedTuple):
    """A dosed solve's arguments (`DoseSchedule.plan`): solve ``f`` from ``y0`` at
    ``params``, saving at ``ts``, with ``jumps``, then `DoseSchedule.finish` the solution.

    Attributes:
        f, y0, params, ts, jumps: the solve's arguments (over the given ``[t0, t1]``).
        d: the model's states.
        segments: trajectories of the solve per given trajectory (``1``: no restart).
        seg: ``(n, k + 1)`` which of them each save time (and ``t1``, last) reads, or
            ``None``.
        single: one trajectory given.
        ts_out: the given save times (``(n, k)``), or ``None``.
        t1: the end of the solve: the given ``t1``, or later where a restart before
            ``t0`` runs its stretch on a local time that starts at ``t0`` (so it needs
            ``t0 - tau`` more to reach the given ``t1``).
        after: ``(n, k)`` which save times read the state just after the changes at
            their time (`plan`'s ``ts_after``; with restarts ``(n, k + 1)``, as ``seg``),
            or ``None``: none.

    Example:
        >>> plan = gs.DoseSchedule([gs.Bolus(0.0, 100.0), gs.Reset(12.0)]).plan(
        ...     f, 0.0, 24.0, y0, p, ts=ts)
        >>> sol = gs.DoseSchedule.finish(gs.solve(plan.f, 0.0, 24.0, plan.y0, plan.params,
        ...                                       ts=plan.ts, jumps=plan.jumps), plan)
    """

    f: Callable
    y0: jax.Array
    params: object
    ts: jax.Array | None
    jumps: tuple | None
    d: int
    segments: int
    seg: jax.Array | None
    single: bool
    ts_out: jax.Array | None
    t1: object = None
    after: jax.Array | None = None


# Helpers of `DoseSchedule` that need none of its records.


def _shifted(g: Callable) -> Callable:
    """``h(u, z, (p, shift)) = g(u + shift, z, p)``: a trajectory started at a restart
    runs on local time ``u`` from ``t0``; one function per ``g`` (cached as
    `DoseSchedule.field`)."""
    key = (g, "shifted")
    if key not in _FIELDS:
        def h(t, z, q):
            return g(t + q[1], z, q[0])

        h.__name__ = h.__qualname__ = getattr(g, "__qualname__", "field") + "_restarted"
        h.__wrapped__ = g
        _FIELDS[key] = h
    return _FIELDS[key]


def _merged(items, D: int):
    """``(times (N, J), sizes (N, J, D))`` of ``(times, sizes)`` items, each row sorted
    with its ``+inf`` padding last; ``None`` without items."""
    if not items:
        return None
    T = jnp.concatenate([t for t, _ in items], axis=1)
    S = jnp.concatenate([s for _, s in items], axis=1)
    order = jnp.argsort(T, axis=1, stable=True)
    return (jnp.take_along_axis(T, order, axis=1),
            jnp.take_along_axis(S, order[..., None], axis=1))


def _layout_jumps(jumps, n: int, d: int, D: int, dtype):
    """Other jumps ``(times, sizes (.., d))`` as additive ``(times (n, J), origin,
    sizes (n, J, D))``, or none."""
    if jumps is None:
        return []
    jt, js = jnp.asarray(jumps[0], dtype), jnp.asarray(jumps[1], dtype)
    jt = jnp.broadcast_to(jt, (n,) + jt.shape[-1:])
    js = jnp.broadcast_to(js, (n,) + js.shape[-2:])
    js = jnp.concatenate([js, jnp.zeros(js.shape[:-1] + (D - d,), dtype)], -1)
    return [(jt, jt, jnp.where(jnp.isfinite(jt)[..., None], js, 0.0))]


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
            if c.kind in ("amount", "rate") and not 0 <= c.cmt < d:
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

        # named after f (what the kernel's messages show) and wrapping it (what tells
        # one model's dosed field from another's: they share this function's code)
        g.__name__ = g.__qualname__ = getattr(f, "__qualname__", "field") + "_dosed"
        g.__wrapped__ = f
        _FIELDS[key] = g
        return g

    def _layout(self, n: int, d: int, f, params, options, dtype):
        """The changes (callable values evaluated), the input compartments, the solve's
        width ``D`` and each change's ``(times (n, K), origin (n, K), sizes (n, K, D))``."""
        changes = self._changes(n, d)
        inputs = tuple(sorted({c.cmt for c in changes if c.kind == "rate"}))
        D = d + len(inputs)
        col = {("amount", c): c for c in range(d)}
        col.update({("rate", c): d + j for j, c in enumerate(inputs)})
        additive, restarts = [], []
        for c in changes:
            v = c.values
            if callable(v):
                v = v(f, params, {**options, "d": d})
            t = jnp.asarray(c.times, dtype)
            if c.kind == "restart":
                v = jnp.zeros(t.shape + (d,), dtype) if v is None else v
                restarts.append((t, jnp.asarray(v, dtype)))
                continue
            v = jnp.where(jnp.isfinite(t)[..., None] if c.kind == "state" else jnp.isfinite(t),
                          jnp.asarray(v, dtype), 0.0)
            if c.kind == "state":
                size = jnp.concatenate([v, jnp.zeros(v.shape[:-1] + (D - d,), v.dtype)], -1)
            else:
                size = v[..., None] * jax.nn.one_hot(col[(c.kind, c.cmt)], D, dtype=v.dtype)
            o = t if c.origin is None else jnp.asarray(c.origin, dtype)
            additive.append((t, o, size))
        return additive, restarts, inputs, D

    def apply(self, f: Callable, y0, *, t1=None, jumps=None):
        """The solve's ``(vector field, initial state, jumps)``, for a schedule without
        restarts and whose changes need no model (`plan` does every schedule).

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
        if any(c.kind == "restart" or callable(c.values) for c in self._changes(n, d)):
            raise ValueError("gs.DoseSchedule.apply: the schedule has a reset or a "
                             "steady-state dose, which need the model's parameters and the "
                             "save times: use DoseSchedule.plan (gs.solve does).")
        additive, _, inputs, D = self._layout(n, d, f, None, {}, Y.dtype)
        additive += _layout_jumps(jumps, n, d, D, Y.dtype)
        items = []
        for t, _, size in additive:
            if t1 is not None:
                size = jnp.where((t > t1)[..., None], 0.0, size)
                t = jnp.where(t > t1, jnp.inf, t)
            items.append((t, size))
        Z0 = jnp.concatenate([Y, jnp.zeros((n, D - d), Y.dtype)], axis=1)
        merged = _merged(items, D)
        if merged is None:
            return f, (Z0[0] if single else Z0), None
        g = self.field(f, d, inputs)
        if single:
            return g, Z0[0], (merged[0][0], merged[1][0])
        return g, Z0, merged

    def plan(self, f: Callable, t0, t1, y0, params, *, ts=None, jumps=None,
             options: dict | None = None, ts_after=None) -> "DosedSolve":
        """The dosed solve's arguments (every schedule; `finish` maps its solution back).

        Without a restart this is `apply`. A restart (`Reset`, `SteadyState` with ``SS =
        1``) at ``tau`` makes the future independent of the past, so each trajectory with
        ``R`` restart slots becomes ``R + 1`` trajectories of the ensemble, one per stretch
        between restarts, each run on local time ``u = t - tau + t0`` (the vector field
        sees ``t``: it takes ``tau - t0`` as a parameter) from the restart's state, with
        the changes of the doses given in its stretch; every save time is read from its
        stretch's trajectory (one at a restart's time reads the state before it, as at a
        jump). Only additive jumps reach a driver, so every driver runs it unchanged, and
        the gradient w.r.t. a restart's time is exact: it moves the save times and the
        vector field's time, both differentiable. A restart may come before ``t0`` (a dose
        at steady state given before the record starts): its stretch then runs ``t0 -
        tau`` past ``t1`` on its local time (`DosedSolve.t1`), and what came before it,
        ``y0`` included, is never read.

        Args:
            f, t0, t1, y0, params, ts, jumps: as `gradsolve.solve`'s.
            options: ``solver``, ``rtol``, ``atol``, ``driver`` of the solve, for changes
                that need the model (a steady state).
            ts_after: ``None``, or booleans of ``ts``'s shape: ``True`` where the save
                time reads the state just after every change at its time (a jump, a dose,
                a restart), as a NONMEM observation record listed after a dose record at
                the same time; ``False`` (the default) reads the state before them.

        Returns:
            A `DosedSolve`: solve ``f``, ``y0``, ``params``, ``ts``, ``jumps`` over
            ``[t0, t1]``, then `finish` the solution.
        """
        options = {"solver": None, "rtol": 1e-6, "atol": 1e-9, "driver": None,
                   **{k: v for k, v in (options or {}).items() if v is not None}}
        y0 = jnp.asarray(y0)
        single = y0.ndim == 1
        Y = y0[None] if single else y0
        n, d = Y.shape
        P = jax.tree.map(lambda x: jnp.asarray(x)[None], params) if single else params
        after = _after_mask(ts_after, ts, n, single, "gs.DoseSchedule.plan")
        additive, restarts, inputs, D = self._layout(n, d, f, P, options, Y.dtype)
        additive += _layout_jumps(jumps, n, d, D, Y.dtype)
        if not restarts:
            merged = _merged(
                [(jnp.where(t > t1, jnp.inf, t), jnp.where((t > t1)[..., None], 0.0, size))
                 for t, _, size in additive], D)
            Z0 = jnp.concatenate([Y, jnp.zeros((n, D - d), Y.dtype)], axis=1)
            if single:
                Z0, merged = Z0[0], None if merged is None else (merged[0][0], merged[1][0])
            return DosedSolve(self.field(f, d, inputs), Z0, params, ts, merged, d, 1, None,
                              single, ts, t1, after)
        return self._split(f, t0, t1, Y, P, ts, additive, restarts, inputs, D, single, after)

    def _split(self, f, t0, t1, Y, P, ts, additive, restarts, inputs, D, single, after=None):
        """`plan` with restarts: one trajectory per stretch between restarts."""
        n, d = Y.shape
        dtype = Y.dtype
        taus = jnp.concatenate([t for t, _ in restarts], axis=1)            # (n, R)
        vals = jnp.concatenate([v for _, v in restarts], axis=1)            # (n, R, d)
        order = jnp.argsort(taus, axis=1, stable=True)
        taus = jnp.take_along_axis(taus, order, axis=1)
        vals = jnp.take_along_axis(vals, order[..., None], axis=1)
        S = taus.shape[1] + 1
        t0 = jnp.asarray(t0, dtype)
        # A restart before t0 runs its stretch from local time t0: to reach the given t1
        # it needs t0 - tau more (the horizon carries no derivative: the save times do).
        early = jax.lax.stop_gradient(jnp.max(jnp.where(jnp.isfinite(taus), t0 - taus, 0.0),
                                              initial=0.0))
        if not isinstance(early, jax.core.Tracer) and float(early) <= 0.0:
            t_end = t1
        else:
            t_end = jnp.asarray(t1, dtype) + early
        starts = jnp.concatenate([jnp.full((n, 1), t0, dtype), taus], axis=1)  # (n, S)
        ends = jnp.concatenate([taus, jnp.full((n, 1), jnp.inf, dtype)], axis=1)
        live = jnp.isfinite(starts)
        first = (jnp.arange(S) == 0)[None, :]
        at = jnp.where(live, starts, t0)

        def local(t):  # (n, K) true times -> (n, S, K) local ones
            st = at[:, :, None]
            return jnp.where(first[..., None], t[:, None], jnp.where(
                t[:, None] == st, t0, t0 + (t[:, None] - st)))

        items = []
        for t, o, size in additive:
            inside = ((o[:, None] >= starts[:, :, None]) & (o[:, None] < ends[:, :, None])
                      & jnp.isfinite(t)[:, None])
            u = local(jnp.where(jnp.isfinite(t), t, t0))
            inside = inside & (u <= t_end)
            items.append((jnp.where(inside, u, jnp.inf).reshape(n * S, -1),
                          jnp.where(inside[..., None], size[:, None], 0.0).reshape(
                              n * S, -1, D)))
        merged = _merged(items, D)
        Z = jnp.concatenate([Y[:, None], vals], axis=1)                      # (n, S, d)
        Z0 = jnp.concatenate([Z, jnp.zeros((n, S, D - d), dtype)], -1).reshape(n * S, D)
        saves = ts is not None
        tb = jnp.full((n, 1), t1, dtype) if ts is None else jnp.broadcast_to(
            jnp.asarray(ts, dtype), (n, jnp.shape(ts)[-1]))
        text = jnp.concatenate([tb, jnp.full((n, 1), t1, dtype)], axis=1)   # (n, k + 1)
        # Each save time reads the stretch it lies in; one at a restart's time reads the
        # stretch before it, or (read after) the one the restart starts.
        past = taus[:, None, :] < text[:, :, None]
        if after is not None:  # as text: the save times, then t1 (read before)
            after = jnp.concatenate([after, jnp.zeros((n, 1), bool)], axis=1)
            past = past | (after[:, :, None] & (taus[:, None, :] == text[:, :, None]))
        seg = jax.lax.stop_gradient(jnp.sum(past, axis=-1))
        # (clamped by `where`, not `clip`: a save time at an end keeps its whole derivative,
        # where clip's tie would halve it)
        u = local(text)
        u = jnp.where(u > t_end, t_end, jnp.where(u < t0, t0, u))
        lts = jnp.where(live[:, :, None], u, t0)
        reps = lambda x: jnp.repeat(jnp.asarray(x), S, axis=0)
        q = (jax.tree.map(reps, P), (at - t0).reshape(n * S))
        g = _shifted(self.field(f, d, inputs))
        return DosedSolve(g, Z0, q, lts.reshape(n * S, -1), merged, d, S, seg, single,
                          tb if saves else None, t_end, after)

    @staticmethod
    def finish(sol, plan: "DosedSolve"):
        """The `gradsolve.Solution` of the dosed solve ``plan`` (from `plan`) with the
        model's ``d`` states, one trajectory per given one: each save time read from its
        stretch's trajectory, ``error_ratio`` the largest and step counts the sums of its
        stretches' (``mesh`` is the planned ensemble's)."""
        d, S = plan.d, plan.segments
        if S == 1:
            if plan.after is not None:
                ys = sol.ys + _right_limits(plan.ts, plan.jumps, sol.ys)
                after = plan.after[0] if plan.single else plan.after
                sol = eqx.tree_at(lambda s: s.ys, sol,
                                  jnp.where(after[..., None], ys, sol.ys))
            return DoseSchedule.solution(sol, d)
        N = sol.ys.shape[0]
        n = N // S
        ys = sol.ys.reshape((n, S) + sol.ys.shape[1:])
        picked = jnp.take_along_axis(ys, plan.seg[:, None, :, None], axis=1)[:, 0, :, :d]
        if plan.after is not None:
            right = sol.ys + _right_limits(plan.ts, plan.jumps, sol.ys)
            right = right.reshape((n, S) + sol.ys.shape[1:])
            right = jnp.take_along_axis(right, plan.seg[:, None, :, None], axis=1)[:, 0, :, :d]
            picked = jnp.where(plan.after[..., None], right, picked)
        y1 = picked[:, -1]
        ts_out = plan.ts_out
        ys_out = picked[:, :-1] if ts_out is not None else y1[:, None]
        if ts_out is None:
            ts_out = jnp.broadcast_to(sol.ts[:1, -1:], (n, 1))

        def per(key, x):
            if jnp.ndim(x) == 0 or jnp.shape(x)[0] != N:
                return x
            x = jnp.reshape(x, (n, S) + jnp.shape(x)[1:])
            return jnp.max(x, axis=1) if key == "status" else jnp.sum(x, axis=1)

        stats = {k: per(k, v) for k, v in sol.stats.items()}
        err = jnp.max(sol.error_ratio.reshape(n, S), axis=1)
        if plan.single:
            ys_out, y1, ts_out, err = ys_out[0], y1[0], ts_out[0], err[0]
            stats = {k: (v[0] if jnp.ndim(v) and jnp.shape(v)[0] == 1 else v)
                     for k, v in stats.items()}
        return eqx.tree_at(lambda s: (s.ys, s.y1, s.ts, s.stats, s.error_ratio), sol,
                           (ys_out, y1, ts_out, stats, err))

    @staticmethod
    def solution(sol, d: int):
        """``sol``, a `gradsolve.Solution` of the dosed solve, with the extra rate
        components dropped from ``ys`` and ``y1`` (``d``: the model's states)."""
        return eqx.tree_at(lambda s: (s.ys, s.y1), sol, (sol.ys[..., :d], sol.y1[..., :d]))


def _after_mask(ts_after, ts, n: int, single: bool, where: str):
    """``ts_after`` as ``(n, k)`` booleans, or ``None`` when not given or all ``False``."""
    if ts_after is None:
        return None
    if ts is None:
        raise ValueError(f"{where}: `ts_after` needs `ts` (it says which save times read the "
                         "state after the changes at their time).")
    a = np.asarray(ts_after)
    if a.dtype != bool:
        raise ValueError(f"{where}: `ts_after` must be booleans, got dtype {a.dtype}.")
    k = jnp.shape(ts)[-1]
    if a.shape not in ((k,), (n, k)) or (single and a.shape != (k,)):
        raise ValueError(f"{where}: `ts_after` must have the shape of `ts`, ({k},)"
                         + ("" if single else f" or ({n}, {k})") + f"; got {a.shape}.")
    if not a.any():
        return None
    return jnp.asarray(np.broadcast_to(a, (n, k)))


def _right_limits(ts, jumps, ys):
    """``(..., k, D)``: the sum of the jumps at each save time (``ts (..., k)``, jumps
    ``(times (..., J), sizes (..., J, D))``), what turns a save's state before them into
    the state after them; zeros without jumps. Times compare exactly, as a jump's own
    node does."""
    if jumps is None or ts is None:
        return jnp.zeros_like(ys)
    jt, js = jumps
    ts = jnp.broadcast_to(jnp.asarray(ts, js.dtype), ys.shape[:-1])
    jt = jnp.broadcast_to(jt, ys.shape[:-2] + jt.shape[-1:])
    js = jnp.broadcast_to(js, ys.shape[:-2] + js.shape[-2:])
    hit = (jax.lax.stop_gradient(ts)[..., :, None] == jax.lax.stop_gradient(jt)[..., None, :])
    return jnp.einsum("...kj,...jd->...kd", hit.astype(js.dtype), js)


def as_schedule(doses, where: str) -> DoseSchedule:
    """``doses`` as a `DoseSchedule`: one already, or a sequence of dose records."""
    if isinstance(doses, DoseSchedule):
        return doses
    if isinstance(doses, (AbstractDose, list, tuple)):
        return DoseSchedule(doses)
    raise TypeError(f"{where}: `doses` must be a gs.DoseSchedule or a list of dose records "
                    f"(gs.Bolus, gs.Infusion, ...); got {type(doses).__name__}.")
