"""The ensemble axis shards over devices with unchanged results (4 host CPU devices)."""

import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

import gradsolve as gs

CODE = r"""
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import gradsolve as gs
assert len(jax.devices()) == 4
f = lambda t, y, p: jnp.stack([p[0]*y[0] - p[1]*y[0]*y[1], -p[2]*y[1] + p[3]*y[0]*y[1]])
n = 256  # 64 a device: the kernel splits a call only from SPREAD_MIN a device
p = jnp.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * jnp.linspace(-1, 1, n)[:, None])
y0 = jnp.ones((n, 2)); ts = jnp.linspace(0.0, 5.0, 6)
solve = jax.jit(lambda a, b: gs.solve(f, 0.0, 5.0, a, b, ts=ts).ys)
grad = jax.jit(jax.grad(lambda b, a: jnp.sum(gs.solve(f, 0.0, 5.0, a, b, ts=ts).ys ** 2)))
ref, gref = solve(y0, p), grad(p, y0)
ys_, ps_ = gs.shard_ensemble((y0, p))
assert len(ps_.sharding.device_set) == 4
out, gout = solve(ys_, ps_), grad(ps_, ys_)
assert len(out.sharding.device_set) == 4 and len(gout.sharding.device_set) == 4
np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-14)
np.testing.assert_allclose(gout, gref, rtol=1e-12)
from gradsolve._config import kernel_enabled
from gradsolve.drivers.kernel import kernel_target
if kernel_enabled() and kernel_target(f, gs.Tsit5(), y0, p).prefix is not None:
    # The compiled kernel runs on each device's share (shard_map): no gathering.
    assert gs.solve(f, 0.0, 5.0, ys_, ps_, ts=ts).route == "gradsolve-kernel"
    assert "all-gather" not in grad.lower(ps_, ys_).compile().as_text()
mesh = gs.record(f, 0.0, 5.0, ys_, ps_, ts=ts)
np.testing.assert_allclose(gs.replay(f, mesh, ys_, ps_).ys, ref, rtol=1e-12, atol=1e-14)
moved = jax.jit(lambda a, b, s: gs.replay(f, mesh, a, b, ts=s).ys)(ys_, ps_, jnp.asarray(mesh.ts))
np.testing.assert_allclose(moved, ref, rtol=1e-12, atol=1e-14)
print("OK")
"""


@pytest.mark.parametrize("kernel", ["1", "0"], ids=["kernel", "lanes"])
def test_sharded_ensemble_matches_single_device(kernel):
    """The compiled kernel (shard_map) and, with it off, the lanes replay."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               GRADSOLVE_KERNEL=kernel)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")


def test_shard_ensemble_rejects_bad_shapes():
    with pytest.raises(ValueError, match="same leading ensemble axis"):
        gs.shard_ensemble((jnp.ones((4, 2)), jnp.ones((3, 4))))
    with pytest.raises(ValueError, match="`devices` is empty"):
        gs.ensemble_sharding([])


def test_the_drivers_follow_the_default_device(monkeypatch):
    """On an accelerator's machine, ``jax.default_device(cpu)`` runs a solve on the host:
    the drivers choose by that device's platform, so Auto passes over the chip's Pallas
    kernels there (it tried them, and failed to lower them on the CPU, before). The chip
    is imitated by the default backend's name."""
    import jax

    from gradsolve._sharding import platform

    f = lambda t, y, p: -p * y
    y0, p = jnp.ones((4, 1), jnp.float32), jnp.ones(4, jnp.float32)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert platform() == "tpu"
    assert isinstance(gs.drivers.Auto().choose("replay", f, gs.Tsit5(), y0, p),
                      gs.drivers.Pallas)
    with jax.default_device(jax.devices("cpu")[0]):
        assert platform() == "cpu"
        assert not isinstance(gs.drivers.Auto().choose("replay", f, gs.Tsit5(), y0, p),
                              gs.drivers.Pallas)
