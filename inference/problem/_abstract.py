"""`AbstractProblem`: what fitters, samplers and profiles ask of a problem, and nothing more.

Four problems implement it: `inference.problem._problem.Problem` (an `ODEModel` and its data:
one ODE, one mesh), `inference.problem._program.ProgramProblem` (any NumPyro program with
`inference.ode` sites: a mesh per site), the PEtab problem
(`inference.petab._problem.PetabFitProblem`: the parameter table's scales inside its
bounds, hierarchical inner parameters solved inside) and the population problem
(`inference.population._problem.PopulationProblem`: `fit_population`'s outer vector and its
FOCE-I/Laplace objective). The chains, the mesh policies, checkpoints, the MAP start, the
optimisers and the profiles talk to this interface only. A sampler's defaults are the
sampler's (`inference.sampling.NUTS`, ...); where they depend on the posterior's
structure they ask it one question, `hierarchical`, so no caller asks which class it
holds.

What a method reads, over the flat coordinates ``u (D,)`` (or ``(n, D)``) it moves in:
`names`, `scales`, `bounds` (where it may move), `sample_starts` (multistart), `objective`
and `value_and_grad` (what a fit minimises), `least_squares` / `residuals` /
`residual_terms` (where a Levenberg–Marquardt applies), and `record` / `error_ratio` (the
mesh to record and replay).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class ResidualTerms(NamedTuple):
    """A problem's objective in the form a batched Levenberg–Marquardt reads it:

        objective(u) = sum_i [normal: z_i^2 / 2 + s_i ;  laplace: |z_i| + s_i]
                       + penalty(u) + constant,

    ``z`` the weighted residuals, ``s`` the log noise scales (zeros for plain least
    squares; they may depend on ``u`` where a noise parameter is estimated, which makes the
    objective no sum of squares: the LM then takes the Fisher information as curvature).

    Attributes:
        record: ``record(u (D,), tol_factor) -> mesh`` at one point (a pytree of arrays).
        terms: ``terms(u (D,), mesh) -> (z (m,), s (m,), error (k,))`` by a replay of
            ``mesh``, forward-mode differentiable in ``u``; ``error`` the replay's error
            estimate per solve in units of the requested tolerances.
        laplace: ``(m,)`` bool where the noise is Laplace, or ``None`` (all normal).
        profiled: ``(m,)`` bool where ``s`` is a noise parameter optimised in closed form
            at each ``u`` (its curvature is left out), or ``None``.
        penalty: ``penalty(u (D,)) -> ()`` (a separable negative log prior) or ``None``.
        constant: what the sum above omits, so that it equals `AbstractProblem.objective`.
        cost: ``cost(meshes) -> (n,)``, what evaluating each kept mesh costs (rows of
            similar cost are evaluated together), or ``None``.
    """

    record: Callable
    terms: Callable
    laplace: Any = None
    profiled: Any = None
    penalty: Callable | None = None
    constant: float = 0.0
    cost: Callable | None = None


class AbstractProblem(abc.ABC):
    """A problem over flat coordinates ``u (D,)`` or ``(n, D)``: unconstrained for an ODE
    model or a program, the parameter table's scales inside its bounds for PEtab, the outer
    vector of `fit_population` for a population model.

    Attributes:
        space: the `inference.problem._space.ParamSpace` mapping ``u`` to the model's constrained
            parameters (``space.dim == D``).
        source: what the user passed (a model or a program), which a MAP start fits.
        hierarchical: whether the posterior is a random-effects hierarchy (latent sites
            in a plate, e.g. one value per subject): its step counts vary widely across
            the posterior and its funnel wants smaller steps, so samplers choose their
            defaults by it.
        count_failures_by_default: whether solver failures are counted at every
            evaluation under ``rerecord="always"`` (a host callback per evaluation).
        least_squares: whether `residuals` gives the objective as ``0.5 sum r^2 + const``
            (priors as extra rows where Gaussian); false where a noise parameter is
            estimated or a prior is not Gaussian (`residual_terms` may still apply).

    Example:
        A problem of one's own is a subclass giving the six methods and one default;
        the sampler's chains then evaluate it as they do the built-in ones:

        >>> class Shifted(inference.AbstractProblem):
        ...     count_failures_by_default = True
        ...     def __init__(self, inner):
        ...         self.inner, self.space, self.source = inner, inner.space, inner.source
        ...     def log_density(self, u, mesh=None, **kw):
        ...         return self.inner.log_density(u - 1.0, mesh, **kw)
        ...     ...  # fingerprint, record, ragged_replay, error_ratio, observed_data
    """

    space: Any
    source: Any
    hierarchical: bool = False
    count_failures_by_default: bool
    least_squares: bool = False
    map_fit_options = {"n_starts": 16, "steps": 300}
    """`inference.fit`'s ``n_starts`` and ``steps`` for the sampler's MAP start."""

    def start_point(self, params) -> jax.Array:
        """The unconstrained ``u (D,)`` (or ``(n, D)``) of a constrained parameter dict
        (a fit's best point, or the user's ``init``, already checked) that the chains
        start at or around. A problem without a `ParamSpace` moves in its parameters
        themselves: a dict by `names` (``ValueError`` naming unknown and missing keys), or
        an array of coordinates."""
        if self.space is not None:
            return self.space.to_unconstrained(params)
        names = self.names()
        if not isinstance(params, Mapping):
            return jnp.asarray(params, float)
        unknown, missing = sorted(set(params) - set(names)), [p for p in names
                                                               if p not in params]
        if unknown or missing:
            what = " and ".join(([f"unknown key(s) {unknown}"] if unknown else [])
                                + ([f"missing parameters {missing}"] if missing else []))
            raise ValueError(f"`init` has {what}; the parameters are {list(names)}")
        return jnp.stack([jnp.asarray(params[p], float) for p in names], axis=-1)

    # ------------------------------------------------------------ what methods read
    def names(self) -> tuple[str, ...]:
        """One name per coordinate of ``u``: a parameter's (``"alpha"``) or an element's
        (``"theta[2]"``), as results and error messages show them."""
        return tuple(self.space.labels())

    def scales(self) -> tuple[str, ...]:
        """How each coordinate maps to its parameter: ``"lin"`` (the value itself),
        ``"log"``, ``"log10"``, or ``"unconstrained"`` (another bijection of the
        parameter's support, e.g. a logit). Profiles and intervals are on these scales."""
        out = []
        for e in self.space.entries:
            out.extend([scale_of(e.transform)] * e.size)
        return tuple(out)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lower (D,), upper (D,))`` float arrays: where the coordinates may move,
        ``-inf`` / ``inf`` where nothing bounds them (unconstrained coordinates)."""
        d = int(self.space.dim)
        return np.full(d, -np.inf), np.full(d, np.inf)

    def sample_starts(self, key: jax.Array, n: int) -> np.ndarray:
        """``(n, D)`` starting points of a multistart fit, from ``key`` (a
        ``jax.random.PRNGKey``): draws from the priors, mapped to ``u``; Latin hypercube
        samples of the bounds where the problem's priors are only bounds (PEtab)."""
        raise NotImplementedError(f"{type(self).__name__} draws no starts: give them")

    def objective(self, u: jax.Array, mesh=None, *, prior: bool = True):
        """``(value, aux)``: what a fit minimises at ``u (D,)`` (value ``()``) or
        ``(n, D)`` (``(n,)``): minus the log likelihood, plus minus the log prior with
        ``prior`` (no log-Jacobian of the coordinates: a MAP fit finds the constrained
        mode), replaying ``mesh`` or, with ``None``, solving adaptively; ``inf`` where a
        solve fails. ``aux`` is `log_density`'s. Compiled once per problem and ``prior``
        (called inside a caller's ``jit``, it is traced there)."""
        cache = self.__dict__.setdefault("_objective_jit", {})
        fn = cache.get(bool(prior))
        if fn is None:
            def fn(v, m):
                lp, aux = self.log_density(v, m, prior=prior, jacobian=False)
                return -lp, aux
            fn = cache[bool(prior)] = jax.jit(fn)
        return fn(jnp.asarray(u), mesh)

    def value_and_grad(self, u, *, prior: bool = True) -> tuple[float, np.ndarray]:
        """`objective` at one point ``u (D,)`` (an adaptive solve) and its gradient
        ``(D,)``, as host numbers: what a host optimiser (SciPy) iterates on. Compiled once
        per problem and ``prior``; a non-finite value comes back as ``inf``."""
        cache = self.__dict__.setdefault("_value_and_grad_jit", {})
        fn = cache.get(bool(prior))
        if fn is None:
            fn = cache[bool(prior)] = jax.jit(jax.value_and_grad(
                lambda v: self.objective(v, None, prior=prior)[0]))
        v, g = fn(jnp.asarray(u, float))
        v, g = float(v), np.asarray(g, float)
        if not (np.isfinite(v) and np.all(np.isfinite(g))):
            return np.inf, np.zeros_like(g)
        return v, g

    def residuals(self, u: jax.Array, mesh=None, *, prior: bool = True):
        """``(r, aux)`` where `least_squares`: ``r (M,)`` at ``u (D,)`` or ``(n, M)`` at
        ``(n, D)``, with ``objective = 0.5 * sum(r**2) + const`` (Gaussian priors as extra
        rows with ``prior``), replaying ``mesh`` or, with ``None``, solving."""
        raise NotImplementedError(f"{type(self).__name__} has no least-squares residuals "
                                  "(least_squares is false)")

    def residual_terms(self, *, prior: bool = True) -> ResidualTerms | None:
        """The objective as a batched Levenberg–Marquardt reads it (`ResidualTerms`:
        weighted residuals, log noise scales, a penalty, on kept meshes), or ``None`` where
        the objective is not of that form (a non-Gaussian likelihood, a population's
        integrated likelihood). With `least_squares` it is built from `residuals`."""
        if not self.least_squares:
            return None

        def terms(u, mesh):
            r, aux = self.residuals(u, mesh, prior=prior)
            return r, jnp.zeros_like(r), jnp.atleast_1d(aux.error_ratio)

        u0 = np.asarray(self.sample_starts(jax.random.PRNGKey(0), 1)[0], float)
        const = self.objective(u0, None, prior=prior)[0]
        r0 = self.residuals(u0, None, prior=prior)[0]
        return ResidualTerms(record=self.record, terms=terms,
                             constant=float(const) - 0.5 * float(jnp.sum(r0**2)))

    # ------------------------------------------------------------ meshes and sampling
    @abc.abstractmethod
    def fingerprint(self) -> dict:
        """What a checkpoint must share with this problem to be resumed by it."""

    @abc.abstractmethod
    def record(self, u: jax.Array, tol_factor: float = 1.0):
        """The mesh (or meshes) recorded at ``u (D,)`` or ``(n, D)``, tolerances scaled by
        ``tol_factor``."""

    #: Whether `record_in_place` works (under ``jit``, at a given mesh's capacity).
    records_in_place: bool = False

    def record_in_place(self, u: jax.Array, mesh, tol_factor: float = 1.0):
        """The mesh recorded at ``u (n, D)`` with the shapes of ``mesh`` (its step
        capacity), traceable, so that a compiled loop can swap rows in with
        ``mesh.where`` without leaving ``jit``; a row that needs more steps than the
        capacity comes back with a failed ``status``. Problems that cannot (their meshes
        are recorded on the host) leave `records_in_place` False."""
        raise NotImplementedError(f"{type(self).__name__} records its meshes on the host")

    @abc.abstractmethod
    def log_density(self, u: jax.Array, mesh=None, *, prior: bool = True,
                    jacobian: bool = True, max_steps: int | None = None):
        """``(value, aux)``: the log density at ``u`` (``()`` or ``(n,)``), replaying
        ``mesh`` or, with ``None``, solving adaptively; ``aux.error_ratio`` says how well
        the mesh holds."""

    @abc.abstractmethod
    def ragged_replay(self, u: jax.Array, mesh) -> bool:
        """Whether a replay's cost follows each trajectory's own steps, so a caller may
        give the mesh room to grow without paying for the unused slots."""

    @abc.abstractmethod
    def error_ratio(self, u: jax.Array, mesh) -> jax.Array:
        """The replay's embedded error estimate over the tolerance at ``u (D,)`` on
        ``mesh``: above 1, the mesh no longer holds there."""

    @abc.abstractmethod
    def observed_data(self) -> tuple[dict, dict, dict]:
        """``(values, dims, coords)`` of the observations, for ``arviz``."""


def scale_of(transform) -> str:
    """``"lin"``, ``"log"`` or ``"unconstrained"``: how a `ParamSpace` coordinate maps to
    its parameter (NumPyro's bijection for the prior's support)."""
    from numpyro.distributions import transforms as T

    while isinstance(transform, T.IndependentTransform):
        transform = transform.base_transform
    if isinstance(transform, T.ComposeTransform) and len(transform.parts) == 2:
        # a support [0, inf) or (0, inf) written as exp followed by x + 0
        exp, shift = transform.parts
        if isinstance(exp, T.ExpTransform) and isinstance(shift, T.AffineTransform) and \
                np.all(np.asarray(shift.loc) == 0) and np.all(np.asarray(shift.scale) == 1):
            return "log"
    if isinstance(transform, T.IdentityTransform):
        return "lin"
    if isinstance(transform, T.ExpTransform):
        return "log"
    return "unconstrained"
