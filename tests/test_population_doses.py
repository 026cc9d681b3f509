"""NONMEM-style dose records in a long table (RATE, DUR, ADDL/II, MDV, EVID 2) read into
a `models.PopulationDataset`, its `doses` schedule, and a population model predicting and
scoring them: against the closed form of one-compartment kinetics (superposed infusions and
boluses); every unsupported or inconsistent record an error naming the subject and row."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density
from scipy.stats import norm

import inference
import models

# subject 1: a 2 h infusion of 100 (DUR) and a bolus of 50 with 2 additional doses every 8 h;
# subject 2: an infusion of 80 at RATE 20 (4 h), an EVID 2 row, an MDV observation.
TABLE = {
    "ID":   [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2],
    "TIME": [0.0, 0.0, 1.5, 4.0, 6.0, 13.0, 23.5, 0.0, 0.5, 1.0, 3.0, 7.0, 11.0],
    "DV":   [".", ".", 1.0, 2.0, ".", 3.0, 4.0, ".", ".", 5.0, 6.0, 7.0, 8.0],
    "AMT":  [100.0, ".", ".", ".", 50.0, ".", ".", 80.0, ".", ".", ".", ".", "."],
    "EVID": [1, 0, 0, 0, 1, 0, 0, 1, 2, 0, 0, 0, 0],
    "RATE": [".", ".", ".", ".", 0, ".", ".", 20.0, ".", ".", ".", ".", "."],
    "DUR":  [2.0, ".", ".", ".", ".", ".", ".", ".", ".", ".", ".", ".", "."],
    "ADDL": [".", ".", ".", ".", 2, ".", ".", ".", ".", ".", ".", ".", "."],
    "II":   [".", ".", ".", ".", 8.0, ".", ".", ".", ".", ".", ".", ".", "."],
    "MDV":  [1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0],
    "CMT":  [1] * 13,
}


def one_compartment():
    def latent(data):
        lk = numpyro.sample("lk", dist.Normal(-1.5, 1.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        return {"lk": lk, "sigma": sigma}

    return models.PopulationModel(
        name="iv", vector_field=lambda t, y, p: -p["k"] * y, state_names=("amount",),
        latent=latent,
        individual=lambda th, data: {"k": jnp.broadcast_to(jnp.exp(th["lk"]), (data.n_subjects,))},
        observation=lambda th, p, ts, ys: ys[..., 0] / 10.0,  # volume 10
        noise=lambda th, pred: dist.Normal(pred, th["sigma"]))


def infusion(t, k, start, amount, dur):
    infused = np.clip(t - start, 0.0, dur)
    return np.where(t <= start, 0.0, amount / dur / k * (1 - np.exp(-k * infused))
                    * np.exp(-k * np.maximum(t - start - dur, 0.0)))


def bolus(t, k, start, amount):
    return np.where(t <= start, 0.0, amount * np.exp(-k * np.maximum(t - start, 0.0)))


def exact_amounts(k, data):
    ts, _ = data.observations()
    s1 = infusion(ts[0], k, 0.0, 100.0, 2.0) + sum(bolus(ts[0], k, 6.0 + 8.0 * j, 50.0)
                                                    for j in range(3))
    s2 = infusion(ts[1], k, 0.0, 80.0, 4.0)
    return np.stack([s1, s2])


@pytest.fixture(scope="module")
def data():
    return models.PopulationDataset.from_table(TABLE)


def test_the_table_reads_as_nonmem_means_it(data):
    s1, s2 = data.subjects
    np.testing.assert_array_equal(s1.dose_times, [0.0, 6.0, 14.0, 22.0])  # ADDL 2, II 8
    np.testing.assert_array_equal(s1.dose_amounts, [100.0, 50.0, 50.0, 50.0])
    np.testing.assert_array_equal(s1.dose_rates, [50.0, 0.0, 0.0, 0.0])    # AMT / DUR
    np.testing.assert_array_equal(s2.dose_rates, [20.0])
    np.testing.assert_array_equal(s1.ts, [0.0, 1.5, 4.0, 13.0, 23.5])
    assert np.isnan(s1.ys[0]) and s1.ys[1] == 1.0                          # MDV 1: missing
    np.testing.assert_array_equal(s2.ts, [1.0, 3.0, 7.0, 11.0])             # EVID 2 skipped
    assert np.isnan(s2.ys[2])                                               # MDV 1 on EVID 0
    assert data.has_infusions
    with pytest.raises(ValueError, match="use `doses`"):
        data.jumps(1)


def test_predictions_and_log_density_match_the_closed_form(data):
    model = one_compartment()
    theta = {"lk": jnp.asarray(np.log(0.3)), "sigma": jnp.asarray(0.4)}
    pred = np.asarray(model.predict(theta, data))
    want = exact_amounts(0.3, data) / 10.0
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    np.testing.assert_allclose(pred[seen], want[seen], rtol=1e-8, atol=1e-10)
    lp, _ = log_density(inference.population_program(model), (data,), {}, theta)
    exact = (norm.logpdf(np.log(0.3), -1.5, 1.0) + np.log(2 * norm.pdf(0.4, 0.0, 1.0))
             + norm.logpdf(ys[seen], want[seen], 0.4).sum())
    assert float(lp) == pytest.approx(exact, rel=1e-6)  # the program solves at rtol 1e-6


@pytest.mark.parametrize("column, value, error, match", [
    ("RATE", -3.0, ValueError, "RATE must be >= 0"),
    ("RATE", -2.0, NotImplementedError, "duration the model estimates"),
    ("DUR", -1.0, ValueError, "DUR must be >= 0"),
    ("SS", 1, ValueError, "needs an interval II"),
    ("ADDL", 1.5, ValueError, "whole number"),
])
def test_bad_dose_records_name_the_subject_and_row(column, value, error, match):
    table = {k: list(v) for k, v in TABLE.items()}
    table.setdefault(column, ["."] * len(table["ID"]))
    table[column][7] = value  # subject 2's dose row
    with pytest.raises(error, match=match) as info:
        models.PopulationDataset.from_table(table)
    assert "subject 2" in str(info.value) and "row 8" in str(info.value)


def test_more_bad_records():
    table = {k: list(v) for k, v in TABLE.items()}
    table["DUR"][7] = 4.0  # RATE 20 and DUR 4 on one row
    with pytest.raises(ValueError, match="RATE or DUR, not both"):
        models.PopulationDataset.from_table(table)
    table = {k: list(v) for k, v in TABLE.items()}
    table["SS"] = ["."] * 13
    table["SS"][4], table["II"][4] = 1, 8.0
    with pytest.raises(NotImplementedError, match="steady_state"):
        models.PopulationDataset.from_table(table)
    table = {k: list(v) for k, v in TABLE.items()}
    table["EVID"][2] = 3
    with pytest.raises(NotImplementedError, match="EVID 3"):
        models.PopulationDataset.from_table(table)
    table = {k: list(v) for k, v in TABLE.items()}
    table["CMT"][0] = 2
    data = models.PopulationDataset.from_table(table)
    with pytest.raises(ValueError, match="CMT=2, but the model has 1 states"):
        data.doses(1)
