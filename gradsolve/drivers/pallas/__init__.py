"""The Pallas driver: record, replay and adjoint as fused Pallas kernels on a TPU.

- `_layout`: trajectories on sublanes and lanes, ``(rows, 128)`` blocks.
- `_field`: the vector field evaluated entry by entry over blocks; what Mosaic lowers.
- `_rosenbrock`: Rosenbrock steps on blocks (the Jacobian, an unrolled pivoting LU).
- `_replay`: the forward replay and its exact discrete adjoint, two kernels.
- `_events`: known-time events (jumps, tstops) in those kernels.
- `_record`: the adaptive record, one kernel with a per-lane masked step loop.
- `_fold`: under ``jax.vmap``, the mapped calls folded into one ensemble.
- `driver`: the `Pallas` driver that runs them.
"""

from .driver import Pallas

__all__ = ["Pallas"]
