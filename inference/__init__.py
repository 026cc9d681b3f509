"""Fitting and sampling ODE models with gradsolve (see SPEC §4)."""
