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


_KERNEL: dict[str, bool | None] = {"enabled": None}


def use_compiled_kernel(enable: bool = True) -> None:
    """Turn the compiled CPU replay kernel on (the default) or off.

    On CPU, `gradsolve.replay` (and so `gradsolve.solve`, fits and samplers) translates the
    vector field of an explicit Runge–Kutta solve into C++, compiles it once with the system
    compiler (cached on disk) and runs replay and its adjoint through ``jax.ffi``; it falls
    back to the XLA replay wherever that does not apply (GPU, stiff or Diffrax solvers,
    vector fields with loops or traced indexing, no compiler). Both give the same values
    and gradients to rounding; the kernel is several times faster. The environment
    variable ``GRADSOLVE_KERNEL=0`` has the effect of ``use_compiled_kernel(False)``.

    Args:
        enable: ``True`` to use the kernel where it applies, ``False`` for the XLA replay.

    Example:
        >>> gs.use_compiled_kernel(False)   # e.g. to compare against the XLA replay
    """
    _KERNEL["enabled"] = bool(enable)


def kernel_enabled() -> bool:
    """Whether the compiled replay kernel may be used (see `use_compiled_kernel`)."""
    import os

    if _KERNEL["enabled"] is not None:
        return _KERNEL["enabled"]
    return os.environ.get("GRADSOLVE_KERNEL", "1").lower() not in ("0", "false", "no", "off")
