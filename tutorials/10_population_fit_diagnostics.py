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
# # 10 · From a NONMEM table to FOCE-I, diagnostics and a posterior
#
# The workflow of a population pharmacokinetic analysis, as NONMEM, Monolix or nlmixr2
# users run it, with gradsolve solving every subject as one ensemble:
#
# 1. a long-format NONMEM-style table with two arms: oral doses, and repeated IV
#    infusions (`RATE`, `ADDL`/`II`);
# 2. read it into a `models.PopulationDataset`;
# 3. a FOCE-I fit with `inference.fit_population`: estimates, standard errors, OFV,
#    AIC/BIC, eta shrinkage;
# 4. the diagnostics a pharmacometrician reads: DV against PRED and IPRED, CWRES against
#    time and PRED, a visual predictive check per arm; the fitted table written out;
# 5. the posterior with `inference.sample`, its chains started at the FOCE-I estimate.
#
# The study is simulated from `models.theophylline()` at known values, so that every
# estimate can be set against the truth. The files it writes (the study's table, figures,
# the fitted table) go to `output/` next to this tutorial.

# %%
import csv
import os
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np

import gradsolve as gs

gs.enable_x64()

import inference
import models

QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
# Files go to output/ beside this file (a notebook runs in its own folder); git ignores it.
OUT = (Path(__file__).parent if "__file__" in globals() else Path.cwd()) / "output"
OUT.mkdir(exist_ok=True)

# %% [markdown]
# ## 1. The table
#
# One row per dose or observation: `ID, TIME, DV, AMT, RATE, ADDL, II, EVID, MDV, CMT`
# and the covariates `WT` (kg) and `ARM`. Doses are per kg, as in the theophylline study.
#
# - Oral arm (`ARM = 0`): one dose into the gut (`CMT = 1`) at `TIME = 0`, samples over
#   24 h.
# - IV arm (`ARM = 1`): a one-hour infusion into the central compartment (`CMT = 2`,
#   `RATE` = amount per hour) every 12 h: the dose row at `TIME = 0` with `ADDL = 2`,
#   `II = 12` stands for infusions at 0, 12 and 24 h. Samples through the first interval
#   and after the third dose.
#
# A dose given at steady state (`SS = 1` with its `II`: the profile after many infusions,
# without simulating them) is the natural design of such an IV arm. gradsolve's core
# computes steady states (`gs.steady_state`), but the table reader does not take `SS`
# rows yet; when it does, the IV arm's dose row becomes `SS = 1, II = 12` and the rest of
# this tutorial stays as it is.

# %%
rng = np.random.default_rng(2024)
n_arm = 12
oral_times = [0.25, 0.5, 1, 2, 3.5, 5, 7, 9, 12, 24]
iv_times = [0.5, 1, 1.5, 3, 6, 11.9, 24.5, 25, 27, 30, 36]
header = ["ID", "TIME", "DV", "AMT", "RATE", "ADDL", "II", "EVID", "MDV", "CMT", "WT", "ARM"]
rows = []
for i in range(2 * n_arm):
    iv = i >= n_arm
    wt = round(float(rng.uniform(55, 90)), 1)
    dose = round(320.0 / wt, 2)                                 # 320 mg, per kg
    times = iv_times if iv else oral_times
    rows.append([i + 1, 0.0, ".", dose, dose if iv else 0, 2 if iv else 0, 12 if iv else 0,
                 1, 1, 2 if iv else 1, wt, int(iv)])
    for t in times:
        t = round(t + float(rng.uniform(-0.1, 0.1)), 2)        # actual, not nominal, times
        rows.append([i + 1, t, 0.0, ".", ".", ".", ".", 0, 0, 2, wt, int(iv)])
table = {h: [r[j] for r in rows] for j, h in enumerate(header)}
design = models.PopulationDataset.from_table(table, covariates=["WT", "ARM"])
print(design)
print("IV subject", design.subjects[-1].id, "doses at", design.subjects[-1].dose_times,
      "rates", design.subjects[-1].dose_rates)

# %% [markdown]
# The observed values are drawn from the model at known population values and random
# effects (`PopulationModel.simulate`), then written into the table's `DV` column and the
# table to a CSV file, the form a study's data arrive in.

# %%
model = models.theophylline()
truth = {"lKa": 0.45, "lCl": -3.2, "lKe": -2.45, "omega": np.array([0.5, 0.25]),
         "sigma": 0.5}
eta_true = rng.normal(size=(design.n_subjects, 2))
simulated = model.simulate(jax.random.PRNGKey(1), dict(truth, eta=eta_true), design)
dv = iter(np.concatenate([np.round(s.ys, 3) for s in simulated.subjects]))
table["DV"] = [next(dv) if evid == 0 else "." for evid in table["EVID"]]
study = OUT / "10_study.csv"
with open(study, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(zip(*(table[h] for h in header)))
print(study.read_text()[:600])

# %% [markdown]
# ## 2. Read it
#
# `PopulationDataset.from_table` reads NONMEM's columns (`ADDL` doses are expanded,
# `RATE` makes a dose a zero-order input); every other column is a covariate unless the
# covariates are named.

# %%
data = models.PopulationDataset.from_table(study, covariates=["WT", "ARM"])
arm = data.covariate("ARM")
print(data, "infusions:", data.has_infusions)

# %% [markdown]
# ## 3. FOCE-I
#
# `models.theophylline()` has `ka_i = exp(lKa + omega[0] eta_i0)`, `cl_i = exp(lCl +
# omega[1] eta_i1)`, `ke = exp(lKe)` and an additive error `sigma`; an oral dose enters the
# gut (compartment 1), an infusion the central compartment (2). `inference.fit_population`
# maximises the marginal likelihood with each subject's random effects integrated by the
# Laplace approximation at its conditional mode (FOCE-I, the first-order Hessian with the
# interaction), all subjects' inner optimisations one ensemble. The priors of the
# population sites only give starts and supports; they are not part of the objective.
# `omega` and the random effects are vectors over the two effects, so the table below
# names each component by the individual parameter it acts on.

# %%
EFFECTS = ("ka", "cl")          # omega[0], eta[:, 0] act on ka_i; omega[1], eta[:, 1] on cl_i
fit = inference.fit_population(model, data)
print(f"converged {fit.converged} in {fit.n_iterations} iterations, {fit.wall_time:.0f} s "
      f"({fit.message}; largest gradient component {fit.max_gradient:.1e})")
print(f"OFV {fit.ofv:.2f} (NONMEM's, without N log 2 pi: {fit.ofv_nonmem:.2f}), "
      f"AIC {fit.aic:.2f}, BIC {fit.bic:.2f}")
print(f"{'':10}{'estimate':>10}{'SE':>9}{'truth':>9}")
for k in ("lKa", "lCl", "lKe", "omega", "sigma"):
    for j, (e, s, t) in enumerate(zip(np.ravel(fit.params[k]), np.ravel(fit.se[k]),
                                      np.ravel(truth[k]))):
        name = k if np.ndim(fit.params[k]) == 0 else f"{k}[{EFFECTS[j]}]"
        print(f"{name:10}{e:10.3f}{s:9.3f}{t:9.3f}")
print("eta shrinkage:", {e: round(float(v), 3) for e, v in zip(EFFECTS, fit.shrinkage)})

# %% [markdown]
# `converged` says whether the largest gradient component fell below 1e-6. On this data
# set SciPy's BFGS stops with "precision loss" after 21 iterations (its line search
# compares objective values, which jump by ~1e-12 where a solve's adaptive step count
# changes) short of it, and Newton steps on the exact gradient then take it to ~1e-9
# (measured when this tutorial was written; `fit.message` and `fit.max_gradient` print
# both); the standard errors come from the objective's curvature there.
#
# The IV arm pins clearance and volume directly; the absorption effect (on `ka`) is seen
# only in the oral arm, so half the subjects carry no information on it and its shrinkage
# is large: with shrinkage above ~30 %, plots of the conditional modes (EBEs) say more
# about the prior than about the subjects.

# %% [markdown]
# ## 4. Diagnostics
#
# DV against PRED (random effects at zero) and IPRED (at the conditional modes): the
# population predictions scatter around the identity by the between-subject spread, the
# individual ones by the residual error only.

# %%
fig = inference.plot_dv_pred(fit, data)
fig.savefig(OUT / "10_dv_pred.png", dpi=80)

# %% [markdown]
# Conditional weighted residuals (Hooker et al. 2007) against time and PRED: without
# misfit, standard normal around zero with no trend.

# %%
fig = inference.plot_cwres(fit, data)
fig.savefig(OUT / "10_cwres.png", dpi=80)
cw = fit.cwres[np.isfinite(fit.cwres)]
print(f"CWRES mean {cw.mean():.3f}, sd {cw.std():.3f} (expected 0, 1)")

# %% [markdown]
# A visual predictive check per arm: the study's design simulated `n_replicates` times at
# the estimate (each replicate draws new random effects from the fitted `omega` and new
# residual errors), binned by time; the observed 5th, 50th and 95th percentiles (lines)
# against the 90 % interval of the same percentiles over the replicates (bands). The oral
# arm's doses differ by weight, so its VPC is prediction-corrected (Bergstrand et al.
# 2011). `inference.vpc` returns the numbers; `inference.plot_vpc` draws them.
#
# `plot_vpc` joins the bins' percentiles by lines. The IV arm is not sampled between 12 h
# and the third infusion at 24 h, and two infusions start in that gap: a line across it
# would draw a profile nobody observed and the model does not predict (the concentration
# rises twice there). `broken_at` gives the drawing a bin of no values at each dose
# between two bins (and at every bin without observations), where the lines and bands
# stop.

# %%
def broken_at(v, times):
    """`v` to draw with `inference.plot_vpc`, its lines and bands broken at those of
    ``times`` that fall between two bins and at every empty bin: each becomes a bin of NaN
    percentiles (an empty bin at its middle), which matplotlib leaves undrawn."""
    bin_times = np.where(v.n_obs > 0, v.bin_times, (v.bin_edges[:-1] + v.bin_edges[1:]) / 2)
    drawn = v.bin_times[v.n_obs > 0]
    cuts = np.array([t for t in np.unique(times) if drawn.min() < t < drawn.max()])
    order = np.argsort(np.concatenate([bin_times, cuts]), kind="stable")
    blank = lambda a: np.full((cuts.size,) + a.shape[1:], np.nan)
    return v._replace(
        bin_times=np.concatenate([bin_times, cuts])[order],
        n_obs=np.concatenate([v.n_obs, np.zeros(cuts.size, int)])[order],
        observed=np.concatenate([v.observed, blank(v.observed)])[order],
        simulated=np.concatenate([v.simulated, blank(v.simulated)])[order])


n_rep = 200 if QUICK else 1000
oral = models.PopulationDataset([s for s, a in zip(data.subjects, arm) if a == 0],
                                data.covariate_names)
iv = models.PopulationDataset([s for s, a in zip(data.subjects, arm) if a == 1],
                              data.covariate_names)
oral_bins = [0.0, 0.375, 0.75, 1.5, 2.75, 4.25, 6.0, 8.0, 10.5, 18.0, 25.0]   # one a
iv_bins = [0.0, 0.75, 1.25, 2.0, 4.5, 9.0, 13.0, 24.75, 26.0, 28.5, 33.0, 38.0]  # nominal time
vpc_oral = inference.vpc(model, oral, fit, n_replicates=n_rep, bins=oral_bins,
                         pred_corrected=True)
vpc_iv = inference.vpc(model, iv, fit, n_replicates=n_rep, bins=iv_bins)
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
iv_doses = np.concatenate([s.dose_times for s in iv.subjects])     # 0, 12 and 24 h
inference.plot_vpc(broken_at(vpc_oral, []), ax=axes[0], xlabel="time (h)")
inference.plot_vpc(broken_at(vpc_iv, iv_doses), ax=axes[1], xlabel="time (h)",
                   ylabel="concentration (mg/L)")
axes[0].set_title("oral arm, prediction-corrected")
axes[1].set_title("IV infusion arm")
fig.tight_layout()
fig.savefig(OUT / "10_vpc.png", dpi=80)
for name, v in (("oral", vpc_oral), ("IV", vpc_iv)):
    lo, hi = v.simulated[..., 0], v.simulated[..., 2]
    outside = int(np.sum((v.observed < lo) | (v.observed > hi)))
    print(f"{name}: {outside} of {v.observed.size} observed percentiles outside their "
          f"{100 * v.interval:g} % intervals")

# %% [markdown]
# The fitted table in the long form NONMEM writes (`$TABLE`): the data's columns and
# `PRED, IPRED, IWRES, CWRES, ETA1, ETA2` (the random effects on the model's own,
# standard-normal scale: NONMEM's ETA is `omega * ETA` here). The reader takes it back.

# %%
tab = inference.population_table(fit, data, OUT / "10_fit_table.csv")
print((OUT / "10_fit_table.csv").read_text()[:500])
back = models.PopulationDataset.from_table(OUT / "10_fit_table.csv", covariates=["WT", "ARM"])
print("read back:", back)

# %% [markdown]
# ## 5. The posterior
#
# `inference.sample` runs NumPyro NUTS on the model's program, the population parameters'
# priors now part of the model. Its chains start at the FOCE-I estimate: the population
# values and each subject's conditional mode (`init` takes a dict of every latent site;
# the chains are jittered around it). A good start shortens warmup and keeps chains out
# of the flip-flop mode (`ka` and `ke` swapped).

# %%
init = dict(fit.params, eta=fit.etas.reshape(data.n_subjects, 2))
warm, draws = (100, 100) if QUICK else (500, 1000)
idata = inference.sample(model, data, init=init, num_warmup=warm, num_samples=draws,
                         num_chains=2 if QUICK else 4, progress=False)
import arviz as az

summary = az.summary(idata, var_names=["lKa", "lCl", "lKe", "omega", "sigma"])
summary.index = [f"omega[{EFFECTS[int(i[6:-1])]}]" if i.startswith("omega[") else i
                 for i in summary.index]                  # omega[0] -> omega[ka], as above
print(summary[["mean", "sd", "hdi_3%", "hdi_97%", "ess_bulk", "r_hat"]])
print("divergences:", int(idata.sample_stats["diverging"].sum()))
post_mean = summary["mean"].values
foce = np.concatenate([np.ravel(fit.params[k]) for k in ("lKa", "lCl", "lKe", "omega",
                                                         "sigma")])
print("posterior mean - FOCE-I estimate:", np.round(post_mean - foce, 3))
