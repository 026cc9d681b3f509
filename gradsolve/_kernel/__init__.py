"""Compiled CPU kernels: the vector field translated to C++, run through ``jax.ffi``.

`kernel_replay` (replay and its discrete adjoint) and `kernel_record` (the adaptive
record) share one generated source per vector field, solver and dtype.
"""

from .record import kernel_record
from .replay import kernel_replay, kernel_target

__all__ = ["kernel_record", "kernel_replay", "kernel_target"]
