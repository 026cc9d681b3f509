"""Fitting and sampling ODE models with gradsolve (see SPEC §4).

- `log_density`, `numpyro_model`, `ParamSpace`: the unnormalised log
  posterior of an `models.ODEModel` given a `models.Dataset`, its NumPyro
  program, and the map to a flat unconstrained vector.
- `fit` (Optax, many starts as one ensemble, mesh reuse with re-recording on drift),
  `fit_least_squares` (Optimistix Levenberg–Marquardt), `FitResult`.
- `sample`: NumPyro NUTS/HMC whose gradients come from replaying a recorded mesh;
  returns ``arviz.InferenceData``.

Importing this package changes no JAX configuration (use float64 for accuracy work:
``jax.config.update("jax_enable_x64", True)`` or ``gradsolve.enable_x64()``).
"""

from ._baseline import diffrax_numpyro_model
from ._density import ParamSpace, log_density, numpyro_model
from ._fit import FitResult, fit, fit_least_squares
from ._sample import sample

__all__ = [
    "log_density",
    "numpyro_model",
    "ParamSpace",
    "fit",
    "FitResult",
    "fit_least_squares",
    "sample",
    "diffrax_numpyro_model",
]

