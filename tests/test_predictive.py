"""`inference.predictive`: posterior and prior predictive draws through the model's own
solver, against closed forms (exponential decay; the theophylline Bateman function) and
the noise model's own moments."""

import arviz as az
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

import inference
import models

TS = np.linspace(0.0, 4.0, 9)


@pytest.fixture(scope="module")
def decay():
    """y' = -k y, y(0) = y0; observations Normal(y, sigma)."""
    return models.ODEModel(
        name="decay", vector_field=lambda t, y, p: -p["k"] * y,
        priors={"k": dist.LogNormal(0.0, 0.3), "y0": dist.LogNormal(jnp.log(2.0), 0.1),
                "sigma": dist.HalfNormal(0.2)},
        y0=lambda p: jnp.atleast_1d(p["y0"]), t0=0.0,
        noise=lambda p, y: dist.Normal(y, p["sigma"]).to_event(2))


def _closed(k, y0, ts):
    return y0[:, None] * np.exp(-k[:, None] * ts[None, :])


def test_posterior_predictive_is_the_solution_plus_the_noise(decay):
    rng = np.random.default_rng(0)
    n = 400
    draws = {"k": rng.uniform(0.3, 1.5, n), "y0": rng.uniform(1.0, 3.0, n),
             "sigma": np.full(n, 0.05)}
    pp = inference.predictive(decay, TS, draws, seed=1)
    assert pp["obs"].shape == (n, TS.size, 1) and pp["y_pred"].shape == (n, TS.size, 1)
    assert "k" not in pp  # given latents are not returned
    exact = _closed(draws["k"], draws["y0"], TS)
    np.testing.assert_allclose(pp["y_pred"][..., 0], exact, rtol=1e-5, atol=1e-7)  # the solve: rtol 1e-6, atol 1e-8
    z = (pp["obs"][..., 0] - exact) / 0.05  # standard normal, 3,600 values
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.05


def test_prior_predictive_draws_the_prior_and_solves_at_each_draw(decay):
    pp = inference.predictive(decay, TS, num_samples=2000, seed=3)
    assert pp["k"].shape == (2000,) and pp["obs"].shape == (2000, TS.size, 1)
    logk = np.log(pp["k"])
    assert abs(logk.mean()) < 0.03 and abs(logk.std() - 0.3) < 0.02  # LogNormal(0, 0.3)
    np.testing.assert_allclose(pp["y_pred"][..., 0], _closed(pp["k"], pp["y0"], TS),
                               rtol=1e-5, atol=1e-7)  # the solve: rtol 1e-6, atol 1e-8


def test_inference_data_keeps_chains_and_draws(decay):
    rng = np.random.default_rng(2)
    post = {"k": rng.uniform(0.5, 1.0, (2, 30)), "y0": rng.uniform(1.5, 2.5, (2, 30)),
            "sigma": np.full((2, 30), 0.1)}
    pp = inference.predictive(decay, models.Dataset(ts=TS, ys=np.zeros((TS.size, 1))),
                              az.from_dict(posterior=post), batch_size=7)
    assert pp["y_pred"].shape == (2, 30, TS.size, 1)
    exact = _closed(post["k"].ravel(), post["y0"].ravel(), TS).reshape(2, 30, TS.size)
    np.testing.assert_allclose(pp["y_pred"][..., 0], exact, rtol=1e-5, atol=1e-7)  # the solve: rtol 1e-6, atol 1e-8


def test_population_posterior_predictive_matches_the_closed_form():
    model, data = models.theophylline(), models.load_dataset("theophylline")
    rng = np.random.default_rng(4)
    n, S = 6, data.n_subjects
    draws = {"lKa": rng.normal(0.45, 0.1, n), "lCl": rng.normal(-3.2, 0.1, n),
             "lKe": rng.normal(-2.45, 0.05, n), "omega": rng.uniform(0.1, 0.6, (n, 2)),
             "sigma": np.full(n, 1e-9), "eta": rng.normal(0.0, 1.0, (n, S, 2))}
    pp = inference.predictive(model, data, draws)
    ts, _ = data.observations()
    assert pp["obs"].shape == (n,) + ts.shape
    for i in range(n):
        exact = np.asarray(models.theophylline_closed_form(
            {k: v[i] for k, v in draws.items()}, data))
        np.testing.assert_allclose(pp["obs"][i], exact, rtol=1e-5, atol=1e-7)


def test_bad_input_names_the_argument(decay):
    with pytest.raises(TypeError, match="samples"):
        inference.predictive(decay, TS, [1.0, 2.0])
    with pytest.raises(ValueError, match="leading"):
        inference.predictive(decay, TS, {"k": np.ones(3), "y0": np.ones(4), "sigma": np.ones(3)})
    with pytest.raises(ValueError, match="data"):
        inference.predictive(decay, None, num_samples=3)
    with pytest.raises(ValueError, match="num_samples"):
        inference.predictive(decay, TS, {"k": np.ones(3)}, num_samples=3)
    with pytest.raises(ValueError, match="no site named"):
        inference.predictive(decay, TS, num_samples=2, return_sites=["nope"])
    with pytest.raises(TypeError, match="model"):
        inference.predictive(3.0, TS, num_samples=2)
    for name, bad in (("num_samples", 2.5), ("batch_size", 0), ("num_samples", True)):
        with pytest.raises(ValueError, match=f"`{name}` must be an int >= 1"):
            inference.predictive(decay, TS, **{name: bad})


def test_draws_of_another_model_are_refused(decay):
    """A key of ``samples`` that no site of the program is named (a typo, another model's
    draws) was ignored: that parameter was drawn from the prior instead."""
    draws = {"k": np.full(3, 0.5), "y0": np.full(3, 2.0), "sigma": np.full(3, 0.1),
             "kk": np.ones(3)}
    with pytest.raises(ValueError, match=r"`samples` has \['kk'\], which no site of the "
                       r"program is named \(its sample sites: \['k', 'y0', 'sigma', 'obs'\]"):
        inference.predictive(decay, TS, draws)
