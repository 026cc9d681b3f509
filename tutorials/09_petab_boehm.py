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
# # 09 · A PEtab problem: multistart fit and posterior
#
# Systems biologists exchange fitting problems as [PEtab](https://petab.readthedocs.io): an
# SBML model plus tables of conditions, measurements, observables and parameters. The PEtab
# benchmark collection is how tools in that field are compared. This tutorial takes one of
# its problems as it is, Boehm et al. (2014, J. Proteome Res.): STAT5 dimerisation after
# Epo stimulation, 8 states, 9 estimated parameters (3 of them noise levels), 48
# measurements.
#
# 1. load it with `models.load_petab` and check the log-likelihood against AMICI's number;
# 2. fit it from many starts with `inference.fit` (Levenberg–Marquardt, every start one
#    member of one ensemble) and look at the waterfall;
# 3. plot the best fit against the data;
# 4. sample the posterior briefly with `inference.sample` (NUTS).

# %%
import os
from pathlib import Path

import arviz as az
import matplotlib.pyplot as plt
import numpy as np

import gradsolve as gs

gs.enable_x64()

import inference
import models

QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
# The problem ships with the repository's tests (a copy from the benchmark collection).
BOEHM = Path(models.__file__).resolve().parents[1] / "tests" / "data" / "petab" / \
    "Boehm_JProteomeRes2014"

# %% [markdown]
# ## 1. Load
#
# The SBML model becomes one JAX vector field; each simulation condition is one trajectory
# of a `gs.solve` ensemble (here there is one). `log_likelihood` takes the estimated
# parameters on their PEtab scale (log10 here), as a vector or a dict by id, and is
# jittable and differentiable. AMICI reports -138.2220 at the nominal parameters.

# %%
problem = models.load_petab(BOEHM)
print(problem)
print(problem.parameter_ids)
print("scales:", set(problem.scales), " bounds:", np.asarray(problem.bounds[0])[0],
      "to", np.asarray(problem.bounds[1])[0])
llh_nominal = float(problem.log_likelihood())
print(f"log-likelihood at nominal: {llh_nominal:.4f} (AMICI: -138.2220)")

# %% [markdown]
# ## 2. Multistart fit
#
# `inference.fit(problem, n_starts=...)` draws the starts by Latin hypercube inside the
# bounds (on the parameter scale), and advances them together: each iteration solves every
# start and every condition as one ensemble, with the forward-mode Jacobian of all
# residuals. All noise here is normal, so the optimiser is Levenberg–Marquardt on the
# noise-weighted residuals; the three noise levels are estimated too, which makes the
# objective more than a sum of squares, and the curvature is then the Fisher information
# (Fisher scoring). The result keeps every start, sorted by final objective: the
# waterfall. Steps of the same height are local optima reached from several starts.
#
# (The first iteration compiles the ensemble's solve and Jacobian: about half a minute.)

# %%
n_starts = 4 if QUICK else 24
res = inference.fit(problem, n_starts=n_starts, seed=0, steps=60 if QUICK else 1000)
print(res)
print("final objectives:", np.round(res.losses, 3))
print(f"objective at nominal: {-llh_nominal:.4f}")
ax = res.plot_waterfall()
ax.axhline(-llh_nominal - res.loss + 1, color="k", ls=":", label="nominal")
ax.legend(frameon=False)
plt.show()

# %% [markdown]
# `res.params` is a dict by parameter id on the parameter scale; the problem accepts it
# directly, and the fit's objective is exactly `-log_likelihood` there (there are no
# priors in this problem's table).

# %%
print({k: round(v, 3) for k, v in res.params.items()})
print(-float(problem.log_likelihood(res.params)), res.loss)

# %% [markdown]
# ## 3. The best fit against the data
#
# `problem.simulate(x)` returns PEtab's simulation table: the measurement table with the
# observable's value (and the noise level) at each measurement.

# %%
sim = problem.simulate(res.params)
data = problem.petab_problem.measurement_df
fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), sharex=True)
for ax, (obs, rows) in zip(axes, data.groupby("observableId")):
    s = sim.loc[rows.index].sort_values("time")
    ax.plot(rows["time"], rows["measurement"], "o", ms=4, label="data")
    ax.plot(s["time"], s["simulation"], "-", label="best fit")
    ax.fill_between(s["time"], s["simulation"] - s["sigma"], s["simulation"] + s["sigma"],
                    alpha=0.2, label="± sigma")
    ax.set_title(obs)
    ax.set_xlabel("time (min)")
axes[0].legend(frameon=False)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. A brief look at the posterior
#
# `inference.sample(problem, ...)` runs NumPyro NUTS on `log_likelihood + log_prior`:
# the priors the parameter table gives, uniform inside the bounds (on the parameter scale)
# where it gives none, as here. The chains start at the best fit. Several parameters are
# pinned only by their bounds (the fit put `k_exp_hetero` on its lower bound), so the
# posterior has long flat directions and NUTS takes its longest trajectories: the tree
# depth is capped here to keep the run short (each leapfrog step is one gradient of the
# whole solve), and these few draws are a look at the posterior, not a converged sample.

# %%
idata = inference.sample(problem, num_warmup=10 if QUICK else 100,
                         num_samples=10 if QUICK else 100, num_chains=1,
                         max_tree_depth=4 if QUICK else 5, init=res.params, seed=0)
print(az.summary(idata, kind="stats"))
print("divergences:", int(idata.sample_stats.diverging.sum()),
      " leapfrog steps per draw:", np.asarray(idata.sample_stats.n_steps).ravel())
az.plot_forest(idata, combined=True, figsize=(6, 4))
plt.show()
