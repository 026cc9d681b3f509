"""Optimisation: `fit` (every problem, every optimiser), `fit_least_squares`, and the
optimiser objects `fit(problem, optimizer=...)` takes, each over the problem interface
(`inference.AbstractProblem`) through one method, `AbstractOptimizer.minimize`:

- `Optax`: Optax's gradient methods, all starts one ensemble, mesh reuse (``_optax.py``);
- `LevenbergMarquardt`: the batched bounded Levenberg–Marquardt on residuals (``_lm.py``);
- `LBFGSB`, `BFGS`: SciPy's, one start after another (``_scipy.py``);
- `GlobalSearch`: CMA-ES restarts with local polishes (``_global.py``).

``method=`` names map to them in one table (``_methods.py``).
"""

from ._global import GlobalSearch
from ._lm import LevenbergMarquardt
from ._optax import Optax
from ._optimizer import AbstractOptimizer, OptimizeResult
from ._scipy import BFGS, LBFGSB

__all__ = ["AbstractOptimizer", "OptimizeResult", "Optax", "LevenbergMarquardt", "LBFGSB",
           "BFGS", "GlobalSearch"]
