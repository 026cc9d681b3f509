"""`PopulationProblem`: what `fit_population` minimises, behind `AbstractProblem`.

The coordinates are the fit's own outer vector ``u (P,)``: every population site (fixed
effects, the random effects' scales, the noise), each mapped to the real line by the
bijection of its prior's support, flattened in the model's order. The objective is half
the FOCE-I (or Laplace) objective ``OFV = -2 log L``, so that it is a negative
log-likelihood like every other problem's and a likelihood-ratio threshold means the same
on all of them. Each evaluation finds every subject's conditional mode again (warm-started
at the last ones) and solves adaptively: there is no mesh to keep.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._checkpoint import digest
from ..problem._abstract import AbstractProblem, scale_of
from ..problem._problem import TOLERANCES
from ._checks import float32_rtol
from ._population_fit import _objective, _problem

__all__ = ["PopulationProblem"]


class _NoMesh:
    """`PopulationProblem.log_density`'s aux: every evaluation solves adaptively."""

    error_ratio = 0.0


class PopulationProblem(AbstractProblem):
    """A `models.PopulationModel` and its data as `fit_population` fits them.

    Args:
        model, data: the population model and its `models.PopulationDataset`.
        method: ``"foce-i"`` or ``"laplace"`` (the fit's).
        params: the population sites where the coordinates' layout is read (a fit's
            ``params``; default the priors' medians).
        rtol, atol, solver, inner_iterations, driver: the objective's settings, as
            `fit_population`'s (pass the fit's to evaluate the objective it minimised).
        seed: for the draw that reveals the sites' shapes; caller: the function that
            error messages name.
    """

    def __init__(self, model, data, *, method: str = "foce-i", params=None,
                 rtol: float = TOLERANCES.population_rtol,
                 atol: float = TOLERANCES.population_atol, solver=None,
                 inner_iterations: int = 50, driver=None, seed: int = 0,
                 caller: str = "inference.profile"):
        rtol = float32_rtol(method, rtol, caller)
        init = None if params is None else {k: np.asarray(v) for k, v in params.items()}
        self.pb = _problem(model, data, method, init, seed)
        self.model, self.data, self.source, self.method = model, data, model, method
        self.settings = dict(rtol=float(rtol), atol=float(atol), solver=solver,
                             inner_iterations=int(inner_iterations), driver=driver)
        self._obj = _objective(self.pb, **self.settings)
        self.space = None  # the population sites' own bijections (`unflatten`)
        self.dim = int(np.asarray(self.pb.u0).size)
        self.n_evaluations = 0

    @property
    def u0(self) -> np.ndarray:
        """``u (P,)`` of the ``params`` the problem was built with."""
        return np.asarray(self.pb.u0, float)

    def unflatten(self, u) -> dict:
        """The population sites (constrained, each its own shape) at ``u (P,)``."""
        return {k: np.asarray(v) for k, v in self.pb.unflatten(jnp.asarray(u)).items()}

    def names(self) -> tuple[str, ...]:
        """One label per coordinate: the site (``"lKa"``) or its element
        (``"omega[1]"``)."""
        out = []
        for k in self.pb.names:
            if self.pb.shapes[k] == ():
                out.append(k)
            else:
                out.extend(f"{k}[{i}]" for i in range(self.pb.sizes[k]))
        return tuple(out)

    def scales(self) -> tuple[str, ...]:
        """Each coordinate's scale: ``"lin"`` (a real site), ``"log"`` (a positive one,
        e.g. a random effect's scale), else ``"unconstrained"``."""
        return tuple(s for k in self.pb.names
                     for s in [scale_of(self.pb.bij[k])] * self.pb.sizes[k])

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Unbounded: every coordinate is on the real line."""
        return np.full(self.dim, -np.inf), np.full(self.dim, np.inf)

    def sample_starts(self, key, n: int) -> np.ndarray:
        """``(n, P)``: the priors' medians (the fit's start), then draws around them of
        unit scale on the unconstrained coordinates."""
        noise = np.array(jax.random.normal(key, (int(n), self.dim)))  # writable
        noise[0] = 0.0
        return self.u0[None] + noise

    def start_point(self, params) -> np.ndarray:
        """``u (P,)`` of a dict of the population sites (a `PopulationFit`'s
        ``params``)."""
        return np.concatenate([np.ravel(np.asarray(self.pb.bij[k].inv(
            jnp.asarray(np.broadcast_to(np.asarray(params[k], float), self.pb.shapes[k])))))
            for k in self.pb.names])

    def value_and_grad(self, u, *, prior: bool = True) -> tuple[float, np.ndarray]:
        """Half the OFV at ``u (P,)`` and its exact gradient (the modes found inside);
        ``inf`` where no conditional modes are found. ``prior`` does not apply (the
        population sites' priors are starts and supports, not part of the likelihood)."""
        self.n_evaluations += 1
        v, g = self._obj.fun(np.asarray(u, float))
        if not v < 1e300:
            return np.inf, np.zeros(self.dim)
        return 0.5 * float(v), 0.5 * np.asarray(g, float)

    def objective(self, u, mesh=None, *, prior: bool = True):
        """``(value, aux)``: half the OFV at ``u (P,)`` (``()``) or ``(n, P)`` (``(n,)``),
        evaluated point by point on the host."""
        u = np.asarray(u, float)
        if u.ndim == 1:
            return self.value_and_grad(u)[0], _NoMesh()
        return np.array([self.value_and_grad(row)[0] for row in u]), _NoMesh()

    def log_density(self, u, mesh=None, *, prior: bool = True, jacobian: bool = True,
                    max_steps: int | None = None):
        """Minus `objective`: the Laplace-approximated marginal log-likelihood."""
        f, aux = self.objective(u, mesh, prior=prior)
        return -f, aux

    def fingerprint(self) -> dict:
        """The model, the method, the settings and a digest of the observations."""
        return dict(model=getattr(self.model, "name", type(self.model).__name__),
                    method=self.method, dim=self.dim,
                    data=digest((np.asarray(self.pb.ts), np.nan_to_num(self.pb.ys))),
                    **{k: repr(v) for k, v in self.settings.items()})

    def record(self, u, tol_factor: float = 1.0):
        """``None``: each evaluation solves adaptively (the modes move with ``u``)."""
        return None

    def ragged_replay(self, u, mesh) -> bool:
        return False

    def error_ratio(self, u, mesh):
        """0: nothing is replayed."""
        return jnp.zeros(())

    def observed_data(self) -> tuple[dict, dict, dict]:
        """The observations ``(subject, time)``, NaN where missing."""
        return ({"dv": np.asarray(self.pb.ys)}, {"dv": ["subject", "time"]}, {})
