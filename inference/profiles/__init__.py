"""Profile likelihoods for every problem: `profile` (the walks as one ensemble, re-optimised
by the batched Levenberg–Marquardt or L-BFGS-B), its one result type `ProfileResult` and
plot, and `profile_intervals`, a population fit's intervals in NONMEM's terms."""
