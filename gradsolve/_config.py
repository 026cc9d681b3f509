"""Opt-in global configuration. Importing gradsolve never calls this."""

from __future__ import annotations

import jax


def enable_x64(enable: bool = True) -> None:
    """Switch JAX to 64-bit floats (``jax_enable_x64``), the documented default for accuracy work.

    gradsolve itself works in whatever precision its inputs have; float32 solves are fine
    for tolerances above ~1e-5. Call this once at program start, before creating arrays.

    Args:
        enable: ``True`` (default) switches 64-bit floats on, ``False`` back off.

    Example:
        >>> import gradsolve as gs
        >>> gs.enable_x64()
    """
    jax.config.update("jax_enable_x64", bool(enable))
