"""PEtab problems (`models.PetabProblem`) as problems of `inference.AbstractProblem`: what
the tables mean (the parameter table's scales, bounds and priors, the Latin hypercube
starts, hierarchical optimisation's inner parameters), and nothing generic. Fits, profiles
and samplers run on them as on every other problem (``petab/_problem.py``:
`PetabFitProblem` for fits and profiles, `PetabProgramProblem` for sampling)."""

from . import _problem  # noqa: F401  (registers PEtab problems with `problem_of`)
