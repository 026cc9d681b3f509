"""A NumPyro program with `inference.ode` sites as something `fit` and `sample` run.

`ProgramProblem` is to a program what `Problem` is to an `ODEModel`: flat unconstrained
parameters ``u (D,)`` or ``(n, D)`` in, log densities out, states from a replay of
recorded meshes (or an adaptive solve). The program's latent sample sites are the
parameters (their names and shapes, from one trace at construction); its observed sample
sites are the likelihood.

`ProgramMesh` holds the meshes of a program's ode sites, at one parameter point or at
``n`` points (starts, chains), and gives the fitter and the sampler the row algebra they
use on a ``gs.Mesh`` (``select``, ``scatter``, ``repeat``, ``chains``, ``merge``, ...)
with one row per POINT: a point of a population program is a whole ensemble of subjects,
so one start or one chain is ``S`` trajectories, and one log density of ``C`` chains is
one ``C * S``-trajectory replay.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

import gradsolve as gs

from ._abstract import AbstractProblem
from .._checkpoint import digest
from ._observed import check_observed_sites
from ._ode import SITE, RecordSites, ReplaySites, SolveSites
from ._problem import Problem
from ._space import ParamSpace

__all__ = ["ProgramMesh", "ProgramModel", "ProgramProblem", "PopulationInferenceModel",
           "population_program", "problem_for"]


def _is_host(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic))


def _xp(mesh: gs.Mesh):
    return np if _is_host(mesh.n_steps) else jnp


def _flat_points(m: gs.Mesh, S: int | None, n: int, xp) -> gs.Mesh:
    """A site's mesh from a record ``jax.vmap``-ed over ``n`` points (every leaf with a
    leading axis ``n``, then the site's ``S`` trajectories) as one ensemble of ``n * S``
    rows (``n`` where ``S is None``); the shared fields from the first point. ``xp``:
    ``np`` for a host mesh, ``jnp`` under ``jit``."""
    changes = {}
    for f in dataclasses.fields(m):
        per_row = f.name in gs.Mesh.PER_TRAJECTORY or f.name == "params"
        flat = ((lambda x: x if S is None else xp.reshape(x, (n * S,) + x.shape[2:]))
                if per_row else (lambda x: x[0]))
        changes[f.name] = jax.tree_util.tree_map(
            lambda x, flat=flat: flat(xp.asarray(x)) if eqx.is_array(x) else x,
            getattr(m, f.name))
    return dataclasses.replace(m, **changes)


class ProgramMesh(eqx.Module):
    """The meshes of a program's ode sites at one point or at ``n`` points.

    Attributes:
        meshes: site name -> ``gs.Mesh``. At one point (``n is None``) each is the mesh
            the site recorded (an ensemble of ``sizes[name]`` trajectories, or a single
            trajectory where ``sizes[name]`` is ``None``). At ``n`` points the points'
            meshes are joined along the ensemble axis: rows ``i * S`` to ``(i + 1) * S - 1``
            are point ``i``'s.
        sizes: site name -> trajectories per point (``None``: a single trajectory).
        n: the number of points, ``None`` for one.

    Per-point views (``status``, ``n_steps``, ``ok``) reduce over the point's
    trajectories and sites: a point is usable only when every one of its solves is.
    """

    meshes: dict
    sizes: dict = eqx.field(static=True)
    n: int | None = eqx.field(static=True)

    # ------------------------------------------------------------------ per point
    @property
    def is_ensemble(self) -> bool:
        return self.n is not None

    def _per_point(self, field: str, reduce):
        out = None
        for name, m in self.meshes.items():
            xp, a = _xp(m), getattr(m, field)
            S = self.sizes[name]
            if self.n is None:
                v = reduce(xp.asarray(a)) if S is not None else xp.asarray(a)
            else:
                v = reduce(xp.reshape(xp.asarray(a), (self.n, -1)), axis=1)
            out = v if out is None else xp.maximum(out, v)
        return out

    @property
    def status(self):
        """``(n,)`` (or a scalar): nonzero where some solve of the point failed."""
        return self._per_point("status", lambda a, axis=None: a.max(axis=axis))

    @property
    def n_steps(self):
        """``(n,)`` (or a scalar): the most steps any trajectory of the point needs."""
        return self._per_point("n_steps", lambda a, axis=None: a.max(axis=axis))

    @property
    def ok(self):
        return self.status == 0

    @property
    def capacity(self) -> int:
        return max(m.capacity for m in self.meshes.values())

    @property
    def n_jumps(self) -> int:
        """The most jumps any site was recorded with (0: no events)."""
        return max(m.n_jumps for m in self.meshes.values())

    # ------------------------------------------------------------------ rows = points
    def _rows(self, name: str, points) -> np.ndarray:
        S = self.sizes[name]
        # a JAX array of points (e.g. traced in a jitted scatter) stays one
        xp = jnp if isinstance(points, jax.Array) else np
        p = xp.asarray(points)
        return p if S is None else (p[:, None] * S + xp.arange(S)[None]).reshape(-1)

    def _points(self, rows) -> np.ndarray:
        if isinstance(rows, jax.Array) and rows.dtype != bool:
            return rows.astype(jnp.int32).reshape(-1)
        r = np.asarray(rows)
        return np.flatnonzero(r) if r.dtype == bool else r.astype(np.int64).reshape(-1)

    def where(self, mask, other: "ProgramMesh") -> "ProgramMesh":
        """Point ``i``'s meshes from ``other`` where ``mask[i]`` (``(n,)`` bool, possibly
        traced), else from this one; shapes kept (`gs.Mesh.where`, site by site)."""
        return ProgramMesh({k: m.where(self._row_mask(k, mask), other.meshes[k])
                            for k, m in self.meshes.items()}, self.sizes, self.n)

    def retired(self, keep) -> "ProgramMesh":
        """The points where ``keep (n,)`` is False replaying no step (their trajectories'
        ``n_steps`` set to 0; jittable): points a fit no longer uses."""
        return ProgramMesh({k: eqx.tree_at(lambda x: x.n_steps, m,
                                           jnp.where(self._row_mask(k, keep), m.n_steps, 0))
                            for k, m in self.meshes.items()}, self.sizes, self.n)

    def _row_mask(self, name: str, mask) -> jax.Array:
        """A per-point ``(n,)`` bool as the per-trajectory mask of site ``name``'s rows."""
        S = self.sizes[name]
        return jnp.asarray(mask) if S is None else jnp.repeat(jnp.asarray(mask), S)

    def select(self, rows) -> "ProgramMesh":
        """Points ``rows`` (int indices or a bool mask of shape ``(n,)``), in that order."""
        p = self._points(rows)
        return ProgramMesh({k: m.select(self._rows(k, p)) for k, m in self.meshes.items()},
                           self.sizes, len(p))

    def scatter(self, rows, other: "ProgramMesh") -> "ProgramMesh":
        """Points ``rows`` replaced by all points of ``other`` (capacities reconciled)."""
        other = other if other.is_ensemble else other.repeat(1)
        p = self._points(rows)
        return ProgramMesh({k: m.scatter(self._rows(k, p), other.meshes[k])
                            for k, m in self.meshes.items()}, self.sizes, self.n)

    def repeat(self, count: int) -> "ProgramMesh":
        """One point's meshes as ``count`` identical points."""
        if self.is_ensemble:
            raise ValueError("ProgramMesh.repeat: needs the meshes of one point")
        out = {k: m.repeat(count) if self.sizes[k] is None else
               gs.Mesh.concatenate([m] * int(count)) for k, m in self.meshes.items()}
        return ProgramMesh(out, self.sizes, int(count))

    def row(self, i: int) -> "ProgramMesh":
        """Point ``i``'s meshes (one point; itself when it holds one point)."""
        if not self.is_ensemble:
            return self
        sub = self.select(np.array([int(i)]))
        return ProgramMesh({k: m.unbatch() if self.sizes[k] is None else m
                            for k, m in sub.meshes.items()}, self.sizes, None)

    def points(self) -> list["ProgramMesh"]:
        """Every point's meshes, one `ProgramMesh` each."""
        return [self.row(i) for i in range(self.n)] if self.is_ensemble else [self]

    # ------------------------------------------------------------------ whole
    def _each(self, fn) -> "ProgramMesh":
        return ProgramMesh({k: fn(m) for k, m in self.meshes.items()}, self.sizes, self.n)

    def to_host(self) -> "ProgramMesh":
        return self._each(lambda m: m.to_host())

    def to_device(self) -> "ProgramMesh":
        return self._each(lambda m: m.to_device())

    def trim(self) -> "ProgramMesh":
        return self._each(lambda m: m.trim())

    def with_capacity(self, cap: int) -> "ProgramMesh":
        return self._each(lambda m: m.with_capacity(cap))

    def chains(self, count: int, capacity: int | None = None) -> "ProgramMesh":
        """Every array leaf with a leading axis of ``count`` (one point per chain, or the
        one point broadcast), on device, each site at ``capacity`` step slots: the stack
        ``jax.vmap`` hands one point to each chain (as ``gs.Mesh.chains``)."""
        if self.is_ensemble and self.n != count:
            raise ValueError(f"ProgramMesh.chains: `count`={count} but the meshes hold "
                             f"{self.n} points")
        out = {}
        for k, m in self.meshes.items():
            m = (m if capacity is None else m.with_capacity(capacity)).to_device()
            S = self.sizes[k]
            rowwise = set(gs.Mesh.PER_TRAJECTORY) | {"params"} if self.is_ensemble else set()

            def stack(x, per_row):
                if not eqx.is_array(x):
                    return x
                x = jnp.asarray(x)
                if per_row:
                    return x if S is None else jnp.reshape(x, (count, S) + x.shape[1:])
                return jnp.broadcast_to(x, (count,) + x.shape)

            out[k] = dataclasses.replace(m, **{
                f.name: jax.tree_util.tree_map(functools.partial(stack, per_row=f.name in rowwise),
                                               getattr(m, f.name))
                for f in dataclasses.fields(m)})
        return ProgramMesh(out, self.sizes, None)

    @staticmethod
    def from_stack(meshes: Mapping[str, gs.Mesh], sizes: Mapping, n: int) -> "ProgramMesh":
        """The ``n``-point `ProgramMesh` of a ``jax.vmap``-ed record (every leaf with a
        leading axis ``n``), on host, trimmed."""
        out = {}
        for k, m in meshes.items():
            # cut the step slots on device first: a record at an ode site's capacity holds
            # (n, S, max_steps + 1) times, mostly unused, and copying and padding them all
            # on the host cost more than the record itself
            m = m.trim().to_host()
            out[k] = _flat_points(m, sizes[k], n, np).padded().trim()
        return ProgramMesh(out, dict(sizes), n)

    @staticmethod
    def merge(parts: Sequence["ProgramMesh"]) -> "ProgramMesh":
        """One point's meshes, per site and trajectory as fine as the finest of every
        point of ``parts`` that recorded successfully (`gs.Mesh.merge`)."""
        first = parts[0]
        out = {}
        for k, S in first.sizes.items():
            if S is None:
                out[k] = gs.Mesh.merge([p.meshes[k] for p in parts])
                continue
            # trajectory j of every point: rows j, S + j, 2 S + j, ... of each part
            out[k] = gs.Mesh.concatenate([
                gs.Mesh.merge([p.meshes[k].select(np.arange(j, (p.n or 1) * S, S))
                               for p in parts]) for j in range(S)])
        return ProgramMesh(out, first.sizes, None).trim()


class _Errors(NamedTuple):
    """What `ProgramProblem.log_density` returns beside the value: ``error_ratio``, the
    largest replay error ratio of the point over its sites and trajectories."""

    error_ratio: jax.Array


def _site_log_prob(site) -> jax.Array:
    """A sample site's log density, summed, with its scale (as NumPyro's ``log_density``)."""
    fn, value = site["fn"], site["value"]
    lp = fn.log_prob(value, site["intermediates"]) if site.get("intermediates") else \
        fn.log_prob(value)
    if site.get("scale") is not None:
        lp = site["scale"] * lp
    return jnp.sum(lp)


class ProgramModel:
    """What the fitter and sampler need to know of a program's parameters: its latent
    sites as ``priors`` (name -> the site's distribution, plates expanded), their prior
    medians as ``defaults``, validation and prior draws.

    Args:
        name: the program's name; program, data: the program and the argument it is
            called with; priors: from the program's trace.
    """

    def __init__(self, name: str, program, data, priors: Mapping[str, dist.Distribution],
                 defaults: Mapping[str, Any]):
        from models import prior_median

        self.name, self.program, self.data = name, program, data
        self.ode_defaults = dict(defaults)
        self.priors = dict(priors)
        self.defaults = {k: prior_median(d) for k, d in self.priors.items()}
        self.shapes = {k: tuple(d.batch_shape) + tuple(d.event_shape)
                       for k, d in self.priors.items()}

    def check_params(self, params: Mapping[str, Any]) -> int | None:
        """Validate a parameter dict (the program's latent sites): its ensemble size or
        ``None``."""
        if not isinstance(params, Mapping):
            raise ValueError(f"{self.name}: parameters must be a dict with keys "
                             f"{sorted(self.priors)}, got {type(params).__name__}")
        missing = sorted(set(self.priors) - set(params))
        extra = sorted(set(params) - set(self.priors))
        if missing or extra:
            raise ValueError(f"{self.name}: the parameter dict must have exactly the "
                             f"program's latent sites {sorted(self.priors)}; missing "
                             f"{missing}, unknown {extra}")
        n = None
        for k, shape in self.shapes.items():
            s = tuple(np.shape(params[k]))
            if s == shape:
                m = None
            elif len(s) == len(shape) + 1 and s[1:] == shape:
                m = s[0]
            else:
                raise ValueError(f"{self.name}: `{k}` has shape {s}; the site has shape "
                                 f"{shape} (or (n,) + {shape} for an ensemble)")
            if m is not None and n is not None and m != n:
                raise ValueError(f"{self.name}: the parameters have different leading "
                                 f"sizes ({n} and {m})")
            n = n if m is None else m
        return n

    def sample_prior(self, key, n: int | None = None) -> dict[str, jax.Array]:
        """Latent values drawn by running the program under ``numpyro.handlers.seed``
        (so hierarchical priors are drawn as the program draws them); ``n`` of them with
        a leading axis ``n``."""
        def one(k):
            with SolveSites(defaults=self.ode_defaults):
                tr = handlers.trace(handlers.seed(self.program, k)).get_trace(self.data)
            return {name: tr[name]["value"] for name in self.priors}

        # jitted: run eagerly, the program's solves under vmap dispatch (and compile) op
        # by op, about fifty compiles for a population program
        if n is None:
            return jax.jit(one)(key)
        return jax.jit(jax.vmap(one))(jax.random.split(key, int(n)))


def _latent_and_observed(program, data, name: str, defaults):
    """``(priors, observed, ode_sites, plates)`` of one seeded trace of ``program(data)``;
    ``ode_sites``: name -> its `OdeCall` (the run's defaults filled in); ``plates``: every
    latent, observed and ode site's enclosing plates, ``(plate name, size)`` outermost
    first. A program that observes no data, or whose observations do not fit their
    distributions, is refused here (`check_observed_sites`)."""
    with SolveSites(defaults=defaults):
        tr = handlers.trace(handlers.seed(program, 0)).get_trace(data)
    priors, observed, sites, plates = {}, {}, {}, {}
    for site in tr.values():
        if site["type"] in (SITE, "sample"):
            plates[site["name"]] = tuple((f.name, int(f.size))
                                         for f in site.get("cond_indep_stack", ()))
        if site["type"] == SITE:
            sites[site["name"]] = site["args"][0].resolved(defaults)
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            if not isinstance(site["fn"], dist.Unit):  # numpyro.factor
                observed[site["name"]] = np.asarray(site["value"])
            continue
        fn = site["fn"]
        if fn.support.is_discrete:
            raise ValueError(f"{name}: latent site {site['name']!r} is discrete "
                             f"({type(fn).__name__}); gradient-based inference needs "
                             "continuous latent sites (marginalise it out)")
        priors[site["name"]] = fn
    if not sites:
        raise ValueError(f"{name}: the program has no inference.ode site; run it with "
                         "NumPyro directly (there is no mesh to reuse)")
    if not priors:
        raise ValueError(f"{name}: the program has no latent sample site to infer")
    check_observed_sites(tr, name)
    return priors, observed, sites, plates


class ProgramProblem(AbstractProblem):
    """A NumPyro program with `inference.ode` sites, the argument it is called with, and
    the default tolerances of its sites: the pieces `fit` and `sample` evaluate.

    Args:
        program: a NumPyro program, called as ``program(data)``.
        data: anything (the program's one argument).
        name: how runs and checkpoints name it (default the program's ``__name__``).
        source: what the user passed (a population model; default ``program``), which a
            MAP initialisation fits again.
        solver, rtol, atol, max_steps: defaults of the ode sites that do not set their
            own (``rtol = 1e-6``, ``atol = 1e-8``, 16,384 steps, ``gs.Tsit5()``).
    """

    # a sampler's defaults follow `hierarchical` (`inference.sampling.NUTS` says why)
    count_failures_by_default = False

    def __init__(self, program, data, *, name: str | None = None, solver=None,
                 rtol: float, atol: float, max_steps: int, source=None):
        if not callable(program):
            raise ValueError(f"`model` must be a models.ODEModel, a population model or a "
                             f"NumPyro program, got {type(program).__name__}")
        self.name = name or getattr(program, "__name__", type(program).__name__)
        self.program, self.data = program, data
        self.source = program if source is None else source
        self.solver, self.rtol, self.atol = solver, float(rtol), float(atol)
        self.max_steps = int(max_steps)
        self.defaults = dict(solver=solver, rtol=self.rtol, atol=self.atol,
                             max_steps=self.max_steps)
        priors, self.observed, calls, self.plates = _latent_and_observed(
            program, data, self.name, self.defaults)
        self.sites = list(calls)
        self._calls = calls
        self.space = ParamSpace(priors)
        self.model = ProgramModel(self.name, program, data, priors, self.defaults)
        # the sizes of each site's ensemble at one point, from the record's shapes
        shapes = jax.eval_shape(functools.partial(self._record_point, tol_factor=1.0),
                                jnp.zeros(self.space.dim))
        self.sizes = {k: (None if not m.is_ensemble else m.n) for k, m in shapes.items()}
        self._record_one = jax.jit(self._record_point, static_argnums=1)
        self._record_many = jax.jit(jax.vmap(self._record_point, in_axes=(0, None)),
                                    static_argnums=1)
        self._record_block: int | None = None  # points a record holds at once (memory)
        self._constrained = jax.jit(self.space.from_unconstrained)
        # latent sites in a plate: random effects (of an ode site's trajectories or not,
        # e.g. eight schools' funnel); or, however the program writes them (a plate, or
        # NumPyro's `.expand([S, q]).to_event(2)` without one), latent sites whose leading
        # axis runs over an ode site's trajectories: one value per subject is a random
        # effect, and its funnel wants the same defaults
        self.hierarchical = (any(self.plates.get(name) for name in self.space.names)
                             or bool(self.per_trajectory()))

    def sample_starts(self, key: jax.Array, n: int) -> np.ndarray:
        """``(n, D)`` draws of the program's latent sites from their priors, mapped to
        ``u`` (`inference.fit`'s starts where no ``init`` is given)."""
        from ._starts import prior_draws

        return prior_draws(self.model, self.space, key, int(n))

    def per_trajectory(self) -> list[str]:
        """The latent sites whose value's leading axis has the size of an ode site's
        ensemble (two trajectories or more), in a plate or not: one value per trajectory,
        e.g. a subject's random effects."""
        sizes = {n for n in self.sizes.values() if n is not None and n > 1}
        return [name for name, shape in self.space.shapes.items()
                if shape and shape[0] in sizes]

    def members(self, site: str) -> dict[str, str]:
        """The latent sites that belong, element by element, to the trajectories of the ode
        ``site``'s ensemble: latent site -> the plate that indexes both (a plate around the
        ode site, or a plate as large as its ensemble, e.g. the subjects of a population
        program). A per-subject method (conditional modes, a subject's mesh) reads this
        instead of guessing from shapes.

        Example:
            >>> problem.members("theophylline")   # models.theophylline()'s program
            {'eta': 'subjects'}
        """
        if site not in self.sites:
            raise ValueError(f"{self.name}: no ode site {site!r}; its ode sites: {self.sites}")
        n = self.sizes.get(site)
        own = {p for p, _ in self.plates.get(site, ())}
        out = {}
        for latent in self.space.names:
            for plate, size in self.plates.get(latent, ()):
                if plate in own or (n is not None and size == n):
                    out[latent] = plate
                    break
        return out

    def fingerprint(self) -> dict:
        """What a checkpoint must share with this problem to resume it."""
        return dict(model=self.name, dim=self.space.dim, sites=tuple(self.sites),
                    labels=digest(tuple(self.space.labels())), data=digest(self.observed),
                    solver=repr(self.solver), rtol=self.rtol, atol=self.atol,
                    max_steps=self.max_steps)

    # --------------------------------------------------------------------- running
    def _run(self, u, handler):
        x = self.space.from_unconstrained(u)
        with handler:
            return handlers.trace(handlers.substitute(self.program, data=x)).get_trace(self.data)

    def _record_point(self, u, tol_factor):
        h = RecordSites(tol_factor, self.defaults)
        self._run(u, h)
        return h.meshes

    records_in_place = True

    def record_in_place(self, u, mesh: ProgramMesh, tol_factor: float = 1.0) -> ProgramMesh:
        """Every ode site recorded at the points ``u (n, D)`` under ``jit``, each at its
        capacity in ``mesh`` (see `AbstractProblem.record_in_place`)."""
        caps = {k: m.capacity for k, m in mesh.meshes.items()}

        def point(ui):
            h = RecordSites(tol_factor, self.defaults, capacities=caps)
            self._run(ui, h)
            return h.meshes

        n = u.shape[0]
        out = {k: _flat_points(m, self.sizes[k], n, jnp)
               for k, m in jax.vmap(point)(u).items()}
        return ProgramMesh(out, dict(self.sizes), n)

    def record(self, u, tol_factor: float = 1.0) -> ProgramMesh:
        """Every ode site recorded at ``u (D,)`` or ``(n, D)`` (host, trimmed)."""
        u = jnp.asarray(u, dtype=jnp.result_type(float))
        if u.ndim == 1:
            meshes = {k: m.trim().to_host()
                      for k, m in self._record_one(u, float(tol_factor)).items()}
            return ProgramMesh(meshes, self.sizes, None)
        return self._record_chunked(u, float(tol_factor))

    def _record_chunked(self, u, tol_factor: float) -> ProgramMesh:
        """The ``(n, D)`` record in blocks of points: all ``n`` at once where it fits in the
        device's memory, else halves (the block size kept for the next record), since a
        record holds every trajectory at its site's full step capacity until it is trimmed
        (a population's 200 subjects times 128 chains asks more than a TPU v5e's 16 GB)."""
        n = u.shape[0]
        size = min(n, self._record_block or n)
        while True:
            try:
                parts = []
                for lo in range(0, n, size):
                    block = u[lo:lo + size]
                    real = block.shape[0]
                    if real < size:  # one compiled shape: pad with the last point
                        block = jnp.concatenate([block, jnp.repeat(block[-1:], size - real, 0)])
                    part = ProgramMesh.from_stack(self._record_many(block, tol_factor),
                                                  self.sizes, size)
                    parts.append(part if real == size else part.select(np.arange(real)))
                break
            except jax.errors.JaxRuntimeError as e:
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                if size == 1:
                    raise MemoryError(
                        f"{self.name}: recording one point's ode sites does not fit in the "
                        f"device's memory ({e}); lower the sites' max_steps (the step "
                        f"capacity every trajectory is recorded at) or run on a device "
                        f"with more memory") from e
                size = (size + 1) // 2
                self._record_block = size
        if len(parts) == 1:
            return parts[0]
        meshes = {k: gs.Mesh.concatenate([p.meshes[k] for p in parts]) for k in self.sites}
        return ProgramMesh(meshes, dict(self.sizes), n)

    def _density(self, u, mesh, prior, jacobian, max_steps):
        # each site solves at its own capacity (a population's subjects need more steps
        # in parts of the posterior than at the starting points)
        h = (SolveSites(None, self.defaults) if mesh is None
             else ReplaySites(mesh.meshes, self.defaults, drivers=self.replay_drivers))
        tr = self._run(u, h)
        lp_prior, lp_like = 0.0, 0.0
        for site in tr.values():
            if site["type"] == "sample":
                if site["is_observed"]:
                    lp_like = lp_like + _site_log_prob(site)
                else:
                    lp_prior = lp_prior + _site_log_prob(site)
        lp = lp_prior + lp_like if prior else lp_like
        if jacobian:
            lp = lp + self.space.log_abs_det_jacobian(u)
        lp = jnp.where(jnp.isnan(lp), -jnp.inf, lp)
        errs = list(h.error_ratios.values())
        err = functools.reduce(jnp.maximum, errs) if errs else jnp.zeros((), lp.dtype)
        return lp, err

    def log_density(self, u, mesh: ProgramMesh | None = None, *, prior: bool = True,
                    jacobian: bool = True, max_steps: int | None = None):
        """The log density at unconstrained ``u (D,)`` or ``(n, D)``: the program's log
        joint (only its observed sites without ``prior``) plus ``log |dx/du|`` with
        ``jacobian``, the ode sites replaying ``mesh`` (``n`` points, or one shared) or,
        with ``mesh=None``, solving (at each site's own ``max_steps``; the argument is
        accepted for the interface `Problem` shares). Returns ``(value, errors)``; ``errors.error_ratio``
        is per point. A failed solve gives ``-inf``."""
        u = jnp.asarray(u)
        run = functools.partial(self._density, prior=prior, jacobian=jacobian,
                                max_steps=max_steps)
        if u.ndim == 1:
            lp, err = run(u, mesh)
        elif mesh is None:
            lp, err = jax.vmap(lambda uu: run(uu, None))(u)
        else:
            lp, err = jax.vmap(run)(u, mesh.chains(u.shape[0]))
        return lp, _Errors(err)

    @property
    def replay_drivers(self) -> dict:
        """Each ode site's replay driver (`gs.drivers.Auto`'s choice from the site's field,
        solver and shapes), decided where a density is traced and passed to every replay
        of it. (Not cached: `gs.use_compiled_kernel` may change it.)"""
        return {k: c.replay_driver() for k, c in self._calls.items()}

    def ragged_replay(self, u, mesh: ProgramMesh) -> bool:
        """Whether every site's replay costs each trajectory's own steps (its decided
        driver is ``ragged``: the compiled kernel)."""
        return all(d.ragged for d in self.replay_drivers.values())

    def error_ratio(self, u, mesh: ProgramMesh) -> jax.Array:
        """The replay error ratio of ``mesh`` (one point) at ``u (D,)``."""
        return self._density(u, mesh, True, False, None)[1]

    def observed_data(self) -> tuple[dict, dict, dict]:
        """``(values, dims, coords)`` of the observed sites, for ``arviz``."""
        return dict(self.observed), {}, {}


@runtime_checkable
class PopulationInferenceModel(Protocol):
    """What a many-subject model provides (`models.PopulationModel` does) for
    `population_program` to build its NumPyro program: latent sites, each subject's ODE
    parameters, doses, the ensemble solve's arguments from them (``solve_args``: the
    vector field, ``t0``, ``t1``, ``y0``, ``params``, ``ts``, ``events``), an observation
    function and a noise model."""

    name: str
    vector_field: Any
    t0: float
    solver: Any

    def latent(self, data) -> dict: ...
    def individual(self, theta, data) -> dict: ...
    def dosing(self, theta, p, data) -> tuple: ...
    def solve_args(self, theta, data) -> tuple: ...
    def observation(self, theta, p, ts, ys, as_solved=None) -> jax.Array: ...
    def solved_at_t0(self, data) -> np.ndarray: ...
    def observations(self, theta, pred) -> dist.Distribution: ...


def population_program(model):
    """The NumPyro program of a population model: ``program(data)`` with ``data`` a
    `models.PopulationDataset`.

    It samples the model's latent sites (``model.latent``), forms each subject's ODE
    parameters and doses, solves all ``S`` subjects as ONE ensemble at the `ode` site
    named after the model (each subject's own sampling times and dose schedule), maps the
    states to predicted observations and observes ``"obs"`` ``(S, K)`` (padding slots
    and missing values skipped). A failed solve adds ``-inf`` (``"solver_failure"``).

    Args:
        model: a population model (`models.PopulationModel`: ``latent``, ``individual``,
            ``dosing``, ``solve_args``, ``observation``, ``observations``,
            ``vector_field``, ``t0``, ``solver``).

    Returns:
        The NumPyro program ``program(data)``; under plain NumPyro its ode site solves
        with ``gs.solve``.

    Example:
        >>> program = inference.population_program(models.theophylline())
        >>> mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(program), num_warmup=500,
        ...                           num_samples=1000)
        >>> mcmc.run(jax.random.PRNGKey(0), models.load_dataset("theophylline"))
    """
    from ._ode import ode

    def program(data):
        ts, ys = data.observations()
        theta = model.latent(data)
        a = model.solve_args(theta, data)
        sol = ode(model.name, a.f, a.t0, a.t1, a.y0, a.params, ts=ts, solver=model.solver,
                  **a.events)
        p = a.params
        pred = model.observation(theta, p, ts, sol.ys, as_solved=model.solved_at_t0(data))
        ok = jnp.all(jnp.isfinite(pred))
        numpyro.factor("solver_failure", jnp.where(ok, 0.0, -jnp.inf))
        pred = jnp.where(ok, pred, 1.0)
        numpyro.sample("obs", model.observations(theta, pred, data.censoring()), obs=ys)

    program.__name__ = model.name
    program.__doc__ = f"NumPyro program of population model {model.name!r}."
    return program


def problem_for(model, data, *, solver=None, rtol: float, atol: float,
                max_steps: int | None):
    """The `Problem` of an `ODEModel` (any `InferenceModel`), or the `ProgramProblem` of a
    population model or of a NumPyro program ``program(data)``; ``max_steps=None``: the
    default capacity of each (``MAX_STEPS`` for a record, ``SITE_MAX_STEPS`` for an ode
    site)."""
    from ._problem import MAX_STEPS, SITE_MAX_STEPS, InferenceModel, Problem

    if isinstance(model, InferenceModel):
        return Problem(model, data, solver=solver, rtol=rtol, atol=atol,
                       max_steps=MAX_STEPS if max_steps is None else max_steps)
    max_steps = SITE_MAX_STEPS if max_steps is None else max_steps

    if isinstance(model, PopulationInferenceModel):
        return ProgramProblem(population_program(model), data, name=model.name,
                              solver=solver, rtol=rtol, atol=atol, max_steps=max_steps,
                              source=model)
    return ProgramProblem(model, data, solver=solver, rtol=rtol, atol=atol,
                          max_steps=max_steps)


_KINDS: list[tuple[Callable[[Any], bool], Callable[..., AbstractProblem]]] = []
"""The kinds of model an importer taught `problem_of`: ``(is_kind, build)`` pairs."""


def register_kind(is_kind: Callable[[Any], bool], build: Callable[..., AbstractProblem]
                  ) -> None:
    """Teach `problem_of` a kind of model that carries its own problem (an importer's:
    ``inference/petab`` registers `models.PetabProblem`), so that the methods that call
    `problem_of` never name it.

    Args:
        is_kind: ``is_kind(model) -> bool``, whether ``model`` is of this kind.
        build: ``build(model, data, *, solver, rtol, atol, max_steps, fit)`` -> the
            `AbstractProblem` every method runs on (with ``fit``: the one fits move in);
            ``None`` settings are the kind's own. It checks ``data`` itself.
    """
    _KINDS.append((is_kind, build))


def carries_data(model) -> bool:
    """Whether ``model`` is of a kind `register_kind` taught `problem_of` (a
    `models.PetabProblem`: it carries its data and settings)."""
    return any(is_kind(model) for is_kind, _ in _KINDS)


def problem_of(model, data, *, solver=None, rtol=None, atol=None, max_steps=None,
               fit: bool = False) -> AbstractProblem:
    """The problem every method runs on: a registered kind's own (`register_kind`; a
    `models.PetabProblem`'s, which carries its data and settings), else `problem_for`'s
    (``None`` tolerances: `inference`'s defaults). ``fit``: the problem a fit moves in
    where its kind has another one than its sampler's."""
    for is_kind, build in _KINDS:
        if is_kind(model):
            return build(model, data, solver=solver, rtol=rtol, atol=atol,
                         max_steps=max_steps, fit=fit)
    from ._problem import TOLERANCES

    return problem_for(model, data, solver=solver,
                       rtol=TOLERANCES.rtol if rtol is None else rtol,
                       atol=TOLERANCES.atol if atol is None else atol, max_steps=max_steps)
