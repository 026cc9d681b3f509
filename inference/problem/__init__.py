"""The posterior a method works on: an ODE model and its data (`Problem`) or a NumPyro
program with `ode` sites (`ProgramProblem`), behind `AbstractProblem`; its flat
unconstrained parameter space, its log density, its meshes and the one rule
(`MeshPolicy`) by which every method records, reuses and re-records them."""
