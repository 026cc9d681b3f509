"""PEtab v1 problems (an SBML model and its tables) as gradsolve ensembles: `load_petab`."""

from ._problem import PetabProblem, Residuals, load_petab
from ._sbml import SbmlOdes, read_sbml

__all__ = ["PetabProblem", "Residuals", "load_petab", "SbmlOdes", "read_sbml"]
