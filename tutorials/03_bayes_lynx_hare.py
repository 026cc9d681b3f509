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
# # 03 · Bayesian inference for the lynx–hare model with NUTS and ChEES
#
# A point estimate (tutorial 02) hides how uncertain the rates are. `inference.sample` runs
# NumPyro's NUTS on the same model; every leapfrog step needs a gradient of the log
# posterior, i.e. an ODE solve plus its adjoint — thousands of them per chain. At the end,
# the same posterior from the ensemble sampler (BlackJAX's ChEES-HMC, `sampler="chees"`),
# whose many chains step in lockstep, and the effective sample size per second of each.
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
import pandas as pd

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

# %% [markdown]
# ## The ensemble sampler: ChEES-HMC beside NUTS
#
# NUTS builds a tree per chain and per draw, so chains vectorised together wait for the
# deepest tree. `sampler="chees"` runs BlackJAX's ChEES-HMC instead: every chain takes the
# same number of leapfrog steps (a trajectory length adapted from statistics across the
# chains, jittered), so the 16 chains' ODE solves are one ensemble per leapfrog step, on
# one mesh. The posterior is the same; what changes is how many effective draws a second
# buys. Both numbers below count the whole call (MAP start, compilation, warmup, sampling):
# a second call in the same process is faster, the compiled programs being cached.

# %%
chees_chains = 8 if QUICK else 16
chees = inference.sample(model, data, sampler="chees", num_warmup=num_warmup,
                         num_samples=num_samples, num_chains=chees_chains, seed=0,
                         progress=False, fit_kwargs=fit_kwargs)
names = list(model.priors)


def ess_per_second(idata):
    """The smallest bulk ESS over every parameter, per second of the whole call."""
    ess = float(az.ess(idata, var_names=names).to_array().min())
    return ess, ess / idata.posterior.attrs["wall_time_s"]


for label, run in (("NUTS", idata), ("ChEES", chees)):
    ess, rate = ess_per_second(run)
    steps = float(run.sample_stats["n_steps"].mean())
    print(f"{label:<6} {run.posterior.sizes['chain']:>2} chains: min bulk ESS {ess:7.0f}, "
          f"{run.posterior.attrs['wall_time_s']:5.1f} s, {rate:7.1f} ESS/s, "
          f"{steps:4.1f} leapfrog steps a draw")

side = pd.concat({label: az.summary(run, var_names=names, kind="stats")[["mean", "sd"]]
                  for label, run in (("NUTS", idata), ("ChEES", chees))}, axis=1)
print(side.to_string())

# %% [markdown]
# The means and standard deviations agree within Monte Carlo error (in quick mode the
# chains are too short to say much). ChEES wants many chains, since it adapts from
# statistics across them; on an accelerator give it more (`num_chains=128`).
