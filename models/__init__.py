"""models: ODE models as data, a model zoo, and embedded data sets.

``import models`` gives `ODEModel` (vector field, priors, initial state, noise model,
defaults; ``simulate``, ``predict``, ``log_prior``, ``log_likelihood``), `Dataset` and,
for many subjects with doses, `PopulationDataset` and `PopulationModel` (``theophylline``, ``two_compartment_oral``,
``simulated_study``), with `load_dataset` / `list_datasets`
(files shipped in ``models/data``, no download), and one constructor per zoo model. ``models`` uses ``gradsolve`` to solve;
``gradsolve`` never imports ``models``. Importing this package changes no JAX config.
"""

from typing import TYPE_CHECKING

from . import _pk_population, _zoo
from ._data import list_datasets, load_dataset
from ._dataset import Dataset
from ._lynx_hare import lynx_hare
from ._model import ODEModel, prior_median
from ._pk_population import (
    simulated_study,
    theophylline,
    theophylline_closed_form,
    two_compartment_oral,
)
from ._population import PopulationDataset, Subject
from ._population_model import PopulationModel

if TYPE_CHECKING:  # imported on first use (below); named here for readers and API docs
    from ._petab import PetabProblem, load_petab
from ._zoo import (
    brusselator,
    fitzhugh_nagumo,
    hires,
    lorenz,
    lorenz96,
    lotka_volterra,
    one_compartment_pk,
    pendulum,
    robertson,
    seir,
    sir,
    van_der_pol,
)

ZOO = tuple(_zoo.__all__) + ("lynx_hare",)
"""Names of the zoo constructors (each ``models.<name>()`` returns an `ODEModel`)."""

TWO_COMPARTMENT_TRUTH = _pk_population.TWO_COMPARTMENT_TRUTH
"""The population values `simulated_study` draws from (``lKa`` = log 1/h, ``lCl`` = log 5
L/h at 70 kg, ``lV1`` = log 50 L, ``lQ`` = log 10 L/h, ``lV2`` = log 100 L, ``omega`` = (0.3,
0.25, 0.2), ``sigma_add`` = 0.05 mg/L, ``sigma_prop`` = 0.1)."""

POPULATION_ZOO = ("theophylline", "two_compartment_oral")
"""Names of the population model constructors (each returns a `PopulationModel`)."""

__all__ = ["ODEModel", "Dataset", "PopulationDataset", "Subject", "PopulationModel",
           "load_dataset", "list_datasets", "load_petab", "PetabProblem", "prior_median",
           "theophylline_closed_form",
           "simulated_study", "TWO_COMPARTMENT_TRUTH", "ZOO", "POPULATION_ZOO", *ZOO,
           *POPULATION_ZOO]


def __getattr__(name):
    # The PEtab importer needs the optional extra ``petab`` (petab, libsbml, sbmlmath, sympy):
    # imported on first use, so ``import models`` works without it.
    if name in ("load_petab", "PetabProblem"):
        from . import _petab

        return getattr(_petab, name)
    raise AttributeError(f"module 'models' has no attribute '{name}'")
