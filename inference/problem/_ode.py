"""`ode`: an ODE solve as a site of any NumPyro program.

``inference.ode(name, f, t0, t1, y0, params, ...)`` is called inside a NumPyro program the
way ``numpyro.sample`` is. It sends a message of type `SITE` through NumPyro's effect
stack (``numpyro.primitives.apply_stack``), so NumPyro's own handlers (``trace``,
``substitute``, ``seed``, ``plate``, ``Predictive``, ``MCMC``, ``SVI``) see it and pass it
through, and the site's default behaviour is ``gs.solve``: under plain NumPyro the program
solves adaptively and differentiates through the recorded steps.

`inference.fit` and `inference.sample` run the program under one of two handlers defined
here, which is how a program reuses meshes:

- `RecordSites` records every site's mesh at the current parameters (``gs.record``) and
  keeps it by site name, then replays it (so the program's value is the adaptive
  solution);
- `ReplaySites` replays the meshes it is given (``gs.replay``) and keeps each site's
  largest ``error_ratio``, which the mesh policy reads to decide when to re-record.

Every other NumPyro handler ignores messages of this type (they act on ``"sample"``,
``"param"``, ``"plate"``, ``"deterministic"``), which is why a custom type is safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.primitives import Messenger, apply_stack

import gradsolve as gs

from ._problem import SITE_MAX_STEPS, TOLERANCES
from ._policy import tightened

__all__ = ["ode", "SITE", "OdeCall", "RecordSites", "ReplaySites", "SolveSites"]

SITE = "gradsolve_ode"
"""The NumPyro message type of an `ode` site."""


class OdeCall(NamedTuple):
    """The arguments of one `ode` site, as its message carries them."""

    f: Any
    t0: Any
    t1: Any
    y0: Any
    params: Any
    ts: Any
    jumps: Any
    tstops: Any
    solver: Any
    rtol: float | None
    atol: float | None
    max_steps: int | None

    def resolved(self, defaults: Mapping[str, Any] | None = None) -> "OdeCall":
        """This call with the settings it leaves open (``None``) taken from ``defaults``
        (the run's ``solver``, ``rtol``, ``atol``, ``max_steps``), then from `inference`'s
        (``gs.Tsit5()``, ``1e-6``, ``1e-8``, 16,384)."""
        d = dict(solver=None, rtol=TOLERANCES.rtol, atol=TOLERANCES.atol,
                 max_steps=SITE_MAX_STEPS)
        d.update({k: v for k, v in (defaults or {}).items() if v is not None})
        pick = lambda k: getattr(self, k) if getattr(self, k) is not None else d[k]
        solver = pick("solver")
        return self._replace(solver=gs.Tsit5() if solver is None else solver,
                             rtol=pick("rtol"), atol=pick("atol"), max_steps=pick("max_steps"))

    def solve(self) -> gs.Solution:
        """``gs.solve`` of this call (the default behaviour of the site)."""
        return gs.solve(self.f, self.t0, self.t1, self.y0, self.params, ts=self.ts,
                        solver=self.solver, rtol=self.rtol, atol=self.atol,
                        max_steps=self.max_steps, jumps=self.jumps, tstops=self.tstops,
                        throw=False)

    def record(self, tol_factor: float) -> gs.Mesh:
        """``gs.record`` of this call at ``tol_factor`` times its tolerances."""
        return gs.record(self.f, self.t0, self.t1, self.y0, self.params, ts=self.ts,
                         solver=self.solver, rtol=tightened(self.rtol, tol_factor, self.y0),
                         atol=self.atol * tol_factor, max_steps=self.max_steps,
                         jumps=self.jumps, tstops=self.tstops, throw=False)

    def replay(self, mesh: gs.Mesh, driver=None) -> gs.Solution:
        """``gs.replay`` of ``mesh`` at this call's ``y0``, ``params``, jumps and save
        times (concrete save times are the recorded ones; traced ones move their nodes),
        on ``driver`` (``None``: ``gs.drivers.Auto()``)."""
        ts = self.ts if isinstance(self.ts, jax.core.Tracer) else None
        return gs.replay(self.f, mesh, self.y0, self.params, ts=ts, jumps=self.jumps,
                         driver=driver)

    def replay_driver(self) -> gs.drivers.AbstractDriver:
        """The driver `gs.drivers.Auto` picks to replay this call's meshes (from its
        vector field, solver and shapes: a single trajectory counts as an ensemble of
        one)."""
        y0, params = jnp.asarray(self.y0), self.params
        if y0.ndim == 1:
            y0 = y0[None]
            params = jax.tree_util.tree_map(lambda a: jnp.asarray(a)[None], params)
        return gs.drivers.Auto().choose("replay", self.f, self.solver, y0, params,
                                        events=self.jumps is not None or self.tstops is not None)


def _positive(name: str, v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not v > 0:
        raise ValueError(f"{where}: `{name}` must be a positive number, got {v!r}")
    return float(v)


def ode(name: str, f, t0, t1, y0, params, *, ts=None, jumps=None, tstops=None, solver=None,
        rtol: float | None = None, atol: float | None = None,
        max_steps: int | None = None, doses=None, ts_after=None) -> gs.Solution:
    """An ODE solve as a site of a NumPyro program.

    Call it inside a NumPyro program as you call ``numpyro.sample``. Under plain NumPyro
    (``MCMC``, ``SVI``, ``Predictive``, any handler) it is ``gs.solve`` with these
    arguments: the adaptive solution, differentiated through its accepted steps. Under
    `inference.sample` and `inference.fit` (``inference.sample(program, data)``) the
    site's mesh is recorded once, replayed for every gradient, and re-recorded by the
    same `MeshPolicy` as an `ODEModel`'s, one mesh per site.

    Args:
        name: the site's name, unique within the program.
        f: the vector field ``f(t, y (d,), params) -> (d,)`` of ONE trajectory.
        t0, t1: the interval (taken as recorded when a mesh is replayed).
        y0: ``(d,)``, or ``(n, d)`` for an ensemble (e.g. one trajectory per subject).
        params: pytree; every leaf with the leading axis ``n`` for an ensemble (broadcast
            shared parameters, ``jnp.broadcast_to(ke, (n,))``).
        ts: save times ``(k,)`` or ``(n, k)`` (e.g. every subject's sampling times).
        jumps: ``(times, sizes)`` bolus doses, as ``gs.solve``'s ``jumps=``; the sizes
            may depend on parameters (bioavailability).
        tstops: times where ``f`` is discontinuous (an infusion's start and end).
        solver: a gradsolve solver (default ``gs.Tsit5()``).
        rtol, atol, max_steps: default those of `inference` (``rtol = 1e-6``, ``atol =
            1e-8``, 16,384 steps: a population's posterior reaches subjects' rates that
            need thousands of explicit steps, and a solve that runs out of them is a
            cliff for a sampler; on the compiled CPU kernel each subject takes only the
            steps it needs).
        doses: a ``gs.DoseSchedule`` or a list of dose records (``gs.Bolus``,
            ``gs.Infusion``, ...), as ``gs.solve``'s ``doses=``: every field may depend on
            parameters (a lag time, a bioavailability, a modelled rate or duration).
        ts_after: booleans of ``ts``'s shape: which save times read the state after the
            doses at their time, as ``gs.solve``'s ``ts_after=``.

    Returns:
        A ``gs.Solution`` (``ys (n, k, d)``, ``error_ratio``, ...). A failed solve gives
        NaN states (it does not raise), so a sampler rejects the point.

    Example:
        >>> def program(data):
        ...     k = numpyro.sample("k", dist.LogNormal(0.0, 1.0))
        ...     sol = inference.ode("decay", lambda t, y, p: -p * y, 0.0, 5.0,
        ...                         jnp.ones(1), k, ts=data.ts)
        ...     numpyro.sample("obs", dist.Normal(sol.ys[:, 0], 0.1), obs=data.ys[:, 0])
        >>> inference.sample(program, data)      # mesh reuse; or numpyro.infer.MCMC
    """
    where = "inference.ode"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: `name` must be a non-empty string, got {name!r}")
    if not callable(f):
        raise ValueError(f"{where}({name!r}): `f` must be a function f(t, y, params), got "
                         f"{type(f).__name__}")
    rtol = None if rtol is None else _positive("rtol", rtol, where)
    atol = None if atol is None else _positive("atol", atol, where)
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(
            max_steps, (int, np.integer)) or max_steps < 1):
        raise ValueError(f"{where}({name!r}): `max_steps` must be a positive int, got "
                         f"{max_steps!r}")
    plan = None
    if doses is not None or ts_after is not None:
        if not isinstance(doses, gs.DoseSchedule):
            doses = gs.DoseSchedule([] if doses is None else doses)
        plan = doses.plan(f, t0, t1, y0, params, ts=ts, jumps=jumps, ts_after=ts_after,
                          options=dict(solver=solver, rtol=rtol, atol=atol))
        f, y0, params, ts, jumps, t1 = (plan.f, plan.y0, plan.params, plan.ts, plan.jumps,
                                        plan.t1)
    call = OdeCall(f, t0, t1, y0, params, ts, jumps, tstops, solver, rtol, atol,
                   None if max_steps is None else int(max_steps))
    if plan is not None:
        return gs.DoseSchedule.finish(_site(name, call), plan)
    return _site(name, call)


def _site(name: str, call: OdeCall) -> gs.Solution:
    """``call`` solved as the site ``name``: ``gs.solve`` without handlers (NumPyro's
    default for a message no handler answers is to call its ``fn``), else what the
    innermost handler of `SITE` messages makes of it."""
    msg = {"type": SITE, "name": name, "fn": lambda c: c.resolved().solve(), "args": (call,), "kwargs": {},
           "value": None, "cond_indep_stack": [], "infer": {}, "scale": None, "mask": None,
           "stop": False, "is_observed": False, "intermediates": []}
    return apply_stack(msg)["value"]


class _Sites(Messenger):
    """Base of the handlers: acts on `SITE` messages only, once per name, with the run's
    default settings (``defaults``: ``solver``, ``rtol``, ``atol``, ``max_steps``) for the
    sites that leave them open."""

    def __init__(self, defaults: Mapping[str, Any] | None = None, fn=None):
        super().__init__(fn)
        self.defaults = dict(defaults or {})
        self.seen: list[str] = []
        self.error_ratios: dict[str, jax.Array] = {}  # filled by replaying handlers

    def process_message(self, msg):
        if msg["type"] != SITE:
            return
        name = msg["name"]
        if name in self.seen:
            raise ValueError(f"inference.ode: two sites are named {name!r}; every ode site "
                             "of a program needs its own name (its mesh is kept by name)")
        self.seen.append(name)
        msg["value"] = self.run(name, msg["args"][0].resolved(self.defaults))

    def run(self, name: str, call: OdeCall) -> gs.Solution:
        raise NotImplementedError


class RecordSites(_Sites):
    """Record every `ode` site at the current parameters, keep the meshes by name
    (`meshes`), and return the replay of each (the adaptive solution).

    Args:
        tol_factor: record at this times each site's ``rtol``/``atol``.
        capacities: site name -> the step capacity to record it at, instead of the site's
            ``max_steps`` (a compiled loop that swaps fresh rows into kept meshes needs
            their shapes); ``None``: the sites' own.
    """

    def __init__(self, tol_factor: float = 1.0, defaults=None, fn=None, capacities=None):
        super().__init__(defaults, fn)
        self.tol_factor = float(tol_factor)
        self.capacities = dict(capacities or {})
        self.meshes: dict[str, gs.Mesh] = {}

    def run(self, name, call):
        if name in self.capacities:
            call = call._replace(max_steps=int(self.capacities[name]))
        mesh = call.record(self.tol_factor)
        self.meshes[name] = mesh
        return call.replay(mesh)


class ReplaySites(_Sites):
    """Replay the given mesh of every `ode` site and keep each site's largest replay
    ``error_ratio`` (`error_ratios`, name -> scalar) for the mesh policy.

    Args:
        meshes: site name -> the ``gs.Mesh`` recorded for it (`RecordSites`).
        drivers: site name -> the driver its replays run on, decided once by the caller
            (a missing site: ``gs.drivers.Auto()`` at each replay).
    """

    def __init__(self, meshes: Mapping[str, gs.Mesh], defaults=None, fn=None, drivers=None):
        super().__init__(defaults, fn)
        self.meshes = meshes
        self.drivers = dict(drivers or {})

    def run(self, name, call):
        if name not in self.meshes:
            raise ValueError(
                f"inference.ode: site {name!r} has no recorded mesh (recorded sites: "
                f"{sorted(self.meshes)}); a program must run the same ode sites at every "
                "call (no site behind Python control flow that depends on parameters)")
        sol = call.replay(self.meshes[name], self.drivers.get(name))
        self.error_ratios[name] = jnp.max(sol.error_ratio)
        return sol


class SolveSites(_Sites):
    """Solve every `ode` site adaptively (``gs.solve``) with the run's defaults; with
    ``max_steps``, at that step capacity (the sampler's in-potential solve)."""

    def __init__(self, max_steps: int | None = None, defaults=None, fn=None):
        super().__init__(defaults, fn)
        self.max_steps = max_steps

    def run(self, name, call):
        if self.max_steps is not None:
            call = call._replace(max_steps=int(self.max_steps))
        return call.solve()
