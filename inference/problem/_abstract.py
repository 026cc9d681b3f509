"""`AbstractProblem`: what fitters and samplers ask of a posterior, and nothing more.

Two problems implement it: `inference.problem._problem.Problem` (an `ODEModel` and its data: one
ODE, one mesh) and `inference.problem._program.ProgramProblem` (any NumPyro program with
`inference.ode` sites: a mesh per site). The chains, the mesh policies, checkpoints and
the MAP start talk to this interface only, and the sampler's defaults that depend on the
kind of problem are its attributes (a class's, or an instance's where the problem's structure
decides them), so no caller asks which class it holds.
"""

from __future__ import annotations

import abc
from typing import Any

import jax


class AbstractProblem(abc.ABC):
    """A posterior over flat unconstrained parameters ``u (D,)`` or ``(n, D)``.

    Attributes:
        space: the `inference.problem._space.ParamSpace` mapping ``u`` to the model's constrained
            parameters (``space.dim == D``).
        source: what the user passed (a model or a program), which a MAP start fits.
        default_rerecord: the sampler's mesh policy when the user gives none: ``"warmup"``
            (re-record while warming up, sample on a frozen mesh checked by its error
            ratio) suits one small ODE; ``"always"`` (record at every proposal) suits
            programs whose sites' step counts vary widely across the posterior.
        default_target_accept: NUTS's target acceptance rate when the user gives none.
        dense_target_accept: the target instead where the metric is dense, or ``None``
            (the same): a random-effects hierarchy's dense metric takes longer steps
            along its correlations into the curvature of its funnel.
        dense_mass_by_default: whether a dense mass matrix is adapted by default where
            the dimension is small.
        default_init: where the chains start when the user does not say: ``"map"`` (the
            MAP point, jittered) or ``"advi"`` (draws from a mean-field variational fit
            started there: a random-effects hierarchy's mode lies far from its draws).
        count_failures_by_default: whether solver failures are counted at every
            evaluation under ``rerecord="always"`` (a host callback per evaluation).

    Example:
        A problem of one's own is a subclass giving the six methods and four defaults;
        the sampler's chains then evaluate it as they do the built-in ones:

        >>> class Shifted(inference.AbstractProblem):
        ...     default_rerecord, default_target_accept = "warmup", 0.8
        ...     dense_mass_by_default = count_failures_by_default = True
        ...     def __init__(self, inner):
        ...         self.inner, self.space, self.source = inner, inner.space, inner.source
        ...     def log_density(self, u, mesh=None, **kw):
        ...         return self.inner.log_density(u - 1.0, mesh, **kw)
        ...     ...  # fingerprint, record, ragged_replay, error_ratio, observed_data
    """

    space: Any
    source: Any
    default_rerecord: str
    default_target_accept: float
    dense_target_accept: float | None = None
    dense_mass_by_default: bool
    default_init: str = "map"
    count_failures_by_default: bool
    map_fit_options = {"n_starts": 16, "steps": 300}
    """`inference.fit`'s ``n_starts`` and ``steps`` for the sampler's MAP start."""

    def start_point(self, params) -> jax.Array:
        """The unconstrained ``u (D,)`` (or ``(n, D)``) of a constrained parameter dict
        (a fit's best point, or the user's ``init``, already checked) that the chains
        start at or around."""
        return self.space.to_unconstrained(params)

    @abc.abstractmethod
    def fingerprint(self) -> dict:
        """What a checkpoint must share with this problem to be resumed by it."""

    @abc.abstractmethod
    def record(self, u: jax.Array, tol_factor: float = 1.0):
        """The mesh (or meshes) recorded at ``u (D,)`` or ``(n, D)``, tolerances scaled by
        ``tol_factor``."""

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
