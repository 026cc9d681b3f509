"""Does the simulated 200-subject two-compartment study recover its truth? The EXACT marginal
likelihood ``sum_i log int p(y_i | eta) N(eta; 0, I) d eta`` by importance sampling, against
FOCE-I and Laplace, at the truth and at the exact maximum-likelihood estimate, for
`models.simulated_study` seeds.

Everything here is independent of `inference.fit_population`: the concentrations are the
closed-form two-compartment oral solution (superposition of the unit-dose response, Gibaldi
and Perrier, Pharmacokinetics, 2nd ed., 1982; checked against SciPy ``solve_ivp`` and against
``model.predict`` below), the design is re-drawn from `simulated_study`'s description and
compared with the data set, the conditional modes are a damped Newton from 7 starts, and the
importance sampler draws per subject from a defensive mixture (Hesterberg 1995): 75% a
multivariate t (4 df) at the mode with 1.5^2 times the inverse Hessian, 25% the prior
``N(0, I)``. Monte Carlo standard errors by the delta method on the weights. The exact
maximum-likelihood estimate maximises the IS estimate on fixed draws (L-BFGS), re-centring the
proposal at the current modes between rounds; its standard errors invert the Hessian of
``-log L`` (``omega`` of ka, at its zero boundary, held).

    python benchmarks/foce_recovery.py                  # seed 0 (the study bench_foce.py fits)
    python benchmarks/foce_recovery.py --seeds 1 2 3    # other seeds (8-16 min each, 2 cores)
    python benchmarks/foce_recovery.py --draws 8000     # more draws per subject
    python benchmarks/foce_recovery.py --subjects 20 --draws 500   # a 2-minute smoke run
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.scipy.special import gammaln, logsumexp  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402
from scipy.optimize import minimize  # noqa: E402
from scipy.stats import chi2  # noqa: E402

import models  # noqa: E402

NAMES = ("lKa", "lCl", "lV1", "lQ", "lV2")
LOG2PI = math.log(2 * math.pi)
PER_SUBJECT = ("wt", "ts", "ys", "mask")          # the study's arrays with a subject axis
SHARED = ("dose_t", "dose_a")                      # the same for every subject


def design(S, seed):
    """The design of models.simulated_study, re-drawn here from its description (NumPy rng
    calls in the same order): (wt (S,), [obs times])."""
    rng = np.random.default_rng(seed)
    dose_times = 12.0 * np.arange(6)
    wts, obs = [], []
    for _ in range(S):
        wts.append(float(np.round(np.clip(rng.normal(70.0, 15.0), 40.0, 120.0), 1)))
        k = int(rng.integers(4, 7))
        o = np.sort(np.round(rng.uniform(0.25, 72.0, size=k), 2))
        obs.append(np.where(np.isin(o, dose_times), o + 0.05, o))
    return np.array(wts), obs


def study(S=200, seed=0):
    """The simulated study as plain arrays, checked against the design: dict with ts, ys,
    mask (S, K), wt (S,), dose times/amounts (6,), truth (population dict), eta_true."""
    data, truth = models.simulated_study(n_subjects=S, seed=seed)
    ts, ys = data.observations()
    wt = data.covariate("WT")
    wt_d, obs_d = design(S, seed)
    assert np.array_equal(wt, wt_d), "WT differs from the design"
    for i, s in enumerate(data.subjects):
        assert np.array_equal(s.ts, obs_d[i]), f"obs times of subject {i} differ"
        assert np.array_equal(s.dose_times, 12.0 * np.arange(6)), i
        assert np.array_equal(s.dose_amounts, np.full(6, 100.0)), i
        assert np.array_equal(s.dose_cmt, np.zeros(6, int)), i   # the gut, state 0
    mask = ~np.isnan(ys)
    pop = {k: float(v) for k, v in models.TWO_COMPARTMENT_TRUTH.items() if k != "omega"}
    pop["omega"] = np.array(models.TWO_COMPARTMENT_TRUTH["omega"], float)
    return dict(ts=ts, ys=np.where(mask, ys, 0.0), mask=mask, wt=wt,
                dose_t=12.0 * np.arange(6), dose_a=np.full(6, 100.0), truth=pop,
                eta_true=np.asarray(truth["eta"]), data=data)


def conc(phi, eta, wt, ts, dose_t, dose_a):
    """Closed-form concentration (superposition of the two-compartment oral unit
    response; Gibaldi & Perrier). eta (..., 3), wt (...), ts (..., K) -> (..., K)."""
    om = jnp.asarray(phi["omega"])
    ka = jnp.exp(phi["lKa"] + om[0] * eta[..., 0])
    cl = jnp.exp(phi["lCl"] + om[1] * eta[..., 1]) * (wt / 70.0) ** 0.75
    v1 = jnp.exp(phi["lV1"] + om[2] * eta[..., 2])
    q, v2 = jnp.exp(phi["lQ"]), jnp.exp(phi["lV2"])
    k10, k12, k21 = cl / v1, q / v1, q / v2
    ssum, prod = k10 + k12 + k21, k10 * k21
    a = 0.5 * (ssum + jnp.sqrt(ssum ** 2 - 4 * prod))
    b = prod / a
    # keep ka off the macro-constants (a removable singularity; 1e-7 relative changes the
    # concentration by ~1e-7 relative, far below the noise)
    tiny = 1e-7
    ka = jnp.where(jnp.abs(ka - a) < tiny * a, a * (1 + 2 * tiny), ka)
    ka = jnp.where(jnp.abs(ka - b) < tiny * b, b * (1 + 2 * tiny), ka)
    ca = (k21 - a) / ((ka - a) * (b - a))
    cb = (k21 - b) / ((ka - b) * (a - b))
    ck = (k21 - ka) / ((a - ka) * (b - ka))
    s = ts[..., :, None] - dose_t                                  # (..., K, J)
    after = s > 0
    s = jnp.where(after, s, 0.0)
    ex = lambda r: jnp.exp(-r[..., None, None] * s)
    g = ka[..., None, None] * (ca[..., None, None] * ex(a) + cb[..., None, None] * ex(b)
                               + ck[..., None, None] * ex(ka))
    return jnp.sum(jnp.where(after, dose_a * g, 0.0), -1) / v1[..., None]


def loglik(phi, eta, wt, ts, ys, mask, dose_t, dose_a):
    """log p(y | eta, phi) (...,): Normal(c, sigma_add + sigma_prop |c|)."""
    c = conc(phi, eta, wt, ts, dose_t, dose_a)
    sd = phi["sigma_add"] + phi["sigma_prop"] * jnp.abs(c)
    lp = -0.5 * ((ys - c) / sd) ** 2 - jnp.log(sd) - 0.5 * LOG2PI
    return jnp.sum(jnp.where(mask, lp, 0.0), -1)


def joint(phi, eta, st):
    """l_i(eta) = log p(y_i|eta) + log N(eta; 0, I); eta (S, ..., 3)."""
    extra = eta.ndim - 2
    ex = lambda x: x.reshape(x.shape[:1] + (1,) * extra + x.shape[1:])
    ll = loglik(phi, eta, ex(st["wt"]), ex(st["ts"]), ex(st["ys"]), ex(st["mask"]),
                st["dose_t"], st["dose_a"])
    return ll + jnp.sum(-0.5 * eta ** 2 - 0.5 * LOG2PI, -1)


def _arrays(st):
    """The study's arrays that the likelihood reads, as JAX arrays."""
    return {k: jnp.asarray(st[k]) for k in PER_SUBJECT + SHARED}


def _rows(arr, rows):
    """``arr`` restricted to the subjects ``rows`` (an index or a slice)."""
    return {k: (v[rows] if k in PER_SUBJECT else v) for k, v in arr.items()}


@functools.partial(jax.jit, static_argnames="iters")
def _newton_modes(phi, arr, iters):
    """Damped Newton on ``-l_i`` from 7 starts (0 and +-1.5 on each axis) for every subject:
    ``(eta (S, 7, 3), -l_i (S, 7), Hessian (S, 7, 3, 3))``. The step uses the Hessian's
    eigenvalues' absolute values (floored at 1e-3), halved up to 9 times to a decrease."""
    starts = jnp.concatenate([jnp.zeros((1, 3)), 1.5 * jnp.eye(3), -1.5 * jnp.eye(3)])

    def newton(eta0, sub):
        one = {k: (v[None] if k in PER_SUBJECT else v) for k, v in sub.items()}
        f = lambda e: -joint(phi, e[None], one)[0]
        g_f, h_f = jax.grad(f), jax.hessian(f)

        def body(eta, _):
            w, V = jnp.linalg.eigh(h_f(eta))
            step = -(V / jnp.maximum(jnp.abs(w), 1e-3)) @ (V.T @ g_f(eta))
            cand = eta + 0.5 ** jnp.arange(10)[:, None] * step
            vals = jax.vmap(f)(cand)
            vals = jnp.where(jnp.isfinite(vals), vals, jnp.inf)
            j = jnp.argmin(vals)
            return jnp.where(vals[j] < f(eta), cand[j], eta), None

        eta, _ = jax.lax.scan(body, eta0, None, length=iters)
        return eta, f(eta), h_f(eta)

    axes = {k: (0 if k in PER_SUBJECT else None) for k in arr}
    return jax.vmap(jax.vmap(newton, in_axes=(0, None)), in_axes=(None, axes))(starts, arr)


def modes(phi, st, iters=60):
    """Every subject's conditional mode (S, 3), the exact Hessian -d2 l/d eta2 there
    (S, 3, 3), and how far the 7 starts' end points spread (S,): the best of 7 Newton
    searches (`_newton_modes`)."""
    eta, val, H = _newton_modes(phi, _arrays(st), iters)
    best = jnp.argmin(val, axis=1)
    S = eta.shape[0]
    take = lambda x: jnp.take_along_axis(x, best.reshape((S,) + (1,) * (x.ndim - 1)), 1)[:, 0]
    spread = jnp.max(jnp.abs(eta - take(eta)[:, None]), axis=(1, 2))
    return take(eta), take(H), np.asarray(spread)


def laplace_objectives(phi, st, eta_hat, H):
    """-2 log L by the Laplace approximation (exact Hessian) and by FOCE-I (first-order
    Hessian J' R^-1 J + I), independent of inference.fit_population."""
    arr = _arrays(st)
    l = joint(phi, eta_hat, arr)
    def pred_i(e, i):
        return conc(phi, e, arr["wt"][i], arr["ts"][i], arr["dose_t"], arr["dose_a"])
    J = jax.vmap(lambda e, i: jax.jacfwd(pred_i)(e, i))(eta_hat, jnp.arange(eta_hat.shape[0]))
    c = conc(phi, eta_hat, arr["wt"], arr["ts"], arr["dose_t"], arr["dose_a"])
    var = (phi["sigma_add"] + phi["sigma_prop"] * jnp.abs(c)) ** 2
    w = jnp.where(arr["mask"], 1.0 / var, 0.0)
    Hf = jnp.einsum("ski,sk,skj->sij", J, w, J) + jnp.eye(3)
    lap = l + 1.5 * LOG2PI - 0.5 * jnp.linalg.slogdet(H)[1]
    foce = l + 1.5 * LOG2PI - 0.5 * jnp.linalg.slogdet(Hf)[1]
    return np.asarray(-2 * lap), np.asarray(-2 * foce)


def proposal(eta_hat, H, key, n, df=4.0, scale=1.5, prior_frac=0.25):
    """Draws (S, n, 3) from the defensive mixture (1 - prior_frac) t_df(mode, scale^2 H^-1)
    + prior_frac N(0, I), and their log proposal density."""
    S = eta_hat.shape[0]
    cov = scale ** 2 * jnp.linalg.inv(H)
    L = jnp.linalg.cholesky(cov)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    z = jax.random.normal(k1, (S, n, 3))
    chi = jax.random.chisquare(k2, df, (S, n, 1))
    t = eta_hat[:, None] + jnp.einsum("sij,snj->sni", L, z) * jnp.sqrt(df / chi)
    prior = jax.random.normal(k3, (S, n, 3))
    use_prior = jax.random.uniform(k4, (S, n, 1)) < prior_frac
    x = jnp.where(use_prior, prior, t)
    Linv = jnp.linalg.inv(L)
    r = jnp.einsum("sij,snj->sni", Linv, x - eta_hat[:, None])
    m = jnp.sum(r ** 2, -1)
    logdetL = jnp.sum(jnp.log(jnp.diagonal(L, axis1=1, axis2=2)), -1)[:, None]
    lt = (gammaln((df + 3) / 2) - gammaln(df / 2) - 1.5 * jnp.log(df * jnp.pi) - logdetL
          - (df + 3) / 2 * jnp.log1p(m / df))
    lp = jnp.sum(-0.5 * x ** 2 - 0.5 * LOG2PI, -1)
    lq = jnp.logaddexp(jnp.log1p(-prior_frac) + lt, jnp.log(prior_frac) + lp)
    return x, lq


@jax.jit
def _log_weights(phi, x, lq, arr):
    """log p(y_i, x_ik | phi) - log q(x_ik): (S, n)."""
    return joint(phi, x, arr) - lq


def is_loglik(phi, st, x, lq, chunk=25):
    """Per-subject log marginal likelihood by IS (S,), its Monte Carlo SE (delta method on
    the weights) and the weights' effective sample size; ``chunk`` subjects at a time."""
    arr = _arrays(st)
    S, n = x.shape[:2]
    out, se, ess = [], [], []
    for a in range(0, S, chunk):
        rows = slice(a, a + chunk)
        lw = _log_weights(phi, x[rows], lq[rows], _rows(arr, rows))
        lm = logsumexp(lw, axis=1) - jnp.log(n)
        w = jnp.exp(lw - lm[:, None])                           # mean 1
        out.append(lm)
        se.append(jnp.std(w, axis=1) / jnp.sqrt(n))
        ess.append(jnp.sum(w, 1) ** 2 / jnp.sum(w ** 2, 1))
    return tuple(np.asarray(jnp.concatenate(a)) for a in (out, se, ess))


def marginal(phi, st, key, n=4000, **kw):
    """Everything at one phi: modes, Laplace/FOCE-I -2logL per subject, IS log L per
    subject with SE."""
    phi = {k: jnp.asarray(v) for k, v in phi.items()}
    eta_hat, H, spread = modes(phi, st)
    lap, foce = laplace_objectives(phi, st, eta_hat, H)
    x, lq = proposal(eta_hat, H, key, n, **kw)
    ll, se, ess = is_loglik(phi, st, x, lq)
    return dict(eta=np.asarray(eta_hat), lap=lap, foce=foce, is_ll=ll, is_se=se, ess=ess,
                spread=spread)


def pack(phi):
    """The 10 parameters on the unconstrained scale (logs of omega and the sigmas)."""
    return np.concatenate([[phi[k] for k in NAMES], np.log(np.maximum(phi["omega"], 1e-6)),
                           [np.log(phi["sigma_add"]), np.log(phi["sigma_prop"])]])


def unpack(u):
    """The inverse of `pack`."""
    return {**{k: u[i] for i, k in enumerate(NAMES)}, "omega": jnp.exp(u[5:8]),
            "sigma_add": jnp.exp(u[8]), "sigma_prop": jnp.exp(u[9])}


def _is_m2ll(u, x, lq, arr):
    """-2 sum_i log (1/n sum_k p(y_i, x_ik | phi(u)) / q(x_ik))."""
    lw = joint(unpack(u), x, arr) - lq
    return -2 * jnp.sum(logsumexp(lw, axis=1) - jnp.log(x.shape[1]))


_is_m2ll_and_grad = jax.jit(jax.value_and_grad(_is_m2ll))


def exact_mle(st, phi0, key, n=2000, outer=4, inner=40, log=print):
    """Maximise the IS marginal likelihood: re-centre the proposal at the current modes,
    L-BFGS on fixed draws, repeat."""
    u = pack(phi0)
    bounds = [(None, None)] * 5 + [(-12, 2)] * 3 + [(-12, 2)] * 2
    for it in range(outer):
        phi = unpack(jnp.asarray(u))
        eta, H, _ = modes(phi, st)
        key, sub = jax.random.split(key)
        x, lq = proposal(eta, H, sub, n)
        arr = _arrays(st)
        fun = lambda v: tuple(np.asarray(a, float)
                              for a in _is_m2ll_and_grad(jnp.asarray(v), x, lq, arr))
        res = minimize(fun, u, jac=True, method="L-BFGS-B", bounds=bounds,
                       options=dict(maxiter=inner))
        u = res.x
        log(f"outer {it}: -2logL(IS, fixed draws) {res.fun:.3f}, nit {res.nit}, u "
            + " ".join(f"{a:.3f}" for a in u))
    return unpack(jnp.asarray(u)), u


def check_closed_form(st, n_subjects=3):
    """Largest relative difference of the closed form from SciPy ``solve_ivp`` (DOP853,
    rtol 1e-12, dose by dose) on a few subjects at the truth, and from
    ``two_compartment_oral().predict`` on all of them."""
    T, eta = st["truth"], st["eta_true"]
    c = np.asarray(conc({k: jnp.asarray(v) for k, v in T.items()}, jnp.asarray(eta),
                        jnp.asarray(st["wt"]), jnp.asarray(st["ts"]), st["dose_t"],
                        st["dose_a"]))
    worst = 0.0
    for i in range(n_subjects):
        om, e = T["omega"], eta[i]
        ka, v1 = np.exp(T["lKa"] + om[0] * e[0]), np.exp(T["lV1"] + om[2] * e[2])
        cl = np.exp(T["lCl"] + om[1] * e[1]) * (st["wt"][i] / 70) ** 0.75
        q, v2 = np.exp(T["lQ"]), np.exp(T["lV2"])
        f = lambda t, y: [-ka * y[0], ka * y[0] - cl * y[1] / v1 - q * (y[1] / v1 - y[2] / v2),
                          q * (y[1] / v1 - y[2] / v2)]
        tobs = st["ts"][i][st["mask"][i]]
        y, t0, ref = np.zeros(3), 0.0, {}
        for td in list(st["dose_t"]) + [tobs.max() + 1.0]:
            if td > t0:
                tt = tobs[(tobs > t0) & (tobs <= td)]
                sol = solve_ivp(f, (t0, td), y, method="DOP853", rtol=1e-12, atol=1e-14,
                                t_eval=np.append(tt, td))
                ref.update({a: b / v1 for a, b in zip(tt, sol.y[1])})
                y = sol.y[:, -1].copy()
            y[0] += 100.0
            t0 = td
        r = np.array([ref[t] for t in tobs])
        worst = max(worst, float(np.max(np.abs(c[i][st["mask"][i]] - r) / r)))
    pred = np.asarray(models.two_compartment_oral().predict(
        {**{k: jnp.asarray(v) for k, v in T.items()}, "eta": jnp.asarray(eta)}, st["data"]))
    m = st["mask"]
    lib = float(np.max(np.abs(pred[m] - c[m]) / c[m]))
    sd = T["sigma_add"] + T["sigma_prop"] * np.abs(c)
    res = ((st["ys"] - c) / sd)[m]
    return worst, lib, res


P9 = ("lKa", "lCl", "lV1", "lQ", "lV2", "omega_cl", "omega_v1", "sigma_add", "sigma_prop")


def _nine(phi):
    """The `P9` parameters of ``phi`` as one vector (9,)."""
    return jnp.asarray([phi[k] for k in NAMES] + list(np.asarray(phi["omega"])[1:])
                       + [phi["sigma_add"], phi["sigma_prop"]])


def _phi9(v, om_ka):
    """The inverse of `_nine`, omega of ka given apart."""
    return {**{k: v[i] for i, k in enumerate(NAMES)},
            "omega": jnp.stack([jnp.asarray(om_ka), v[5], v[6]]),
            "sigma_add": v[7], "sigma_prop": v[8]}


def _m2ll9(v, om_ka, x, lq, arr):
    """`_is_m2ll` in the `P9` parameters (natural scale) and omega of ka."""
    lw = joint(_phi9(v, om_ka), x, arr) - lq
    return -2 * jnp.sum(logsumexp(lw, axis=1) - jnp.log(x.shape[1]))


_m2ll9_jit = jax.jit(_m2ll9)
_m2ll9_hvp = jax.jit(lambda v, d, *rest: jax.jvp(
    lambda w: jax.grad(_m2ll9)(w, *rest), (v,), (d,))[1])


def exact_se(st, phi, key, n=3000):
    """Standard errors of the 9 `P9` parameters, omega of ka held at ``phi``'s (it sits at
    its zero boundary on seed 0), from the Hessian of ``-2 log L`` (IS on fixed draws at
    ``phi``'s modes; forward-over-reverse Hessian-vector products), and their correlation
    matrix. Also ``-2 log L`` along the straight line from ``phi`` to the truth, all 10
    parameters moving (the draws fixed), against the quadratic model in the 9 (omega of ka
    held): ``[(t, exact, quadratic)]``."""
    arr = _arrays(st)
    om_ka = jnp.asarray(phi["omega"])[0]
    v_hat, v_true = _nine(phi), _nine(st["truth"])
    eta, H, _ = modes({k: jnp.asarray(v) for k, v in phi.items()}, st)
    x, lq = proposal(eta, H, key, n)
    Hm = np.stack([np.asarray(_m2ll9_hvp(v_hat, jnp.eye(9)[j], om_ka, x, lq, arr))
                   for j in range(9)])
    Hm = 0.5 * (Hm + Hm.T)
    cov = 2 * np.linalg.inv(Hm)
    se = np.sqrt(np.diag(cov))
    d = np.asarray(v_true - v_hat)
    f = lambda v, omk: float(_m2ll9_jit(v, omk, x, lq, arr))
    f0, om_t = f(v_hat, om_ka), st["truth"]["omega"][0]
    line = [(t, f(v_hat + t * (v_true - v_hat), om_ka + t * (om_t - om_ka)) - f0,
             t * t * d @ Hm @ d / 2) for t in (0.25, 0.5, 0.75, 1.0)]
    return np.asarray(v_hat), se, cov / np.outer(se, se), line


def at(phi, st, key, n, label):
    """`marginal` at ``phi``, its summed objectives printed on one line."""
    r = marginal(phi, st, key, n)
    print(f"  {label:<22} -2logL: exact (IS) {-2 * r['is_ll'].sum():9.3f} "
          f"(MC se {2 * np.sqrt((r['is_se'] ** 2).sum()):.3f}, min ESS {r['ess'].min():.0f}"
          f"/{n}),  Laplace {r['lap'].sum():9.3f},  FOCE-I {r['foce'].sum():9.3f}")
    return r


def run_seed(seed, draws, S):
    """Everything for one seed: the closed form checked, the objectives at the truth and at
    the exact ML estimate, the likelihood ratio, Wald z of the truth, the line between."""
    t0 = time.perf_counter()
    st = study(S, seed)
    worst, lib, res = check_closed_form(st)
    print(f"\nseed {seed}: {S} subjects, {int(st['mask'].sum())} observations. Closed form vs "
          f"solve_ivp {worst:.1e}, vs model.predict {lib:.1e} (max rel.); standardized "
          f"residuals at the truth with the simulation's etas: mean {res.mean():.3f}, "
          f"sd {res.std():.3f}")
    key = jax.random.PRNGKey(1000 + seed)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    r_true = at(st["truth"], st, k1, draws, "truth")
    phi, _ = exact_mle(st, st["truth"], k2, log=lambda s: None)
    phi = {k: np.asarray(v) for k, v in phi.items()}
    r_hat = at(phi, st, k3, draws, "exact ML estimate")
    lr = 2 * (r_hat["is_ll"].sum() - r_true["is_ll"].sum())
    print(f"  likelihood ratio truth vs estimate 2 dlogL = {lr:.2f} on 10 parameters "
          f"(chi2_10 p = {chi2.sf(lr, 10):.2f}); largest per-subject contributions "
          f"{np.round(np.sort(r_hat['is_ll'] - r_true['is_ll'])[::-1][:5], 2)}")
    print(f"  omega of ka at the estimate {phi['omega'][0]:.4f} "
          f"(truth {st['truth']['omega'][0]})")
    v, se, corr, line = exact_se(st, phi, k4)
    tv = np.asarray(_nine(st["truth"]))
    for k, a, s, t in zip(P9, v, se, tv):
        print(f"    {k:<11} {a:8.4f} (SE {s:.4f})  truth {t:8.4f}  Wald z {(a - t) / s:6.2f}")
    print(f"  correlations lKa-lV1 {corr[0, 2]:.3f}, lKa-lQ {corr[0, 3]:.3f}, "
          f"lV1-lQ {corr[2, 3]:.3f}")
    print("  -2logL along the line estimate -> truth (exact / quadratic model): "
          + ", ".join(f"t={t}: {a:.1f} / {b:.1f}" for t, a, b in line))
    print(f"  ({time.perf_counter() - t0:.0f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--draws", type=int, default=4000, help="IS draws per subject")
    ap.add_argument("--subjects", type=int, default=200)
    args = ap.parse_args()
    for seed in args.seeds:
        run_seed(seed, args.draws, args.subjects)


if __name__ == "__main__":
    main()
