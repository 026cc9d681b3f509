"""`inference.profile_intervals` against independent references: on a model whose
predictions are linear in the random effects, FOCE-I is the exact Gaussian marginal
likelihood, so each reported bound is checked by re-profiling that closed form with SciPy
(the other parameters re-optimised with the bound's coordinate fixed), not the function's
own path; the near-quadratic slope's interval against its Wald interval; a variance whose
profile is flat down to zero is reported not found."""

import numpy as np
import pytest
from numpyro import handlers
from scipy.optimize import minimize
from scipy.stats import chi2

import inference
import models
from test_population_fit import T, linear_data, linear_model

INIT = {"a": 1.0, "b": 0.5, "omega": 1.0, "sigma": 0.5}
C2 = chi2.ppf(0.95, 1)


def exact_m2ll(Y):
    """``-2 log L`` of y_i ~ N(a + b t, omega^2 11' + sigma^2 I) in (a, b, log omega,
    log sigma): the linear model's exact marginal likelihood."""
    def m2ll(x):
        a, b, om, sg = x[0], x[1], np.exp(x[2]), np.exp(x[3])
        C = om ** 2 * np.ones((T.size, T.size)) + sg ** 2 * np.eye(T.size)
        r = Y - (a + b * T)
        _, logdet = np.linalg.slogdet(C)
        quad = np.einsum("ij,jk,ik->i", r, np.linalg.inv(C), r)
        return np.sum(quad) + len(Y) * (logdet + T.size * np.log(2 * np.pi))
    return m2ll


def exact_profile(m2ll, j, value, x0):
    """min of ``m2ll`` over every coordinate but ``j``, held at ``value`` (Nelder–Mead)."""
    free = np.arange(4) != j

    def f(v):
        x = np.array(x0, float)
        x[free], x[j] = v, value
        return m2ll(x)
    res = minimize(f, np.asarray(x0, float)[free], method="Nelder-Mead",
                   options=dict(xatol=1e-9, fatol=1e-10, maxiter=20000))
    return res.fun


def unconstrained(name, v):
    return np.log(v) if name in ("omega", "sigma") else v


@pytest.fixture(scope="module")
def linear_fit():
    data = linear_data(np.random.default_rng(0))
    fit = inference.fit_population(linear_model(), data, init=INIT)
    return data, fit, inference.profile_intervals(fit, linear_model(), data)


def test_bounds_lie_where_the_exact_profile_crosses_chi2(linear_fit):
    data, fit, ci = linear_fit
    Y = np.stack([s.ys for s in data.subjects])
    m2ll = exact_m2ll(Y)
    x_hat = np.array([unconstrained(k, fit.params[k]) for k in ("a", "b", "omega", "sigma")])
    m2ll_min = minimize(m2ll, x_hat, method="Nelder-Mead",
                        options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000)).fun
    assert ci.ofv_min == pytest.approx(m2ll_min, abs=1e-4)
    assert ci.threshold == pytest.approx(3.841459, abs=1e-6)
    for j, k in enumerate(("a", "b", "omega", "sigma")):
        assert ci.found_lower[k] and ci.found_upper[k]
        assert ci.lower[k] < fit.params[k] < ci.upper[k]
        for bound in (ci.lower[k], ci.upper[k]):
            rise = exact_profile(m2ll, j, unconstrained(k, bound), x_hat) - m2ll_min
            assert rise == pytest.approx(C2, abs=0.02), (k, bound, rise)
    assert ci.notes == []
    vals, rise = ci.profiles["omega"]
    assert np.all(np.diff(vals) > 0) and rise.min() == pytest.approx(0.0, abs=1e-9)


def test_laplace_route_bounds_against_the_exact_profile():
    """The same check through method='laplace' (the second-order route: exact Hessians of
    the solve), for the mean's intercept and the between-subject sd."""
    data = linear_data(np.random.default_rng(0))
    fit = inference.fit_population(linear_model(), data, method="laplace", init=INIT)
    ci = inference.profile_intervals(fit, linear_model(), data, names=["a", "omega"])
    m2ll = exact_m2ll(np.stack([s.ys for s in data.subjects]))
    x_hat = np.array([unconstrained(k, fit.params[k]) for k in ("a", "b", "omega", "sigma")])
    for j, k in ((0, "a"), (2, "omega")):
        for bound in (ci.lower[k], ci.upper[k]):
            rise = exact_profile(m2ll, j, unconstrained(k, bound), x_hat) - m2ll(x_hat)
            assert rise == pytest.approx(C2, abs=0.02), (k, bound, rise)


def test_near_quadratic_interval_is_the_wald_interval(linear_fit):
    """b (the slope) enters the predictions linearly: its profile is nearly quadratic, so
    the profile interval is estimate +- 1.96 SE within a few percent; omega's (a standard
    deviation from 6 subjects) is not: it is skewed to the right."""
    _, fit, ci = linear_fit
    b, se = fit.params["b"], fit.se["b"]
    wald = 2 * 1.96 * se
    assert ci.upper["b"] - ci.lower["b"] == pytest.approx(wald, rel=0.10)
    assert ci.lower["b"] == pytest.approx(b - 1.96 * se, abs=0.1 * wald)
    om = fit.params["omega"]
    assert ci.upper["omega"] - om > 1.5 * (om - ci.lower["omega"])


def test_a_variance_flat_to_zero_is_not_found():
    """Data without between-subject variation: omega's estimate sits near 0 and its
    profile stays below chi2 all the way down; the lower bound is reported missing."""
    rng = np.random.default_rng(1)
    data = linear_data(rng)
    # the same design, the between-subject term removed
    data = models.PopulationDataset([s._replace(ys=2.0 + 0.7 * T + 0.3 * rng.normal(size=T.size))
                                     for s in data.subjects])
    fit = inference.fit_population(linear_model(), data, init=INIT)
    ci = inference.profile_intervals(fit, linear_model(), data, names=["omega"], max_steps=6)
    assert list(ci.lower) == ["omega"]
    assert not ci.found_lower["omega"] and np.isnan(ci.lower["omega"])
    assert any(n.startswith("omega lower bound not found") for n in ci.notes)
    assert ci.found_upper["omega"] and ci.upper["omega"] > fit.params["omega"]
    Y = np.stack([s.ys for s in data.subjects])
    m2ll = exact_m2ll(Y)
    x0 = np.array([fit.params["a"], fit.params["b"], np.log(0.1), np.log(fit.params["sigma"])])
    m2ll_min = min(ci.ofv_min, exact_profile(m2ll, 2, np.log(1e-6), x0))
    rise = exact_profile(m2ll, 2, np.log(ci.upper["omega"]), x0) - m2ll_min
    assert rise == pytest.approx(C2, abs=0.02)


def test_bad_arguments(linear_fit):
    data, fit, _ = linear_fit
    with pytest.raises(ValueError, match="`names`.*'kappa'"):
        inference.profile_intervals(fit, linear_model(), data, names=["kappa"])
    with pytest.raises(ValueError, match="`names`.*'omega\\[3\\]'"):
        inference.profile_intervals(fit, linear_model(), data, names=["omega[3]"])
    with pytest.raises(ValueError, match="`level`"):
        inference.profile_intervals(fit, linear_model(), data, level=95)
    with pytest.raises(TypeError, match="`fit`"):
        inference.profile_intervals(fit.params, linear_model(), data)
    other = linear_data(np.random.default_rng(5))
    with pytest.raises(ValueError, match="not a fit of this"):
        inference.profile_intervals(fit, linear_model(), other, names=["b"])


@pytest.mark.slow
def test_two_compartment_bounds_against_fits_with_the_parameter_fixed():
    """5 subjects of the simulated two-compartment study: at each profile bound of lCl and
    lQ, `fit_population` of the model with that parameter conditioned to the bound (its
    own BFGS from the estimate, none of the profile's starts) rises chi2 above the fit."""
    model = models.two_compartment_oral()
    data, _ = models.simulated_study(n_subjects=5, seed=0)
    fit = inference.fit_population(model, data)
    ci = inference.profile_intervals(fit, model, data, names=["lCl", "lQ"])
    print("\n", ci.lower, ci.upper, ci.notes, f"{ci.wall_time:.1f} s")
    for k in ("lCl", "lQ"):
        assert ci.found_lower[k] and ci.found_upper[k]
        for bound in (ci.lower[k], ci.upper[k]):
            fixed = model.replace(
                latent=handlers.condition(model.latent_fn, data={k: bound}),
                individual=lambda theta, d, k=k, b=bound: model.individual_fn(
                    dict(theta, **{k: b}), d))
            init = {name: v for name, v in fit.params.items() if name != k}
            refit = inference.fit_population(fixed, data, init=init)
            print(k, bound, "rise", refit.ofv - fit.ofv)
            assert refit.ofv - fit.ofv == pytest.approx(C2, abs=0.05), (k, bound)
