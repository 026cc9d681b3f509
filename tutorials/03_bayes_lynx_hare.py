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
# # 03 · Bayesian inference for the lynx–hare model with NUTS
#
# A point estimate (tutorial 02) hides how uncertain the rates are. `inference.sample` runs
# NumPyro's NUTS on the same model; every leapfrog step needs a gradient of the log
# posterior, i.e. an ODE solve plus its adjoint — thousands of them per chain.
#
# **Why this is fast:** during warmup the sampler records a mesh per chain and re-records
# as the chain moves (`rerecord="warmup"`); the sampling phase then replays a *frozen*
# mesh recorded at a tighter tolerance. A fixed mesh makes the log density a fixed,
# smooth function of the parameters, which is exactly what Hamiltonian Monte Carlo needs
# to stay exact. The chains start from a multi-start MAP fit (`init="map"`).

# %%
import os

import arviz as az
import matplotlib.pyplot as plt
import numpy as np

import gradsolve as gs

gs.enable_x64()

import inference
import models

QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
num_chains, num_warmup, num_samples = (2, 100, 100) if QUICK else (4, 500, 1000)
fit_kwargs = {"n_starts": 8, "steps": 200} if QUICK else None

model, data = models.lynx_hare(), models.load_dataset("lynx_hare")

# %%
idata = inference.sample(model, data, num_warmup=num_warmup, num_samples=num_samples,
                         num_chains=num_chains, seed=0, progress=False, fit_kwargs=fit_kwargs)
summary = az.summary(idata, var_names=list(model.priors))
print(summary.to_string())

# %% [markdown]
# Check `r_hat` (≈ 1) and `ess_bulk` before trusting the numbers. In quick mode the chains
# are far too short for that; run the full-size notebook for real estimates.
#
# ## Trace plot

# %%
az.plot_trace(idata, var_names=list(model.priors))
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Pair plot of the rates `theta = (alpha, beta, gamma, delta)`
#
# The rates are strongly correlated (e.g. a faster hare birth rate can be compensated by a
# faster predation rate): the posterior is a narrow ridge, which is why a gradient-based
# sampler is worth the cost of differentiating the ODE.

# %%
az.plot_pair(idata, var_names=["theta"], kind="scatter", marginals=True,
             scatter_kwargs={"alpha": 0.3})
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Posterior predictive check
#
# Solve the model for posterior draws (one ensemble solve: the draws are the ensemble axis)
# and draw the log-normal observation noise on top. The data should look like a typical
# draw from this band.

# %%
post = idata.posterior
flat = {k: np.asarray(post[k].values).reshape((-1,) + post[k].shape[2:]) for k in model.priors}
n_draws = 50 if QUICK else 200
idx = np.random.default_rng(0).choice(flat["theta"].shape[0], n_draws, replace=False)
draws = {k: v[idx] for k, v in flat.items()}
tt = np.linspace(0.0, float(np.max(data.ts)), 100)
pred = np.asarray(model.predict(draws, tt))  # (n_draws, len(tt), 2)
noise = np.random.default_rng(1).normal(size=pred.shape) * draws["sigma"][:, None, :]
ppc = pred * np.exp(noise)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for j, (ax, name) in enumerate(zip(axes, model.observed_names)):
    lo, hi = np.percentile(ppc[:, :, j], [5, 95], axis=0)
    ax.fill_between(1900 + tt, lo, hi, color=f"C{j}", alpha=0.25, label="90% predictive")
    ax.plot(1900 + tt, np.median(pred[:, :, j], axis=0), color=f"C{j}", label="median ODE solution")
    ax.plot(1900 + np.asarray(data.ts), np.asarray(data.ys)[:, j], "ko", ms=4, label="data")
    ax.set_title(name); ax.set_xlabel("year")
axes[0].set_ylabel("pelts (thousands)"); axes[0].legend()
fig.tight_layout(); plt.show()
