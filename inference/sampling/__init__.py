"""Sampling: `sample` (NumPyro NUTS whose gradients replay a recorded mesh; its warmup
phases, chain state, metric and ADVI start), its ArviZ output and `predictive`."""
