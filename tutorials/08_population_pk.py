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
# # 08 · Population pharmacokinetics with doses
#
# Most pharmacokinetic data are populations: many subjects, each with their own doses and
# sampling times, kept as a long-format table (one row per observation or dose) as NONMEM
# and Monolix users keep them. This tutorial goes from such a table to per-subject
# posterior predictive plots:
#
# 1. read the table into a `models.PopulationDataset`;
# 2. the theophylline model (`models.theophylline()`): one compartment, first-order
#    absorption, log-normal random effects on `ka` and `CL`, non-centred;
# 3. the same model written as a plain NumPyro program with `inference.ode`, the ODE site
#    that solves every subject as ONE ensemble;
# 4. sample with `inference.sample`, check against the closed form, and plot each subject.

# %%
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro
import numpyro.distributions as dist

import gradsolve as gs

gs.enable_x64()

import inference
import models

QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
# Figures go to output/ beside this file (a notebook runs in its own folder); git ignores it.
OUT = (Path(__file__).parent if "__file__" in globals() else Path.cwd()) / "output"
OUT.mkdir(exist_ok=True)

# %% [markdown]
# ## 1. A long-format table
#
# `ID, TIME, DV, AMT, EVID, CMT` plus covariates (`WT`): `EVID = 1` rows are doses (`AMT`
# into compartment `CMT`, 1-based), `EVID = 0` rows observations. The embedded
# theophylline data (R's `Theoph`) are exactly such a table; a table of your own reads the
# same way, from a CSV path or a dict of columns.

# %%
data = models.load_dataset("theophylline")
print(data)
s = data.subjects[0]
print("subject", s.id, "doses at", s.dose_times, "amount", s.dose_amounts, "WT", s.covariates["WT"])
ts, ys = data.observations()          # (S, K), padded: NaN marks a missing value
print(ts.shape, ys.shape)

table = {"ID": [1, 1, 1, 1, 2, 2, 2], "TIME": [0, 0, 1, 4, 0, 2, 6],
         "DV": [".", 0.0, 5.1, 3.2, ".", 4.0, 1.9], "AMT": [4.0, ".", ".", ".", 3.5, ".", "."],
         "EVID": [1, 0, 0, 0, 1, 0, 0], "CMT": [1, 2, 2, 2, 1, 2, 2], "WT": [70] * 4 + [82] * 3}
print(models.PopulationDataset.from_table(table))

# %% [markdown]
# ## 2. The model as data
#
# `models.theophylline()` is a `models.PopulationModel`: latent sites (`lKa`, `lCl`,
# `lKe`, `omega`, `sigma`, and `eta` of shape `(S, 2)` inside a `subjects` plate), each
# subject's ODE parameters, doses (a dose at `t = 0` becomes the initial state), the
# observation function `c = a_central * ke / cl_i` and the noise model.
# `inference.population_program(model)` is its NumPyro program.

# %%
model = models.theophylline()
theta = model.sample_latent(jax.random.PRNGKey(0), data)
print({k: np.shape(v) for k, v in theta.items()})
program = inference.population_program(model)
lp, _ = numpyro.infer.util.log_density(program, (data,), {}, theta)
print("log density at a prior draw:", float(lp))

# %% [markdown]
# ## 3. The same model as a NumPyro program
#
# A NumPyro user keeps writing NumPyro: plates, non-centred random effects, any
# likelihood. `inference.ode(name, f, t0, t1, y0, params, ts=...)` is the ODE site: under
# plain NumPyro it is `gs.solve`; under `inference.fit` / `inference.sample` it is
# recorded and replayed. All subjects are one ensemble: `y0 (S, 2)`, every parameter leaf
# with the leading axis `S`, every subject its own save times `ts (S, K)`. Later doses
# would be `jumps=(times (S, J), sizes (S, J, 2))` (`data.jumps(n_states=2)`).

# %%
dose = np.array([s.dose_amounts[0] for s in data.subjects])
S = data.n_subjects


def pk(t, y, p):
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["ke"] * y[1]])


def theophylline(data):
    ts, ys = data.observations()
    lKa = numpyro.sample("lKa", dist.Normal(0.5, 0.5))
    lCl = numpyro.sample("lCl", dist.Normal(-3.2, 0.5))
    lKe = numpyro.sample("lKe", dist.Normal(-2.5, 0.5))
    omega = numpyro.sample("omega", dist.HalfNormal(1.0).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("subjects", S):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    ka, cl = jnp.exp(lKa + omega[0] * eta[:, 0]), jnp.exp(lCl + omega[1] * eta[:, 1])
    ke = jnp.exp(lKe)
    y0 = jnp.stack([jnp.asarray(dose), jnp.zeros(S)], -1)
    sol = inference.ode("pk", pk, 0.0, float(ts.max()), y0,
                        {"ka": ka, "ke": jnp.broadcast_to(ke, (S,))}, ts=ts)
    conc = jnp.where(ts > 0, sol.ys[..., 1] * ke / cl[:, None], 0.0)  # pre-dose samples
    seen = ~np.isnan(ys)
    with numpyro.handlers.mask(mask=seen):
        numpyro.sample("obs", dist.Normal(conc, sigma), obs=np.where(seen, ys, 0.0))


lp2, _ = numpyro.infer.util.log_density(theophylline, (data,), {}, theta)
print("the same log density:", float(lp2))

# %% [markdown]
# ## 4. Sample
#
# Chains start at a multi-start MAP fit (so none starts in the flip-flop mode, `ka` and
# `ke` swapped, tens of log-density units worse). For a population the sampler solves
# adaptively at every evaluation (`rerecord="always"`, its default for programs): the
# posterior spans several-fold ranges of every subject's absorption rate, beyond what one
# frozen explicit mesh holds (see `inference.sample`).

# %%
warm, draws = (150, 150) if QUICK else (500, 1000)
idata = inference.sample(model, data, num_warmup=warm, num_samples=draws, num_chains=4,
                         progress=False)
import arviz as az

print(az.summary(idata, var_names=["lKa", "lCl", "lKe", "omega", "sigma"]))
print("divergences:", int(idata.sample_stats["diverging"].sum()))

# %% [markdown]
# ## 5. Per-subject posterior predictive
#
# Each posterior draw's concentrations on a fine time grid, with the observation noise,
# against the data: `inference.predictive` runs the model's own program (its ODE solve,
# every draw and subject as one ensemble) at the draws, with each subject's sampling times
# replaced by the grid.

# %%
pick = np.linspace(0, idata.posterior.sizes["chain"] * idata.posterior.sizes["draw"] - 1,
                   100).astype(int)
post = {k: idata.posterior[k].values.reshape((-1,) + idata.posterior[k].shape[2:])[pick]
        for k in idata.posterior.data_vars}
grid = np.linspace(0.0, 25.0, 60)
design = models.PopulationDataset([s._replace(ts=grid, ys=np.zeros_like(grid),
                                              obs_cmt=np.ones(grid.size, int))
                                   for s in data.subjects], data.covariate_names)
noisy = inference.predictive(model, design, post, seed=0)["obs"]        # (100, 12, 60)
curves = inference.predictive(model, design, {**post, "sigma": 0 * post["sigma"]})["obs"]
fig, axes = plt.subplots(3, 4, figsize=(12, 7), sharex=True, sharey=True)
for i, ax in enumerate(axes.ravel()):
    lo, hi = np.percentile(noisy[:, i], [5, 95], axis=0)
    ax.fill_between(grid, lo, hi, alpha=0.3, label="90 % predictive")
    ax.plot(grid, np.median(curves[:, i], 0), label="median")
    ax.plot(data.subjects[i].ts, data.subjects[i].ys, "k.", label="data")
    ax.set_title(f"subject {data.subjects[i].id}")
axes[0, 0].legend(fontsize=7)
fig.supxlabel("time (h)")
fig.supylabel("concentration (mg/L)")
fig.tight_layout()
fig.savefig(OUT / "08_theophylline_predictive.png", dpi=80)
