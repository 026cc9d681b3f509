"""Hierarchical optimisation of PEtab problems (`models.load_petab(..., hierarchical=True)`):
scalings, offsets and noise parameters optimised in closed form inside the objective.

Independent references: the one-state decay model ``A = A0 exp(-k t)`` in closed form with
SciPy's Nelder-Mead on its full negative log-likelihood (``scipy.stats`` densities) over the
inner parameters; central differences of the reduced objective; a multistart fit of the
same problem without hierarchical optimisation.
"""

import shutil
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats

pytest.importorskip("petab")
libsbml = pytest.importorskip("libsbml")

import gradsolve as gs  # noqa: E402
import inference  # noqa: E402
import models  # noqa: E402
from test_petab_fit import _decay_problem  # noqa: E402

T = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0])
A_TRUE = 3.0 * np.exp(-0.7 * T)
RAW = A_TRUE + 0.1 * np.array([0.9, -1.1, 0.4, -0.6, 1.3, 0.2, -0.8, 0.5])
E = 0.05 * np.array([-0.7, 1.2, 0.3, -1.4, 0.6, 0.9, -0.2, -0.5])
SCALED = 2.5 * A_TRUE + 0.8 + E  # scale 2.5, offset 0.8, noise sd 0.05
SCALED_LOG = 2.5 * A_TRUE * np.exp(E)  # log-normal: scale 2.5, sd 0.05 (natural log)
RAW_SD = 0.1
LINEAR = "observableParameter1_obs_s * A + observableParameter2_obs_s"
# the log10-transformed observable's parameters: no offset
LOG_PARAMS = {"parameterId": ["A0", "k", "scale", "sigma"], "parameterScale": "log10",
              "lowerBound": 1e-3, "upperBound": 1e3, "nominalValue": [3.0, 0.7, 2.0, 0.1],
              "estimate": 1}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The decay problem's SBML model, condition table and YAML (test_petab_fit's)."""
    path = tmp_path_factory.mktemp("template")
    _decay_problem(path)
    return path


def _write(template: Path, path: Path, *, formula=LINEAR, overrides="scale;offset",
           transformation="lin", data=SCALED, extra=(), types=None, priors=None,
           noise="normal", params=None, **load):
    """A decay problem with two observables: ``obs_raw = A`` (noise sd 0.1, fixed) and
    ``obs_s`` (``formula``, its placeholders ``overrides``, noise ``sigma``), ``extra``
    more ``(id, formula, data, noise parameter)`` observables; A0 and k estimated (log10),
    scale (log10), offset (lin) and sigma (log10) estimated; ``types`` a parameterType
    column, ``priors`` objectivePrior columns."""
    path.mkdir(parents=True, exist_ok=True)
    for f in ("model.xml", "conditions.tsv", "problem.yaml"):
        shutil.copy(template / f, path / f)
    obs = [("obs_raw", "A", "noiseParameter1_obs_raw", "lin"),
           ("obs_s", formula, "noiseParameter1_obs_s", transformation)]
    obs += [(o, f, f"noiseParameter1_{o}", "lin") for o, f, _, _ in extra]
    pd.DataFrame({"observableId": [o[0] for o in obs],
                  "observableFormula": [o[1] for o in obs],
                  "noiseFormula": [o[2] for o in obs],
                  "observableTransformation": [o[3] for o in obs],
                  "noiseDistribution": noise}).to_csv(path / "observables.tsv", sep="\t",
                                                      index=False)
    rows = [pd.DataFrame({"observableId": "obs_raw", "simulationConditionId": "c0",
                          "time": T, "measurement": RAW, "noiseParameters": RAW_SD}),
            pd.DataFrame({"observableId": "obs_s", "simulationConditionId": "c0", "time": T,
                          "measurement": data, "observableParameters": overrides,
                          "noiseParameters": "sigma"})]
    rows += [pd.DataFrame({"observableId": o, "simulationConditionId": "c0", "time": T,
                           "measurement": d, "noiseParameters": s}) for o, _, d, s in extra]
    pd.concat(rows).to_csv(path / "measurements.tsv", sep="\t", index=False)
    table = pd.DataFrame(params or {
        "parameterId": ["A0", "k", "offset", "scale", "sigma"],
        "parameterScale": ["log10", "log10", "lin", "log10", "log10"],
        "lowerBound": [1e-3, 1e-3, -10.0, 1e-3, 1e-3],
        "upperBound": [1e3, 1e3, 10.0, 1e3, 1e3],
        "nominalValue": [3.0, 0.7, 0.5, 2.0, 0.1], "estimate": 1})
    for col, values in (types or {}).items():
        table[col] = values
    for col, values in (priors or {}).items():
        table[col] = values
    table.to_csv(path / "parameters.tsv", sep="\t", index=False)
    load.setdefault("solver", gs.Tsit5())
    return models.load_petab(path / "problem.yaml", **load)


def _nll(a0, k, scale, offset, sigma, transformation="lin"):
    """The full negative log-likelihood in closed form (linear parameter values)."""
    a = a0 * np.exp(-k * T)
    out = -np.sum(stats.norm.logpdf(RAW, a, RAW_SD))
    if transformation == "lin":
        return out - np.sum(stats.norm.logpdf(SCALED, scale * a + offset, sigma))
    # log10-normal: the density of log10(m), times d log10(m) / dm
    return out - np.sum(stats.norm.logpdf(np.log10(SCALED_LOG), np.log10(scale * a), sigma)
                        - np.log(SCALED_LOG * np.log(10.0)))


@pytest.fixture(scope="module")
def linear(template, tmp_path_factory):
    return _write(template, tmp_path_factory.mktemp("linear"))


# ----------------------------------------------------------------- detection
def test_scaling_offset_and_noise_are_found_and_hierarchical_false_keeps_them(template,
                                                                              linear,
                                                                              tmp_path):
    assert linear.parameter_ids == ("A0", "k")
    assert linear.inner_parameter_ids == ("offset", "scale", "sigma")
    assert linear.inner_kinds == {"offset": "offset", "scale": "scaling", "sigma": "sigma"}
    assert linear.full_parameter_ids == ("A0", "k", "offset", "scale", "sigma")
    assert np.asarray(linear.bounds[0]).shape == (2,) and len(linear.scales) == 2
    # obs_s's noise is the inner sigma, obs_raw's fixed (the table's rows, obs_raw's
    # first, in the residuals' order): the LM leaves sigma's derivative out of the
    # curvature (the reduced problem's Fisher information)
    df = linear.petab_problem.measurement_df
    np.testing.assert_array_equal(linear.residual_layout().profiled,
                                  np.asarray(df["observableId"] == "obs_s"))
    # (d) the opt-out is the problem as it was: every estimated parameter outer
    old = _write(template, tmp_path, hierarchical=False)
    assert old.parameter_ids == ("A0", "k", "offset", "scale", "sigma")
    assert old.inner_parameter_ids == () and old.full is old
    assert old.residual_layout().profiled is None
    # a start of every parameter is refused naming the inner ones; a dict of them is a
    # start of the outer ones (the inner ones set in closed form)
    with pytest.raises(ValueError, match=r"has 5 parameters, the problem 2 .*inner "
                                         r"parameters \['offset', 'scale', 'sigma'\]"):
        inference.fit(linear, init=np.asarray(old.nominal))
    with pytest.raises(ValueError, match=r"keys \['kk'\] that are not parameters"):
        inference.fit(linear, init={**dict(zip(old.parameter_ids, old.nominal)), "kk": 1.0})
    assert linear.full.parameter_ids == old.parameter_ids
    np.testing.assert_allclose(linear.full.nominal, old.nominal)


def test_priors_log_observables_and_laplace_noise_decide_what_is_inner(template, tmp_path):
    # a prior keeps its parameter outer
    p = _write(template, tmp_path / "prior", priors={
        "objectivePriorType": ["", "", "", "parameterScaleNormal", ""],
        "objectivePriorParameters": ["", "", "", "0.4;0.2", ""]})
    assert p.inner_parameter_ids == ("offset", "sigma")
    # a log-transformed observable: a pure factor is a scaling (an offset in log space);
    # with an additive offset neither is inner
    p = _write(template, tmp_path / "log", formula="observableParameter1_obs_s * A",
               overrides="scale", transformation="log10", data=SCALED_LOG,
               params=LOG_PARAMS)
    assert p.inner_parameter_ids == ("scale", "sigma") and p.parameter_ids == ("A0", "k")
    assert p.inner_kinds["scale"] == "scaling"
    p = _write(template, tmp_path / "log_offset", transformation="log10",
               data=SCALED_LOG)
    assert p.inner_parameter_ids == ("sigma",)
    # Laplace noise: nothing is inner
    p = _write(template, tmp_path / "laplace", noise="laplace")
    assert p.inner_parameter_ids == () and len(p.parameter_ids) == 5


def test_a_parameter_type_column_decides_and_a_nonlinear_mark_is_named(template, tmp_path):
    p = _write(template, tmp_path / "marked",
               types={"parameterType": ["", "", "", "", "sigma"]})
    assert p.parameter_ids == ("A0", "k", "offset", "scale")
    assert p.inner_parameter_ids == ("sigma",)
    # (e) marked a scaling, but it enters nonlinearly: the error names it and the formula
    with pytest.raises(ValueError, match=r"'scale'.*scaling.*A\*exp\(scale\)"):
        _write(template, tmp_path / "nonlinear", formula="exp(scale) * A + offset",
               overrides="", types={"parameterType": ["", "", "offset", "scaling", "sigma"]})
    # unmarked, the same parameter is simply outer
    p = _write(template, tmp_path / "nonlinear_auto", formula="exp(scale) * A + offset",
               overrides="")
    assert p.inner_parameter_ids == ("offset", "sigma") and "scale" in p.parameter_ids
    with pytest.raises(ValueError, match=r"parameterType 'noise' of parameter 'sigma'"):
        _write(template, tmp_path / "unknown", types={"parameterType": [""] * 4 + ["noise"]})


def test_groups_that_do_not_nest_keep_their_noise_outer_or_raise_when_marked(template,
                                                                              tmp_path):
    # `scale` is shared by obs_s (noise sigma) and obs_t (noise tau): its closed form would
    # depend on sigma / tau
    params = {"parameterId": ["A0", "k", "offset", "scale", "sigma", "tau"],
              "parameterScale": ["log10", "log10", "lin", "log10", "log10", "log10"],
              "lowerBound": [1e-3, 1e-3, -10.0, 1e-3, 1e-3, 1e-3],
              "upperBound": [1e3, 1e3, 10.0, 1e3, 1e3, 1e3],
              "nominalValue": [3.0, 0.7, 0.5, 2.0, 0.1, 0.1], "estimate": 1}
    extra = [("obs_t", "scale * A", 2.5 * A_TRUE + E[::-1], "tau")]
    with pytest.warns(UserWarning, match=r"\['offset', 'scale'\].*\['sigma', 'tau'\]"):
        p = _write(template, tmp_path / "auto", extra=extra, params=params)
    assert p.inner_parameter_ids == ("offset", "scale")
    assert p.residual_layout().profiled is None  # the noise stayed outer: no row profiled
    with pytest.raises(NotImplementedError, match="'sigma', 'tau'"):
        _write(template, tmp_path / "marked", extra=extra, params=dict(
            params, parameterType=["", "", "offset", "scaling", "sigma", "sigma"]))


# ----------------------------------------------------------------- the closed forms
@pytest.mark.parametrize("transformation", ["lin", "log10"])
def test_the_inner_optimum_is_a_direct_minimisation_of_the_full_likelihood(
        template, linear, tmp_path, transformation):
    # (a) at a fixed outer point off the optimum: the closed form against Nelder-Mead over
    # the inner parameters of the full negative log-likelihood in closed form
    if transformation == "lin":
        problem, start = linear, [0.3, 0.5, -1.0]
    else:
        problem = _write(template, tmp_path, formula="observableParameter1_obs_s * A",
                         overrides="scale", transformation="log10", data=SCALED_LOG,
                         params=LOG_PARAMS)
        start = [0.3, -1.0]
    a0, k = 2.6, 0.8
    x = np.log10([a0, k])
    full, ll = problem.full_parameters(x, log_likelihood=True)
    full = np.asarray(full)
    inner = full[2:]

    def nll(v):
        if transformation == "lin":
            return _nll(a0, k, 10 ** v[0], v[1], 10 ** v[2])
        return _nll(a0, k, 10 ** v[0], 0.0, 10 ** v[1], "log10")

    ref = optimize.minimize(nll, start, method="Nelder-Mead",
                            options=dict(xatol=1e-11, fatol=1e-14, maxiter=20000))
    # the table's order: offset (lin), scale (log10), sigma (log10)
    ours = inner[[1, 0, 2]] if transformation == "lin" else inner
    np.testing.assert_allclose(ours, ref.x, atol=1e-6)
    assert float(ll) == pytest.approx(-ref.fun, rel=1e-8)
    # the reduced objective is the full one at the inner optimum
    assert float(problem.log_likelihood(x)) == pytest.approx(float(ll), rel=1e-12)
    assert float(problem.full.log_likelihood(full)) == pytest.approx(float(ll), rel=1e-12)
    # its simulation table holds the predictions at the inner optimum
    sim = problem.simulate(x)
    s = sim[sim.observableId == "obs_s"]
    scale = 10 ** ours[0]
    pred = scale * a0 * np.exp(-k * T) + (ours[1] if transformation == "lin" else 0.0)
    np.testing.assert_allclose(s["simulation"], pred, rtol=1e-6)
    np.testing.assert_allclose(s["sigma"], 10 ** ours[-1], rtol=1e-10)


def test_the_reduced_gradient_and_residual_jacobian_are_central_differences(template,
                                                                            tmp_path):
    # (b) tight tolerances: central differences of re-solved ODEs resolve the derivative
    problem = _write(template, tmp_path, rtol=1e-12, atol=1e-14)
    x = np.log10([2.6, 0.8])
    grad = np.asarray(jax.grad(problem.log_likelihood)(x))
    jac = np.asarray(jax.jacfwd(lambda x: problem.residuals(x)[:2])(x)[0])
    h = 1e-5
    fd, fd_jac = np.empty(2), np.empty_like(jac)
    for i in range(2):
        e = np.zeros(2)
        e[i] = h
        fd[i] = (float(problem.log_likelihood(x + e)) -
                 float(problem.log_likelihood(x - e))) / (2 * h)
        fd_jac[:, i] = (np.asarray(problem.residuals(x + e).z) -
                        np.asarray(problem.residuals(x - e).z)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6)
    np.testing.assert_allclose(jac, fd_jac, rtol=1e-5, atol=1e-6 * np.abs(fd_jac).max())
    # the envelope theorem: the full gradient's outer part at the inner optimum is the
    # reduced gradient (its inner part vanishes)
    full = problem.full_parameters(x)
    g_full = np.asarray(jax.grad(problem.full.log_likelihood)(full))
    np.testing.assert_allclose(g_full[:2], grad, rtol=1e-7)
    np.testing.assert_allclose(g_full[2:], 0.0, atol=1e-6 * np.abs(grad).max())


def test_a_bound_clips_the_inner_optimum(template, tmp_path):
    # the offset's optimum (0.8) lies above an upper bound of 0.5: clipped there, and the
    # scale (estimated with it) and sigma are the optima given that offset
    params = {"parameterId": ["A0", "k", "offset", "scale", "sigma"],
              "parameterScale": ["log10", "log10", "lin", "log10", "log10"],
              "lowerBound": [1e-3, 1e-3, -10.0, 1e-3, 1e-3],
              "upperBound": [1e3, 1e3, 0.5, 1e3, 1e3],
              "nominalValue": [3.0, 0.7, 0.5, 2.0, 0.1], "estimate": 1}
    problem = _write(template, tmp_path, params=params)
    a0, k = 3.0, 0.7
    full = np.asarray(problem.full_parameters(np.log10([a0, k])))
    assert full[2] == 0.5
    ref = optimize.minimize(lambda v: _nll(a0, k, 10 ** v[0], 0.5, 10 ** v[1]), [0.3, -1.0],
                            method="Nelder-Mead",
                            options=dict(xatol=1e-11, fatol=1e-14, maxiter=20000))
    np.testing.assert_allclose(full[3:], ref.x, atol=1e-6)


# ----------------------------------------------------------------- fits
@pytest.mark.slow
def test_fitting_the_reduced_problem_reaches_the_full_problems_optimum(template, linear,
                                                                       tmp_path):
    # (c) the same optimum as the full problem's multistart, and the fit reports the
    # inner parameters there
    res = inference.fit(linear, n_starts=4, seed=0)
    full = _write(template, tmp_path, hierarchical=False)
    ref = inference.fit(full, n_starts=8, seed=0)
    assert res.loss == pytest.approx(ref.loss, abs=1e-6)
    assert res.parameter_ids == ("A0", "k") and res.starts.shape == (4, 2)
    assert set(res.params) == set(full.parameter_ids)
    for p in full.parameter_ids:
        assert res.params[p] == pytest.approx(ref.params[p], abs=1e-4)
        assert res.all_params[p].shape == (4,)
    assert float(full.log_likelihood(res.params)) == pytest.approx(-res.loss, rel=1e-10)
    # profiles see the reduced problem
    prof = inference.profile(linear, res, parameters="k", max_steps=5)
    assert prof.all_parameter_ids == ("A0", "k")


def test_the_objective_without_hierarchy_is_unchanged_where_nothing_is_inner(template,
                                                                               tmp_path):
    # Laplace noise: no inner parameter, the problem is the full one whatever the flag
    on = _write(template, tmp_path / "on", noise="laplace")
    off = _write(template, tmp_path / "off", noise="laplace", hierarchical=False)
    x = np.asarray(off.nominal)
    assert float(on.log_likelihood(x)) == float(off.log_likelihood(x))
    np.testing.assert_array_equal(np.asarray(on.full_parameters(x)), x)
