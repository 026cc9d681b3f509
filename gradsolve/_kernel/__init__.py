"""Compiled CPU replay kernel: the vector field translated to C++, run through ``jax.ffi``."""

from .replay import kernel_replay, kernel_target

__all__ = ["kernel_replay", "kernel_target"]
