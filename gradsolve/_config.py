"""Configuration: the environment read once (`SETTINGS`), and opt-in switches.

Importing gradsolve reads its environment variables once and validates them; nothing reads
the environment afterwards, and importing never changes JAX's configuration.
"""

from __future__ import annotations

import os
from typing import NamedTuple

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


class Settings(NamedTuple):
    """The environment's settings, read once when gradsolve is imported and validated.

    Attributes:
        kernel: ``GRADSOLVE_KERNEL`` (default on; ``0``/``false``/``no``/``off``): whether
            `gradsolve.drivers.Auto` may pick the compiled CPU kernel.
        kernel_cache: ``GRADSOLVE_KERNEL_CACHE``: where compiled kernels are kept (``None``:
            ``~/.cache/gradsolve/kernels``, else a folder in the temp directory).
        kernel_cache_mb: ``GRADSOLVE_KERNEL_CACHE_MB`` (default 1024): the size above which
            the least recently used kernels are deleted.
        cxx: ``CXX``: the C++ compiler to try first (then ``g++``, ``c++``, ``clang++``).
        kernel_build_timeout: ``GRADSOLVE_KERNEL_BUILD_TIMEOUT`` (default 300): seconds a
            compiler process may run before the build is abandoned for the XLA drivers.
        kernel_max_source_mb: ``GRADSOLVE_KERNEL_MAX_SOURCE_MB`` (default 5): the size of
            generated C++ above which no kernel is built: about what the compiler can build
            within ``kernel_build_timeout`` on 2 cores (a 4-32-32-4 MLP field generates
            5.5 MB, whose adjoint took 236 s and 1.7 GB). Scalar-arithmetic fields (SBML
            models with dozens of species) reach 2-5 MB and gain most: a 75-species one
            (3.2 MB) built in 162 s in the background and then ran its objective+gradient
            in 55 ms against 3.4 s on the XLA drivers, whose compile took 700 s.
        kernel_background_s: ``GRADSOLVE_KERNEL_BACKGROUND_S`` (default 20; ``inf``:
            never): `gradsolve.drivers.Auto` compiles a kernel whose build is estimated to
            take longer than this many seconds in the background and runs the XLA drivers
            until it is ready (`gradsolve.drivers.Auto`). 20 s is about 1 MB of generated
            C++ (an MLP field with 32 hidden units); Lotka–Volterra (6 s) and Lorenz-96 with
            up to 64 states (18 s) still build before the first call returns, as an
            explicit ``gs.drivers.Kernel()`` always does.
        xla_cache: ``GRADSOLVE_XLA_CACHE``: where fits and samplers keep compiled XLA
            programs (JAX's persistent compilation cache; ``None``: ``~/.cache/gradsolve/xla``;
            ``0``/``false``/``no``/``off``: not at all, see `use_compilation_cache`).
    """

    kernel: bool
    kernel_cache: str | None
    kernel_cache_mb: float
    cxx: str | None
    kernel_build_timeout: float
    kernel_max_source_mb: float
    kernel_background_s: float
    xla_cache: str | None


def _flag(name: str, default: bool = True) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    low = value.lower()
    if low in ("0", "false", "no", "off"):
        return False
    if low in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"gradsolve: ${name} must be 0/1 (or false/true, no/yes, off/on), "
                     f"got {value!r}.")


def _positive(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        out = float(value)
    except ValueError:
        out = -1.0
    if not out > 0:
        raise ValueError(f"gradsolve: ${name} must be a positive number, got {value!r}.")
    return out


def read_settings() -> Settings:
    """`Settings` from the environment now (gradsolve reads them once, at import)."""
    return Settings(
        kernel=_flag("GRADSOLVE_KERNEL"),
        kernel_cache=os.environ.get("GRADSOLVE_KERNEL_CACHE") or None,
        kernel_cache_mb=_positive("GRADSOLVE_KERNEL_CACHE_MB", 1024.0),
        cxx=os.environ.get("CXX") or None,
        kernel_build_timeout=_positive("GRADSOLVE_KERNEL_BUILD_TIMEOUT", 300.0),
        kernel_max_source_mb=_positive("GRADSOLVE_KERNEL_MAX_SOURCE_MB", 5.0),
        kernel_background_s=_positive("GRADSOLVE_KERNEL_BACKGROUND_S", 20.0),
        xla_cache=os.environ.get("GRADSOLVE_XLA_CACHE") or None,
    )


SETTINGS = read_settings()

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
    adjoint through ``jax.ffi``; they fall back to the XLA drivers wherever that does not
    apply (GPU, stiff or Diffrax solvers, vector fields with loops or traced indexing, no
    compiler). Both give the same values and gradients to rounding; the kernel is several
    times faster. The environment variable ``GRADSOLVE_KERNEL=0`` (read at import) has the
    effect of ``use_compiled_kernel(False)``. The setting is read when a function is
    traced, by the default driver `gradsolve.drivers.Auto`; an explicit
    ``driver=gs.drivers.Kernel()`` runs the kernel regardless.

    Args:
        enable: ``True`` to use the kernel where it applies, ``False`` for the XLA drivers.

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
    """Whether the default driver may use the compiled kernel (see `use_compiled_kernel`)."""
    if _KERNEL["enabled"] is not None:
        return _KERNEL["enabled"]
    return SETTINGS.kernel
