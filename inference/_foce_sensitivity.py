"""FOCE-I by forward sensitivities: the predictions' Jacobian in the random effects from
an augmented ODE, so every derivative `fit_population` takes of a solve is first order.

Each subject's state ``y`` (``d``) is solved together with ``S = dy/d eta`` (``d x q``),

    dy/dt = f(t, y, p),      dS/dt = (df/dy) S + (df/dp) (dp/d eta),      S(0) = dy0/d eta,

one ordinary ensemble solve of ``d (1 + q)`` states (the forward sensitivity equations;
Hindmarsh et al. 2005, "SUNDIALS", ACM TOMS 31:363, sec. 5; Leis & Kramer 1988). The
augmented field is a plain JAX function (``f``'s Jacobian products by ``jax.jvp``), so the
compiled kernel runs it and its hand-written adjoint differentiates it in the population
parameters. A bolus adds ``d size / d eta`` to ``S`` (zero unless the amount depends on
``eta``); the jump times must not depend on ``eta``.

From the predictions ``pred`` and ``J = d pred / d eta``: the inner Newton search uses
FOCE-I's first-order Hessian ``J' W J + Omega^-1`` and the exact gradient ``J' dl/dpred +
dl/d eta``; the objective's exact gradient in the population parameters needs the modes'
derivative (implicit function theorem: ``d eta*/d phi = H^-1 dg/d phi`` with ``H`` the
exact Hessian of ``l``) and ``d F / d eta`` at the mode (``F`` the objective, through
``log det`` of the first-order Hessian). Both are second derivatives of the solve in
``eta``; they are taken here by central differences of the first-order quantities ``g`` and
``log det`` over ``eta* +- h e_k`` (``2 q`` copies of every subject, one forward solve,
no derivative through it), and enter the objective as

    F(phi, eta*) + dF/d eta . H^-1 g(phi, eta*),

whose value is ``F`` at the mode (``g`` vanishes there) and whose gradient in ``phi`` is
the total derivative ``dF/d phi + dF/d eta . d eta*/d phi`` (Almquist et al. 2015, J
Pharmacokinet Pharmacodyn 42:191, eq. 15): one augmented solve with its adjoint per
objective gradient.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import gradsolve as gs

__all__ = ["sensitivity_refusal", "sensitivity_functions"]

STEP = 1e-5  # central-difference step in eta (the effects are O(1): non-centred)


def sensitivity_refusal(model, data, method: str, theta: dict) -> str | None:
    """Why the sensitivity route does not apply (a sentence), or ``None`` where it does:
    the Laplace method (an exact Hessian), and dose schedules (infusions, steady states,
    resets, dose parameters), whose restart values and rate states have the model's
    shape."""
    if method != "foce-i":
        return "method='laplace' needs the exact Hessian of each subject's density"
    p = model.individual(theta, data)
    _, jumps = model.dosing(theta, p, data)
    if isinstance(jumps, gs.DoseSchedule):
        return ("the doses form a schedule (infusions, steady states, resets or dose "
                "parameters), whose restarts and rate states the sensitivities do not carry")
    return None


@functools.lru_cache(maxsize=None)
def _augmented_field(f, d: int, q: int):
    """``(t, z (d + d q,), a) -> dz/dt``: ``f`` and its forward sensitivity equations,
    ``a = {"p": p, "dp": dp}`` with every leaf of ``dp`` the matching leaf of ``p``'s
    derivative in ``eta`` (last axis ``q``). Cached so a second fit reuses the kernel."""

    def field(t, z, a):
        y, S = z[:d], jnp.reshape(z[d:], (d, q))
        dy = f(t, y, a["p"])
        cols = [jax.jvp(lambda y_, p_: f(t, y_, p_), (y, a["p"]),
                        (S[:, k], jax.tree_util.tree_map(lambda v: v[..., k], a["dp"])))[1]
                for k in range(q)]
        return jnp.concatenate([dy, jnp.reshape(jnp.stack(cols, -1), (d * q,))])

    return field


class Context(NamedTuple):
    """What the sensitivity route needs of `fit_population`'s problem."""

    model: Any
    data: Any
    eff: str            # the random-effects site
    eta_shape: tuple    # its per-subject shape (q entries in all)
    q: int
    ts: np.ndarray      # (S, K) observation times
    ys0: np.ndarray     # (S, K) observations, 0 where missing
    seen: np.ndarray    # (S, K) where an observation is
    t1: float
    solve_kw: dict      # solver, rtol, atol, driver
    effect_logprob: Any  # (model, data, theta, name) -> (S,)


def _theta(ctx, phi, eta):
    S = eta.shape[0]
    return dict(phi, **{ctx.eff: jnp.reshape(eta, (S,) + ctx.eta_shape)})


def _inputs(ctx, phi, eta):
    """The augmented ensemble's ``z0 (S, D)``, parameters and jumps at ``eta (S, q)``."""
    model, data, q = ctx.model, ctx.data, ctx.q
    S = eta.shape[0]

    def parts(e):
        th = _theta(ctx, phi, e)
        p = model.individual(th, data)
        y0, jumps = model.dosing(th, p, data)
        return p, y0, (None if jumps is None else jumps[1])

    (p, y0, sizes), lin = jax.linearize(parts, eta)
    basis = jnp.broadcast_to(jnp.eye(q, dtype=eta.dtype)[:, None, :], (q, S, q))
    dp, dy0, dsizes = jax.vmap(lin)(basis)                       # leading axis q
    last = lambda v: jnp.moveaxis(v, 0, -1)
    d = y0.shape[-1]
    z0 = jnp.concatenate([y0, jnp.reshape(last(dy0), (S, d * q))], -1)
    jumps = None
    if sizes is not None:
        times = model.dosing(_theta(ctx, phi, eta), p, data)[1][0]
        J = sizes.shape[1]
        jumps = (times, jnp.concatenate([sizes, jnp.reshape(last(dsizes), (S, J, d * q))], -1))
    return z0, {"p": p, "dp": jax.tree_util.tree_map(last, dp)}, jumps


def _solve(ctx, z0, params, jumps, mesh=None):
    """The augmented ensemble solve (``ys (n, K, D)`` in its `gs.Solution`), or, given a
    recorded ``mesh`` of as many rows, its replay on that mesh."""
    field = _augmented_field(ctx.model.vector_field, ctx.model.n_states, ctx.q)
    if mesh is not None:
        return gs.replay(field, mesh, z0, params, jumps=jumps, driver=ctx.solve_kw["driver"])
    ts = jnp.asarray(ctx.ts, z0.dtype)
    return gs.solve(field, ctx.model.t0, ctx.t1, z0, params, ts=ts, jumps=jumps, throw=False,
                    **ctx.solve_kw)


def _observe(ctx, phi, eta, params, ys):
    """``pred (S, K)`` and ``J (S, K, q)`` from the augmented states ``ys (S, K, D)``."""
    model, q = ctx.model, ctx.q
    S, K = ys.shape[:2]
    d = model.n_states
    y, sens = ys[..., :d], jnp.reshape(ys[..., d:], (S, K, d, q))
    ts = ctx.ts
    pred, lin = jax.linearize(
        lambda e, p, y_: model.observation(_theta(ctx, phi, e), p, ts, y_), eta, params["p"], y)
    basis = jnp.broadcast_to(jnp.eye(q, dtype=eta.dtype)[:, None, :], (q, S, q))
    first = lambda v: jnp.moveaxis(v, -1, 0)
    J = jax.vmap(lin)(basis, jax.tree_util.tree_map(first, params["dp"]), first(sens))
    return pred, jnp.moveaxis(J, 0, -1)


def _terms(ctx, phi, eta, pred, J):
    """Per subject: ``l (S,)``, the exact gradient ``g (S, q)`` and FOCE-I's first-order
    Hessian ``H (S, q, q)`` of ``l`` (the interaction: residual variances at ``pred``)."""
    seen, ys0, q = jnp.asarray(ctx.seen), jnp.asarray(ctx.ys0), ctx.q
    S = eta.shape[0]

    def joint(e, pr):
        th = _theta(ctx, phi, e)
        noise = ctx.model.noise(th, jnp.where(seen, pr, 1.0))
        lp = jnp.where(seen, noise.log_prob(ys0), 0.0)
        var = jnp.broadcast_to(noise.variance, pr.shape)
        return jnp.sum(lp, 1) + ctx.effect_logprob(ctx.model, ctx.data, th, ctx.eff), var

    (l, var), vjp = jax.vjp(joint, eta, pred)
    g_eta, g_pred = vjp((jnp.ones_like(l), jnp.zeros_like(var)))
    g = g_eta + jnp.einsum("skq,sk->sq", J, g_pred)
    w = jnp.where(seen, 1.0 / var, 0.0)
    prior = lambda e: jnp.sum(ctx.effect_logprob(ctx.model, ctx.data, _theta(ctx, phi, e),
                                                 ctx.eff))
    basis = jnp.broadcast_to(jnp.eye(q, dtype=eta.dtype)[:, None, :], (q, S, q))
    P = -jnp.moveaxis(jax.vmap(lambda b: jax.jvp(jax.grad(prior), (eta,), (b,))[1])(basis),
                      0, -1)
    return l, g, jnp.einsum("ski,sk,skj->sij", J, w, J) + P


def evaluate(ctx, phi, eta):
    """``pred, J, l, g, H`` at ``eta (S, q)`` and the mesh: one augmented solve."""
    z0, params, jumps = _inputs(ctx, phi, eta)
    sol = _solve(ctx, z0, params, jumps)
    pred, J = _observe(ctx, phi, eta, params, sol.ys)
    return (pred, J) + _terms(ctx, phi, eta, pred, J) + (sol.mesh,)


def _perturbed(ctx, phi, eta, logdet, mesh):
    """Central differences over ``eta +- STEP e_k`` of ``g`` and ``log det H``, all
    ``2 q`` copies of every subject in one replay of the solve's ``mesh`` at ``eta`` (the
    same steps at every shift, so the differences are smooth in the step): ``(-dg/d eta
    (S, q, q), d log det H / d eta (S, q))``."""
    q = ctx.q
    S = eta.shape[0]
    shifts = [s * STEP * jnp.eye(q, dtype=eta.dtype)[k] for k in range(q) for s in (1.0, -1.0)]
    ins = [_inputs(ctx, phi, eta + h) for h in shifts]
    cat = lambda *xs: jnp.concatenate(xs, 0)
    z0 = cat(*[i[0] for i in ins])
    params = jax.tree_util.tree_map(cat, *[i[1] for i in ins])
    jumps = None if ins[0][2] is None else (cat(*[i[2][0] for i in ins]),
                                            cat(*[i[2][1] for i in ins]))
    tiled = gs.Mesh.concatenate([mesh] * (2 * q))
    ys = jnp.reshape(_solve(ctx, z0, params, jumps, tiled).ys,
                     (2 * q, S) + ctx.ts.shape[1:] + (-1,))
    gs_, lds = [], []
    for j, h in enumerate(shifts):
        e = eta + h
        pj = jax.tree_util.tree_map(lambda v: v[j * S:(j + 1) * S], params)
        pred, J = _observe(ctx, phi, e, pj, ys[j])
        _, g, H = _terms(ctx, phi, e, pred, J)
        gs_.append(g)
        lds.append(logdet(H))
    dg = jnp.stack([(gs_[2 * k] - gs_[2 * k + 1]) / (2 * STEP) for k in range(q)], -1)
    dld = jnp.stack([(lds[2 * k] - lds[2 * k + 1]) / (2 * STEP) for k in range(q)], -1)
    H0 = -0.5 * (dg + jnp.swapaxes(dg, -1, -2))
    return H0, dld


def sensitivity_functions(ctx, unflatten, solve_spd, logdet_spd):
    """`fit_population`'s jitted ``newton_step(u, eta)``, ``objective(u, eta*)`` and
    ``tables(u, eta)`` on the sensitivity route."""
    q = ctx.q

    @jax.jit
    def newton_step(u, eta):
        _, _, _, g, H, _ = evaluate(ctx, unflatten(u), eta)
        step = solve_spd(H, g)
        return eta + step, jnp.max(jnp.abs(step))

    @jax.jit
    def objective(u, eta_star):
        phi = unflatten(u)
        _, _, l, g0, H, mesh = evaluate(ctx, phi, eta_star)
        H0, dld = jax.lax.stop_gradient(_perturbed(ctx, jax.lax.stop_gradient(phi), eta_star,
                                                   logdet_spd, mesh))
        # F = -2 sum(l + q/2 log 2 pi - 1/2 log det H); dF/d eta = -2 (g - 1/2 dld)
        dF = jax.lax.stop_gradient(-2.0 * (g0 - 0.5 * dld))
        shift = solve_spd(H0, g0)                          # carries d eta*/d phi
        F = -2.0 * jnp.sum(l + 0.5 * q * jnp.log(2 * jnp.pi) - 0.5 * logdet_spd(H))
        return F + jnp.sum(dF * shift)

    @jax.jit
    def tables(u, eta):
        phi = unflatten(u)
        pred0 = evaluate(ctx, phi, jnp.zeros_like(eta))[0]
        ipred, J = evaluate(ctx, phi, eta)[:2]
        return pred0, ipred, J

    return newton_step, objective, tables
