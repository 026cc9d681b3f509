"""FOCE-I's sensitivity route (`inference.fit_population`, method "foce-i"): the
predictions' Jacobian in the random effects from the forward sensitivity equations solved
with the states, and the objective's gradient built from it, against independent
computations: central differences of plain solves (`PopulationModel.predict`), and the
NumPy FOCE-I of theophylline (Bateman function) with its objective's central differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import inference
import models
from inference.population import _foce_sensitivity as fs
from inference.population._sites import _effect_logprob
from test_foce import ofv, subjects


def two_dose_data(infusion: bool):
    """Three subjects of the theophylline model, 4 mg/kg at 0 and 12 h (the second a
    jump of the solve, or with ``infusion`` a 2-hour zero-order input into the central
    compartment: a dose schedule), five samples each (one right at the second dose)."""
    table = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "RATE")}
    obs = {1: [1.0, 4.0, 12.0, 14.0, 20.0], 2: [0.5, 3.0, 8.0, 13.0, 24.0],
           3: [2.0, 6.0, 12.5, 16.0, 22.0]}
    for i, times in obs.items():
        # (the sample at 12 h is listed before the dose there: the pre-dose trough)
        for t, evid in sorted([(0.0, 1), (12.0, 1)] + [(t, 0) for t in times],
                              key=lambda e: (e[0], e[1])):
            inf = infusion and evid and t == 12.0
            row = (i, t, "." if evid else 5.0, 4.0 if evid else ".", evid,
                   2 if inf or not evid else 1, 2.0 if inf else 0.0)
            for k, v in zip(table, row):
                table[k].append(v)
    return models.PopulationDataset.from_table(table)


@pytest.mark.parametrize("doses", ["jumps", "schedule"])
def test_sensitivities_equal_central_differences_of_plain_solves(doses):
    """``J = d pred / d eta`` from the augmented solve against central differences of
    plain solves. ``"jumps"``: doses at 0 (the initial sensitivities) and at 12 h (a jump)
    whose amounts depend on ``eta`` (a bioavailability ``exp(0.3 omega_1 eta_1)``, so
    ``S`` jumps too); ``"schedule"``: a population lag time (0.5 h) and an infusion at 12
    h, a dose schedule whose rate states sit after the augmented ones."""
    model = models.theophylline()
    if doses == "jumps":
        data = two_dose_data(infusion=False)
        model = model.replace(dose_sizes=lambda theta, p, sizes: sizes * jnp.exp(
            0.3 * theta["omega"][1] * theta["eta"][:, 1])[:, None, None])
    else:
        data = two_dose_data(infusion=True)
        model = model.replace(dose_parameters=lambda theta, p: {
            "ALAG1": jnp.broadcast_to(0.5 * jnp.exp(theta["lKe"] + 2.4), (3,))})
    phi = {"lKa": jnp.asarray(0.4), "lCl": jnp.asarray(-3.2), "lKe": jnp.asarray(-2.4),
           "omega": jnp.asarray([0.6, 0.3]), "sigma": jnp.asarray(0.7)}
    eta = jnp.asarray(np.random.default_rng(1).normal(size=(3, 2)))
    ts, ys = data.observations()
    seen = ~np.isnan(ys)
    ctx = fs.Context(model, data, "eta", (2,), 2, np.asarray(ts), np.where(seen, ys, 0.0),
                     seen, float(ts.max()), dict(solver=model.solver, rtol=1e-10,
                                                 atol=1e-12, driver=None), _effect_logprob)
    assert fs.sensitivity_refusal(model, data, "foce-i", dict(phi, eta=eta), "eta") is None
    pred, J = jax.jit(lambda e: fs.evaluate(ctx, phi, e)[:2])(eta)
    predict = lambda e: np.asarray(model.predict(dict(phi, eta=e), data))  # noqa: E731
    np.testing.assert_allclose(pred, predict(eta), rtol=1e-8, atol=1e-10)
    h = 1e-5
    for k in range(2):
        e = np.zeros((3, 2))
        e[:, k] = h
        ref = (predict(eta + e) - predict(eta - e)) / (2 * h)
        np.testing.assert_allclose(J[..., k], ref, rtol=1e-5, atol=1e-7)
    assert np.all(np.abs(J[:, 3:, 1]) > 1e-3)  # the second dose's sensitivity is in it


def test_objective_and_gradient_equal_an_independent_foce_i(monkeypatch):
    """The objective `fit_population` minimises on the sensitivity route (value and
    exact gradient, the modes re-found at each point) at a point away from the optimum:
    against the NumPy FOCE-I of theophylline and its central differences. The gradient
    includes the modes' dependence on the population parameters, whose exact Hessian
    the route takes by central differences of its first-order gradient."""
    captured = {}

    def minimize(fun, x0, **kwargs):
        captured["fun"] = fun
        return scipy.optimize.OptimizeResult(x=np.asarray(x0), success=False, nit=0,
                                             message="stopped by the test")

    monkeypatch.setattr(scipy.optimize, "minimize", minimize)
    fit = inference.fit_population(models.theophylline(), models.load_dataset("theophylline"))
    assert fit.route == "sensitivities"
    # x = (lKa, lCl, lKe, log omega (2), log sigma): the library's unconstrained scale
    x = np.array([0.45, -3.25, -2.4, np.log(0.6), np.log(0.2), np.log(0.75)])
    v, g = captured["fun"](x)
    _, subj = subjects()
    f = lambda z: ofv(z, subj, np.zeros((len(subj), 2)))   # noqa: E731
    assert v == pytest.approx(f(x), abs=1e-5)
    h = 1e-4
    E = np.eye(x.size) * h
    ref = np.array([(f(x + E[i]) - f(x - E[i])) / (2 * h) for i in range(x.size)])
    np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_route_falls_back_where_sensitivities_do_not_apply():
    """The Laplace method, a lag time with a random effect and a reset keep the
    second-order route, saying why."""
    model, data = models.theophylline(), models.load_dataset("theophylline")
    theta = model.sample_latent(jax.random.key(0), data)
    assert fs.sensitivity_refusal(model, data, "foce-i", theta, "eta") is None
    assert "laplace" in fs.sensitivity_refusal(model, data, "laplace", theta, "eta")
    lagged = model.replace(dose_parameters=lambda theta, p: {"ALAG1": 0.2 * p["ka"]})
    assert "random effects" in fs.sensitivity_refusal(lagged, data, "foce-i", theta, "eta")
    table = {"ID": [1, 1, 1, 1, 1], "TIME": [0.0, 1.0, 5.0, 5.0, 6.0],
             "DV": [".", 2.0, ".", ".", 1.0], "AMT": [4.0, ".", ".", 4.0, "."],
             "EVID": [1, 0, 3, 1, 0], "CMT": [1, 2, 1, 1, 2]}
    reset = models.PopulationDataset.from_table(table)
    theta1 = model.sample_latent(jax.random.key(0), reset)
    assert "resets" in fs.sensitivity_refusal(model, reset, "foce-i", theta1, "eta")


@pytest.mark.slow
def test_fit_through_diffrax_equals_the_default_route():
    """The same FOCE-I fit with every solve through ``jax.vmap(diffrax.diffeqsolve)``
    between the doses (a driver that records no mesh: the central-difference copies solve
    adaptively) reaches the default route's optimum."""
    import gradsolve as gs

    data, _ = models.simulated_study(n_subjects=5, seed=0)
    fits = [inference.fit_population(models.two_compartment_oral(), data, solver=gs.Tsit5(),
                                     driver=d) for d in (None, gs.drivers.Diffrax())]
    assert all(f.converged for f in fits)
    np.testing.assert_allclose(fits[1].ofv, fits[0].ofv, rtol=1e-8)
    for k in fits[0].params:
        np.testing.assert_allclose(fits[1].params[k], fits[0].params[k], atol=1e-4)
