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
# # 07 · gradsolve next to Diffrax: translating code, matching gradients, what differs
#
# This tutorial is for Diffrax users. It covers:
#
# 1. how a `diffrax.diffeqsolve` call maps onto `gs.solve`;
# 2. why the two gradients agree to the tolerance, and on one shared mesh to round-off;
# 3. how to use a Diffrax solver (here `diffrax.Kvaerno5`) inside gradsolve;
# 4. how failures are reported differently;
# 5. how the gradient cost grows with the ensemble size;
# 6. what gradsolve does not do.
#
# Set `GRADSOLVE_TUTORIAL_QUICK=1` to run everything at a small size.

# %%
import os
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

gs.enable_x64()
QUICK = os.environ.get("GRADSOLVE_TUTORIAL_QUICK") == "1"

# %% [markdown]
# ## 1 · The same solve, written twice
#
# | Diffrax | gradsolve |
# |---|---|
# | `term = diffrax.ODETerm(lambda t, y, args: ...)` | `f(t, y, params)`: the same signature, no wrapper |
# | `jax.vmap(lambda y0, a: diffeqsolve(...))(y0s, args)` | `gs.solve(f, t0, t1, y0s, params)`: `y0 (n, d)` and every `params` leaf with leading axis `n` *is* the ensemble |
# | `solver=diffrax.Tsit5()` | `solver=gs.Tsit5()` (or the Diffrax solver itself, section 3) |
# | `stepsize_controller=diffrax.PIDController(rtol, atol)` | `rtol=..., atol=...` (the same PI controller, see `gs.PIDController`) |
# | `saveat=diffrax.SaveAt(ts=ts)` | `ts=ts`, shape `(k,)` or per trajectory `(n, k)` |
# | `sol.ys`, `sol.stats["num_accepted_steps"]` | `sol.ys`, `sol.stats["num_accepted_steps"]`, plus `sol.mesh`, `sol.error_ratio` |
# | `adjoint=diffrax.RecursiveCheckpointAdjoint()` | built in: the replay's discrete adjoint |

# %%
def lv(t, y, p):
    """Lotka–Volterra for one trajectory: y (2,), p (4,)."""
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


n = 16 if QUICK else 200
rng = np.random.default_rng(0)
params = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((n, 4)) - 0.5)))
y0 = jnp.ones((n, 2))
ts = jnp.linspace(0.0, 10.0, 21)
rtol, atol = 1e-6, 1e-8


def diffrax_ys(y0, params, ts=ts, solver=diffrax.Tsit5(), controller=None):
    """The Diffrax side: one `diffeqsolve` per trajectory, vmapped."""
    controller = controller or diffrax.PIDController(rtol=rtol, atol=atol)

    def one(y, p):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: lv(t, y, a)), solver, 0.0, 10.0, None, y, args=p,
            saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller, max_steps=4096,
        ).ys

    return jax.vmap(one)(y0, params)


def gradsolve_ys(y0, params):
    return gs.solve(lv, 0.0, 10.0, y0, params, ts=ts, solver=gs.Tsit5(), rtol=rtol, atol=atol).ys


ys_dfx = jax.jit(diffrax_ys)(y0, params)
ys_gs = jax.jit(gradsolve_ys)(y0, params)
print("shapes:", ys_dfx.shape, ys_gs.shape)
print(f"max |ys_gs - ys_dfx| / max |ys|: {float(jnp.max(jnp.abs(ys_gs - ys_dfx)) / jnp.max(jnp.abs(ys_dfx))):.1e}")

# %% [markdown]
# ## 2 · Why the gradients agree to the tolerance, and when they agree to round-off
#
# Both libraries differentiate the steps they took. Neither differentiates the step-size
# choice: Diffrax's PID controller stops gradients through it, and gradsolve replays a
# fixed mesh. So the gradient is the exact derivative of the discrete solution.
#
# The two *solutions* differ slightly, because the step sequences differ. Diffrax reaches
# a save time by interpolating its dense output. gradsolve makes every save time a node of
# the mesh (`mesh.save_index`). Each is accurate to the tolerance, so values and gradients
# agree to about `rtol`:

# %%
def loss(ys):
    return jnp.sum(jnp.log(ys) ** 2)


g_dfx = jax.jit(jax.grad(lambda p: loss(diffrax_ys(y0, p))))(params)
g_gs = jax.jit(jax.grad(lambda p: loss(gradsolve_ys(y0, p))))(params)
print(f"gradient, different meshes: max rel. difference "
      f"{float(jnp.max(jnp.abs(g_gs - g_dfx)) / jnp.max(jnp.abs(g_dfx))):.1e}")

# %% [markdown]
# Now give both libraries **the same steps**. `gs.record` returns the mesh. We pass one
# trajectory's step times to Diffrax through `diffrax.StepTo`, which takes exactly those
# steps. The save times are mesh nodes, so Diffrax's interpolation returns node values
# there. Both gradients now differentiate the same arithmetic, and they agree to
# round-off.

# %%
mesh = gs.record(lv, 0.0, 10.0, y0, params, ts=ts, rtol=rtol, atol=atol)
i = 0
steps_i = mesh.times[i, : int(mesh.n_steps[i]) + 1]
print(f"trajectory {i}: {int(mesh.n_steps[i])} accepted steps, {int(mesh.n_rejected[i])} rejected")


def loss_dfx_same_mesh(p):
    return loss(diffrax_ys(y0[i:i + 1], p[None], controller=diffrax.StepTo(ts=steps_i))[0])


def loss_gs_replay(p):
    return loss(gs.replay(lv, mesh, y0, params.at[i].set(p)).ys[i])


ga = jax.grad(loss_dfx_same_mesh)(params[i])
gb = jax.grad(loss_gs_replay)(params[i])
print("diffrax  (StepTo on the recorded mesh):", np.asarray(ga))
print("gradsolve (replay of that mesh):       ", np.asarray(gb))
print(f"max rel. difference: {float(jnp.max(jnp.abs(ga - gb)) / jnp.max(jnp.abs(ga))):.1e}")

# %% [markdown]
# The replay also keeps the mesh usable after the parameters change. Its embedded error
# estimate, `sol.error_ratio`, says whether the controller would still accept every
# recorded step (`<= 1`) at the new parameters. `inference.fit` and `inference.sample`
# re-record when it says no. Diffrax has no counterpart, because it re-runs the adaptive
# loop on every call.

# %%
for scale in (1.0, 1.01, 1.1):
    r = gs.replay(lv, mesh, y0, scale * params).error_ratio
    print(f"params x {scale:4.2f}: largest error_ratio {float(jnp.max(r)):.3f}")

# %% [markdown]
# ## 3 · Diffrax solvers inside gradsolve
#
# Any Diffrax solver can be passed as `solver=`. If it has an embedded error estimate,
# gradsolve records with its own controller and replays through that solver's own `step`.
# The gradient is then the discrete adjoint of those Diffrax steps. A solver without an
# error estimate (e.g. `diffrax.Euler`) cannot be recorded adaptively, so `gs.solve` calls
# `diffrax.diffeqsolve` for it. `sol.route` always says what ran.
#
# Here is the implicit `diffrax.Kvaerno5()` on a stiff Van der Pol oscillator (mu = 1000),
# next to gradsolve's own `gs.Rodas5P()`:

# %%
def vdp(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


mus = jnp.array([500.0, 1000.0])
yv0 = jnp.tile(jnp.array([2.0, 0.0]), (2, 1))
tv = jnp.linspace(0.0, 1000.0 if not QUICK else 200.0, 6)

for solver in (diffrax.Kvaerno5(), gs.Rodas5P()):
    t = time.perf_counter()
    sol = gs.solve(vdp, 0.0, float(tv[-1]), yv0, mus, ts=tv, solver=solver, rtol=1e-6, atol=1e-8)
    print(f"{type(solver).__name__:10s} route={sol.route:34s} accepted steps={np.asarray(sol.stats['num_accepted_steps'])} "
          f"y(t1)[0]={np.asarray(sol.ys[:, -1, 0]).round(5)}  ({time.perf_counter() - t:.1f} s, compile included)")

sol_euler = gs.solve(lv, 0.0, 10.0, y0[:2], params[:2], ts=ts, solver=diffrax.Euler(), dt0=1e-3)
print("diffrax.Euler (no error estimate):", sol_euler.route)

# %% [markdown]
# ## 4 · When a solve fails
#
# If a trajectory runs out of steps, Diffrax raises an error for the whole `vmap`. Outside
# `jit`, gradsolve raises a `RuntimeError` that names the failing trajectories and suggests a
# fix. Inside `jit` it does not raise by default. It marks the trajectory in `mesh.status`
# and returns NaN for its outputs, so a sampler can treat it as zero posterior density
# instead of crashing. `throw=True` or `throw=False` overrides the default.

# %%
try:
    gs.solve(vdp, 0.0, 1000.0, yv0, mus, ts=tv, solver=gs.Tsit5(), max_steps=2000)
except RuntimeError as err:
    print("RuntimeError:", str(err)[:400], "...")

sol = jax.jit(lambda m: gs.solve(vdp, 0.0, 1000.0, yv0, m, ts=tv, solver=gs.Tsit5(),
                                 max_steps=2000))(mus)
print("under jit: status", np.asarray(sol.mesh.status), " ys finite:",
      np.asarray(jnp.isfinite(sol.ys).all(axis=(1, 2))))

# %% [markdown]
# ## 5 · Gradient cost against the ensemble size
#
# The gradient of the loss above, timed four ways:
#
# - Diffrax's default adjoint through `vmap(diffeqsolve)`;
# - `jax.grad` through `gs.solve`, which records a new mesh on every call;
# - `jax.grad` through `gs.replay` on a mesh recorded once, which is what fitting loops and
#   samplers do between re-records;
# - the forward replay alone, for scale.
#
# Times are best of a few runs. At a few dozen trajectories fixed costs dominate. Run
# without `GRADSOLVE_TUTORIAL_QUICK` to see the ensemble regime. `benchmarks/` has the full
# side-by-side tables.

# %%
def best_ms(fn, *args, reps=5):
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter(); jax.block_until_ready(fn(*args)); best = min(best, time.perf_counter() - t)
    return 1e3 * best


sizes = (8, 32) if QUICK else (10, 100, 1000)
print(f"{'n':>6} {'diffrax grad':>13} {'gs.solve grad':>14} {'replay grad':>12} {'replay fwd':>11}")
for m in sizes:
    pm = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.2 * (rng.random((m, 4)) - 0.5)))
    ym = jnp.ones((m, 2))
    mesh_m = gs.record(lv, 0.0, 10.0, ym, pm, ts=ts, rtol=rtol, atol=atol)
    t_dfx = best_ms(jax.jit(jax.grad(lambda p: loss(diffrax_ys(ym, p)))), pm)
    t_solve = best_ms(jax.jit(jax.grad(lambda p: loss(gs.solve(lv, 0.0, 10.0, ym, p, ts=ts, rtol=rtol, atol=atol).ys))), pm)
    t_rep = best_ms(jax.jit(jax.grad(lambda p: loss(gs.replay(lv, mesh_m, ym, p).ys))), pm)
    t_fwd = best_ms(jax.jit(lambda p: gs.replay(lv, mesh_m, ym, p).ys), pm)
    print(f"{m:>6} {t_dfx:>10.2f} ms {t_solve:>11.2f} ms {t_rep:>9.2f} ms {t_fwd:>8.2f} ms"
          f"   (diffrax / replay grad = {t_dfx / t_rep:.0f}x)")

# %% [markdown]
# ## 6 · What gradsolve does not do
#
# gradsolve handles ODE ensembles, solved forward in time, with reverse-mode and
# forward-mode derivatives. Use Diffrax directly for:
#
# - SDEs, CDEs and other non-ODE terms;
# - event handling (`diffrax.Event`);
# - dense output between save times (`sol.evaluate`);
# - integrating backwards in time (gradsolve requires `t1 > t0`);
# - continuous adjoints (`BacksolveAdjoint`);
# - large state vectors. gradsolve is built for small systems (1–64 states) in large
#   ensembles. For one big PDE semi-discretisation, Diffrax's per-solve machinery costs
#   little and the ensemble axis buys nothing.
