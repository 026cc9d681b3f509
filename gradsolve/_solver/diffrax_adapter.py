"""Drive a ``diffrax`` solver's own ``step`` from gradsolve's record and replay loops.

Given any Diffrax solver with an embedded error estimate, `DiffraxSolver` wraps it in
the gradsolve solver interface: the record loop calls ``solver.step`` to attempt steps and
accepts them with gradsolve's controller, and the replay drives the same ``step`` over the
recorded mesh, so its gradient is the exact discrete adjoint of those Diffrax steps.
Solvers without an error estimate are flagged ``adaptive = False``; `gradsolve.solve`
then falls back to ``diffrax.diffeqsolve`` with a constant step and
``RecursiveCheckpointAdjoint`` and reports that route.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._caches import cache
from .base import AbstractSolver


def _is_diffrax_solver(obj) -> bool:
    try:
        import diffrax
    except ImportError:  # pragma: no cover - diffrax is a dependency
        return False
    return isinstance(obj, diffrax.AbstractSolver)


class DiffraxSolver(AbstractSolver):
    """A Diffrax solver seen through gradsolve's interface (made by `as_solver`)."""

    solver: Any
    order: int = eqx.field(static=True)
    embedded_order: int = eqx.field(static=True)
    implicit: bool = eqx.field(static=True)
    adaptive: bool = eqx.field(static=True)

    def with_tolerances(self, rtol, atol) -> "DiffraxSolver":
        """Fill an implicit solver's root-finder tolerances from the record's, as
        ``diffrax.diffeqsolve`` does from its step-size controller."""
        import optimistix as optx
        from diffrax._root_finder import use_stepsize_tol  # the sentinel diffeqsolve fills

        rf = getattr(self.solver, "root_finder", None)
        if rf is None:
            return self
        num = lambda v: v if isinstance(v, jax.core.Tracer) else float(v)  # traced under jit
        values = {"rtol": num(rtol), "atol": num(atol), "norm": optx.rms_norm}
        names = [a for a in ("rtol", "atol", "norm") if getattr(rf, a, None) is use_stepsize_tol]
        if not names:
            return self
        new = eqx.tree_at(
            lambda s: tuple(getattr(s.root_finder, a) for a in names), self.solver,
            tuple(values[a] for a in names),
        )
        return eqx.tree_at(lambda a: a.solver, self, new)

    def _term(self, f):
        import diffrax

        return diffrax.ODETerm(lambda t, y, args: f(t, y, args))

    def init(self, f, t0, y0, params):
        return self.solver.init(self._term(f), t0, t0 + 1.0, y0, params)

    def step(self, f, t0, h, y0, params, state):
        import diffrax

        y1, y_err, _, new_state, result = self.solver.step(
            self._term(f), t0, t0 + h, y0, params, state, made_jump=False
        )
        if y_err is None:
            y_err = jnp.zeros_like(y0)
        failed = result != diffrax.RESULTS.successful
        # A failed implicit solve is a rejected step: infinite error shrinks h.
        y_err = jnp.where(failed, jnp.inf, y_err)
        y1 = jnp.where(h == 0, y0, y1)
        return y1, y_err, new_state


_HAS_ERROR = cache("diffrax error estimates")  # Diffrax solver type -> has one


def _has_error_estimate(wrapped: DiffraxSolver) -> bool:
    """Whether the Diffrax solver's ``step`` returns an embedded error (abstract trace only,
    once per solver class: it is a property of the method, not of its settings)."""
    cls = type(wrapped.solver)
    if cls not in _HAS_ERROR:
        _HAS_ERROR[cls] = _probe_error_estimate(wrapped)
    return _HAS_ERROR[cls]


def _probe_error_estimate(wrapped: DiffraxSolver) -> bool:
    import diffrax

    probe = wrapped.with_tolerances(1e-6, 1e-9).solver
    term = diffrax.ODETerm(lambda t, y, args: -y)
    y = jnp.zeros((1,))
    t0, t1 = jnp.zeros((), y.dtype), jnp.ones((), y.dtype)

    def attempt():
        state = probe.init(term, t0, t1, y, None)
        return probe.step(term, t0, t1, y, None, state, made_jump=False)[1]

    try:
        return jax.eval_shape(attempt) is not None
    except Exception:  # noqa: BLE001 - a solver that cannot step a plain ODETerm
        return False


def _takes_one_term(solver) -> bool:
    """Whether a Diffrax solver steps a single term (``term_structure`` an ``AbstractTerm``
    class, not a ``MultiTerm`` or a tuple of terms)."""
    import typing

    import diffrax

    structure = getattr(solver, "term_structure", diffrax.AbstractTerm)
    cls = typing.get_origin(structure) or structure
    return (isinstance(cls, type) and issubclass(cls, diffrax.AbstractTerm)
            and not issubclass(cls, diffrax.MultiTerm))


def as_solver(solver, where: str) -> AbstractSolver:
    """Accept a gradsolve solver or any ``diffrax`` solver; raise a clear error otherwise."""
    if isinstance(solver, AbstractSolver):
        return solver
    if _is_diffrax_solver(solver):
        import diffrax

        if not _takes_one_term(solver):
            raise ValueError(
                f"{where}: `solver` {type(solver).__name__} is not supported: it needs the "
                f"term structure {solver.term_structure} (e.g. an IMEX split into explicit and "
                "implicit parts in a diffrax.MultiTerm, or an SDE's drift and diffusion), "
                "but gradsolve drives Diffrax solvers with the single ODETerm of `f`. Use a "
                "solver of one ODETerm: diffrax.Kvaerno5() or gs.Rodas5P() for stiff "
                "problems, diffrax.Tsit5() or gs.Tsit5() otherwise."
            )
        term = diffrax.ODETerm(lambda t, y, args: y)
        order = solver.order(term)
        if order is None:
            raise ValueError(f"{where}: `solver` {type(solver).__name__} is not an ODE solver.")
        def wrap(adaptive: bool) -> DiffraxSolver:
            return DiffraxSolver(
                solver=solver, order=int(order), embedded_order=max(int(order) - 1, 1),
                implicit=isinstance(solver, diffrax.AbstractImplicitSolver), adaptive=adaptive,
            )

        return wrap(_has_error_estimate(wrap(True)))
    raise ValueError(
        f"{where}: `solver` must be a gradsolve solver (gs.Tsit5(), gs.Rodas5P(), ...) or a "
        f"diffrax solver instance, got {solver!r}."
    )
