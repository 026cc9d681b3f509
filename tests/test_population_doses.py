"""NONMEM-style dose records in a long table (RATE, DUR, ADDL/II, MDV, EVID 2) read into
a `models.PopulationDataset`, its `doses` schedule, and a population model predicting and
scoring them: against the closed form of one-compartment kinetics (superposed infusions and
boluses); every unsupported or inconsistent record an error naming the subject and row."""

import jax
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


@pytest.mark.parametrize("column, value, match, named", [
    ("RATE", -3.0, "RATE must be >= 0", "column RATE"),
    ("DUR", -1.0, "DUR must be >= 0", "column DUR"),
    ("SS", 1, "needs an interval II", "column II"),
    ("SS", 3, "SS must be 0, 1 or 2", "column SS"),
    ("ADDL", 1.5, "whole number", "column ADDL"),
    ("EVID", 5, "EVID 5 .* is not one of", "column EVID"),
    ("WT", ".", "covariate 'WT' is missing", "column WT"),
])
def test_bad_dose_records_name_the_subject_row_and_column(column, value, match, named):
    table = {k: list(v) for k, v in TABLE.items()}
    table.setdefault(column, [70.0 if column == "WT" else "."] * len(table["ID"]))
    table[column][7] = value  # subject 2's dose row
    with pytest.raises(ValueError, match=match) as info:
        models.PopulationDataset.from_table(table)
    assert "subject 2" in str(info.value) and "row 8" in str(info.value)
    assert named in str(info.value)


def test_more_bad_records():
    table = {k: list(v) for k, v in TABLE.items()}
    table["DUR"][7] = 4.0  # RATE 20 and DUR 4 on one row
    with pytest.raises(ValueError, match="columns RATE and DUR: give RATE or DUR, not both"):
        models.PopulationDataset.from_table(table)
    table = {k: list(v) for k, v in TABLE.items()}
    table["EVID"][8] = 3    # subject 2's EVID 2 row at 0.5 a reset ...
    table["TIME"][9] = 0.5  # ... and its observation at 1.0 moved to 0.5: read after it
    s2 = models.PopulationDataset.from_table(table).subjects[1]
    np.testing.assert_array_equal(s2.resets, [0.5])
    np.testing.assert_array_equal(s2.ts, [0.5, 3.0, 7.0, 11.0])
    np.testing.assert_array_equal(s2.obs_after, [True, False, False, False])
    np.testing.assert_array_equal(s2.obs_rows, [10, 11, 12, 13])
    table = {k: list(v) for k, v in TABLE.items()}
    table["CMT"][4] = 2
    data = models.PopulationDataset.from_table(table)
    with pytest.raises(ValueError, match=r"subject 1 has a dose into compartment CMT=2 \(row "
                                         r"5, column CMT\), but the model has 1 states"):
        data.doses(1)
    table = {k: list(v) for k, v in TABLE.items()}
    table["RATE"][7] = -2
    data = models.PopulationDataset.from_table(table)
    with pytest.raises(ValueError, match="subject 2, row 8, column RATE: RATE = -2 needs the "
                                         "model's duration D1"):
        one_compartment().predict({"lk": jnp.asarray(-1.0), "sigma": jnp.asarray(1.0)}, data)
    with pytest.raises(ValueError, match="unknown dose parameters"):
        data.doses(1, parameters={"ALAG2": jnp.zeros(2)})
    table = {k: list(v) for k, v in TABLE.items()}
    table["CENS"] = ["."] * 13
    table["CENS"][9] = 2
    with pytest.raises(ValueError, match=r"subject 2, row 10, column CENS: CENS must be 0, "
                                         r"1 or -1, got 2"):
        models.PopulationDataset.from_table(table)


# ------------------------------------------- SS, EVID 3/4, RATE -2, ALAG1 and F1
# subject 1: SS = 1 bolus every 12 h at 0; EVID 4 (reset and a dose of 50) at 14.
# subject 2: RATE -2 (duration D1) infusion of 80 at 1; EVID 3 at 8; bolus 30 at 10.
# subject 3: SS = 1 infusion of 60 at RATE 20 every 8 h, at 2.
# Every dose into CMT 1 has the model's lag ALAG1 and bioavailability F1.
TABLE2 = {
    "ID":   [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3],
    "TIME": [0.0, 1.0, 5.0, 11.0, 14.0, 15.0, 20.0, 1.0, 2.0, 4.0, 7.5, 8.0, 9.0, 10.0,
             12.0, 13.0, 2.0, 3.0, 6.0, 9.5],
    "DV":   [".", 1, 1, 1, ".", 1, 1, ".", 1, 1, 1, ".", 1, ".", 1, 1, ".", 1, 1, 1],
    "AMT":  [100, ".", ".", ".", 50, ".", ".", 80, ".", ".", ".", ".", ".", 30, ".", ".",
             60, ".", ".", "."],
    "EVID": [1, 0, 0, 0, 4, 0, 0, 1, 0, 0, 0, 3, 0, 1, 0, 0, 1, 0, 0, 0],
    "RATE": [".", ".", ".", ".", ".", ".", ".", -2, ".", ".", ".", ".", ".", ".", ".", ".",
             20, ".", ".", "."],
    "SS":   [1] + ["."] * 15 + [1, ".", ".", "."],
    "II":   [12.0] + ["."] * 15 + [8.0, ".", ".", "."],
}


def _exact2(k, lag, F, dur):
    """Observed amounts / 10 of TABLE2's subjects: superposition, windows between resets."""
    def bol(t, t_dose, a):
        return np.where(t > t_dose, F * a * np.exp(-k * (t - t_dose)), 0.0)

    def inf(t, start, rate, d):
        return infusion(t, k, start, rate * d, d)

    past = range(400)  # a dose repeated forever: exp(-0.3 * 8 * 400) is nothing
    t1 = np.array([1.0, 5.0, 11.0, 15.0, 20.0])
    s1 = np.where(t1 <= 14.0, sum(bol(t1, lag - 12.0 * j, 100.0) for j in past),
                  bol(t1, 14.0 + lag, 50.0))
    t2 = np.array([2.0, 4.0, 7.5, 9.0, 12.0, 13.0])
    s2 = np.where(t2 <= 8.0, inf(t2, 1.0 + lag, F * 80.0 / dur, dur), bol(t2, 10.0 + lag, 30.0))
    t3 = np.array([3.0, 6.0, 9.5])
    s3 = sum(inf(t3, 2.0 + lag - 8.0 * j, 20.0, F * 60.0 / 20.0) for j in past)
    out = np.full((3, 6), np.nan)
    for i, s in enumerate((s1, s2, s3)):
        out[i, :s.size] = s / 10.0
    return out


@pytest.mark.slow
def test_steady_state_resets_and_modelled_doses_from_a_table():
    """SS = 1 (bolus and infusion), EVID 3/4, RATE = -2 with the model's D1, and ALAG1/F1
    from the model: predictions against the superposition closed form (1e-8), and their
    gradient w.r.t. k, the lag, F and D1 against central differences of it."""
    data = models.PopulationDataset.from_table(TABLE2)
    assert data.needs_schedule
    np.testing.assert_array_equal(data.subjects[1].resets, [8.0])
    np.testing.assert_array_equal(data.subjects[0].dose_ss, [1, 0])
    S = data.n_subjects
    model = one_compartment().replace(dose_parameters=lambda th, p: {
        "ALAG1": jnp.broadcast_to(th["lag"], (S,)), "F1": jnp.broadcast_to(th["F"], (S,)),
        "D1": jnp.broadcast_to(th["dur"], (S,))})

    def pred(lk, lag, F, dur):
        theta = {"lk": lk, "sigma": jnp.asarray(1.0), "lag": lag, "F": F, "dur": dur}
        return model.predict(theta, data)

    args = [np.array(np.log(0.3)), np.array(0.4), np.array(0.8), np.array(2.5)]
    exact = lambda lk, lag, F, dur: _exact2(np.exp(lk), lag, F, dur)
    seen = ~np.isnan(exact(*args))
    got = np.asarray(pred(*map(jnp.asarray, args)))
    np.testing.assert_allclose(got[seen], exact(*args)[seen], rtol=1e-8, atol=1e-10)
    w = np.where(seen, np.cos(np.arange(18.0)).reshape(3, 6), 0.0)
    g = jax.grad(lambda *a: jnp.sum(jnp.where(seen, pred(*a), 0.0) * w), argnums=(0, 1, 2, 3))(
        *map(jnp.asarray, args))
    eps = 1e-6
    for j in range(4):
        up, dn = [a.copy() for a in args], [a.copy() for a in args]
        up[j] += eps
        dn[j] -= eps
        fd = np.sum(np.nan_to_num(exact(*up) - exact(*dn)) * w) / (2 * eps)
        assert float(g[j]) == pytest.approx(fd, rel=1e-6, abs=1e-9), j


# ------------------------------------------------------------------- M3 censoring
def test_m3_censored_log_density_against_scipy():
    """CENS = 1 (below the limit in DV) and CENS = -1 rows, and an LLOQ: the program's log
    density equals the priors plus norm.logpdf of the observed values plus norm.logcdf
    (norm.logsf) at the limits of the censored ones, computed with SciPy."""
    from scipy.stats import halfnorm

    table = {k: list(v) for k, v in TABLE.items()}
    table["CENS"] = ["."] * 13
    table["CENS"][3], table["DV"][3] = 1, 0.5    # subject 1 at 4.0: below 0.5
    table["CENS"][12], table["DV"][12] = -1, 9.0  # subject 2 at 11.0: above 9.0
    data = models.PopulationDataset.from_table(table)
    cens = data.censoring()
    assert cens.sum() == 0 and (cens != 0).sum() == 2
    model = one_compartment()
    theta = {"lk": jnp.asarray(np.log(0.3)), "sigma": jnp.asarray(0.4)}
    lp, _ = log_density(inference.population_program(model), (data,), {}, theta)
    want = exact_amounts(0.3, data) / 10.0
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    obs = seen & (cens == 0)
    exact = (norm.logpdf(np.log(0.3), -1.5, 1.0) + halfnorm.logpdf(0.4, scale=1.0)
             + norm.logpdf(ys[obs], want[obs], 0.4).sum()
             + norm.logcdf(ys[cens == 1], want[cens == 1], 0.4).sum()
             + norm.logsf(ys[cens == -1], want[cens == -1], 0.4).sum())
    assert float(lp) == pytest.approx(exact, rel=1e-6)

    lloq = 2.5  # every DV below it censored at it
    data = models.PopulationDataset.from_table(TABLE, lloq=lloq)
    cens = data.censoring()
    ts, ys = data.observations()
    below = np.isin(ys, [lloq]) & (cens == 1)
    assert below.sum() == 2 and np.all(ys[cens == 1] == lloq)
    lp, _ = log_density(inference.population_program(model), (data,), {}, theta)
    obs = ~np.isnan(ys) & (cens == 0)
    exact = (norm.logpdf(np.log(0.3), -1.5, 1.0) + halfnorm.logpdf(0.4, scale=1.0)
             + norm.logpdf(ys[obs], want[obs], 0.4).sum()
             + norm.logcdf(lloq, want[cens == 1], 0.4).sum())
    assert float(lp) == pytest.approx(exact, rel=1e-6)


# ------------------------------------------------------- time-varying covariates
def test_time_varying_covariate_is_carried_forward():
    """A covariate changing within subjects (``time_varying=``): its value at every
    observation time is the last one at or before it, against a direct walk of the
    table's rows."""
    table = {k: list(v) for k, v in TABLE.items()}
    table["WT"] = [70, 70, 70, 72, 72, 72, 75, 60, 60, 60, 61, 61, 58]
    table["CRCL"] = [90] * 7 + [80] * 6
    with pytest.raises(ValueError, match="covariate 'WT' changes"):
        models.PopulationDataset.from_table(table)
    data = models.PopulationDataset.from_table(table, time_varying=["WT"])
    ts, _ = data.observations()
    got = data.covariate_at("WT", ts)
    for i, sid in enumerate(data.ids):
        rows = [r for r in range(13) if table["ID"][r] == sid]
        for j, t in enumerate(ts[i]):
            last = [table["WT"][r] for r in rows if table["TIME"][r] <= t][-1]
            assert got[i, j] == last, (sid, t)
    np.testing.assert_array_equal(data.covariate("WT"), [70.0, 60.0])  # the first values
    np.testing.assert_array_equal(data.covariate_at("CRCL", ts), np.where(ts > -1, 1, 0) *
                                  np.array([[90.0], [80.0]]))
    with pytest.raises(ValueError, match="`time_varying` names"):
        models.PopulationDataset.from_table(table, time_varying=["HT"])
