"""`inference.profile` on every kind of problem, against independent references.

- An ODE model and a NumPyro program whose likelihood is Gaussian in its parameters (``y' =
  a``, ``y(0) = b``, observed with known noise sd: the data are linear in ``(a, b)``):
  their 95 % profile intervals are the least-squares estimates ``+- sqrt(chi2_1(0.95))``
  standard errors exactly (NumPy's ``lstsq`` and ``sigma^2 (X^T X)^-1``).
- A population model whose predictions are linear in the random effects (FOCE-I is then
  the exact Gaussian marginal likelihood): at each interval end, the closed-form marginal
  likelihood minimised by Nelder–Mead over the other coordinates, with that one fixed,
  lies ``threshold`` above its optimum.
- Slow: lynx–hare (an `ODEModel`), theophylline (`fit_population`) and Boehm (PEtab): at
  each interval end a fresh fit with that coordinate fixed (SciPy's optimisers on the
  public densities, or `fit_population` of the model conditioned on the end) rises by the
  threshold above the optimum.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import optimize, stats

import gradsolve as gs
import inference
import models
from inference.problem._problem import Problem
from test_population_fit import linear_data, linear_model
from test_population_profile import INIT, exact_m2ll, exact_profile

THRESHOLD = stats.chi2.ppf(0.95, 1) / 2
T = np.linspace(0.5, 5.0, 10)
SIGMA = 0.3


def _line_data():
    rng = np.random.default_rng(3)
    return models.Dataset(ts=T, ys=(2.0 + 0.7 * T + SIGMA * rng.normal(size=T.size))[:, None])


def _line_model():
    """``y' = a``, ``y(0) = b``: ``y(t) = b + a t``, normal noise of known sd."""
    return models.ODEModel(
        name="line", vector_field=lambda t, y, p: jnp.broadcast_to(p["a"], y.shape),
        priors={"a": dist.Normal(0.0, 10.0), "b": dist.Normal(0.0, 10.0)},
        y0=lambda p: jnp.reshape(p["b"], (1,)),
        noise=lambda p, y: dist.Normal(y, SIGMA).to_event(2),
        defaults={"a": 0.5, "b": 1.5})


def _line_program(ys):
    a = numpyro.sample("a", dist.Normal(0.0, 10.0))
    b = numpyro.sample("b", dist.Normal(0.0, 10.0))
    sol = inference.ode("line", lambda t, y, p: jnp.broadcast_to(p["a"], y.shape), 0.0,
                        float(T[-1]), jnp.reshape(b, (1,)), {"a": a}, ts=jnp.asarray(T),
                        max_steps=64)
    numpyro.sample("obs", dist.Normal(sol.ys[:, 0], SIGMA), obs=ys)


def _analytic_intervals(ys):
    """The least-squares estimate ``(a, b)`` +- ``sqrt(chi2_1(0.95))`` standard errors."""
    X = np.stack([T, np.ones_like(T)], axis=1)
    est = np.linalg.lstsq(X, ys, rcond=None)[0]
    se = SIGMA * np.sqrt(np.diag(np.linalg.inv(X.T @ X)))
    half = np.sqrt(2 * THRESHOLD) * se
    return {"a": (est[0] - half[0], est[0] + half[0]), "b": (est[1] - half[1], est[1] + half[1])}


def _check_analytic(prof, ys):
    ref = _analytic_intervals(ys)
    assert prof.parameter_ids == ("a", "b") and prof.objective == "mle"
    assert prof.scales == {"a": "lin", "b": "lin"} and prof.reliable
    for p in ("a", "b"):
        width = ref[p][1] - ref[p][0]
        np.testing.assert_allclose(prof.intervals[p], ref[p], atol=1e-4 * width)
        assert prof.identifiable[p] == (True, True)


@pytest.fixture(scope="module")
def line():
    data = _line_data()
    with gs.use_compiled_kernel(False):  # a one-line field: no kernel build for it
        model = _line_model()
        res = inference.fit(model, data, objective="mle", init=model.defaults, steps=1000,
                            progress=False)
        prof = inference.profile(model, res, data, progress=False)
    return model, data, res, prof


def test_an_ode_model_gaussian_in_its_parameters_has_the_analytic_intervals(line):
    _, data, _, prof = line
    _check_analytic(prof, np.asarray(data.ys)[:, 0])
    # the held coordinate is the path's value; every point re-optimised the other
    for j, p in enumerate(prof.parameter_ids):
        np.testing.assert_array_equal(prof.paths[p].x[:, j], prof.paths[p].values)


def test_a_program_gaussian_in_its_parameters_has_the_analytic_intervals():
    ys = np.asarray(_line_data().ys)[:, 0]
    with gs.use_compiled_kernel(False):
        res = inference.fit(_line_program, ys, {"a": 0.5, "b": 1.5}, objective="mle",
                            steps=1000, progress=False)
        prof = inference.profile(_line_program, res, ys, progress=False)
    _check_analytic(prof, ys)


@pytest.fixture(scope="module")
def linear_population():
    data = linear_data(np.random.default_rng(0))
    fit = inference.fit_population(linear_model(), data, init=INIT, progress=False)
    return data, fit


def test_a_population_profile_ends_where_the_exact_marginal_likelihood_rises_by_the_threshold(
        linear_population):
    data, fit = linear_population
    prof = inference.profile(linear_model(), fit, data, parameters=["b", "omega"],
                             progress=False)
    assert prof.scales == {"b": "lin", "omega": "log"} and prof.reliable
    assert prof.objective_opt == pytest.approx(fit.ofv / 2, abs=1e-6)
    m2ll = exact_m2ll(np.stack([s.ys for s in data.subjects]))
    x_hat = np.array([fit.params["a"], fit.params["b"], np.log(fit.params["omega"]),
                      np.log(fit.params["sigma"])])
    f_min = optimize.minimize(m2ll, x_hat, method="Nelder-Mead",
                              options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000)).fun / 2
    for j, p in ((1, "b"), (2, "omega")):
        assert prof.identifiable[p] == (True, True)
        for end in prof.intervals[p]:
            rise = exact_profile(m2ll, j, end, x_hat) / 2 - f_min
            assert rise == pytest.approx(THRESHOLD, abs=1e-3), (p, end, rise)


def test_profile_intervals_is_the_population_profile_in_nonmem_terms(linear_population):
    data, fit = linear_population
    ci = inference.profile_intervals(fit, linear_model(), data, names=["omega"])
    prof = ci.result
    assert isinstance(prof, inference.ProfileResult)
    assert ci.threshold == pytest.approx(2 * prof.threshold)
    lo, hi = prof.intervals["omega"]
    np.testing.assert_allclose([ci.lower["omega"], ci.upper["omega"]], np.exp([lo, hi]))


def test_bad_arguments_are_named(line, linear_population):
    model, data, res, _ = line
    with pytest.raises(ValueError, match=r"\['c'\] is not a parameter of the problem"):
        inference.profile(model, res, data, parameters=["a", "c"])
    with pytest.raises(ValueError, match=r"\['kappa'\] is not a parameter"):
        pdata, pfit = linear_population
        inference.profile(linear_model(), pfit, pdata, parameters="kappa")
    with pytest.raises(ValueError, match="`min_step` 0.5 is above `max_step` 0.1"):
        inference.profile(model, res, data, min_step=0.5, max_step=0.1)
    for name in ("max_steps", "first_step", "max_iter"):
        with pytest.raises(ValueError, match=f"`{name}` must be"):
            inference.profile(model, res, data, **{name: 0})
    with pytest.raises(ValueError, match="`parameters` must be parameter ids"):
        inference.profile(model, res, data, parameters=[])
    with pytest.raises(ValueError, match="pass the data fitted"):
        inference.profile(model, res)
    with pytest.raises(TypeError, match="FitResult"):
        inference.profile(model, res.params, data)

    class Reversed(Problem):
        def bounds(self):
            return np.array([1.0, -np.inf]), np.array([0.0, np.inf])

    with pytest.raises(ValueError, match=r"bounds of \['a'\] are reversed"):
        inference.profile(Reversed(model, data), res)


# ---------------------------------------------------------------------------- slow
def _refit_rise(f, x_opt, j, value, f_opt, bounds=None):
    """``min f`` over every coordinate but ``j`` (held at ``value``), from the optimum,
    inside ``bounds`` (``(lower, upper)`` or ``None``), minus ``f_opt``: SciPy's L-BFGS-B
    on ``f``'s own value and gradient."""
    free = np.arange(len(x_opt)) != j
    box = None if bounds is None else list(zip(bounds[0][free], bounds[1][free]))

    def g(v):
        x = np.array(x_opt, float)
        x[free], x[j] = v, value
        val, grad = f(x)
        return val, grad[free]

    res = optimize.minimize(g, np.asarray(x_opt, float)[free], jac=True, method="L-BFGS-B",
                            bounds=box, options=dict(gtol=1e-9, ftol=1e-15, maxiter=2000))
    return res.fun - f_opt


@pytest.mark.slow  # 92 s on the loaded 2-core VM: an 8-start fit and one profile of lynx-hare
def test_lynx_hare_profile_ends_are_where_a_refit_rises_by_the_threshold():
    import jax

    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    res = inference.fit(model, data, n_starts=8, seed=0, progress=False)
    prof = inference.profile(model, res, data, parameters=["theta[0]"], progress=False)
    space = inference.ParamSpace(model.priors)

    @jax.jit
    def vg(u):  # the MAP objective through the public log density (no Jacobian)
        return jax.value_and_grad(
            lambda v: -inference.log_density(model, data, space.from_unconstrained(v)))(u)

    f = lambda u: tuple(np.asarray(a, float) for a in vg(jnp.asarray(u)))  # noqa: E731
    x_opt = prof.optimum
    f_opt = float(f(x_opt)[0])
    assert f_opt == pytest.approx(prof.objective_opt, abs=1e-6)
    for end in prof.intervals["theta[0]"]:
        rise = _refit_rise(f, x_opt, 0, end, f_opt)
        assert rise == pytest.approx(THRESHOLD, abs=1e-3), (end, rise)


@pytest.mark.slow  # 522 s on the loaded 2-core VM: the FOCE-I fit, one profile, two refits
def test_theophylline_profile_ends_are_where_a_conditioned_fit_rises_by_the_threshold():
    from numpyro import handlers

    model, data = models.theophylline(), models.load_dataset("theophylline")
    fit = inference.fit_population(model, data, progress=False)
    k = "lCl"  # a real site: its coordinate is its value
    prof = inference.profile(model, fit, data, parameters=[k], progress=False)
    assert prof.scales[k] == "lin" and prof.identifiable[k] == (True, True)
    for value in prof.intervals[k]:
        fixed = model.replace(
            latent=handlers.condition(model.latent_fn, data={k: value}),
            individual=lambda theta, d, b=value: model.individual_fn(dict(theta, **{k: b}), d))
        refit = inference.fit_population(
            fixed, data, init={n: v for n, v in fit.params.items() if n != k}, progress=False)
        rise = (refit.ofv - fit.ofv) / 2
        assert rise == pytest.approx(THRESHOLD, abs=1e-3), (value, rise)


@pytest.mark.slow  # 387 s on the loaded 2-core VM: a 4-start fit near the nominal point, one profile
def test_boehm_profile_ends_are_where_a_refit_rises_by_the_threshold():
    import jax

    from test_petab_fit import DATA

    problem = models.load_petab(DATA / "Boehm_JProteomeRes2014", hierarchical=False)
    lo, hi = (np.asarray(b) for b in problem.bounds)
    near = np.clip(np.asarray(problem.nominal) + 0.3 * np.sign(np.arange(9) % 2 - 0.5), lo, hi)
    res = inference.fit(problem, init=near, n_starts=4, seed=0)
    p = "Epo_degradation_BaF3"
    j = problem.parameter_ids.index(p)
    prof = inference.profile(problem, res, parameters=[p], progress=False)
    vg = jax.jit(jax.value_and_grad(lambda x: -problem.log_likelihood(x)))
    f = lambda x: tuple(np.asarray(a, float) for a in vg(jnp.asarray(x)))  # noqa: E731
    x_opt = prof.optimum
    f_opt = float(f(x_opt)[0])
    for end in prof.intervals[p]:
        # inside the table's bounds, as the profile (parameters sit on them at the optimum)
        rise = _refit_rise(f, x_opt, j, end, f_opt, (lo, hi))
        assert rise == pytest.approx(THRESHOLD, abs=1e-3), (end, rise)
