"""Optimisation: `fit` (Optax, many starts as one ensemble, mesh reuse) and
`fit_least_squares` (the batched Levenberg–Marquardt of `optimize/_lm.py`, all starts one ensemble), on any problem of `problem`."""
