# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Large ensembles and sharding across devices
#
# > **Try it with several CPU devices:** run with
# > `XLA_FLAGS=--xla_force_host_platform_device_count=4 python tutorials/05_many_devices.py`
# > (the flag must be set before JAX starts). With one device everything below still runs;
# > the "sharded" solve then simply lives on that one device.
#
# gradsolve vectorises over the *ensemble axis* (the leading axis of `y0` and of every
# parameter leaf). Larger ensembles amortise fixed costs (dispatch, the adaptive loop's
# control flow) over more trajectories, until the hardware is saturated and the cost grows
# linearly. Past that point the next lever is more devices: trajectories are independent,
# so sharding the ensemble axis needs no communication inside the solve's arithmetic.

# %%
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import gradsolve as gs

gs.enable_x64()
QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
print("devices:", jax.devices())


def lv(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


ts = jnp.linspace(0.0, 10.0, 20)


def ensemble(n, seed=0):
    rng = np.random.default_rng(seed)
    p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((n, 4)) - 0.5)))
    return jnp.ones((n, 2)), p


# %% [markdown]
# ## Cost vs ensemble size
#
# We time a jitted loss-and-gradient of the whole ensemble. Each new `n` compiles once
# (excluded from the timing). Watch the time *per trajectory* fall as `n` grows.

# %%
def loss(y0, p):
    return jnp.sum(gs.solve(lv, 0.0, 10.0, y0, p, ts=ts, rtol=1e-6, atol=1e-8).ys ** 2)


vg = jax.jit(jax.value_and_grad(loss, argnums=1))
sizes = [8, 64] if QUICK else [16, 64, 256, 1024, 4096]
times = []
for n in sizes:
    y0, p = ensemble(n)
    jax.block_until_ready(vg(y0, p))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter(); jax.block_until_ready(vg(y0, p)); best = min(best, time.perf_counter() - t)
    times.append(best)
    print(f"n = {n:5d}: {1e3 * best:8.2f} ms total, {1e6 * best / n:8.1f} µs per trajectory")

fig, ax = plt.subplots(figsize=(5, 3))
ax.loglog(sizes, 1e3 * np.array(times), "o-", label="measured")
ax.loglog(sizes, 1e3 * times[-1] * np.array(sizes) / sizes[-1], "k--", label="linear in n")
ax.set_xlabel("ensemble size n"); ax.set_ylabel("value+grad time (ms)"); ax.legend()
fig.tight_layout(); plt.show()

# %% [markdown]
# ## Sharding the ensemble axis with `jax.sharding`
#
# Build a one-axis device mesh, put `y0` and the parameters on it split along the ensemble
# axis (`NamedSharding(mesh, P("ens"))`), and call a jitted solve. JAX's SPMD partitioner
# propagates the sharding through `gs.solve`; each device integrates its share. The
# ensemble size should be a multiple of the device count.
#
# Inside `jit` a failed trajectory does not raise: check `mesh.status` (0 = ok).

# %%
devices = np.array(jax.devices())
dmesh = Mesh(devices, ("ens",))
shard = NamedSharding(dmesh, P("ens"))

n = (16 if QUICK else 4096) * len(devices)
y0, p = ensemble(n, seed=1)
y0_s, p_s = jax.device_put(y0, shard), jax.device_put(p, shard)
print("p is split over", len(p_s.sharding.device_set), "device(s); shard shape", p_s.addressable_shards[0].data.shape)


@jax.jit
def solve_ys(y0, p):
    sol = gs.solve(lv, 0.0, 10.0, y0, p, ts=ts, rtol=1e-6, atol=1e-8)
    return sol.ys, sol.mesh.status


ys_s, status = solve_ys(y0_s, p_s)
ys_ref, _ = solve_ys(y0, p)  # the same solve, unsharded
print("output sharding:", ys_s.sharding)
print("all trajectories ok:", bool(jnp.all(status == 0)))
print("max |sharded - unsharded|:", float(jnp.max(jnp.abs(ys_s - ys_ref))))
assert np.allclose(np.asarray(ys_s), np.asarray(ys_ref), rtol=1e-10, atol=1e-12)

# %% [markdown]
# Gradients shard the same way: `jax.grad` of a loss of the sharded solve returns a
# gradient laid out like `p_s`.

# %%
g_s = vg(y0_s, p_s)[1]
print("gradient sharding:", g_s.sharding)
print("matches unsharded:", bool(np.allclose(np.asarray(g_s), np.asarray(vg(y0, p)[1]), rtol=1e-8)))
