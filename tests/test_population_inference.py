"""Population inference: `inference.population_program` of `models.theophylline()`, a hand
written NumPyro program with `inference.ode`, and the closed form (Bateman function) in
plain NumPyro, which is the independent reference."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density

import inference
import models

POP = ["lKa", "lCl", "lKe", "omega", "sigma"]


@pytest.fixture(scope="module")
def theoph():
    return models.theophylline(), models.load_dataset("theophylline")


def closed_form_program(model):
    """Theophylline with the Bateman function in place of the ODE (the reference)."""
    def program(data):
        _, ys = data.observations()
        theta = model.latent(data)
        pred = models.theophylline_closed_form(theta, data)
        numpyro.sample("obs", model.observations(theta, pred), obs=ys)
    return program


def hand_written(data):
    """SPEC's theophylline model as a NumPyro user writes it, with `inference.ode`."""
    ts, ys = data.observations()
    S = data.n_subjects
    dose = np.array([s.dose_amounts[0] for s in data.subjects])
    lKa = numpyro.sample("lKa", dist.Normal(0.5, 0.5))
    lCl = numpyro.sample("lCl", dist.Normal(-3.2, 0.5))
    lKe = numpyro.sample("lKe", dist.Normal(-2.5, 0.5))
    omega = numpyro.sample("omega", dist.HalfNormal(1.0).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("subjects", S):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    ka, cl = jnp.exp(lKa + omega[0] * eta[:, 0]), jnp.exp(lCl + omega[1] * eta[:, 1])
    ke = jnp.exp(lKe)

    def f(t, y, p):
        return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["ke"] * y[1]])

    y0 = jnp.stack([jnp.asarray(dose), jnp.zeros(S)], -1)
    sol = inference.ode("pk", f, 0.0, float(ts.max()), y0,
                        {"ka": ka, "ke": jnp.broadcast_to(ke, (S,))}, ts=ts)
    # the t = 0 samples are taken before the dose
    conc = jnp.where(ts > 0, sol.ys[..., 1] * ke / cl[:, None], 0.0)
    seen = ~np.isnan(ys)
    with numpyro.handlers.mask(mask=seen):
        numpyro.sample("obs", dist.Normal(conc, sigma), obs=np.where(seen, ys, 0.0))


def test_three_programs_agree(theoph):
    model, data = theoph
    for seed in range(3):
        theta = model.sample_latent(jax.random.PRNGKey(seed), data)
        ref, _ = log_density(closed_form_program(model), (data,), {}, theta)
        ode, _ = log_density(inference.population_program(model), (data,), {}, theta)
        hand, _ = log_density(hand_written, (data,), {}, theta)
        np.testing.assert_allclose(float(ode), float(ref), rtol=1e-6)
        np.testing.assert_allclose(float(hand), float(ref), rtol=1e-6)


def _reference(model, data):
    mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(closed_form_program(model)),
                              num_warmup=1000, num_samples=4000, num_chains=4,
                              chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(42), data)
    s = mcmc.get_samples()
    return {k: (np.mean(s[k], 0), np.std(s[k], 0)) for k in POP}


def _agrees(idata, ref):
    import arviz as az

    assert int(idata.sample_stats["diverging"].sum()) == 0
    rhat = az.rhat(idata, var_names=POP)
    for k in POP:
        post = idata.posterior[k].values.reshape((-1,) + idata.posterior[k].shape[2:])
        mean, sd = ref[k]
        assert np.all(np.abs(post.mean(0) - mean) <= 0.25 * sd), k
        assert np.all(np.abs(post.std(0) / sd - 1) <= 0.2), k
        assert np.all(rhat[k].values < 1.05), k
    # no chain ended in the flip-flop mode (ka and ke swapped: lKa well below lKe)
    assert np.all(idata.posterior["lKa"].values.mean(1) > idata.posterior["lKe"].values.mean(1))


@pytest.mark.slow
def test_theophylline_posterior_matches_closed_form_reference(theoph):
    model, data = theoph
    ref = _reference(model, data)
    for seed in (0, 1):
        idata = inference.sample(model, data, num_warmup=500, num_samples=1000, num_chains=4,
                                 seed=seed, progress=False)
        _agrees(idata, ref)
    idata = inference.sample(hand_written, data, num_warmup=500, num_samples=1000,
                             num_chains=4, seed=0, progress=False)
    _agrees(idata, ref)


TWO_CPT = ["lKa", "lCl", "lV1", "lQ", "lV2", "omega", "sigma_add", "sigma_prop"]


@pytest.mark.slow
def test_simulated_study_posterior_covers_the_truth():
    """200 subjects, six oral doses each, sparse samples, simulated at known population
    values: every population parameter's posterior mean lies within 3.5 posterior sd of
    the value the data were drawn from (for a well-specified model and this many subjects
    the z-scores are close to standard normal), the chains mix and nothing diverges."""
    import arviz as az

    model = models.two_compartment_oral()
    data, _ = models.simulated_study(n_subjects=200, seed=0)
    idata = inference.sample(model, data, num_warmup=500, num_samples=500, num_chains=4,
                             seed=0, progress=False)
    assert int(idata.sample_stats["diverging"].sum()) == 0
    rhat = az.rhat(idata, var_names=TWO_CPT)
    for k in TWO_CPT:
        post = idata.posterior[k].values.reshape((-1,) + idata.posterior[k].shape[2:])
        truth = np.asarray(models.TWO_COMPARTMENT_TRUTH[k])
        z = (post.mean(0) - truth) / post.std(0)
        assert np.all(np.abs(z) < 3.5), (k, z)
        assert np.all(rhat[k].values < 1.05), (k, rhat[k].values)


def _linear_closed_form(data):
    """`test_population_fit.linear_model` with ``y_i(t) = a + omega eta_i + b t`` written
    out (no ODE): the reference for its fit and its sampler's sites."""
    from test_population_fit import T

    ys = np.stack([s.ys for s in data.subjects])
    a = numpyro.sample("a", dist.Normal(0.0, 10.0))
    b = numpyro.sample("b", dist.Normal(0.0, 10.0))
    omega = numpyro.sample("omega", dist.HalfNormal(2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("subjects", data.n_subjects):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
    pred = a + omega * eta[:, None] + b * jnp.asarray(T)
    numpyro.sample("obs", dist.Normal(pred, sigma), obs=ys)


def test_a_population_model_through_fit_reaches_the_closed_forms_map():
    """`inference.fit` of a `models.PopulationModel` (its `population_program`, every
    subject one ensemble): its loss is the closed-form program's negative log density at
    its point, and that point the MAP SciPy's BFGS finds on NumPyro's log density in
    (a, b, log omega, log sigma, eta) from the same start."""
    from scipy.optimize import minimize
    from test_population_fit import linear_data, linear_model

    data = linear_data(np.random.default_rng(0))
    # near the truth: at omega -> 0 the etas leave the likelihood and the joint density
    # has a flat ridge where a start drawn from the priors may stop
    init = dict(a=2.0, b=0.7, omega=0.8, sigma=0.3, eta=np.zeros(data.n_subjects))
    res = inference.fit(linear_model(), data, init=init, method="lbfgs", progress=False)
    at_fit = {k: jnp.asarray(v) for k, v in res.params.items()}
    assert res.loss == pytest.approx(
        -float(log_density(_linear_closed_form, (data,), {}, at_fit)[0]), abs=1e-6)

    def unpack(x):
        return dict(a=x[0], b=x[1], omega=jnp.exp(x[2]), sigma=jnp.exp(x[3]), eta=x[4:])

    def neg(x):
        return -log_density(_linear_closed_form, (data,), {}, unpack(x))[0]

    x0 = np.concatenate([[2.0, 0.7, np.log(0.8), np.log(0.3)], np.zeros(data.n_subjects)])
    ref = minimize(jax.jit(jax.value_and_grad(neg)), x0, jac=True, method="BFGS",
                   options=dict(gtol=1e-9))
    assert res.loss == pytest.approx(float(ref.fun), abs=1e-5)
    for k, v in unpack(ref.x).items():
        np.testing.assert_allclose(np.asarray(res.params[k]).reshape(np.shape(v)), v,
                                   atol=2e-3, err_msg=k)


def test_a_population_model_through_sample_draws_its_programs_sites():
    """`inference.sample` of a `models.PopulationModel` (a few draws): the posterior holds
    the latent sites of the closed-form program (NumPyro's trace), shaped
    ``(chains, draws, *site)``, finite and inside their supports."""
    from numpyro import handlers
    from test_population_fit import linear_data, linear_model

    data = linear_data(np.random.default_rng(0))
    trace = handlers.trace(handlers.seed(_linear_closed_form, 0)).get_trace(data)
    latent = {k: v["value"].shape for k, v in trace.items()
              if v["type"] == "sample" and not v["is_observed"]}
    init = dict(a=2.0, b=0.7, omega=0.8, sigma=0.3, eta=np.zeros(data.n_subjects))
    idata = inference.sample(linear_model(), data, num_warmup=5, num_samples=5, num_chains=1,
                             init=init, seed=0, progress=False)  # given starts: no MAP fit
    assert set(latent) <= set(idata.posterior.data_vars)
    for k, shape in latent.items():
        v = idata.posterior[k].values
        assert v.shape == (1, 5) + shape and np.all(np.isfinite(v)), k
    assert np.all(idata.posterior["omega"].values > 0)
    assert np.all(idata.posterior["sigma"].values > 0)
