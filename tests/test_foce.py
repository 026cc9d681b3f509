"""`inference.fit_population` (FOCE-I) on theophylline against an independent FOCE-I
computation: the Bateman function and its derivatives with respect to the random effects
written out here in NumPy, each subject's conditional mode found by SciPy, the first-order
Hessian ``J' J / sigma^2 + I`` with the interaction (residual variance at the individual
prediction; additive error here), the objective differentiated by central differences.

One fit (module fixture) is checked for: its OFV equal to the independent objective at the
estimate; the estimate a stationary point of the independent objective (which tests the
outer gradient, including the modes' dependence on the population parameters: a gradient
without it stops elsewhere); its SEs against the independent objective's curvature; the
conditional modes, PRED, IPRED and IWRES against the closed form; and the fixed effects
against nlme's published fit (Lindstrom-Bates, a different approximation)."""

import numpy as np
import pytest
from scipy.optimize import minimize

import inference
import models

Q = 2  # random effects per subject (log ka, log cl)


def subjects():
    """Each subject's (dose times, doses, observation times, observations), from the raw
    records."""
    data = models.load_dataset("theophylline")
    out = []
    for s in data.subjects:
        keep = np.isfinite(s.ys)
        out.append((np.asarray(s.dose_times, float), np.asarray(s.dose_amounts, float),
                    np.asarray(s.ts, float)[keep], np.asarray(s.ys, float)[keep]))
    return data, out


def conc_and_jac(ka, cl, ke, om, dose_t, dose, t):
    """Concentrations ``(k,)`` and their derivatives ``(k, 2)`` w.r.t. ``eta`` where
    ``ka = exp(lKa + om[0] eta[0])``, ``cl = exp(lCl + om[1] eta[1])``: the Bateman function
    summed over doses (a sample at a dose time reads the state before it)."""
    s = t[:, None] - dose_t[None, :]
    after = s > 0
    s = np.where(after, s, 0.0)
    E = np.exp(-ke * s) - np.exp(-ka * s)
    A = ka / (ka - ke)
    c = np.where(after, dose * ke / cl * A * E, 0.0).sum(1)
    dA = -ke / (ka - ke) ** 2
    dc_dka = np.where(after, dose * ke / cl * (dA * E + A * s * np.exp(-ka * s)), 0.0).sum(1)
    return c, np.stack([om[0] * ka * dc_dka, -om[1] * c], -1)


def subject_terms(x, subj, eta0):
    """The conditional mode of one subject and its FOCE-I contribution ``l(eta*) + q/2 log
    2 pi - 1/2 log det H`` (Beal & Sheiner's FOCE with interaction; Wang 2007)."""
    lKa, lCl, lKe = x[:3]
    om, sg = np.exp(x[3:5]), np.exp(x[5])
    dose_t, dose, t, y = subj
    ke = np.exp(lKe)

    def neg_l(eta):
        ka, cl = np.exp(lKa + om[0] * eta[0]), np.exp(lCl + om[1] * eta[1])
        c, J = conc_and_jac(ka, cl, ke, om, dose_t, dose, t)
        r = y - c
        val = 0.5 * np.sum(r ** 2) / sg ** 2 + y.size * np.log(sg) \
            + 0.5 * y.size * np.log(2 * np.pi) + 0.5 * eta @ eta + 0.5 * Q * np.log(2 * np.pi)
        return val, -J.T @ r / sg ** 2 + eta

    res = minimize(neg_l, eta0, jac=True, method="BFGS", options=dict(gtol=1e-11, maxiter=500))
    eta = res.x
    ka, cl = np.exp(lKa + om[0] * eta[0]), np.exp(lCl + om[1] * eta[1])
    c, J = conc_and_jac(ka, cl, ke, om, dose_t, dose, t)
    H = J.T @ J / sg ** 2 + np.eye(Q)
    return eta, c, -res.fun + 0.5 * Q * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(H)[1]


def ofv(x, subj, etas):
    """-2 log L, every constant included; ``etas`` (S, 2) start the inner searches and are
    overwritten with the modes."""
    total = 0.0
    for i, s in enumerate(subj):
        etas[i], _, term = subject_terms(x, s, etas[i])
        total += term
    return -2.0 * total


@pytest.fixture(scope="module")
def fitted():
    model, data = models.theophylline(), models.load_dataset("theophylline")
    fit = inference.fit_population(model, data)
    p = fit.params
    x = np.array([p["lKa"], p["lCl"], p["lKe"], np.log(p["omega"][0]),
                  np.log(p["omega"][1]), np.log(p["sigma"])], float)
    return fit, x, subjects()[1]


def test_ofv_and_conditional_modes_equal_an_independent_foce_i(fitted):
    fit, x, subj = fitted
    etas = np.zeros((len(subj), Q))
    ref = ofv(x, subj, etas)
    assert abs(fit.ofv - ref) < 1e-4, (fit.ofv, ref)
    n_obs = sum(s[3].size for s in subj)
    np.testing.assert_allclose(fit.ofv_nonmem, ref - n_obs * np.log(2 * np.pi), atol=1e-4)
    np.testing.assert_allclose(fit.etas, etas, atol=2e-5)
    # PRED (eta = 0), IPRED (the modes), IWRES = (DV - IPRED) / sigma: additive error
    sg = np.exp(x[5])
    for i, s in enumerate(subj):
        ke = np.exp(x[2])
        om = np.exp(x[3:5])
        pred, _ = conc_and_jac(np.exp(x[0]), np.exp(x[1]), ke, om, s[0], s[1], s[2])
        e = etas[i]
        ipred, J = conc_and_jac(np.exp(x[0] + om[0] * e[0]), np.exp(x[1] + om[1] * e[1]), ke,
                                om, s[0], s[1], s[2])
        k = s[2].size
        np.testing.assert_allclose(fit.pred[i, :k], pred, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(fit.ipred[i, :k], ipred, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fit.iwres[i, :k], (s[3] - ipred) / sg, atol=1e-5)
        # CWRES (Hooker et al. 2007): the residual from the model linearised at the mode,
        # E y = f(eta*) - J eta*, Cov y = J Omega J' + R (Omega = I: non-centred etas),
        # whitened by the Cholesky factor; its squared norm is whitening-independent.
        r = s[3] - (ipred - J @ e)
        C = J @ J.T + sg ** 2 * np.eye(k)
        np.testing.assert_allclose(np.sum(fit.cwres[i, :k] ** 2), r @ np.linalg.solve(C, r),
                                   rtol=1e-4)
        np.testing.assert_allclose(fit.cwres[i, :k], np.linalg.solve(np.linalg.cholesky(C), r),
                                   atol=1e-4)
    # eta shrinkage: 1 - sd(eta*) / sd(prior), sample sd (ddof 1); the non-centred prior is N(0, 1)
    np.testing.assert_allclose(fit.shrinkage, 1 - etas.std(0, ddof=1), atol=1e-3)


def test_estimate_is_a_stationary_point_and_ses_match_its_curvature(fitted):
    """Central differences of the independent objective: its gradient at the fitted
    estimate is zero to the differences' accuracy, and the Newton step it implies is a
    small fraction of a standard error; the SEs (inverse of half the Hessian, delta method
    to omega and sigma) agree with the library's."""
    fit, x, subj = fitted
    etas = np.zeros((len(subj), Q))
    f0 = ofv(x, subj, etas)
    h = 1e-3
    n = x.size
    f = lambda z: ofv(z, subj, etas.copy())                       # noqa: E731
    E = np.eye(n) * h
    g = np.array([(f(x + E[i]) - f(x - E[i])) / (2 * h) for i in range(n)])
    H = np.zeros((n, n))
    for i in range(n):
        H[i, i] = (f(x + E[i]) - 2 * f0 + f(x - E[i])) / h ** 2
        for j in range(i):
            H[i, j] = H[j, i] = (f(x + E[i] + E[j]) - f(x + E[i] - E[j]) - f(x - E[i] + E[j])
                                 + f(x - E[i] - E[j])) / (4 * h * h)
    cov = 2 * np.linalg.inv(H)
    se_x = np.sqrt(np.diag(cov))
    step = np.linalg.solve(H, g)
    print("\ngradient", g, "\nNewton step / se", step / se_x)
    assert np.all(np.abs(step) < 0.02 * se_x), step / se_x
    assert 0.5 * g @ step < 1e-3                 # the OFV the library left on the table
    se_ref = se_x * np.concatenate([np.ones(3), np.exp(x[3:])])
    se = fit.se
    got = np.array([se["lKa"], se["lCl"], se["lKe"], se["omega"][0], se["omega"][1],
                    se["sigma"]])
    print("SE", got, "\nindependent", se_ref)
    np.testing.assert_allclose(got, se_ref, rtol=0.05)
    # the condition number is that of the Hessian on the unconstrained scale
    ev = np.linalg.eigvalsh(H)
    np.testing.assert_allclose(fit.condition_number, ev.max() / ev.min(), rtol=0.05)


def test_fixed_effects_near_nlme(fitted):
    """nlme's published fit of this model (Pinheiro & Bates 2000; Lindstrom-Bates, a
    different approximation to the same marginal likelihood)."""
    fit, _, _ = fitted
    got = [fit.params["lKe"], fit.params["lKa"], fit.params["lCl"]]
    np.testing.assert_allclose(got, [-2.43, 0.45, -3.21], atol=0.05)
    assert fit.aic == pytest.approx(fit.ofv + 2 * 6)
    n_obs = int(np.isfinite(fit.iwres).sum())
    assert fit.bic == pytest.approx(fit.ofv + 6 * np.log(n_obs))
