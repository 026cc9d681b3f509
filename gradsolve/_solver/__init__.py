"""Solvers: explicit Runge–Kutta pairs, Rosenbrock methods and the Diffrax adapter."""

from .base import AbstractExplicitRK, AbstractSolver
from .dopri5 import Dopri5
from .tsit5 import Tsit5

__all__ = ["AbstractSolver", "AbstractExplicitRK", "Tsit5", "Dopri5"]
