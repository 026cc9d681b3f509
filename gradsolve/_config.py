"""Opt-in global configuration. Importing gradsolve never calls this."""

from __future__ import annotations

import os

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


class _KernelSetting:
    """Returned by `use_compiled_kernel`: as a context manager, restores the old setting."""

    def __init__(self, previous: bool | None):
        self._previous = previous

    def __enter__(self) -> "_KernelSetting":
        return self

    def __exit__(self, *exc) -> None:
        _KERNEL["enabled"] = self._previous


def use_compiled_kernel(enable: bool = True) -> _KernelSetting:
    """Turn the compiled CPU kernel on (the default) or off.

    On CPU, `gradsolve.record` and `gradsolve.replay` (and so `gradsolve.solve`, fits and
    samplers) translate the vector field of an explicit Runge–Kutta solve into C++, compile
    it once with the system compiler (cached on disk) and run the record, the replay and its
    adjoint through ``jax.ffi``; they fall back to the XLA driver wherever that does not
    apply (GPU, stiff or Diffrax solvers, vector fields with loops or traced indexing, no
    compiler). Both give the same values and gradients to rounding; the kernel is several
    times faster. The environment variable ``GRADSOLVE_KERNEL=0`` has the effect of
    ``use_compiled_kernel(False)``. The setting is read when a function is traced.

    Args:
        enable: ``True`` to use the kernel where it applies, ``False`` for the XLA driver.

    Returns:
        A context manager: the setting applies at once, and leaving a ``with`` block
        restores the previous one.

    Example:
        >>> gs.use_compiled_kernel(False)          # from now on
        >>> with gs.use_compiled_kernel(False):    # or only inside the block
        ...     sol = gs.replay(f, mesh, y0, p)
    """
    previous = _KERNEL["enabled"]
    _KERNEL["enabled"] = bool(enable)
    return _KernelSetting(previous)


def kernel_enabled() -> bool:
    """Whether the compiled replay kernel may be used (see `use_compiled_kernel`)."""
    if _KERNEL["enabled"] is not None:
        return _KERNEL["enabled"]
    return _env_flag("GRADSOLVE_KERNEL")


def lanes_enabled() -> bool:
    """Whether explicit Runge–Kutta replays off the compiled kernel use the lanes replay
    (`gradsolve._lanes`); ``GRADSOLVE_LANES=0`` selects the batched XLA replay instead
    (same values and gradients to rounding; for comparison and debugging)."""
    return _env_flag("GRADSOLVE_LANES")


def _env_flag(name: str) -> bool:
    """An on-by-default switch: off when the variable is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(name, "1").lower() not in ("0", "false", "no", "off")
