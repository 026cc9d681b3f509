"""gradsolve: record an adaptive ODE solve, replay its mesh, differentiate it fast.

Public API (``import gradsolve as gs``): `record`, `replay`, `solve`, `MeshReuse` (a kept
mesh for loops), `Mesh`, `Solution`,
the solvers `Tsit5`, `Dopri5`, `Vern7`, `Rosenbrock23`, `Rodas5P`, the drivers
(``gs.drivers``: how a solve runs, passed as ``driver=``), dose schedules as data
(`DoseSchedule` of `Bolus`, `Infusion`, `SteadyState`, `Reset` or your own `AbstractDose`
records, passed as
``doses=``), `clear_caches` and `enable_x64`.
Importing this package never changes global JAX configuration.
"""

from . import drivers
from ._caches import clear_caches
from ._compilation_cache import ensure_compilation_cache, use_compilation_cache
from ._config import enable_x64, use_compiled_kernel
from ._controller import PIDController
from ._doses import AbstractDose, Bolus, DoseChange, DosedSolve, DoseSchedule, Infusion, Reset
from ._mesh import Mesh, Status
from ._record import record
from ._replay import replay
from ._reuse import MeshReuse, ReuseState
from ._sharding import ensemble_sharding, shard_ensemble
from ._solution import Solution
from ._solve import solve
from ._steady_state import SteadyState, steady_state
from ._solver import (
    AbstractExplicitRK,
    AbstractRosenbrock,
    AbstractSolver,
    ButcherTableau,
    Dopri5,
    Rodas5P,
    Rosenbrock23,
    Tsit5,
    Vern7,
)

__all__ = [
    "record",
    "replay",
    "solve",
    "MeshReuse",
    "ReuseState",
    "Mesh",
    "Solution",
    "Status",
    "PIDController",
    "DoseSchedule",
    "DoseChange",
    "AbstractDose",
    "Bolus",
    "Infusion",
    "Reset",
    "SteadyState",
    "DosedSolve",
    "steady_state",
    "AbstractSolver",
    "AbstractExplicitRK",
    "ButcherTableau",
    "Tsit5",
    "Dopri5",
    "Vern7",
    "Rosenbrock23",
    "Rodas5P",
    "AbstractRosenbrock",
    "enable_x64",
    "clear_caches",
    "drivers",
    "use_compiled_kernel",
    "use_compilation_cache",
    "ensure_compilation_cache",
    "ensemble_sharding",
    "shard_ensemble",
]
__version__ = "0.1.0"
