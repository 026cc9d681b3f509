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
# # 06 · Bring your own model
#
# An `ODEModel` is plain data: a vector field, priors, an initial state, a noise model.
# Everything in `inference` (fit, sample, log density) works on any such model — the zoo
# models are built exactly the same way. Here: a damped harmonic oscillator
#
# $$\ddot x + 2\zeta\omega\,\dot x + \omega^2 x = 0,$$
#
# written as a first-order system in `(x, v)`, where only the position `x` is measured.

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro.distributions as dist

import gradsolve as gs

gs.enable_x64()

import inference
import models

QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"

# %% [markdown]
# ## 1. The vector field, for ONE trajectory
#
# `params` is a dict with the keys of `priors`. The unknown initial position `x0` is a
# parameter too, so `y0` is a function of the parameters.

# %%
def oscillator(t, y, p):
    x, v = y[0], y[1]
    return jnp.stack([v, -2.0 * p["zeta"] * p["omega"] * v - p["omega"] ** 2 * x])


model = models.ODEModel(
    name="damped_oscillator",
    vector_field=oscillator,
    priors={
        "omega": dist.LogNormal(jnp.log(2.0), 0.5),   # angular frequency (1/s), positive
        "zeta": dist.Beta(2.0, 8.0),                   # damping ratio in (0, 1): underdamped
        "x0": dist.Normal(1.0, 0.5),                   # initial position
        "sigma": dist.HalfNormal(0.2),                 # measurement noise (default Normal noise)
    },
    y0=lambda p: jnp.stack([p["x0"], 0.0 * p["x0"]]),  # released at rest
    t0=0.0,
    observed=(0,),                                     # only x is measured
    defaults={"omega": 2.0, "zeta": 0.15, "x0": 1.0, "sigma": 0.05},
    state_names=("x", "v"),
)
print(model.param_names, model.param_shapes)

# %% [markdown]
# Why priors matter even for "just fitting": they define the unconstrained space the
# optimiser and the sampler move in (`omega` and `sigma` positive, `zeta` in (0, 1)), and
# they regularise directions the data barely inform.
#
# ## 2. Synthetic data
#
# `model.simulate` solves at the defaults ("truth") and draws the observation noise.

# %%
truth = model.defaults
ts = jnp.linspace(0.5, 10.0, 30)
data = model.simulate(jax.random.PRNGKey(0), truth, ts)
print(data.ts.shape, data.ys.shape)

# %% [markdown]
# ## 3. Fit (MAP, many starts)

# %%
fit = inference.fit(model, data, n_starts=8 if QUICK else 32, steps=300 if QUICK else 1000,
                    seed=0, progress=False)
print(fit)
for k in model.param_names:
    print(f"  {k:<6} truth {float(truth[k]):.4f}   fit {float(fit.params[k]):.4f}")

tt = jnp.linspace(0.0, 10.0, 300)
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(tt, model.predict(truth, tt)[:, 0], "k--", label="truth")
ax.plot(tt, model.predict(fit.params, tt)[:, 0], "C0", label="MAP fit")
ax.plot(data.ts, data.ys[:, 0], "o", color="C1", ms=4, label="data")
ax.set_xlabel("t"); ax.set_ylabel("x"); ax.legend(); fig.tight_layout(); plt.show()

# %% [markdown]
# ## 4. Sample briefly
#
# NUTS from the MAP point. Short chains here (this is a demo); check `r_hat` and
# `ess_bulk` in the summary before trusting intervals.

# %%
import arviz as az

nw, ns = (50, 50) if QUICK else (500, 1000)
idata = inference.sample(model, data, num_warmup=nw, num_samples=ns, num_chains=2, seed=0,
                         progress=False, init=fit.params)
print(az.summary(idata, var_names=list(model.param_names)).to_string())
az.plot_posterior(idata, var_names=["omega", "zeta"],
                  ref_val={"omega": [{"ref_val": float(truth["omega"])}],
                           "zeta": [{"ref_val": float(truth["zeta"])}]})
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 5. A likelihood that is not a NumPyro distribution
#
# `noise=` takes a function that returns a NumPyro distribution. If your observation model
# is easier to write as a log density, pass `log_likelihood(params, y_pred, ys) -> scalar`
# instead. It covers ONE trajectory, with `y_pred` and `ys` of shape `(k, m)`.
# `inference.fit`, `inference.log_density` and `inference.sample` use it as is.
# `simulate` cannot, because a log density does not say how to draw data.
#
# Here the likelihood is a Gaussian whose spread grows with the signal. Its scale `b`
# replaces `sigma`, so no `sigma` prior is needed.

# %%
def heteroscedastic(p, y_pred, ys):
    scale = p["b"] * (0.1 + jnp.abs(y_pred))
    return jnp.sum(-0.5 * ((ys - y_pred) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi))


priors_b = {k: v for k, v in model.priors.items() if k != "sigma"} | {"b": dist.HalfNormal(0.5)}
model_ll = models.ODEModel(
    name="damped_oscillator_hetero", vector_field=oscillator, priors=priors_b,
    y0=lambda p: jnp.stack([p["x0"], 0.0 * p["x0"]]), observed=(0,), state_names=("x", "v"),
    log_likelihood=heteroscedastic,
)
fit_ll = inference.fit(model_ll, data, n_starts=8 if QUICK else 32, steps=300 if QUICK else 1000,
                       seed=0, progress=False)
print({k: round(float(v), 4) for k, v in fit_ll.params.items()})
