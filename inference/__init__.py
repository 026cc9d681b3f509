"""Fitting and sampling ODE models with gradsolve.

- `log_density`, `numpyro_model`, `ParamSpace`: the unnormalised log posterior of a
  `models.ODEModel` given a `models.Dataset`, its NumPyro program, and the map to a flat
  unconstrained vector.
- `fit` of any problem (many starts as one ensemble; ``method=`` or ``optimizer=``: Optax
  with mesh reuse and re-recording on drift, the batched Levenberg–Marquardt, L-BFGS-B,
  BFGS, the global search), `fit_least_squares` (batched Levenberg–Marquardt, all starts
  one ensemble), `FitResult`; the optimiser objects are in `inference.optimize`
  (`AbstractOptimizer` and its subclasses).
- `sample`: NumPyro NUTS/HMC whose gradients come from replaying a recorded mesh;
  returns ``arviz.InferenceData``.
- `fit_population`, `PopulationFit`: population maximum likelihood, random effects
  integrated by the Laplace approximation (FOCE-I or Laplace), all subjects one ensemble;
  `profile_intervals`, `ProfileIntervals`: its likelihood-profile confidence intervals.
- `profile`, `ProfileResult`: profile likelihoods and likelihood-ratio intervals of any
  problem (an ODE model, a program, a population fit, a PEtab problem), one result type
  and one plot (``profiles/``).
- `vpc`, `VPC`, `plot_vpc`, `plot_dv_pred`, `plot_cwres`, `population_table`: a
  population fit's diagnostics (visual predictive check, DV against PRED/IPRED, CWRES) and
  its long-form table.
- `predictive`: posterior and prior predictive draws of a model or program, through its
  own solver, vectorised over draws.
- `ode`: an ODE solve as a site of any NumPyro program (``gs.solve`` under plain
  NumPyro; mesh-reusing under ``fit(program, data)`` and ``sample(program, data)``), and
  `population_program`, the program of a many-subject `models.PopulationModel`.
- `MeshPolicy`: the one rule by which fits and samplers record, reuse and re-record
  meshes; `InferenceModel`: what a model must provide (`models.ODEModel` does);
  `AbstractProblem`: what fitters, samplers and profiles ask of a problem (an ODE model's,
  a program's, a PEtab problem's and a population model's problems implement it).
- A `models.PetabProblem` carries its data, bounds and priors: ``fit(problem,
  n_starts=...)`` is a multistart fit (Latin hypercube starts, all starts one ensemble,
  the batched bounded Levenberg–Marquardt of ``optimize/_lm.py``) and ``sample(problem)``
  NUTS on its log-likelihood and priors; ``petab/`` only turns its tables into a problem.

Default ODE tolerances: `TOLERANCES`, the one place every function takes them from (its
docstring says which pair applies where, and why).

How a fit runs, file by file: `fit` (``optimize/_fit.py``) validates, builds the problem
(``problem/_program.py``'s ``problem_of``: `problem_for`'s, or the problem of a kind an
importer registered, a PEtab problem's by ``petab/``), draws the starts
(``problem/_starts.py``) and hands them to an optimiser object's ``minimize``; the default
for a model or a program is `inference.optimize.Optax` (``optimize/_optax.py``), which
builds a `FitState` and advances it with `FitKernel.step`; each step evaluates
`Problem.log_density` (``problem/_problem.py``), which calls ``gs.replay`` on the recorded
mesh; `MeshPolicy` (``problem/_policy.py``) decides the re-records, which call
``gs.record`` through `Problem.record`. A NumPyro program with `ode` sites (or a population model, through
`population_program`) runs the same way through `ProgramProblem` (``problem/_program.py``): its
latent sites are the parameters, its ode sites' meshes are recorded and replayed by the
handlers of ``problem/_ode.py``, and one start or chain is a whole ensemble of subjects. Sampling
has the same shape: ``sampling/_sample.py`` (the
front and the sampling phase), ``sampling/_warmup.py`` (the named warmup phases, each advancing
``(SampleState, SampleInfo)``), ``sampling/_chains.py`` (the NumPyro kernel, the `SampleState` its
next step needs and the `SampleInfo` the run reports), ``sampling/_idata.py``.

The folders are the roles, each using only those listed before it: the shared
``_checkpoint``, ``_progress`` and ``_result``; ``problem/`` (the posterior, its space,
meshes and `MeshPolicy`); ``petab/``; ``optimize/``; ``sampling/``; ``population/``; ``profiles/``.

Importing this package changes no JAX configuration (use float64 for accuracy work:
``jax.config.update("jax_enable_x64", True)`` or ``gradsolve.enable_x64()``).
"""

from .problem._baseline import diffrax_numpyro_model
from .sampling._chains import SampleInfo, SampleState
from .problem._density import log_density, numpyro_model
from .population._diagnostics import VPC, plot_cwres, plot_dv_pred, plot_vpc, population_table, vpc
from .problem._abstract import AbstractProblem
from .optimize._fit import FitState, fit
from .optimize._least_squares import fit_least_squares
from .problem._ode import ode
from .problem._policy import MeshPolicy
from .population._population_fit import PopulationFit, fit_population
from .profiles._intervals import ProfileIntervals, profile_intervals
from .profiles._profile import profile
from .profiles._result import ProfileResult
from .sampling._predictive import predictive
from .problem._problem import TOLERANCES as _TOLERANCES
from .problem._problem import InferenceModel
from .problem._program import population_program
from ._result import FitResult
from .sampling._sample import sample
from .problem._space import ParamSpace
from . import petab  # noqa: F401  (a PEtab problem reaches every method through problem_of)

TOLERANCES = _TOLERANCES
"""The default ODE tolerances of every function of `inference`, in this one place:

- ``rtol = 1e-6``, ``atol = 1e-8``: `fit`, `fit_least_squares`, `sample`, `profile`,
  `log_density`, `predictive` and `diffrax_numpyro_model` of an ODE model or a program
  (``rtol`` that of ``gs.solve``; ``atol`` that of the Diffrax baseline the samplers are
  checked against).
- ``population_rtol = 1e-8``, ``population_atol = 1e-10``: `fit_population`,
  `profile_intervals` and `profile` of a population fit (the outer optimiser
  differentiates an objective that holds each subject's Hessian, so it needs more digits).
- A PEtab problem solves at its own settings (`models.load_petab`'s ``rtol``/``atol``)
  unless given others; `models.ODEModel.solve` and ``simulate`` default to 1e-8 / 1e-10,
  so that synthetic data do not carry a fit's own discretisation error.

Example:
    >>> inference.fit(model, data, rtol=inference.TOLERANCES.rtol / 10)
"""

__all__ = [
    "log_density",
    "numpyro_model",
    "ParamSpace",
    "fit",
    "FitResult",
    "FitState",
    "fit_least_squares",
    "sample",
    "SampleInfo",
    "SampleState",
    "MeshPolicy",
    "InferenceModel",
    "AbstractProblem",
    "TOLERANCES",
    "diffrax_numpyro_model",
    "ode",
    "population_program",
    "predictive",
    "fit_population",
    "PopulationFit",
    "profile_intervals",
    "ProfileIntervals",
    "profile",
    "ProfileResult",
    "vpc",
    "VPC",
    "plot_vpc",
    "plot_dv_pred",
    "plot_cwres",
    "population_table",
]
