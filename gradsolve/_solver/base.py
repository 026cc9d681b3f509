"""Solvers as data: the abstract interface that both drivers (record, replay) call.

A solver advances ONE trajectory (``y`` of shape ``(d,)``) by one step of given size and
returns the new state, an embedded error estimate and a small carried state (e.g. the
first-same-as-last stage). The drivers batch it over the ensemble with ``jax.vmap``, so a
step is written once and used by both the adaptive record and the fixed-step replay: the
replay is therefore the very computation that was accepted while recording.

Contract every solver keeps (the replay relies on it):

- ``step`` with ``h == 0`` returns ``y1 == y0`` exactly and has finite derivatives, so that
  padded steps (ragged ensembles) are exact identities in value and gradient. Solvers whose
  formulas divide by ``h`` must guard it (double ``where``).
- ``step`` is a pure function of its inputs: no Python control flow on traced values.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

VectorField = Callable[[Any, Array, Any], Array]


def combine(coeffs, vectors) -> Array | None:
    """``sum_j coeffs[j] * vectors[j]`` over the first ``len(vectors)`` coefficients.

    The coefficients are static (a tableau row), so zeros are skipped at trace time;
    returns ``None`` when every coefficient is zero. Python-float coefficients keep the
    vectors' dtype (float32 stays float32).
    """
    acc = None
    for cj, vj in zip(coeffs, vectors):
        if cj != 0.0:
            term = float(cj) * vj
            acc = term if acc is None else acc + term
    return acc


class AbstractSolver(eqx.Module):
    """Base class of every gradsolve solver.

    Subclasses define ``order`` (of the propagated solution), ``embedded_order`` (of the
    error estimator) and ``step``; ``init`` defaults to no carried state. Solvers are
    stateless equinox modules: construct them with no arguments.

    Attributes:
        order: class-level int, order of the propagated solution.
        embedded_order: class-level int, order of the embedded solution.
        implicit: class-level bool, whether ``step`` solves linear systems with the
            Jacobian (stiff solvers).

    Example:
        >>> isinstance(gs.Tsit5(), gs.AbstractSolver)
        True
        >>> gs.Tsit5().error_order          # min(order, embedded_order) + 1
        5
    """

    order: eqx.AbstractClassVar[int]
    embedded_order: eqx.AbstractClassVar[int]
    implicit: eqx.AbstractClassVar[bool]

    @property
    def error_order(self) -> int:
        """Local order of the error estimate, ``min(p, q) + 1``.

        The step-size controller raises the inverse error to ``1 / error_order``
        (Hairer, Norsett & Wanner, *Solving ODEs I*, II.4).
        """
        return min(self.order, self.embedded_order) + 1

    def init(
        self, f: VectorField, t0: Float[Array, ""], y0: Float[Array, " d"], params: PyTree
    ) -> PyTree:
        """State carried between steps (``None`` unless the solver reuses a stage)."""
        del f, t0, y0, params
        return None

    @abc.abstractmethod
    def step(
        self,
        f: VectorField,
        t0: Float[Array, ""],
        h: Float[Array, ""],
        y0: Float[Array, " d"],
        params: PyTree,
        state: PyTree,
    ) -> tuple[Float[Array, " d"], Float[Array, " d"], PyTree]:
        """One step from ``t0`` to ``t0 + h``.

        Returns ``(y1, y_error, new_state)``: the solution, the embedded error estimate
        (difference of the two solutions of the pair) and the carried state valid at
        ``t0 + h``. On a rejected step the drivers keep the old state.
        """


class ButcherTableau(NamedTuple):
    """The coefficients of an explicit Runge–Kutta pair (what a concrete solver is).

    Attributes:
        a: ``(s, s)`` strictly lower triangular stage coefficients.
        b: ``(s,)`` weights of the propagated solution.
        b_error: ``(s,)`` error weights ``b - b_hat`` (``b_hat`` the embedded solution's).
        c: ``(s,)`` stage times.
        fsal: first-same-as-last: the last stage, taken at the new solution, is the next
            step's first.

    Example:
        >>> heun_euler = gs.ButcherTableau(a=np.array([[0.0, 0.0], [1.0, 0.0]]),
        ...     b=np.array([0.5, 0.5]), b_error=np.array([-0.5, 0.5]),
        ...     c=np.array([0.0, 1.0]), fsal=False)
    """

    a: np.ndarray
    b: np.ndarray
    b_error: np.ndarray
    c: np.ndarray
    fsal: bool


class _TableauField:
    """``cls.a`` (or ``solver.a``) read from the class's ``tableau``, on the class too: the
    kernel generator and the tests read a solver class's coefficients."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, cls):
        return getattr(cls.tableau, self.name)


class AbstractExplicitRK(AbstractSolver):
    """An explicit Runge–Kutta pair given by its Butcher tableau.

    Concrete subclasses set the class-level ``tableau`` (a `ButcherTableau`), ``order`` and
    ``embedded_order``, as Diffrax's do; its fields are read as ``a`` (strictly lower
    triangular, ``(s, s)``), ``b`` (``(s,)``), ``b_error`` (``b - b_hat``, ``(s,)``), ``c``
    (``(s,)``) and ``fsal``. (A subclass may also set those five as class attributes
    directly.) If ``fsal`` the last stage is evaluated at ``(t0 + h, y1)`` and is carried
    to the next step as its first stage.

    Attributes:
        tableau: class-level `ButcherTableau`.

    Example:
        A Heun–Euler 2(1) pair, usable wherever a solver is accepted:

        >>> from typing import ClassVar
        >>> import numpy as np
        >>> class HeunEuler(gs.AbstractExplicitRK):
        ...     tableau: ClassVar = gs.ButcherTableau(
        ...         a=np.array([[0.0, 0.0], [1.0, 0.0]]), b=np.array([0.5, 0.5]),
        ...         b_error=np.array([-0.5, 0.5]), c=np.array([0.0, 1.0]), fsal=False)
        ...     order: ClassVar = 2
        ...     embedded_order: ClassVar = 1
        >>> sol = gs.solve(f, 0.0, 1.0, y0, params, solver=HeunEuler())
    """

    tableau: ClassVar[ButcherTableau]
    implicit: ClassVar[bool] = False

    a = _TableauField("a")
    b = _TableauField("b")
    b_error = _TableauField("b_error")
    c = _TableauField("c")
    fsal = _TableauField("fsal")

    def init(self, f, t0, y0, params):
        if self.fsal:
            return f(t0, y0, params)
        return None

    def step(self, f, t0, h, y0, params, state):
        a, b, e, c = self.a, self.b, self.b_error, self.c
        s = len(b)
        ks = [state if self.fsal else f(t0, y0, params)]
        y1 = None
        for i in range(1, s):
            shift = combine(a[i], ks)
            yi = y0 if shift is None else y0 + h * shift
            if self.fsal and i == s - 1:
                y1 = yi  # FSAL: the last stage is taken at the new solution itself.
            ks.append(f(t0 + float(c[i]) * h, yi, params))
        if y1 is None:
            y1 = y0 + h * combine(b, ks)
        err = combine(e, ks)
        y_error = jnp.zeros_like(y0) if err is None else h * err
        new_state = ks[-1] if self.fsal else None
        return y1, y_error, new_state
