# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Quickstart: solve an ensemble, differentiate it, compare with Diffrax
#
# gradsolve solves *ensembles* of small ODE systems (one vector field, many initial states
# and parameter sets) and differentiates them in reverse mode. The trick: an adaptive solve
# **records** the steps it accepts (the *mesh*); a fixed-step **replay** of that mesh is a
# fixed-length chain, so its gradient is the exact discrete adjoint of those steps — the
# same gradient Diffrax returns by default — without an adaptive loop to differentiate.
# On CPU the record, the replay and its adjoint run as a compiled kernel generated from
# your `f` (`sol.route == "gradsolve-kernel"`); elsewhere as ordinary `lax` loops.
#
# Set `GRADSOLVE_TUTORIAL_QUICK=1` to run everything at a small size.

# %%
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import gradsolve as gs

gs.enable_x64()  # float64 for accuracy work; importing gradsolve never changes JAX config
QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"
n = 32 if QUICK else 1000  # ensemble size

# %% [markdown]
# ## The vector field is written for ONE trajectory
#
# `f(t, y, p)` sees a state `y` of shape `(d,)` and one parameter set. The ensemble is
# given by the leading axis of `y0` (shape `(n, d)`) and of every parameter leaf.
# Here: Lotka–Volterra predator–prey with parameters jittered by ±10 %.

# %%
def lv(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


rng = np.random.default_rng(0)
p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((n, 4)) - 0.5)))
y0 = jnp.ones((n, 2))
ts = jnp.linspace(0.0, 10.0, 50)
rtol, atol = 1e-6, 1e-8

sol = gs.solve(lv, 0.0, 10.0, y0, p, ts=ts, solver=gs.Tsit5(), rtol=rtol, atol=atol)
print("ys:", sol.ys.shape, " accepted steps per trajectory (first 5):",
      np.asarray(sol.stats["num_accepted_steps"])[:5])

# %%
fig, ax = plt.subplots(figsize=(7, 3))
for i in range(min(n, 10)):
    ax.plot(ts, sol.ys[i, :, 0], color="C0", alpha=0.5)
    ax.plot(ts, sol.ys[i, :, 1], color="C1", alpha=0.5)
ax.set_xlabel("t"); ax.set_ylabel("population"); ax.set_title("10 members of the ensemble (prey C0, predator C1)")
fig.tight_layout(); plt.show()

# %% [markdown]
# ## Gradients: `jax.grad` straight through `gs.solve`
#
# `gs.solve` = record + replay. No gradient flows through step-size selection (as in
# Diffrax's default `RecursiveCheckpointAdjoint`), so `jax.grad` of any loss of `sol.ys`
# just works. We compare value, gradient and time against Diffrax on the same problem.

# %%
import diffrax


def loss_gs(q):
    return jnp.sum(gs.solve(lv, 0.0, 10.0, y0, q, ts=ts, rtol=rtol, atol=atol).ys ** 2)


term = diffrax.ODETerm(lambda t, y, a: lv(t, y, a))


def loss_dfx(q):
    def one(a, b):
        return diffrax.diffeqsolve(
            term, diffrax.Tsit5(), 0.0, 10.0, None, a, args=b, saveat=diffrax.SaveAt(ts=ts),
            max_steps=4096, stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol)).ys
    return jnp.sum(jax.vmap(one)(y0, q) ** 2)


def best_time(fn, x, reps=3):
    jax.block_until_ready(fn(x))  # compile
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter(); jax.block_until_ready(fn(x)); best = min(best, time.perf_counter() - t)
    return best


vg_gs = jax.jit(jax.value_and_grad(loss_gs))
vg_dfx = jax.jit(jax.value_and_grad(loss_dfx))
(v1, g1), (v2, g2) = vg_gs(p), vg_dfx(p)
print(f"loss     gradsolve {float(v1):.10g}   diffrax {float(v2):.10g}")
print(f"gradient max rel. difference: {float(jnp.max(jnp.abs(g1 - g2)) / jnp.max(jnp.abs(g2))):.1e}")
print(f"time (value+grad)  gradsolve {1e3 * best_time(vg_gs, p):.1f} ms   diffrax {1e3 * best_time(vg_dfx, p):.1f} ms")

# %% [markdown]
# The two agree to roughly solver tolerance, not to round-off: each library picks its own
# steps. Timings depend on the ensemble size and the hardware: at a few dozen trajectories
# fixed overheads dominate; run the full size (`n = 1000`) to see the ensemble regime. (On an *identical* mesh the gradients match to ~1e-12; see the test suite.)
#
# ## Mesh reuse: record once, replay many times
#
# In a fitting loop the parameters move a little per step. Re-running the adaptive loop for
# every gradient is wasteful: `gs.record` once, then differentiate `gs.replay` on that mesh.

# %%
mesh = gs.record(lv, 0.0, 10.0, y0, p, ts=ts, rtol=rtol, atol=atol)
print("mesh.n_steps (first 5):", np.asarray(mesh.n_steps)[:5], " status all ok:", bool(np.all(mesh.status == 0)))

grad_replay = jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(lv, mesh, y0, q).ys ** 2)))
g3 = grad_replay(p)
print(f"replay gradient vs solve gradient: max rel. diff {float(jnp.max(jnp.abs(g3 - g1)) / jnp.max(jnp.abs(g1))):.1e}")
print(f"time: replay grad {1e3 * best_time(grad_replay, p):.1f} ms (no adaptive loop)")

# %% [markdown]
# ## When does a mesh stop being good? `error_ratio`
#
# Each replay also computes the solver's embedded error estimate on the fixed steps.
# `Solution.error_ratio` is its largest value along each trajectory, in units of the
# tolerance: ≤ 1 means the recorded steps would still have been accepted at these
# parameters; > 1 means it is time to re-record. `inference.fit` and `inference.sample` use
# exactly this signal.

# %%
scales = np.array([1.0, 1.001, 1.003, 1.01, 1.03, 1.1])
ratios = [float(jnp.max(gs.replay(lv, mesh, y0, s * p).error_ratio)) for s in scales]
for s, r in zip(scales, ratios):
    print(f"params x {s:5.3f}: max error_ratio {r:7.3f}  {'re-record' if r > 1 else 'mesh ok'}")

fig, ax = plt.subplots(figsize=(5, 3))
ax.semilogy(scales, ratios, "o-"); ax.axhline(1.0, color="k", ls="--")
ax.set_xlabel("parameter scale factor"); ax.set_ylabel("max error_ratio")
ax.set_title("Replaying a mesh away from where it was recorded")
fig.tight_layout(); plt.show()
