"""Sampling: `sample` (NumPyro NUTS whose gradients replay a recorded mesh; its warmup
phases, chain state, metric and ADVI start), the sampler objects it runs (`NUTS`, `HMC`,
`ChEES`: BlackJAX's ChEES-HMC with its chains in lockstep on one ensemble), its ArviZ
output and `predictive`."""

from ._samplers import HMC, NUTS, ChEES, Sampler

__all__ = ["Sampler", "NUTS", "HMC", "ChEES"]
