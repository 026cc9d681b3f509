"""PEtab problems (`models.PetabProblem`): their multistart fit (Latin hypercube starts,
a batched bounded Levenberg-Marquardt) and their NUTS sampling."""
