"""Tests of `models.PopulationModel`, `models.theophylline`, `models.two_compartment_oral`
and `models.simulated_study`.

Each numerical check compares against something independent of the model code: the
Bateman function (`theophylline_closed_form` recomputes the individual parameters from
theta itself), SciPy's `solve_ivp` between dose times with the doses added by hand, and
SciPy's `stats` log densities. The solves follow the contract `inference` builds its NumPyro
program on (latent -> individual -> dosing -> gs.solve -> observation -> observations).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import stats
from scipy.integrate import solve_ivp

import gradsolve as gs
import models

THEOPH_THETA = {
    "lKa": 0.45, "lCl": -3.2, "lKe": -2.45, "omega": [0.6, 0.25], "sigma": 0.7,
    "eta": np.array([[0.3, -0.5], [-1.1, 0.2], [0.7, 0.9], [-0.2, -1.3], [1.4, 0.1],
                     [0.0, 0.6], [-0.8, -0.4], [0.5, 1.2], [-1.5, 0.3], [0.9, -0.9],
                     [0.2, 0.0], [-0.4, 0.8]]),
}


def _theta(d):
    return {k: jnp.asarray(v, dtype=jnp.float64) for k, v in d.items()}


def _program_solve(model, theta, data, rtol=1e-10, atol=1e-12):
    """The lead's program, without NumPyro: (ts, pred (S, K), sol)."""
    p = model.individual(theta, data)
    y0, jumps = model.dosing(theta, p, data)
    ts, _ = data.observations()
    sol = gs.solve(model.vector_field, model.t0, float(ts.max()), y0, p, ts=jnp.asarray(ts),
                   jumps=jumps, solver=model.solver, rtol=rtol, atol=atol)
    return ts, model.observation(theta, p, ts, sol.ys), sol


@pytest.fixture(scope="module")
def theoph():
    return models.theophylline(), models.load_dataset("theophylline")


@pytest.fixture(scope="module")
def study():
    return models.simulated_study(n_subjects=200, seed=0)


# ----------------------------------------------------------------------------- theophylline


def test_theophylline_data_and_dosing(theoph):
    model, data = theoph
    assert isinstance(data, models.PopulationDataset) and data.n_subjects == 12
    assert model.state_names == ("a_gut", "a_central") and model.solver == gs.Tsit5()
    theta = _theta(THEOPH_THETA)
    p = model.individual(theta, data)
    assert set(p) == {"ka", "ke", "cl"} and all(v.shape == (12,) for v in p.values())
    y0, jumps = model.dosing(theta, p, data)
    # one dose at t = 0 per subject, folded into y0: no event left
    assert jumps is None
    doses = np.array([s.dose_amounts[0] for s in data.subjects])
    np.testing.assert_array_equal(np.asarray(y0), np.stack([doses, np.zeros(12)], axis=1))
    assert doses[0] == 4.02


def test_theophylline_solve_matches_closed_form(theoph):
    model, data = theoph
    theta = _theta(THEOPH_THETA)
    ts, pred, sol = jax.jit(lambda th: _program_solve(model, th, data))(theta)
    assert pred.shape == (12, 11) and sol.ys.shape == (12, 11, 2)
    ref = models.theophylline_closed_form(theta, data)
    # the pre-dose sample at t = 0 reads 0 (the state before the dose)
    assert np.all(np.asarray(pred)[ts == 0.0] == 0.0)
    np.testing.assert_allclose(np.asarray(pred), np.asarray(ref), rtol=1e-6, atol=1e-10)
    # and the Bateman function typed here once more, subject 0 (ka, cl, ke from theta)
    ka = math.exp(0.45 + 0.6 * 0.3)
    cl = math.exp(-3.2 + 0.25 * -0.5)
    ke = math.exp(-2.45)
    t = ts[0]
    c0 = 4.02 * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))
    np.testing.assert_allclose(np.asarray(pred[0]), c0, rtol=1e-6, atol=1e-10)


def test_theophylline_latent_sites_and_log_prior(theoph):
    from numpyro import handlers
    from numpyro.infer.util import log_density

    model, data = theoph
    tr = handlers.trace(handlers.seed(model.latent, rng_seed=0)).get_trace(data)
    shapes = {k: tuple(s["value"].shape) for k, s in tr.items() if s["type"] == "sample"}
    assert shapes == {"lKa": (), "lCl": (), "lKe": (), "omega": (2,), "sigma": (),
                      "eta": (12, 2)}
    draw = model.sample_latent(jax.random.key(3), data)
    assert {k: v.shape for k, v in draw.items()} == shapes
    theta = _theta(THEOPH_THETA)
    lp, _ = log_density(model.latent, (data,), {}, theta)
    ref = (stats.norm.logpdf(0.45, 0.5, 0.5) + stats.norm.logpdf(-3.2, -3.2, 0.5)
           + stats.norm.logpdf(-2.45, -2.5, 0.5)
           + stats.halfnorm.logpdf([0.6, 0.25], scale=1.0).sum()
           + stats.halfnorm.logpdf(0.7, scale=2.0)
           + stats.norm.logpdf(THEOPH_THETA["eta"]).sum())
    np.testing.assert_allclose(float(lp), ref, rtol=1e-12)


def test_theophylline_program_log_density_matches_hand_computed(theoph):
    """The whole program of the contract under NumPyro equals log prior + Normal
    log-likelihood of the closed form (scipy), with a missing observation skipped."""
    import numpyro
    from numpyro.infer.util import log_density

    model, data = theoph
    ts, ys = data.observations()
    ys = ys.copy()
    ys[2, 5] = np.nan                                   # a gap, skipped by the likelihood

    def program(data, ys):
        theta = model.latent(data)
        p = model.individual(theta, data)
        y0, jumps = model.dosing(theta, p, data)
        sol = gs.solve(model.vector_field, model.t0, float(ts.max()), y0, p,
                       ts=jnp.asarray(ts), jumps=jumps, solver=model.solver, rtol=1e-10,
                       atol=1e-12)
        pred = model.observation(theta, p, ts, sol.ys)
        numpyro.sample("obs", model.observations(theta, pred), obs=ys)

    theta = _theta(THEOPH_THETA)
    lp = jax.jit(lambda th: log_density(program, (data, jnp.asarray(ys)), {}, th)[0])(theta)
    c = np.asarray(models.theophylline_closed_form(theta, data))
    ok = ~np.isnan(ys)
    ll = stats.norm.logpdf(ys[ok], c[ok], 0.7).sum()
    lprior = float(log_density(model.latent, (data,), {}, theta)[0])
    np.testing.assert_allclose(float(lp), ll + lprior, rtol=1e-8)


# ----------------------------------------------------------------------------- two compartments


def _two_cpt_rhs(p):
    """The two-compartment oral model re-typed (amounts; central concentration a_c/v1)."""
    def rhs(t, y):
        a_g, a_c, a_p = y
        flow = p["q"] * (a_c / p["v1"] - a_p / p["v2"])
        return [-p["ka"] * a_g, p["ka"] * a_g - p["cl"] * a_c / p["v1"] - flow, flow]
    return rhs


def _piecewise_scipy(rhs, dose_times, dose, ts):
    """Central amounts at ``ts``: solve_ivp from one dose time to the next, adding each
    dose to the gut by hand; a sample at a dose time reads the state before that dose."""

    def integrate(y, a, b):
        return solve_ivp(rhs, (a, b), y, method="DOP853", rtol=1e-12, atol=1e-12).y[:, -1]

    out = []
    for t in ts:
        y, t_prev = np.zeros(3), 0.0
        for d in dose_times:
            if d >= t:
                break
            if d > t_prev:
                y = integrate(y, t_prev, d)
            y = y + np.array([dose, 0.0, 0.0])
            t_prev = d
        if t > t_prev:
            y = integrate(y, t_prev, t)
        out.append(y[1])
    return np.array(out)


def _small_design(times_per_subject, wts, cmt_dose=1):
    table = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "WT")}
    for i, (obs, wt) in enumerate(zip(times_per_subject, wts), start=1):
        events = [(t, 0) for t in obs] + [(12.0 * j, 1) for j in range(6)]
        for t, evid in sorted(events, key=lambda e: (e[0], e[1])):
            vals = (i, t, "." if evid else 1.0, 100.0 if evid else ".", evid,
                    cmt_dose if evid else 2, wt)
            for k, v in zip(table, vals):
                table[k].append(v)
    return models.PopulationDataset.from_table(table)


def test_two_compartment_doses_as_jumps_match_piecewise_scipy():
    model = models.two_compartment_oral()
    obs = [np.array([0.0, 0.5, 3.0, 11.9, 12.0, 25.5, 48.0, 61.0, 72.0]),
           np.array([1.0, 6.0, 30.0, 36.0, 70.0])]
    design = _small_design(obs, [55.0, 90.0])
    theta = _theta({"lKa": math.log(0.8), "lCl": math.log(4.0), "lV1": math.log(40.0),
                    "lQ": math.log(12.0), "lV2": math.log(90.0), "omega": [0.3, 0.2, 0.1],
                    "sigma_add": 0.05, "sigma_prop": 0.1,
                    "eta": np.array([[0.5, -0.3, 0.2], [-0.7, 0.4, -0.1]])})
    p = model.individual(theta, design)
    y0, (jt, js) = model.dosing(theta, p, design)
    np.testing.assert_array_equal(np.asarray(y0), [[100.0, 0, 0], [100.0, 0, 0]])
    np.testing.assert_array_equal(np.asarray(jt), np.tile(12.0 * np.arange(1, 6), (2, 1)))
    assert js.shape == (2, 5, 3) and np.all(np.asarray(js)[..., 0] == 100.0)
    ts, pred, _ = jax.jit(lambda th: _program_solve(model, th, design))(theta)
    for i, s in enumerate(design.subjects):
        pi = {k: float(v[i]) for k, v in p.items()}
        eta_cl = (-0.3, 0.4)[i]
        np.testing.assert_allclose(pi["cl"], 4.0 * math.exp(0.2 * eta_cl)
                                   * (s.covariates["WT"] / 70) ** 0.75, rtol=1e-12)
        ref = _piecewise_scipy(_two_cpt_rhs(pi), 12.0 * np.arange(6), 100.0, s.ts) / pi["v1"]
        np.testing.assert_allclose(np.asarray(pred[i, : s.ts.size]), ref, rtol=1e-7,
                                   atol=1e-10)
    # a bioavailability through dose_sizes scales every prediction (a linear model)
    half = model.replace(dose_sizes=lambda th, p, sizes: 0.5 * sizes)
    _, pred_half, _ = _program_solve(half, theta, design)
    np.testing.assert_allclose(np.asarray(pred_half), 0.5 * np.asarray(pred), rtol=1e-7,
                               atol=1e-10)


def test_simulated_study(study):
    data, truth = study
    assert isinstance(data, models.PopulationDataset) and data.n_subjects == 200
    assert truth["eta"].shape == (200, 3) and truth["omega"].shape == (3,)
    assert set(truth) == set(models.TWO_COMPARTMENT_TRUTH) | {"eta"}
    wt = data.covariate("WT")
    assert wt.min() >= 40 and wt.max() <= 120 and 60 < wt.mean() < 80
    for s in data.subjects:
        np.testing.assert_array_equal(s.dose_times, 12.0 * np.arange(6))
        np.testing.assert_array_equal(s.dose_amounts, 100.0)
        assert np.all(s.dose_cmt == 0) and np.all(s.obs_cmt == 1)
        assert 4 <= s.ts.size <= 6 and np.all(np.isfinite(s.ys))
        assert s.ts.min() > 0 and s.ts.max() <= 72.05
        assert not np.isin(s.ts, s.dose_times).any()
    # the draws are Normal(c, sigma_add + sigma_prop c) around the model's predictions
    model = models.two_compartment_oral()
    ts, ys = data.observations()
    _, pred, _ = jax.jit(lambda th: _program_solve(model, th, data))(truth)
    ok = ~np.isnan(ys)
    z = (ys - np.asarray(pred)) / (0.05 + 0.1 * np.abs(np.asarray(pred)))
    assert abs(z[ok].mean()) < 0.15 and 0.9 < z[ok].std() < 1.1
    # deterministic given the seed (a smaller study, twice)
    a, ta = models.simulated_study(n_subjects=5, seed=3)
    b, tb = models.simulated_study(n_subjects=5, seed=3)
    for sa, sb in zip(a.subjects, b.subjects):
        np.testing.assert_array_equal(sa.ts, sb.ts)
        np.testing.assert_array_equal(sa.ys, sb.ys)
    np.testing.assert_array_equal(np.asarray(ta["eta"]), np.asarray(tb["eta"]))


# ----------------------------------------------------------------------------- errors


def test_population_model_errors(theoph):
    model, data = theoph
    theta = _theta(THEOPH_THETA)
    for call in (lambda: model.latent({"ts": 1}), lambda: model.individual(theta, None),
                 lambda: model.dosing(theta, {}, [1, 2]),
                 lambda: model.simulate(jax.random.key(0), theta, "data"),
                 lambda: model.sample_latent(jax.random.key(0), None),
                 lambda: models.theophylline_closed_form(theta, 3)):
        with pytest.raises(ValueError, match="`data` must be a models.PopulationDataset"):
            call()
    # a dose into a compartment the model does not have names the subject
    bad = _small_design([np.array([1.0, 2.0])], [70.0], cmt_dose=3)
    with pytest.raises(ValueError, match="subject 1 has a dose into compartment CMT=3"):
        model.dosing(theta, None, bad)
    # individual parameters without the subject axis
    flat = model.replace(individual=lambda th, d: {"ka": jnp.exp(th["lKa"])})
    with pytest.raises(ValueError, match="leading subject axis of 12"):
        flat.individual(theta, data)
    p = model.individual(theta, data)
    with pytest.raises(ValueError, match=r"`ys` must have shape \(S, K, 2\)"):
        model.observation(theta, p, np.zeros((12, 11)), jnp.zeros((12, 11, 3)))
    with pytest.raises(ValueError, match="`noise` must return an elementwise"):
        model.replace(noise=lambda th, pr: dist.Normal(0.0, 1.0)).noise(
            theta, jnp.zeros((12, 11)))
    with pytest.raises(ValueError, match=r"replace\(\) got unknown arguments \['ode'\]"):
        model.replace(ode=None)
    kw = dict(name="x", vector_field=lambda t, y, p: -y, state_names=("a",),
              latent=lambda d: {}, individual=lambda th, d: {}, observation=lambda *a: 0,
              noise=lambda th, pr: None)
    models.PopulationModel(**kw)
    with pytest.raises(ValueError, match="`dose_scale`"):
        models.PopulationModel(**kw, dose_scale=(1.0, 2.0))
    with pytest.raises(ValueError, match="`latent` must be a callable"):
        models.PopulationModel(**{**kw, "latent": None})
    with pytest.raises(ValueError, match="`state_names`"):
        models.PopulationModel(**{**kw, "state_names": ()})
