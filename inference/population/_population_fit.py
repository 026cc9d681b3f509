"""`fit_population`: maximum likelihood of a population model with its random effects
integrated out by the Laplace approximation at each subject's conditional mode (FOCE-I,
and the Laplace method), as NONMEM, Monolix and nlmixr2 users fit before any posterior.

For subject ``i`` with random effects ``eta_i`` (``q`` of them) and the population
parameters ``phi``, the joint density ``l_i(eta) = log p(y_i | eta, phi) + log p(eta |
phi)``; the marginal likelihood ``L_i = int exp(l_i) d eta`` is approximated at the mode
``eta_i*`` (Laplace; Wolfinger 1993; Wang 2007, "Derivation of various NONMEM estimation
methods", J Pharmacokinet Pharmacodyn 34:575):

    log L_i ~ l_i(eta_i*) + q/2 log(2 pi) - 1/2 log det H_i,   H_i = -d2 l_i / d eta2.

``method="foce-i"`` takes ``H_i`` in its first-order (Gauss–Newton) form, ``J_i' R_i^-1 J_i``
plus the random effects' prior precision, with ``J_i`` the predictions' Jacobian w.r.t.
``eta`` and ``R_i`` the residual variances at the individual predictions (the
interaction); ``method="laplace"`` the exact Hessian. All subjects' conditional modes are
found at once: one ensemble solve gives every subject's predictions, and ``q`` forward-mode
directions give every subject's Jacobian (each subject's predictions depend on its own
``eta`` only). FOCE-I solves the forward sensitivity equations with the states instead,
so that no derivative of a solve is of second order (`inference.population._foce_sensitivity`);
the Laplace method, and doses that the sensitivities cannot carry, differentiate the solve
twice. The outer gradient is exact: the modes' dependence on ``phi`` enters
through one Newton step taken with gradients at the mode (the implicit function theorem;
Almquist et al. 2015, J Pharmacokinet Pharmacodyn 42:191).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.transforms import biject_to

import gradsolve as gs

from .._progress import progress_bar
from ..optimize._scipy import BFGS
from ..problem._problem import TOLERANCES
from ._checks import check_observations, float32_rtol, refuse_start
from ._foce_sensitivity import Context, sensitivity_functions, sensitivity_refusal
from ._sites import _effect_logprob, _effect_site, _sites

__all__ = ["fit_population", "PopulationFit"]

METHODS = ("foce-i", "laplace")
# other spellings users bring: nlmixr2's "focei", NONMEM's "FOCE INTERACTION" and "LAPLACIAN"
ALIASES = {"focei": "foce-i", "foce_i": "foce-i", "foce interaction": "foce-i",
           "laplacian": "laplace"}
GTOL = 1e-6  # the outer optimiser's tolerance on max |gradient| (unconstrained scale)
L_NOISE = 1e-8  # relative falls of l_i the mode search takes for the solve's noise


class PopulationFit(NamedTuple):
    """The result of `fit_population`.

    Attributes:
        params: the population parameters by site name, at the estimate.
        se: their standard errors, the same keys (inverse of half the Hessian of the
            objective, by central differences of its exact gradient; delta method through
            each site's constraint).
        ofv: the objective, ``-2 log L`` with every constant (NONMEM's OFV omits
            ``N log(2 pi)``, ``N`` the observation count: `ofv_nonmem`).
        ofv_nonmem: ``ofv - N log(2 pi)``.
        aic, bic: ``ofv + 2 P`` and ``ofv + P log N`` (``P`` estimated parameters).
        etas: ``(S, q)`` each subject's conditional mode of its random effects.
        shrinkage: ``(q,)`` eta shrinkage, ``1 - sd(eta*) / sd(prior)`` per component.
        condition_number: of the objective's Hessian (on the unconstrained scale).
        pred, ipred: ``(S, K)`` predictions at ``eta = 0`` and at the modes.
        iwres, cwres: ``(S, K)`` individual weighted residuals ``(DV - IPRED) / sqrt(R)``
            and conditional weighted residuals (Hooker et al. 2007); NaN where no DV.
        method: ``"foce-i"`` or ``"laplace"``.
        converged: whether the largest gradient component fell below ``1e-6``: SciPy's
            BFGS reported success, or it stopped on "precision loss" (its line search
            compares values, which jump where a solve's adaptive step count changes) and
            up to 3 Newton steps on the exact gradient, with the standard errors' Hessian,
            got there; `message` says which, `max_gradient` how far.
        n_iterations: outer iterations.
        wall_time: seconds, everything counted.
        message: the outer optimiser's own account of why it stopped.
        max_gradient: the largest component of the objective's gradient at the estimate
            (unconstrained scale): near zero means a stationary point whatever
            `converged` says.
        route: how the solves' derivatives in the random effects were taken:
            ``"sensitivities"`` (FOCE-I: the predictions' Jacobian from the forward
            sensitivity equations solved with the states, every solve derivative first
            order) or ``"second-order"`` (derivatives of the solve itself, second order
            for the Hessians), followed by why where the first does not apply.

    Example:
        >>> res = inference.fit_population(model, data)
        >>> res.params["lCl"], res.se["lCl"], res.ofv, res.shrinkage
    """

    params: dict
    se: dict
    ofv: float
    ofv_nonmem: float
    aic: float
    bic: float
    etas: np.ndarray
    shrinkage: np.ndarray
    condition_number: float
    pred: np.ndarray
    ipred: np.ndarray
    iwres: np.ndarray
    cwres: np.ndarray
    method: str
    converged: bool
    n_iterations: int
    wall_time: float
    message: str = ""
    max_gradient: float = float("nan")
    route: str = ""

    def table(self, data, path=None) -> dict:
        """The fitted data in NONMEM's long form (`inference.population_table`): one row
        per observation or dose of ``data`` (the data set fitted), with ``PRED, IPRED,
        IWRES, CWRES`` and ``ETA1..ETAq``; written as CSV to ``path`` if given."""
        from ._diagnostics import population_table

        return population_table(self, data, path)


def fit_population(
    model,
    data,
    *,
    method: str = "foce-i",
    init: Mapping[str, Any] | None = None,
    rtol: float = TOLERANCES.population_rtol,
    atol: float = TOLERANCES.population_atol,
    solver=None,
    max_iterations: int = 500,
    inner_iterations: int = 50,
    seed: int = 0,
    driver=None,
    progress: bool | None = None,
) -> PopulationFit:
    """Population maximum likelihood, random effects integrated by the Laplace
    approximation at each subject's conditional mode (FOCE-I by default).

    Args:
        model: a `models.PopulationModel` (``latent`` samples the population sites and one
            random-effects site in a ``numpyro.plate("subjects", S)``).
        data: its `models.PopulationDataset`.
        method: ``"foce-i"`` (first-order Hessian with interaction; the noise must be a
            ``numpyro`` ``Normal``) or ``"laplace"`` (the exact Hessian; needed where the
            data have censored observations, fitted by Beal's M3 likelihood). Other tools'
            spellings are taken too: ``"focei"`` (nlmixr2), ``"laplacian"`` (NONMEM).
        init: starting values of the population sites (default: their priors' medians,
            the population sites' priors serving only as starts and supports: they are not
            part of the likelihood).
        rtol, atol, solver, driver: the ODE solve (default
            ``inference.TOLERANCES.population_rtol`` / ``population_atol``, 1e-8 / 1e-10:
            the outer optimiser differentiates an objective that includes a Hessian); ``driver`` as
            ``gs.solve``'s. ``solver`` defaults to the model's, except that FOCE-I on the
            sensitivity route (`PopulationFit.route`) takes ``gs.Vern7()`` for a non-stiff
            model (fewer steps at these tolerances).
        max_iterations: of the outer optimiser (SciPy's BFGS on the unconstrained scale).
        inner_iterations: Newton iterations per conditional-mode search.
        seed: for the draw that reveals the sites' shapes.
        progress: ``None`` (default): a progress bar over the outer iterations when stderr
            is a terminal, else a plain line on stderr about every 30 s (iteration,
            seconds, OFV); ``True``: the bar; ``False``: nothing.

    Float64 (``gs.enable_x64()``) for FOCE-I: in float32 its objective's gradient is
    rounding (theophylline: max |gradient| 0.66 where float64 reaches 4e-8, standard errors
    off by up to 3x), so it refuses float32 at once instead of returning meaningless
    numbers. The Laplace method runs in float32 at the 4-epsilon tolerance floor, with a
    warning (theophylline: within 1e-3 of float64, its gradient stalling near 1e-4).
    Observations outside the noise model's support (a DV <= 0 under LogNormal noise) and
    a start where a subject's likelihood is not finite are refused too, naming the row.

    Returns:
        A `PopulationFit`.

    Example:
        >>> res = inference.fit_population(models.theophylline(),
        ...                                models.load_dataset("theophylline"))
        >>> res.params["lKe"], res.se["lKe"], res.ofv
    """
    if isinstance(method, str):
        method = ALIASES.get(method.strip().lower(), method.strip().lower())
    if method in METHODS:
        rtol = float32_rtol(method, rtol, "inference.fit_population")
    kw = dict(method=method, init=init, rtol=rtol, atol=atol, solver=solver,
              max_iterations=max_iterations, inner_iterations=inner_iterations, seed=seed,
              progress=progress)
    t0 = time.perf_counter()
    gs.ensure_compilation_cache()  # a second fit of the same model compiles nothing
    res = _fit(model, data, driver=driver, **kw)
    return res._replace(wall_time=time.perf_counter() - t0)


class _Problem(NamedTuple):
    """What `_fit` derives once from the model, the data and the starting values."""

    model: Any
    data: Any
    method: str
    draw: dict            # a draw of every latent site (their shapes)
    eff: str              # the random-effects site
    S: int
    q: int                # random effects per subject
    ts: np.ndarray        # (S, K) observation times
    ys: np.ndarray        # (S, K) observations, NaN where missing
    seen: np.ndarray      # (S, K) where an observation is
    cens: np.ndarray      # (S, K) censoring flags (0: a measurement)
    censored: bool        # whether any observation is censored
    ys0: np.ndarray       # (S, K) observations, 0 where missing
    t1: float
    names: list           # the population sites, in the order of the flat vector u
    shapes: dict
    sizes: dict
    bij: dict             # each site's bijection from the unconstrained scale
    u0: np.ndarray        # the start on the unconstrained scale

    def unflatten(self, u):
        """The population sites from the unconstrained flat vector ``u``."""
        out, i = {}, 0
        for k in self.names:
            out[k] = self.bij[k](jnp.reshape(u[i:i + self.sizes[k]], self.shapes[k]))
            i += self.sizes[k]
        return out

    def theta(self, phi, eta):
        """The latent values: population ``phi`` and random effects ``eta (S, q)``."""
        return dict(phi, **{self.eff: jnp.reshape(eta, (self.S,) + self.eta_shape)})

    @property
    def eta_shape(self):
        return tuple(np.shape(self.draw[self.eff])[1:])


def _problem(model, data, method, init, seed) -> _Problem:
    """Validate the arguments and lay out the problem (`_Problem`)."""
    if method not in METHODS:
        raise ValueError(f"inference.fit_population: `method` must be one of {METHODS}, "
                         f"got {method!r}.")
    for name in ("latent_fn", "individual", "dosing", "observation", "noise"):
        if not hasattr(model, name):
            raise TypeError("inference.fit_population: `model` must be a "
                            f"models.PopulationModel (it has no {name!r}).")
    sites, draw = _sites(model, data, jax.random.PRNGKey(seed))
    eff = sites.effects
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    cens = (np.asarray(data.censoring()) if hasattr(data, "censoring")
            else np.zeros(ys.shape, np.int64))
    censored = bool(np.any(cens[seen] != 0))
    if censored and method == "foce-i":
        raise ValueError(
            "inference.fit_population: the data have censored observations (CENS 1/-1, "
            "Beal's M3 likelihood), whose log-likelihood is not a Normal density: FOCE-I's "
            "first-order Hessian does not apply to them; use method='laplace' (as NONMEM "
            "needs LAPLACIAN for M3).")
    names = list(sites.population)
    shapes = {k: np.shape(draw[k]) for k in names}
    bij = {k: biject_to(sites.population[k].support) for k in names}
    start = dict(init) if init is not None else {}
    for k in names:
        if k not in start:
            start[k] = np.asarray(_median(sites.population[k]), float)
        start[k] = np.broadcast_to(np.asarray(start[k], float), shapes[k])
    u0 = np.concatenate([np.ravel(np.asarray(bij[k].inv(jnp.asarray(start[k])))) for k in names])
    pb = _Problem(
        model=model, data=data, method=method, draw=draw, eff=eff, S=data.n_subjects,
        q=int(np.prod(np.shape(draw[eff])[1:])), ts=ts, ys=ys, seen=seen, cens=cens,
        censored=censored, ys0=np.where(seen, ys, 0.0), t1=float(np.max(ts)), names=names,
        shapes=shapes, sizes={k: int(np.prod(shapes[k])) for k in names}, bij=bij, u0=u0)
    probe = model.noise(dict(pb.unflatten(jnp.asarray(u0)), **{eff: draw[eff]}),
                        jnp.ones(ys.shape))
    check_observations(probe, data, ys, seen, cens, "inference.fit_population")
    if method == "foce-i":
        if not isinstance(probe, dist.Normal):
            raise ValueError("inference.fit_population: method='foce-i' needs a Normal noise "
                             f"model (got {type(probe).__name__}); use method='laplace'.")
    return pb


def _second_order_functions(pb: _Problem, solve_kw: dict):
    """The jitted ``newton_step(u, eta) -> (eta + step, l (S,) at eta)``, ``objective(u,
    eta*)`` and ``tables(u, eta)`` of the second-order route: every derivative in the random
    effects taken through the solve by JAX (second derivatives of the solve)."""
    model, data, eff, S, q, seen = pb.model, pb.data, pb.eff, pb.S, pb.q, pb.seen
    ys0 = jnp.asarray(pb.ys0)
    after = data.observations_after() if data.observations_after().any() else None
    solved = model.solved_at_t0(data)

    def predictions(phi, eta):
        theta = pb.theta(phi, eta)
        p = model.individual(theta, data)
        y0, jumps = model.dosing(theta, p, data)
        events = {"doses": jumps} if isinstance(jumps, gs.DoseSchedule) else {"jumps": jumps}
        sol = gs.solve(model.vector_field, model.t0, pb.t1, y0, p,
                       ts=jnp.asarray(pb.ts, y0.dtype), throw=False, **solve_kw, **events,
                       ts_after=after)
        return model.observation(theta, p, pb.ts, sol.ys, as_solved=solved), theta

    def joint(phi, eta):
        """``(S,)`` per-subject ``l_i``, the predictions and the residual variances."""
        pred, theta = predictions(phi, eta)
        fill = jnp.where(seen, pred, 1.0)
        noise = model.noise(theta, fill)
        # censored entries: the model's own M3 likelihood (`observations`), entry by entry
        lp = jnp.where(seen, model.observations(theta, fill, pb.cens).entry_log_prob(ys0)
                       if pb.censored else noise.log_prob(ys0), 0.0)
        var = jnp.broadcast_to(noise.variance, pred.shape) if pb.method == "foce-i" else None
        return jnp.sum(lp, axis=1) + _effect_logprob(model, data, theta, eff), pred, var

    def curvature(phi, eta, exact=False):
        """``(S, q, q)`` ``H_i`` (first-order or exact), ``(S, q)`` the gradient and
        ``(S,)`` ``l_i``."""
        total = lambda e: jnp.sum(joint(phi, e)[0])
        l, vjp = jax.vjp(lambda e: joint(phi, e)[0], eta)
        g = vjp(jnp.ones_like(l))[0]
        # The q directions batched (vmap), not unrolled: one traced copy of the solve's
        # derivative in the compiled program instead of q (its compile time dominates).
        basis = jnp.broadcast_to(jnp.eye(q)[:, None, :], (q, S, q))
        hvp = lambda fn: jax.vmap(lambda b: jax.jvp(jax.grad(fn), (eta,), (b,))[1])(basis)
        if pb.method == "laplace" or exact:
            return -jnp.moveaxis(hvp(total), 0, -1), g, l
        # one solve for the predictions and residual variances, q tangents of it
        (_, var), tangent = jax.linearize(lambda e: joint(phi, e)[1:], eta)
        J = jnp.moveaxis(jax.vmap(lambda b: tangent(b)[0])(basis), 0, -1)  # (S, K, q)
        w = jnp.where(seen, 1.0 / var, 0.0)
        prior = lambda e: jnp.sum(_effect_logprob(model, data, pb.theta(phi, e), eff))
        P = -jnp.moveaxis(hvp(prior), 0, -1)
        return jnp.einsum("ski,sk,skj->sij", J, w, J) + P, g, l

    @jax.jit
    def newton_step(u, eta):
        H, g, l = curvature(pb.unflatten(u), eta)
        return eta + _solve_spd(H, g), l

    @jax.jit
    def objective(u, eta_star):
        """``-2 log L`` at ``u`` given the modes ``eta_star`` (exact gradient in ``u``)."""
        phi = pb.unflatten(u)
        # the modes' derivative by the implicit function theorem needs the exact Hessian of
        # l_i, whatever form the objective's log det takes
        H0, g0, _ = curvature(phi, eta_star, exact=True)
        H0 = jax.lax.stop_gradient(H0)
        eta = eta_star + _solve_spd(H0, g0)  # carries d eta*/d phi
        H, _, _ = curvature(phi, eta)
        l, _, _ = joint(phi, eta)
        logdet = _logdet_spd(H)
        return -2.0 * jnp.sum(l + 0.5 * q * jnp.log(2 * jnp.pi) - 0.5 * logdet)

    @jax.jit
    def tables(u, eta):
        """PRED, IPRED and IPRED's ``(S, K, q)`` derivative in the modes, one program."""
        phi = pb.unflatten(u)
        pred0 = predictions(phi, jnp.zeros((S, q)))[0]
        ipred, tangent = jax.linearize(lambda e: predictions(phi, e)[0], eta)
        basis = jnp.broadcast_to(jnp.eye(q)[:, None, :], (q, S, q))
        return pred0, ipred, jnp.moveaxis(jax.vmap(tangent)(basis), 0, -1)

    return newton_step, objective, tables


class _Objective(NamedTuple):
    """The population objective `_objective` builds for a laid-out problem."""

    fun: Any              # u -> (OFV, gradient (P,)) with the modes re-found (numpy)
    modes: Any            # u -> eta* (S, q), warm-started at the last modes found
    value_and_grad: Any   # (u, eta*) -> (OFV, gradient), jitted
    tables: Any           # (u, eta) -> PRED, IPRED, d IPRED / d eta
    route: str


def _objective(pb: _Problem, *, rtol, atol, solver, inner_iterations, driver) -> _Objective:
    """The objective ``-2 log L`` of the unconstrained population vector ``u`` (the modes
    found inside), on the sensitivity route where it applies (`PopulationFit.route`)."""
    model, data = pb.model, pb.data
    default_solver = solver is None
    solver = model.solver if solver is None else solver
    refusal = sensitivity_refusal(model, data, pb.method, dict(
        pb.unflatten(jnp.asarray(pb.u0)), **{pb.eff: pb.draw[pb.eff]}), pb.eff)
    route = "sensitivities" if refusal is None else f"second-order ({refusal})"
    if refusal is None:
        # exact Newton steps (quadratic): after a step of 1e-7 the error is ~1e-12
        inner_tol = 1e-7
        if default_solver and not model.stiff:
            # at these tolerances Verner's 7th-order pair takes ~3x fewer steps than Tsit5
            # (230 against 635 per subject on the simulated two-compartment study)
            solver = gs.Vern7()
        ctx = Context(model, data, pb.eff, pb.eta_shape, pb.q, np.asarray(pb.ts), pb.ys0,
                      pb.seen, pb.t1, dict(solver=solver, rtol=rtol, atol=atol, driver=driver),
                      _effect_logprob)
        newton_step, objective, tables = sensitivity_functions(ctx, pb.unflatten, _solve_spd,
                                                               _logdet_spd)
    else:
        inner_tol = 1e-9  # the last step's size: Gauss-Newton converges linearly
        newton_step, objective, tables = _second_order_functions(
            pb, dict(solver=solver, rtol=rtol, atol=atol, driver=driver))
    value_and_grad = jax.jit(jax.value_and_grad(objective))
    modes = _warm_started_modes(newton_step, pb.S, pb.q, inner_iterations, inner_tol)

    def fun(u):
        eta = modes(u)
        v, g = value_and_grad(jnp.asarray(u), eta)
        v, g = float(v), np.asarray(g, float)
        if not np.isfinite(v) or not np.all(np.isfinite(g)):
            return 1e300, np.zeros_like(g)
        return v, g

    return _Objective(fun, modes, value_and_grad, tables, route)


def _fit(model, data, *, method, init, rtol, atol, solver, max_iterations, inner_iterations,
         seed, driver, progress=False) -> PopulationFit:
    t_start = time.perf_counter()
    pb = _problem(model, data, method, init, seed)
    fun, modes, value_and_grad, tables, route = _objective(
        pb, rtol=rtol, atol=atol, solver=solver, inner_iterations=inner_iterations,
        driver=driver)
    start = fun(pb.u0)
    if not start[0] < 1e300:  # no conditional modes at the start: say where, not BFGS
        refuse_start(pb, "inference.fit_population")
    bar = progress_bar(progress, total=int(max_iterations), done=0, every=1,
                       desc=f"fit_population {model.name} ({method})")

    def iteration(intermediate_result):  # SciPy passes the accepted point by this name
        bar.set_postfix(ofv=f"{intermediate_result.fun:.6g}")
        bar.update(1)

    try:
        res = BFGS(int(max_iterations), gtol=GTOL).run(_first_known(fun, pb.u0, start),
                                                       pb.u0, callback=iteration)
    finally:
        bar.close()
    u_hat, converged, message = res.x, bool(res.success), str(res.message)
    eta_hat = modes(u_hat)
    ofv, g_hat = value_and_grad(jnp.asarray(u_hat), eta_hat)  # no second compile
    Hm = _objective_hessian(fun, u_hat)
    if not converged:
        # BFGS's line search compares values, which jump where a solve's step count changes
        # (each evaluation adapts its own mesh: sd 2e-11 with Vern7 at rtol 1e-8 on the
        # 200-subject study, 1e-13 with Tsit5); Newton steps on the gradient compare none
        u_new, g_new = _newton_polish(fun, u_hat, np.asarray(g_hat), Hm)
        if np.max(np.abs(g_new)) < GTOL:
            converged = True
            message += (" Newton steps on the exact gradient then brought max |gradient| "
                        f"below {GTOL:g}.")
        if u_new is not u_hat:
            u_hat = u_new
            eta_hat = modes(u_hat)
            ofv, g_hat = value_and_grad(jnp.asarray(u_hat), eta_hat)
    ofv, max_gradient = float(ofv), float(np.max(np.abs(np.asarray(g_hat))))
    se = _standard_errors(pb, Hm, u_hat)
    eig = np.linalg.eigvalsh(Hm)
    P = u_hat.size
    n_obs = int(pb.seen.sum())
    out = _residual_tables(pb, tables, u_hat, eta_hat)
    return PopulationFit(
        params={k: np.asarray(v) for k, v in pb.unflatten(jnp.asarray(u_hat)).items()},
        se=se, ofv=ofv, ofv_nonmem=ofv - out.pop("n_exact") * np.log(2 * np.pi),
        aic=ofv + 2 * P, bic=ofv + P * np.log(n_obs),
        condition_number=float(eig.max() / eig.min()) if eig.min() > 0 else float("inf"),
        method=method, converged=converged, n_iterations=int(res.nit),
        wall_time=time.perf_counter() - t_start, message=message,
        max_gradient=max_gradient, route=route, **out)


def _first_known(fun, u0, value):
    """``fun`` with its known ``value`` at ``u0`` given once without evaluating it again
    (the optimiser's first call)."""
    known = {np.asarray(u0, float).tobytes(): value}

    def cached(u):
        hit = known.pop(np.asarray(u, float).tobytes(), None)
        return hit if hit is not None else fun(u)

    return cached


def _warm_started_modes(newton_step, S, q, iterations, tol):
    """``modes(u) -> eta* (S, q)``: `_mode_search` warm-started at the last modes found
    (from the prior mode where ``l`` is not finite there); NaN modes (the objective
    non-finite) where neither start finds them."""
    state = {"eta": jnp.zeros((S, q))}

    def modes(u):
        u = jnp.asarray(u)
        eta = _mode_search(newton_step, u, state["eta"], iterations, tol)
        if eta is None:  # restart from the prior mode
            eta = _mode_search(newton_step, u, jnp.zeros((S, q)), iterations, tol)
        if eta is None:  # from the prior mode too: no modes here (the objective NaN)
            return jnp.full((S, q), jnp.nan)
        state["eta"] = eta
        return eta

    modes.state = state  # the warm start, which a caller continuing a path may set
    return modes


def _objective_hessian(fun, u):
    """``(P, P)`` the objective's Hessian on the unconstrained scale at ``u``: central
    differences of its exact gradient ``fun(u)[1]``, symmetrised."""
    P = u.size
    Hm = np.zeros((P, P))
    for j in range(P):
        h = 1e-4 * max(1.0, abs(u[j]))
        up, dn = u.copy(), u.copy()
        up[j] += h
        dn[j] -= h
        Hm[:, j] = (fun(up)[1] - fun(dn)[1]) / (2 * h)
    return 0.5 * (Hm + Hm.T)


def _newton_polish(fun, u, g, Hm, steps=3):
    """Up to ``steps`` Newton steps ``u <- u - H^+ g`` on the exact gradient ``fun(u)[1]``
    with the Hessian ``Hm`` held, each kept only where it lowers ``max |g|``; ``H^+`` drops
    the eigenvalues below ``1e-10`` of the largest (a variance at its zero bound has no
    curvature left). Returns ``(u, g)``; ``u`` the same object where no step was kept."""
    w, V = np.linalg.eigh(Hm)
    keep = w > 1e-10 * w.max()
    for _ in range(steps):
        if np.max(np.abs(g)) < GTOL:
            break
        trial = u - (V[:, keep] / w[keep]) @ (V[:, keep].T @ g)
        g_new = np.asarray(fun(trial)[1])
        if not np.max(np.abs(g_new)) < np.max(np.abs(g)):
            break
        u, g = trial, g_new
    return u, g


def _standard_errors(pb: _Problem, Hm, u_hat):
    """The population sites' standard errors (dict, the sites' shapes) from the objective's
    Hessian ``Hm`` on the unconstrained scale: the covariance ``2 H^-1`` carried through each
    site's constraint by the delta method."""
    cov_u = 2.0 * np.linalg.inv(Hm)
    jac = np.asarray(jax.jacfwd(lambda u: jnp.concatenate(
        [jnp.ravel(v) for v in pb.unflatten(u).values()]))(jnp.asarray(u_hat)))
    se_flat = np.sqrt(np.maximum(np.diag(jac @ cov_u @ jac.T), 0.0))
    se, i = {}, 0
    for k in pb.names:
        se[k] = se_flat[i:i + pb.sizes[k]].reshape(pb.shapes[k])
        i += pb.sizes[k]
    return se


def _residual_tables(pb: _Problem, tables, u_hat, eta_hat) -> dict:
    """`PopulationFit`'s per-observation tables at the estimate (PRED, IPRED, IWRES, CWRES),
    the modes, their shrinkage, and ``n_exact`` the count of uncensored observations."""
    model, data, S, q, seen = pb.model, pb.data, pb.S, pb.q, pb.seen
    pred0, ipred, J_hat = (np.asarray(a) for a in tables(jnp.asarray(u_hat), eta_hat))
    theta_hat = pb.theta(pb.unflatten(jnp.asarray(u_hat)), eta_hat)
    noise = model.noise(theta_hat, jnp.where(seen, ipred, 1.0))
    var = np.broadcast_to(np.asarray(noise.variance), pb.ys.shape)
    exact = seen & (pb.cens == 0)  # censored rows carry a limit, not a measurement
    iwres = np.where(exact, (pb.ys0 - ipred) / np.sqrt(var), np.nan)
    prior_var = np.asarray(jnp.broadcast_to(
        _effect_site(model, data, theta_hat, pb.eff)["fn"].variance, (S,) + pb.eta_shape)
    ).reshape(S, q)
    cwres = _cwres(J_hat, eta_hat, ipred, var, pb.ys0, exact, prior_var)
    etas = np.asarray(eta_hat)
    shrink = 1.0 - np.std(etas, axis=0, ddof=1) / np.sqrt(prior_var[0])
    # the 2 pi constant comes with densities only, not with censored entries' M3 terms
    return dict(etas=etas, shrinkage=shrink, pred=np.where(seen, pred0, np.nan),
                ipred=np.where(seen, ipred, np.nan), iwres=iwres, cwres=cwres,
                n_exact=int(exact.sum()))


def _mode_search(newton_step, u, eta, iterations, tol):
    """Each subject's conditional mode of ``l_i`` from ``eta (S, q)``: the steps that
    ``newton_step(u, eta) -> (eta + step, l_i(eta))`` proposes, each subject's step halved
    back towards its last accepted point while it lowers ``l_i`` (or makes it non-finite):
    a backtracking line search (Nocedal & Wright, Numerical Optimization, 2nd ed., 2006,
    Algorithm 3.1), one trial per subject per call, so every subject's searches share one
    ensemble solve. An undamped step can cycle between two points forever where ``l_i`` has
    two modes (a ``ka``/``ke`` flip-flop). Stops when every subject's last trial was
    accepted and its next step is below ``tol``; returns the modes ``(S, q)`` (after
    ``iterations`` calls, the points reached), or ``None`` where ``l`` is not finite at the
    start."""
    eta = jnp.asarray(eta)
    base = base_l = None
    for _ in range(iterations):
        proposal, l = (np.asarray(a) for a in newton_step(u, eta))
        trial = np.asarray(eta)
        finite = np.isfinite(l) & np.all(np.isfinite(proposal), axis=1)
        if base is None:
            if not np.all(finite):
                return None
            base, base_l, ok = trial, l, finite
        else:
            # a rise, or a fall within the solve's noise in l, is accepted
            ok = finite & (l >= base_l - L_NOISE * (1.0 + np.abs(base_l)))
        base = np.where(ok[:, None], trial, base)
        base_l = np.where(ok, l, base_l)
        back = base + 0.5 * (trial - base)
        nxt = np.where(ok[:, None], proposal, back)
        # a rejected step already below tol: the subject stays at its last accepted point
        settled = ~ok & (np.max(np.abs(trial - base), axis=1) < tol)
        nxt = np.where(settled[:, None], base, nxt)
        eta = jnp.asarray(nxt)
        if np.all(ok | settled) and np.all(np.max(np.abs(nxt - trial), axis=1)[ok] < tol):
            break
    return eta


def _cholesky_small(A):
    """Lower Cholesky factors of ``(..., q, q)`` symmetric positive definite matrices,
    unrolled in ``q``: plain arithmetic instead of a LAPACK call, which failed to resolve
    ("no registered implementation for untyped custom call") when compiled into one program
    with gradsolve's kernel. A matrix that is not positive definite gives NaN."""
    q = A.shape[-1]
    L = [[None] * q for _ in range(q)]
    for j in range(q):
        s = A[..., j, j] - sum(L[j][k] ** 2 for k in range(j))
        L[j][j] = jnp.sqrt(s)
        for i in range(j + 1, q):
            L[i][j] = (A[..., i, j] - sum(L[i][k] * L[j][k] for k in range(j))) / L[j][j]
    zero = jnp.zeros_like(A[..., 0, 0])
    return jnp.stack([jnp.stack([L[i][j] if L[i][j] is not None else zero
                                 for j in range(q)], -1) for i in range(q)], -2)


def _solve_spd(A, b):
    """``A^-1 b`` for ``(..., q, q)`` positive definite ``A`` and ``(..., q)`` ``b``."""
    L = _cholesky_small(A)
    q = A.shape[-1]
    y = []
    for i in range(q):
        y.append((b[..., i] - sum(L[..., i, k] * y[k] for k in range(i))) / L[..., i, i])
    x = [None] * q
    for i in reversed(range(q)):
        x[i] = (y[i] - sum(L[..., k, i] * x[k] for k in range(i + 1, q))) / L[..., i, i]
    return jnp.stack(x, -1)


def _logdet_spd(A):
    """``log det A`` of ``(..., q, q)`` positive definite matrices."""
    L = _cholesky_small(A)
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1)


def _median(d):
    """A start for a population site: its prior's median where NumPyro knows it (or the
    mean, or ones inside a positive support)."""
    for attr in ("median", "mean"):
        try:
            v = np.asarray(getattr(d, attr))
            if np.all(np.isfinite(v)):
                return v
        except (NotImplementedError, AttributeError):
            pass
    return np.ones(d.batch_shape + d.event_shape)



def _cwres(J, eta, ipred, var, ys, seen, prior_var):
    """Conditional weighted residuals: ``C^-1/2 (y - E y)`` with ``E y = f(eta*) - J eta*``
    and ``C = J Omega J' + R`` (``J (S, K, q)`` the predictions' derivative in the modes,
    ``Omega`` the random effects' prior variances), per subject (``C^-1/2`` by Cholesky)."""
    S, q = prior_var.shape
    out = np.full(ys.shape, np.nan)
    e = np.asarray(eta)
    for i in range(S):
        m = seen[i]
        Ji = J[i][m]
        mean = ipred[i][m] - Ji @ e[i]
        C = Ji @ np.diag(prior_var[i]) @ Ji.T + np.diag(var[i][m])
        L = np.linalg.cholesky(C)
        out[i, m] = np.linalg.solve(L, ys[i][m] - mean)
    return out
