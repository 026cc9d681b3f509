"""models: ODE models as data, a model zoo, and embedded data sets.

``import models`` gives `ODEModel` (vector field, priors, initial state, noise model,
defaults; ``simulate``, ``predict``, ``log_prior``, ``log_likelihood``), `Dataset` and,
for many subjects with doses, `PopulationDataset`, with `load_dataset` / `list_datasets`
(files shipped in ``models/data``, no download), and one constructor per zoo model. ``models`` uses ``gradsolve`` to solve;
``gradsolve`` never imports ``models``. Importing this package changes no JAX config.
"""

from . import _zoo
from ._dataset import Dataset, list_datasets, load_dataset
from ._lynx_hare import lynx_hare
from ._model import ODEModel, prior_median
from ._population import PopulationDataset, Subject
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

__all__ = ["ODEModel", "Dataset", "PopulationDataset", "Subject", "load_dataset", "list_datasets", "prior_median", "ZOO", *ZOO]
