"""Observation records after a dose record at the same time (NONMEM processes the records
of one time in table order, so such an observation reads the post-dose state) through
every population path: `PopulationModel.predict`, the NumPyro program that `inference`
samples, the population fit's objective and its NONMEM-style table, against the closed form
of one-compartment IV kinetics."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density
from scipy.stats import norm

import inference
import models
from test_population_doses import one_compartment

K = float(np.exp(-1.5))   # one_compartment's k at lk = -1.5; volume 10
THETA = {"lk": -1.5, "sigma": 0.7}

# an IV bolus of 400 at 0 and at 12: observations before and after each dose row, and one
# after an SS = 1 dose at 24 (its steady-state peak)
TABLE = {
    "ID":   [1] * 10 + [2] * 4,
    "TIME": [0, 0, 0, 5, 12, 12, 12, 24, 24, 30, 0, 0, 3, 6],
    "DV":   [0.5, ".", 38.0, 12.0, 3.0, ".", 40.0, ".", 41.0, 20.0, ".", 30.0, 22.0, 15.0],
    "AMT":  [".", 400, ".", ".", ".", 400, ".", 400, ".", ".", 300, ".", ".", "."],
    "EVID": [0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0],
    "SS":   [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
    "II":   [0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0],
    "CMT":  [1] * 14,
}


def exact_concentrations(k, data):
    """``(S, K)`` the closed form: superposed boluses, the SS = 1 dose at 24 a geometric
    series of past doses; an observation at a dose's time includes it only if it is read
    after it."""
    out = []
    for s in data.subjects:
        c = []
        for t, after in zip(s.ts, s.obs_after):
            doses = [(0.0, 400.0), (12.0, 400.0)] if s.id == 1 else [(0.0, 300.0)]
            if s.dose_ss is not None and (t > 24 or (t == 24 and after)):
                c.append(400.0 * np.exp(-k * (t - 24)) / (1 - np.exp(-k * 12)) / 10)
                continue
            c.append(sum(a * np.exp(-k * (t - td)) for td, a in doses
                         if t > td or (t == td and after)) / 10)
        out.append(c)
    ts, _ = data.observations()
    full = np.full(ts.shape, np.nan)
    for i, c in enumerate(out):
        full[i, :len(c)] = c
    return full


@pytest.fixture(scope="module")
def data():
    return models.PopulationDataset.from_table(TABLE)


def test_observations_after_a_dose_row_are_read_after_it(data):
    assert data.subjects[0].obs_after.tolist() == [False, True, False, False, True, True,
                                                   False]
    pred = np.asarray(one_compartment().predict(THETA, data))
    want = exact_concentrations(K, data)
    seen = ~np.isnan(want)
    np.testing.assert_allclose(pred[seen], want[seen], rtol=1e-8)
    assert pred[0, 1] == pytest.approx(40.0) and pred[0, 0] == 0.0   # post- and pre-dose


def test_the_sampled_program_scores_post_dose_observations(data):
    """The NumPyro program `inference.sample` runs: its observation term is the normal
    log density of the data about the closed-form (post-dose where read after) values."""
    model = one_compartment()
    program = inference.population_program(model)
    _, trace = log_density(program, (data,), {}, THETA)
    got = float(trace["obs"]["fn"].log_prob(trace["obs"]["value"]).sum())
    _, ys = data.observations()
    want = exact_concentrations(K, data)
    seen = ~np.isnan(ys)
    # (the program's solve runs at inference's default tolerances, rtol 1e-6)
    assert got == pytest.approx(float(norm.logpdf(ys[seen], want[seen], 0.7).sum()),
                                rel=1e-5)


def with_random_effects():
    """`one_compartment` with a log-normal random effect on k."""
    def latent(data):
        lk = numpyro.sample("lk", dist.Normal(-1.5, 1.0))
        omega = numpyro.sample("omega", dist.HalfNormal(0.5))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("subjects", data.n_subjects):
            eta = numpyro.sample("eta", dist.Normal(0.0, omega))
        return {"lk": lk, "omega": omega, "sigma": sigma, "eta": eta}

    return models.PopulationModel(
        name="iv_re", vector_field=lambda t, y, p: -p["k"] * y, state_names=("amount",),
        latent=latent, individual=lambda th, data: {"k": jnp.exp(th["lk"] + th["eta"])},
        observation=lambda th, p, ts, ys: ys[..., 0] / 10.0,
        noise=lambda th, pred: dist.Normal(pred, th["sigma"]))


def test_the_population_fit_and_its_table_keep_the_record_order(data, tmp_path):
    """FOCE-I on the data (the route that reads after the doses), its population and
    individual predictions against the closed form at the fitted k, and its NONMEM-style
    table read back to the same observations and flags."""
    # (without the SS = 1 dose: FOCE-I through a steady state's Newton solve is a
    # separate matter)
    data = models.PopulationDataset.from_table({k: v[:7] + v[9:] for k, v in TABLE.items()})
    fit = inference.fit_population(with_random_effects(), data, method="foce-i",
                                   max_iterations=60)
    lk = float(np.asarray(fit.params["lk"]))
    etas = np.asarray(fit.etas).reshape(-1)
    seen = ~np.isnan(exact_concentrations(1.0, data))
    np.testing.assert_allclose(np.asarray(fit.pred)[seen],
                               exact_concentrations(np.exp(lk), data)[seen], rtol=1e-6)
    ipred = np.stack([exact_concentrations(np.exp(lk + e), data)[i]
                      for i, e in enumerate(etas)])
    np.testing.assert_allclose(np.asarray(fit.ipred)[seen], ipred[seen], rtol=1e-6)
    path = tmp_path / "table.csv"
    inference.population_table(fit, data, path)
    back = models.PopulationDataset.from_table(path, covariates=[])
    for a, b in zip(back.subjects, data.subjects):
        np.testing.assert_array_equal(a.ts, b.ts)
        np.testing.assert_array_equal(a.obs_after, b.obs_after)
