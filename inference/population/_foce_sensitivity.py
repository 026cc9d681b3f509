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

NEAR = 0.1  # Gauss-Newton steps below this size switch the search to exact Newton steps
STEP = 1e-5  # central-difference step in eta (the effects are O(1): non-centred)


def sensitivity_refusal(model, data, method: str, theta: dict, eff: str) -> str | None:
    """Why the sensitivity route does not apply (a sentence), or ``None`` where it does:
    the Laplace method (an exact Hessian); resets and steady-state doses, whose restart
    values have the model's shape; and dose schedules whose times or amounts depend on
    the random effects (a lag time or bioavailability with a random effect: the jumps of
    ``S`` would need them), found by a forward derivative at ``theta``, whose random
    effects ``theta[eff]`` should be a generic point (a prior draw)."""
    if method != "foce-i":
        return "method='laplace' needs the exact Hessian of each subject's density"
    if data.observations_after().any():
        return ("observations read the state after the doses at their time, which the "
                "sensitivity solve does not read")

    def schedule(e):
        th = dict(theta, **{eff: e})
        return model.dosing(th, model.individual(th, data), data)[1]

    events = schedule(jnp.asarray(theta[eff]))
    if not isinstance(events, gs.DoseSchedule):
        return None
    S = data.n_subjects
    changes = [c for dose in events.doses for c in dose.changes(S)]
    if any(c.kind in ("restart", "state") or callable(c.values) for c in changes):
        return "the doses include resets or steady states, whose restarts S does not carry"
    e = jnp.asarray(theta[eff])
    _, tangent = jax.jvp(schedule, (e,), (jnp.ones_like(e),))
    if any(np.any(np.asarray(leaf) != 0) for leaf in jax.tree_util.tree_leaves(tangent)):
        return "dose times or amounts depend on the random effects"
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
    """The augmented ensemble's vector field, ``z0 (S, D)``, parameters and jumps at
    ``eta (S, q)``; a dose schedule becomes its plain jumps (and input-rate states after
    the ``d (1 + q)`` augmented ones)."""
    model, data, q = ctx.model, ctx.data, ctx.q
    S = eta.shape[0]

    def parts(e):
        th = _theta(ctx, phi, e)
        p = model.individual(th, data)
        y0, jumps = model.dosing(th, p, data)
        return p, y0, (jumps[1] if isinstance(jumps, tuple) else None)

    (p, y0, sizes), lin = jax.linearize(parts, eta)
    basis = jnp.broadcast_to(jnp.eye(q, dtype=eta.dtype)[:, None, :], (q, S, q))
    dp, dy0, dsizes = jax.vmap(lin)(basis)                       # leading axis q
    last = lambda v: jnp.moveaxis(v, 0, -1)
    d = y0.shape[-1]
    field = _augmented_field(model.vector_field, d, q)
    z0 = jnp.concatenate([y0, jnp.reshape(last(dy0), (S, d * q))], -1)
    params = {"p": p, "dp": jax.tree_util.tree_map(last, dp)}
    events = model.dosing(_theta(ctx, phi, eta), p, data)[1]
    if isinstance(events, gs.DoseSchedule):
        # boluses and input rates change y only: S's equations and values are unchanged
        plan = events.plan(field, model.t0, ctx.t1, z0, params,
                           ts=jnp.asarray(ctx.ts, z0.dtype), options=ctx.solve_kw)
        return plan.f, plan.y0, plan.params, plan.jumps
    jumps = None
    if sizes is not None:
        J = sizes.shape[1]
        jumps = (events[0],
                 jnp.concatenate([sizes, jnp.reshape(last(dsizes), (S, J, d * q))], -1))
    return field, z0, params, jumps


def _solve(ctx, field, z0, params, jumps, mesh=None):
    """The augmented ensemble solve (``ys (n, K, D)`` in its `gs.Solution`), or, given a
    recorded ``mesh`` of as many rows, its replay on that mesh."""
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
    y, sens = ys[..., :d], jnp.reshape(ys[..., d:d * (1 + q)], (S, K, d, q))
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
    field, z0, params, jumps = _inputs(ctx, phi, eta)
    sol = _solve(ctx, field, z0, params, jumps)
    pred, J = _observe(ctx, phi, eta, params, sol.ys)
    return (pred, J) + _terms(ctx, phi, eta, pred, J) + (sol.mesh,)


def _perturbed(ctx, phi, eta, logdet, mesh, base=None):
    """Central differences over ``eta +- STEP e_k`` of ``g`` and ``log det H``, all
    ``2 q`` copies of every subject in one replay of the solve's ``mesh`` at ``eta`` (the
    same steps at every shift, so the differences are smooth in the step): ``(-dg/d eta
    (S, q, q), d log det H / d eta (S, q))``. Given ``base = (g, H)`` at ``eta``, forward
    differences over ``eta + STEP e_k`` instead (``q`` copies; error ``O(STEP)``)."""
    q = ctx.q
    S = eta.shape[0]
    signs = (1.0, -1.0) if base is None else (1.0,)
    shifts = [s * STEP * jnp.eye(q, dtype=eta.dtype)[k] for k in range(q) for s in signs]
    n = len(shifts)
    ins = [_inputs(ctx, phi, eta + h) for h in shifts]
    cat = lambda *xs: jnp.concatenate(xs, 0)
    z0 = cat(*[i[1] for i in ins])
    params = jax.tree_util.tree_map(cat, *[i[2] for i in ins])
    jumps = None if ins[0][3] is None else (cat(*[i[3][0] for i in ins]),
                                            cat(*[i[3][1] for i in ins]))
    if mesh is None:
        # a driver that records no mesh (gs.drivers.Diffrax): the copies solve adaptively
        tiled, sctx = None, ctx._replace(ts=np.tile(ctx.ts, (n,) + (1,) * (ctx.ts.ndim - 1)))
    else:
        tiled, sctx = gs.Mesh.concatenate([mesh] * n), ctx
    ys = jnp.reshape(_solve(sctx, ins[0][0], z0, params, jumps, tiled).ys,
                     (n, S) + ctx.ts.shape[1:] + (-1,))
    gs_, lds = [], []
    for j, h in enumerate(shifts):
        e = eta + h
        pj = jax.tree_util.tree_map(lambda v: v[j * S:(j + 1) * S], params)
        pred, J = _observe(ctx, phi, e, pj, ys[j])
        _, g, H = _terms(ctx, phi, e, pred, J)
        gs_.append(g)
        lds.append(logdet(H))
    if base is None:
        dg = [(gs_[2 * k] - gs_[2 * k + 1]) / (2 * STEP) for k in range(q)]
        dld = [(lds[2 * k] - lds[2 * k + 1]) / (2 * STEP) for k in range(q)]
    else:
        dg = [(gs_[k] - base[0]) / STEP for k in range(q)]
        dld = [(lds[k] - logdet(base[1])) / STEP for k in range(q)]
    dg = jnp.stack(dg, -1)
    return -0.5 * (dg + jnp.swapaxes(dg, -1, -2)), jnp.stack(dld, -1)


def sensitivity_functions(ctx, unflatten, solve_spd, logdet_spd):
    """`fit_population`'s jitted ``newton_step(u, eta) -> (eta + step, l (S,) at eta)``,
    ``objective(u, eta*)`` and ``tables(u, eta)`` on the sensitivity route."""
    q = ctx.q

    @jax.jit
    def newton_step(u, eta):
        # Gauss-Newton (FOCE-I's first-order Hessian, positive definite) while far from the
        # modes; near them Newton with the exact Hessian (forward differences): Gauss-Newton
        # converges linearly, ~24 steps per search on the 200-subject study. A subject whose
        # exact Hessian is not positive definite takes the Gauss-Newton step.
        phi = unflatten(u)
        _, _, l, g, H, mesh = evaluate(ctx, phi, eta)
        first = solve_spd(H, g)

        def exact():
            step = solve_spd(_perturbed(ctx, phi, eta, logdet_spd, mesh, (g, H))[0], g)
            return jnp.where(jnp.all(jnp.isfinite(step), -1, keepdims=True), step, first)

        step = jax.lax.cond(jnp.max(jnp.abs(first)) < NEAR, exact, lambda: first)
        return eta + step, l

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
