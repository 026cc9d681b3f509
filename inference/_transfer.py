"""Host values onto the device without compiling.

``jnp.asarray`` of a NumPy array makes the same array, but JAX (0.10) does it with a
one-operation program compiled for each new shape and dtype; a fit or a sampler's set-up
meets many shapes, and on an accelerator each such compile costs tens of milliseconds of
its first call. ``jax.device_put`` transfers the data (same dtype after the x64 setting's
canonicalisation, uncommitted) and compiles nothing.
"""

from __future__ import annotations

import jax
import numpy as np


def to_device(x, dtype=None) -> jax.Array:
    """``x`` (NumPy, a scalar, or already a JAX array) as a JAX array on the default device;
    ``dtype``: converted on the host first."""
    if isinstance(x, jax.Array) and dtype is None:
        return x
    return jax.device_put(np.asarray(x, dtype=dtype))
