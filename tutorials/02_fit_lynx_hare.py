# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Fitting the lynx–hare data (many starts, one ensemble)
#
# The Hudson's Bay Company pelt counts (1900–1920) and Carpenter's Stan Lotka–Volterra
# model ship with gradsolve (`models.lynx_hare()`, `models.load_dataset("lynx_hare")`).
# `inference.fit` finds the MAP estimate with Optax from many random starts.
#
# **Why many starts are cheap here:** the starts are one *ensemble*. One `gs.record` call
# solves all of them, and every optimisation step differentiates a `gs.replay` of that
# mesh. The ensemble is recorded again only when some start's parameters drift or the
# replay's error estimate says its mesh no longer holds, and then every start at once,
# inside the compiled loop (one ensemble record costs about what a record of a few
# starts does, and the mesh never leaves the device) — so the number of adaptive solves
# (`n_records`) is far below the number of gradient evaluations (`n_grad_evals`).

# %%
import os

import jax
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

import gradsolve as gs

gs.enable_x64()

import inference
import models

QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
n_starts, steps = (8, 200) if QUICK else (64, 1000)

model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
print(model.param_shapes)
print("data:", data.ts.shape, data.ys.shape, data.names)

# %% [markdown]
# ## Fit
#
# Starts are drawn from the priors; the objective is the negative log posterior
# (`objective="map"`), optimised in an unconstrained space (positive parameters via logs).

# %%
fit = inference.fit(model, data, n_starts=n_starts, steps=steps, seed=0, progress=False)
print(fit)
for k, v in fit.params.items():
    print(f"  {k:<7} {np.array2string(np.asarray(v), precision=4)}")

# %% [markdown]
# ## Mesh reuse made visible
#
# Each of the `n_grad_evals` steps evaluated the loss and gradient of all starts at once;
# only `n_records` times was the ensemble re-recorded (`n_records_per_start` counts per
# start). Early on the parameters move fast and re-records are frequent; near the optimum
# the mesh stays valid for many steps.

# %%
print(f"gradient evaluations: {fit.n_grad_evals},  ensemble re-records: {fit.n_records}")
print("re-records per start:", np.asarray(fit.n_records_per_start))
print("largest replay error_ratio per start:", np.round(np.asarray(fit.max_error_ratio), 2))

# %%
hist = np.asarray(fit.loss_history)  # (steps, n_starts)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(hist, color="0.6", lw=0.7, alpha=0.6)  # every start, grey
ax.plot(hist[:, fit.best_index], color="k", lw=2.5, label="best start")
ax.plot([], color="0.6", lw=0.7, label="other starts")
ax.set_yscale("symlog")
ax.set_xlabel("optimisation step"); ax.set_ylabel("negative log posterior")
ax.set_title(f"Loss history of {hist.shape[1]} starts"); ax.legend()
fig.tight_layout(); plt.show()

# %% [markdown]
# Starts that land in a poor basin stay there — that is why we run many of them, and why
# it matters that they cost one ensemble solve rather than `n_starts` separate ones.
#
# ## Fit vs data

# %%
tt = np.linspace(0.0, float(np.max(data.ts)), 200)
pred = np.asarray(model.predict(fit.params, tt))
fig, ax = plt.subplots(figsize=(7, 3.5))
for j, (name, c) in enumerate(zip(model.observed_names, ["C0", "C1"])):
    ax.plot(1900 + tt, pred[:, j], color=c, label=f"{name} (MAP fit)")
    ax.plot(1900 + np.asarray(data.ts), np.asarray(data.ys)[:, j], "o", color=c, label=f"{name} (data)")
ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole years
ax.set_xlabel("year"); ax.set_ylabel("pelts (thousands)"); ax.legend(ncol=2)
ax.set_title("Lynx–hare: best MAP fit")
fig.tight_layout(); plt.show()

# %% [markdown]
# ## Your own Optax loop: `gs.MeshReuse`
#
# `inference.fit` is one such loop, written for you. To write your own (another loss, a
# schedule, a callback) and keep the mesh reuse, carry a `gs.MeshReuse` state next to the
# optimiser's: each call replays the kept mesh and re-records, inside `jit`, only the starts
# whose parameters drifted more than `drift_tol` (10 %) from where their mesh was recorded
# or whose replay error estimate exceeded the tolerance. Here: least squares on the log
# pelts, an ensemble of starts around Carpenter's estimates, Adam on the log parameters
# (rates and initial populations).

# %%
import jax.numpy as jnp
import optax

ts_obs, log_obs = jnp.asarray(data.ts), jnp.log(jnp.asarray(data.ys))
guess = jnp.log(jnp.array([0.55, 0.028, 0.8, 0.024, 33.9, 5.9]))
u0 = guess + 0.2 * jax.random.normal(jax.random.PRNGKey(1), (n_starts, 6))  # one row a start


def unpack(u):
    """Log parameters (n, 6) -> y0 (n, 2) and the model's params."""
    return jnp.exp(u[:, 4:]), {"theta": jnp.exp(u[:, :4])}


reuse = gs.MeshReuse(model.vector_field, 0.0, float(ts_obs[-1]), ts=ts_obs, rtol=1e-6, atol=1e-6)
opt = optax.adam(0.02)


@jax.jit
def step(u, opt_state, state):
    def loss(u):
        y0, p = unpack(u)
        sol, new_state = reuse.solve(state, y0, p)
        per_start = jnp.sum((jnp.log(sol.ys) - log_obs) ** 2, axis=(1, 2))
        return jnp.sum(per_start), (new_state, per_start)

    (_, (state, per_start)), g = jax.value_and_grad(loss, has_aux=True)(u)
    updates, opt_state = opt.update(g, opt_state)
    return optax.apply_updates(u, updates), opt_state, state, per_start


own_steps = 100 if QUICK else 500
u, opt_state, state = u0, opt.init(u0), reuse.init(*unpack(u0))
for _ in range(own_steps):
    u, opt_state, state, per_start = step(u, opt_state, state)
best = int(jnp.argmin(per_start))
print(f"{own_steps} Adam steps on {n_starts} starts: the ensemble was (re-)recorded at "
      f"{int(state.n_records)} calls, {int(state.n_rows_recorded)} start records in all "
      f"(gs.solve would record {own_steps * n_starts})")
print("best start: sum of squares", round(float(per_start[best]), 3), " theta",
      np.array2string(np.exp(np.asarray(u[best, :4])), precision=4))

# %% [markdown]
# The kept mesh is part of the state, so the loop stays one compiled `step`, with no host
# round trip to decide when to re-record. How much it saves is the record's share of
# `gs.solve`'s cost: for 1,000 Lotka–Volterra systems `benchmarks/bench_reuse.py` measured
# 1.2x per step.
