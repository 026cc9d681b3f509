"""Solvers: explicit Runge–Kutta pairs, Rosenbrock methods and the Diffrax adapter."""

from .base import AbstractExplicitRK, AbstractSolver, ButcherTableau
from .dopri5 import Dopri5
from .rodas5p import Rodas5P
from .rosenbrock import AbstractRosenbrock
from .rosenbrock23 import Rosenbrock23
from .tsit5 import Tsit5
from .vern7 import Vern7

__all__ = ["AbstractSolver", "AbstractExplicitRK", "ButcherTableau", "Tsit5", "Dopri5", "Vern7",
           "AbstractRosenbrock", "Rosenbrock23", "Rodas5P"]
