"""Spreading an ensemble over devices (``jax.sharding``).

The ensemble axis is embarrassingly parallel, so sharding is data placement: put ``y0``
and every ``params`` leaf on a 1-D device mesh split along the leading (ensemble) axis, and
the jitted record/replay runs each device's trajectories where they live: the XLA drivers
through GSPMD (only the loop's "all done?" test and the step counts cross devices), the
compiled CPU kernel through ``shard_map`` over the same mesh. Multi-host: call
``jax.distributed.initialize()`` on every host first; ``jax.devices()`` then spans all hosts
and the same call shards over them.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh as DeviceMesh
from jax.sharding import NamedSharding, PartitionSpec


def platform() -> str:
    """The platform the next computation runs on: that of ``jax.default_device`` where one
    is set (``with jax.default_device(jax.devices("cpu")[0]):`` on a TPU machine runs on
    its CPU), else ``jax.default_backend()``. The drivers choose by it, so a solve asked
    for on the host of an accelerator takes the host's kernel, not the chip's."""
    d = jax.config.jax_default_device
    if d is None:
        return jax.default_backend()
    return d if isinstance(d, str) else d.platform


def ensemble_sharding(devices=None) -> NamedSharding:
    """A ``NamedSharding`` that splits axis 0 (the ensemble) over ``devices``.

    Args:
        devices: a sequence of devices; default ``jax.devices()`` (all hosts' devices
            after ``jax.distributed.initialize()``).

    Example:
        >>> s = gs.ensemble_sharding()
        >>> y0 = jax.device_put(y0, s)
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("ensemble_sharding: `devices` is empty.")
    return NamedSharding(DeviceMesh(np.array(devices), ("ensemble",)), PartitionSpec("ensemble"))


def shard_ensemble(tree, devices=None):
    """Place every leaf of ``tree`` (e.g. ``(y0, params)``) split along its leading axis.

    Every leaf needs the same leading size ``n``, divisible by the number of devices.
    gradsolve's functions then run sharded with unchanged results.

    Args:
        tree: pytree of arrays with leading ensemble axis ``n``.
        devices: as in `ensemble_sharding`.

    Returns:
        The same pytree, sharded.

    Example:
        >>> y0, p = gs.shard_ensemble((y0, p))
        >>> sol = jax.jit(lambda a, b: gs.solve(f, 0.0, 1.0, a, b))(y0, p)
    """
    sharding = ensemble_sharding(devices)
    n_dev = sharding.mesh.devices.size
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    sizes = {np.shape(x)[0] if np.ndim(x) else None for _, x in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "shard_ensemble: every leaf of `tree` needs the same leading ensemble axis; got "
            f"leading sizes {sorted(map(str, sizes))}."
        )
    (n,) = sizes
    if n % n_dev:
        raise ValueError(
            f"shard_ensemble: ensemble size {n} is not divisible by the {n_dev} devices; pad "
            "the ensemble (e.g. repeat a trajectory) or pass fewer `devices`."
        )
    return jax.device_put(tree, sharding)


def device(x):
    """A NumPy array (or scalar) as a JAX array on the default device, by a transfer alone.

    ``jnp.asarray`` of a NumPy array is the same array, but JAX (0.10) makes it with a
    one-operation program compiled for each new shape and dtype; a mesh's leaves take many
    shapes, and on an accelerator each such compile costs tens of milliseconds on a first
    call. ``jax.device_put`` gives the same dtype (canonicalised to the x64 setting), the
    same weak type and an uncommitted array, without compiling. Anything else is
    returned as it is.
    """
    if isinstance(x, (np.ndarray, np.generic)):
        return jax.device_put(x)
    return x


def host(x) -> np.ndarray:
    """``x`` as a NumPy array, for the host-side logic of eager calls (status checks, mesh
    trimming, error messages).

    An array spread over several processes (an ensemble sharded over hosts after
    ``jax.distributed.initialize()``) is not fully addressable, so ``np.asarray`` cannot
    read it; it is gathered from every process first. That gather is a collective: every
    process must reach this call, as it does when all processes run the same program on
    the same global arrays (the multi-controller model), and all then see the same values
    and take the same decisions.
    """
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
