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
# # 04 · Stiff problems: Robertson's kinetics with `gs.Rodas5P`
#
# Robertson's reaction (`models.robertson()` in the zoo) has rate constants spanning nine
# orders of magnitude (`k1 = 0.04`, `k2 = 3e7`, `k3 = 1e4`). The fast reactions settle in
# microseconds, yet the interesting dynamics run to `t = 1e5`. An explicit solver must
# keep its step below the fastest time scale *for stability*, even long after that
# component has stopped changing; a linearly implicit (Rosenbrock) method like
# `gs.Rodas5P()` takes steps sized by accuracy alone.

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import gradsolve as gs

gs.enable_x64()
QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"


def robertson(t, y, k):
    r1 = k[0] * y[0]
    r2 = k[1] * y[1] ** 2
    r3 = k[2] * y[1] * y[2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


k = jnp.array([0.04, 3e7, 1e4])
y0 = jnp.array([1.0, 0.0, 0.0])  # one trajectory: y0 of shape (d,) (no ensemble axis)
ts = jnp.logspace(-5, 5, 40)     # log-spaced save times: the dynamics live on all scales

# %% [markdown]
# ## Solve with Rodas5P

# %%
sol = gs.solve(robertson, 0.0, 1e5, y0, k, ts=ts, solver=gs.Rodas5P(), rtol=1e-6, atol=1e-10)
print("accepted steps:", int(sol.stats["num_accepted_steps"]), " rejected:", int(sol.stats["num_rejected_steps"]))
print("y(1e5) =", np.asarray(sol.ys[-1]), " mass y1+y2+y3 - 1 =", float(jnp.sum(sol.ys[-1]) - 1))

fig, ax = plt.subplots(figsize=(7, 3.5))
for j, (name, scale) in enumerate([("y1", 1), ("y2 × 1e4", 1e4), ("y3", 1)]):
    ax.semilogx(ts, scale * sol.ys[:, j], "o-", ms=3, label=name)
ax.set_xlabel("t (log scale)"); ax.set_ylabel("concentration"); ax.legend()
ax.set_title("Robertson: ~100 steps cover 10 decades of time")
fig.tight_layout(); plt.show()

# %% [markdown]
# ## What goes wrong with an explicit solver
#
# `gs.Tsit5()` would need hundreds of thousands of tiny steps. We cap it at `max_steps`
# so it fails quickly. Outside `jit`, a failed solve raises a `RuntimeError` that says
# which trajectories failed, where, and why — here it detects that the step size is
# stability-limited and names the fix. (Inside `jit` there is no exception: check
# `mesh.status`; failed trajectories give NaNs.)

# %%
try:
    gs.solve(robertson, 0.0, 1e5, y0, k, ts=ts, solver=gs.Tsit5(), rtol=1e-6, atol=1e-10,
             max_steps=2000)
except RuntimeError as err:
    print("RuntimeError:", err)

# %% [markdown]
# ## Gradients with respect to the rate constants
#
# Rosenbrock steps differentiate like any other: the replay of the recorded mesh is a plain
# `lax.scan`, so `jax.grad` and `jax.jacfwd` work unchanged. Rates are best handled on a log
# scale. First a scalar gradient, checked against central finite differences:

# %%
def final_y3(logk):
    s = gs.solve(robertson, 0.0, 1e5, y0, jnp.exp(logk), ts=ts, solver=gs.Rodas5P(), rtol=1e-8, atol=1e-12)
    return s.ys[-1, 2]


logk = jnp.log(k)
g = jax.grad(final_y3)(logk)
eps = 1e-4
fd = np.array([(final_y3(logk.at[i].add(eps)) - final_y3(logk.at[i].add(-eps))) / (2 * eps) for i in range(3)])
print("d y3(1e5) / d log k   grad:", np.asarray(g))
print("                 finite diff:", fd)

# %% [markdown]
# Forward mode gives the full sensitivity curves `d y_j(t) / d log k_i` in one pass
# (3 parameters → 3 tangents, cheaper than 120 reverse passes):

# %%
def traj(logk):
    return gs.solve(robertson, 0.0, 1e5, y0, jnp.exp(logk), ts=ts, solver=gs.Rodas5P(), rtol=1e-6, atol=1e-10).ys


S = np.asarray(jax.jacfwd(traj)(logk))  # (40, 3 states, 3 params)
fig, axes = plt.subplots(1, 3, figsize=(11, 3), sharex=True)
for i, ax in enumerate(axes):
    for j in range(3):
        ax.semilogx(ts, S[:, j, i] / np.maximum(np.abs(np.asarray(sol.ys[:, j])), 1e-30), label=f"y{j + 1}")
    ax.set_title(f"relative sensitivity to log k{i + 1}"); ax.set_xlabel("t")
axes[0].legend(); fig.tight_layout(); plt.show()

# %% [markdown]
# Note the opposite signs for `k2` and `k3`: the long-time state depends mostly on their
# ratio, a classic identifiability issue when fitting such kinetics.
