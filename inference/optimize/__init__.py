"""Optimisation: `fit` (Optax, many starts as one ensemble, mesh reuse) and
`fit_least_squares` (Optimistix Levenberg-Marquardt), on any problem of `problem`."""
