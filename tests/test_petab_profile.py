"""Profile likelihoods of PEtab problems (`inference.profile`).

Independent references: a problem whose likelihood is Gaussian in its parameters (``x' =
a``, ``x(0) = b``, observed with known noise sd: the data are linear in ``(a, b)``), whose
95 % profile intervals are the least-squares estimates ``+- sqrt(chi2_1(0.95))`` standard
errors exactly (NumPy's ``lstsq`` and ``sigma^2 (X^T X)^-1``); and the one-state decay
problem of ``test_petab_fit`` (data ``y = A0 exp(-k t)`` plus normal noise of sd ``sigma``,
all three estimated on ``log10``), whose negative log-likelihood is closed-form: SciPy's
Nelder–Mead minimises it over the other two coordinates on the profiled one's values, and
``brentq`` finds where that profile rises by ``chi2_1(0.95) / 2`` above the closed-form
optimum.
"""


import dataclasses
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

pytest.importorskip("petab")
libsbml = pytest.importorskip("libsbml")

import gradsolve as gs  # noqa: E402
import inference  # noqa: E402
import models  # noqa: E402
from inference._result import FitResult  # noqa: E402
from conftest import one_reaction_sbml, write_petab  # noqa: E402
from test_petab_fit import DECAY_T, DECAY_Y, _decay_mle, _decay_problem  # noqa: E402

THRESHOLD = stats.chi2.ppf(0.95, 1) / 2


def _nll(x):
    """The decay problem's negative log-likelihood, closed form, ``x`` on log10."""
    a, k, s = 10.0 ** np.asarray(x, float)
    r = DECAY_Y - a * np.exp(-k * DECAY_T)
    n = len(DECAY_T)
    return 0.5 * n * np.log(2 * np.pi) + n * np.log(s) + np.sum(r**2) / (2 * s**2)


def _profile_ref(j, v, x_opt):
    """min of `_nll` over the two coordinates other than ``j``, with ``x_j = v``."""
    others = [i for i in range(3) if i != j]

    def f(y):
        x = np.empty(3)
        x[j], x[others] = v, y
        return _nll(x)

    return optimize.minimize(f, x_opt[others], method="Nelder-Mead",
                             options=dict(xatol=1e-11, fatol=1e-13, maxiter=20000,
                                          maxfev=40000)).fun


def _interval_ref(j, x_opt, f_opt):
    """Both ends of ``j``'s 95 % profile interval, by brentq on `_profile_ref`."""
    ends = []
    for sign in (-1, 1):
        def rise(v):
            return _profile_ref(j, v, x_opt) - f_opt - THRESHOLD

        far = x_opt[j] + sign * 0.05
        while rise(far) < 0:
            far = x_opt[j] + 2 * (far - x_opt[j])
        ends.append(optimize.brentq(rise, x_opt[j], far, xtol=1e-12))
    return ends


# ------------------------------------------------- a likelihood Gaussian in its parameters
LIN_T = np.linspace(0.0, 5.0, 12)
LIN_SD = 0.1
LIN_Y = 1.0 + 0.5 * LIN_T + LIN_SD * np.random.default_rng(3).standard_normal(LIN_T.size)


def _linear_problem(path: Path):
    """A PEtab problem of dx/dt = a, x(0) = b (so x = b + a t), observed as x with noise sd
    0.1 known; a and b estimated on the linear scale."""
    doc = one_reaction_sbml("line", "X", "b", ("a", "b"), "a", consumed=False)
    yaml = write_petab(
        path, doc,
        observables={"observableId": ["obs_X"], "observableFormula": ["X"],
                     "noiseFormula": [str(LIN_SD)], "noiseDistribution": ["normal"]},
        measurements={"observableId": "obs_X", "simulationConditionId": "c0", "time": LIN_T,
                      "measurement": LIN_Y},
        parameters={"parameterId": ["a", "b"], "parameterScale": "lin", "lowerBound": -10.0,
                    "upperBound": 10.0, "nominalValue": [1.0, 0.0], "estimate": 1})
    return models.load_petab(yaml, solver=gs.Tsit5(), hierarchical=False)


def _linear_truth():
    """The linear problem's least-squares estimates of (a, b) and their standard errors."""
    design = np.stack([LIN_T, np.ones_like(LIN_T)], axis=1)        # columns a, b
    est = np.linalg.lstsq(design, LIN_Y, rcond=None)[0]
    se = LIN_SD * np.sqrt(np.diag(np.linalg.inv(design.T @ design)))
    return est, se


@pytest.fixture(scope="module")
def line(tmp_path_factory):
    return _linear_problem(tmp_path_factory.mktemp("line"))


@pytest.mark.slow  # ~20 s; profiles against closed forms in the normal suite:
# test_profile_intervals_match_the_closed_form_profiles
def test_a_likelihood_gaussian_in_its_parameters_has_the_analytic_intervals(line):
    # y = b + a t + e, e ~ N(0, sd^2): the profile of each parameter is exactly quadratic,
    # its 95 % interval the estimate +- sqrt(chi2_1(0.95)) standard errors
    problem = line
    est, se = _linear_truth()
    half = np.sqrt(stats.chi2.ppf(0.95, 1)) * se
    fit = inference.fit(problem, n_starts=2, seed=0)
    prof = inference.profile(problem, fit)
    assert prof.parameter_ids == ("a", "b")
    for j, p in enumerate(prof.parameter_ids):
        assert prof.estimate[p] == pytest.approx(est[j], abs=1e-7)
        np.testing.assert_allclose(prof.intervals[p], [est[j] - half[j], est[j] + half[j]],
                                   atol=1e-6 * half[j], err_msg=p)
        assert prof.identifiable[p] == (True, True)
    # at 68.3 % (one standard error) the intervals shrink by sqrt(chi2_1(0.95)) = 1.96
    prof68 = inference.profile(problem, fit, confidence=stats.chi2.cdf(1.0, 1))
    for j, p in enumerate(prof68.parameter_ids):
        np.testing.assert_allclose(prof68.intervals[p], [est[j] - se[j], est[j] + se[j]],
                                   atol=1e-6 * se[j], err_msg=p)


@pytest.mark.slow  # ~15 s (the linear problem's compile); the same restart in the normal
# suite: test_a_profile_from_a_point_that_is_not_the_optimum_restarts_from_the_optimum
def test_a_profile_from_far_off_the_optimum_has_the_analytic_intervals(line):
    # the fit "stopped" 6 and 5 standard errors off (objective ~170 above the optimum):
    # the profiles re-optimise from the lower points they find and give the analytic
    # intervals of the optimum, never the start's zero-width ones
    est, se = _linear_truth()
    half = np.sqrt(stats.chi2.ppf(0.95, 1)) * se
    off = _result_at(line, est + [0.3, -0.5])
    with pytest.warns(RuntimeWarning, match="not the optimum") as rec:
        prof = inference.profile(line, off)
    assert prof.n_restarts >= 1 and prof.reliable
    assert prof.fit_objective == pytest.approx(off.loss, rel=1e-12)
    assert f"{off.loss:.6f}" in str(rec[0].message)
    assert f"{prof.objective_opt:.6f}" in str(rec[0].message)
    for j, p in enumerate(prof.parameter_ids):
        assert prof.estimate[p] == pytest.approx(est[j], abs=1e-7)
        np.testing.assert_allclose(prof.intervals[p], [est[j] - half[j], est[j] + half[j]],
                                   atol=1e-6 * half[j], err_msg=p)
        assert prof.identifiable[p] == (True, True)


def _result_at(problem, x, loss=None):
    """A one-start `FitResult` of ``problem`` at ``x`` (its loss a fresh solve's unless
    given)."""
    ids = problem.parameter_ids
    if loss is None:
        loss = -float(problem.log_likelihood(np.asarray(x, float)))
    return FitResult.of_starts(
        {p: np.array([v]) for p, v in zip(ids, x)}, [loss], loss_history=np.array([[loss]]),
        n_records=0, n_records_per_start=np.zeros(1, int), n_grad_evals=0, wall_time=0.0,
        status=np.zeros(1, np.int32), objective="map", n_steps=0,
        max_error_ratio=np.zeros(1), parameter_ids=tuple(ids))


def _with_unused_parameter(path: Path):
    """The decay problem with a fourth estimated parameter ``u`` that enters nothing."""
    _decay_problem(path)
    doc = libsbml.readSBMLFromFile(str(path / "model.xml"))
    p = doc.getModel().createParameter()
    p.setId("u"), p.setValue(1.0), p.setConstant(True)
    libsbml.writeSBMLToFile(doc, str(path / "model.xml"))
    with open(path / "parameters.tsv", "a") as f:
        f.write("u\tlog10\t0.001\t1000.0\t1.0\t1\n")
    return models.load_petab(path / "problem.yaml", solver=gs.Tsit5(), hierarchical=False)


@pytest.fixture(scope="module")
def decay(tmp_path_factory):
    return _decay_problem(tmp_path_factory.mktemp("decay"))


@pytest.fixture(scope="module")
def decay_fit(decay):
    return inference.fit(decay, n_starts=6, seed=1)


@pytest.fixture(scope="module")
def decay_profile(decay, decay_fit):
    return inference.profile(decay, decay_fit)


@pytest.fixture(scope="module")
def with_unused(tmp_path_factory):
    return _with_unused_parameter(tmp_path_factory.mktemp("unused"))


def test_profile_intervals_match_the_closed_form_profiles(decay, decay_fit, decay_profile):
    x_opt, f_opt = _decay_mle()
    prof = decay_profile
    assert prof.parameter_ids == ("A0", "k", "sigma") and prof.objective == "map"
    assert prof.threshold == pytest.approx(THRESHOLD, rel=1e-12)
    assert prof.objective_opt == pytest.approx(decay_fit.loss, abs=1e-8) and not prof.notes
    worst_end = worst_path = 0.0
    for j, p in enumerate(prof.parameter_ids):
        ref = _interval_ref(j, x_opt, f_opt)
        worst_end = max(worst_end, np.max(np.abs(np.asarray(prof.intervals[p]) - ref)))
        assert prof.identifiable[p] == (True, True)
        assert prof.stop_reasons[p] == ("threshold", "threshold")
        path = prof.paths[p]
        # the profiled column is the held value; the others minimise the objective there
        np.testing.assert_array_equal(path.x[:, j], path.values)
        assert np.all(np.diff(path.values) > 0) and path.converged.all()
        assert path.values[0] < ref[0] and path.values[-1] > ref[1]
        dev = [f - _profile_ref(j, v, x_opt) for v, f in zip(path.values, path.objective)]
        worst_path = max(worst_path, np.max(np.abs(dev)))
        np.testing.assert_allclose(path.ratio, np.exp(-(path.objective - prof.objective_opt)))
        assert path.ratio[np.searchsorted(path.values, prof.estimate[p])] == \
            pytest.approx(1.0, abs=1e-8)
    assert worst_end < 1e-6, worst_end  # measured 1.6e-9
    assert worst_path < 1e-6, worst_path  # measured 1.2e-8
    # every walk advanced in the same rounds: far fewer rounds than points
    points = sum(len(prof.paths[p].values) for p in prof.parameter_ids)
    assert prof.n_rounds < points / 3


def test_a_parameter_outside_the_likelihood_has_an_open_interval(with_unused):
    x_opt, f_opt = _decay_mle()
    res = _result_at(with_unused, [*x_opt, 0.0])
    prof = inference.profile(with_unused, res, parameters=["u", "k"])
    assert prof.parameter_ids == ("k", "u")
    assert prof.intervals["u"] == (-np.inf, np.inf)
    assert prof.identifiable["u"] == (False, False)
    assert prof.stop_reasons["u"] == ("bound", "bound")
    path = prof.paths["u"]
    assert path.values[0] == -3.0 and path.values[-1] == 3.0
    np.testing.assert_allclose(path.ratio, 1.0, atol=1e-6)  # flat: u changes nothing
    # the identifiable one is unchanged by the extra coordinate
    np.testing.assert_allclose(prof.intervals["k"], _interval_ref(1, x_opt, f_opt), atol=1e-6)
    assert prof.identifiable["k"] == (True, True)


def _shifted(decay):
    """A result of the decay problem off its optimum by (0.3, -0.2, 0.4) on log10: an
    objective ~460 above it, and A0 and sigma 2 and 2.5 times theirs."""
    x_opt, _ = _decay_mle()
    return _result_at(decay, x_opt + [0.3, -0.2, 0.4])


def test_a_profile_from_a_point_that_is_not_the_optimum_restarts_from_the_optimum(decay):
    x_opt, f_opt = _decay_mle()
    off = _shifted(decay)
    assert off.loss == pytest.approx(_nll([off.params[p] for p in decay.parameter_ids]),
                                     rel=1e-9)
    with pytest.warns(RuntimeWarning, match="not the optimum") as rec:
        prof = inference.profile(decay, off)
    # re-optimised from the lower points its walks found, then profiled from there
    assert prof.n_restarts >= 1 and prof.reliable
    assert prof.fit_objective == pytest.approx(off.loss, rel=1e-12)
    assert prof.objective_opt == pytest.approx(f_opt, abs=1e-6)
    np.testing.assert_allclose(prof.optimum, x_opt, atol=1e-5)
    # the warning and the notes give both objective values
    msg = str(rec[0].message)
    assert f"{off.loss:.6f}" in msg and f"{prof.objective_opt:.6f}" in msg
    assert prof.notes and f"{off.loss:.6f}" in prof.notes[0]
    for j, p in enumerate(prof.parameter_ids):
        assert prof.estimate[p] == pytest.approx(x_opt[j], abs=1e-5)
        np.testing.assert_allclose(prof.intervals[p], _interval_ref(j, x_opt, f_opt),
                                   atol=1e-6, err_msg=p)
        assert prof.identifiable[p] == (True, True)
        path = prof.paths[p]
        assert path.ratio[np.searchsorted(path.values, prof.estimate[p])] == \
            pytest.approx(1.0, abs=1e-6)


def test_with_no_restart_left_the_intervals_are_marked_unreliable_not_zero_width(decay):
    off = _shifted(decay)
    with pytest.warns(RuntimeWarning, match="not reliable"):
        prof = inference.profile(decay, off, max_restarts=0)
    assert prof.n_restarts == 0 and not prof.reliable
    assert prof.objective_opt < off.loss - 100  # the walks went far below the start
    nan_sides = 0
    for p in prof.parameter_ids:
        lo, hi = prof.intervals[p]
        # a side whose start is already past the threshold has no end, never the start
        for end, why, found in zip((lo, hi), prof.stop_reasons[p], prof.identifiable[p]):
            assert np.isnan(end) == (why == "not_optimum")
            assert not (np.isnan(end) and found)
            nan_sides += bool(np.isnan(end))
        assert not lo == hi, p
    assert nan_sides >= 1
    assert "UNRELIABLE" in repr(prof)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:  # the figure says so too, and marks the start at its own ratio, not at 1
        axes = prof.plot()
        assert "unreliable" in axes[0].figure.legends[0].get_title().get_text()
        for ax, p in zip(axes, prof.parameter_ids):
            marker = ax.get_lines()[1]
            start = prof.paths[p].values == prof.estimate[p]
            np.testing.assert_allclose(marker.get_ydata(), prof.paths[p].ratio[start])
    finally:
        plt.close("all")


def test_bad_arguments_are_named(decay, decay_fit, with_unused):
    for c in (0.0, 1.0, 1.5, -0.1, "0.9", True):
        with pytest.raises(ValueError, match="confidence"):
            inference.profile(decay, decay_fit, confidence=c)
    with pytest.raises(ValueError, match=r"\['nope'\] is not a parameter of the problem"):
        inference.profile(decay, decay_fit, parameters=["k", "nope"])
    for bad in (1, ["k", 2], []):
        with pytest.raises(ValueError, match="`parameters` must be parameter ids"):
            inference.profile(decay, decay_fit, parameters=bad)
    with pytest.raises(ValueError, match="max_restarts"):
        inference.profile(decay, decay_fit, max_restarts=-1)
    # at 1 % the interval's rise is 7.9e-5: the default tol 1e-3 cannot locate it
    with pytest.raises(ValueError, match="`tol` 0.001 must be below half the threshold"):
        inference.profile(decay, decay_fit, confidence=0.01)
    with pytest.raises(ValueError, match=r"it estimates \['u'\], which this problem"):
        inference.profile(decay, _result_at(with_unused, [0.0] * 4, loss=0.0))
    nan_fit = _result_at(decay, [0.0, np.nan, 0.0], loss=0.0)
    with pytest.raises(ValueError, match=r"params \['k'\] are not finite"):
        inference.profile(decay, nan_fit)
    with pytest.raises(ValueError, match="another problem"):
        inference.profile(with_unused, decay_fit)
    # same parameters, another objective value: a fit of other data
    other = _result_at(decay, [decay_fit.params[p] for p in decay.parameter_ids])
    shifted = FitResult.of_starts(other.all_params, other.losses + 1.0,
                                  **{k: getattr(other, k) for k in (
                                      "loss_history", "n_records", "n_records_per_start",
                                      "n_grad_evals", "wall_time", "status", "objective",
                                      "n_steps", "max_error_ratio", "parameter_ids")})
    with pytest.raises(ValueError, match="another problem"):
        inference.profile(decay, shifted)
    with pytest.raises(ValueError, match="max_steps"):
        inference.profile(decay, decay_fit, max_steps=0)
    with pytest.raises(TypeError, match="PetabProblem"):
        inference.profile(object(), decay_fit)
    with pytest.raises(TypeError, match="FitResult"):
        inference.profile(decay, decay_fit.params)


def test_an_inner_parameter_is_named_with_how_to_profile_it(tmp_path):
    # with hierarchical optimisation (the default) sigma is computed in closed form
    _decay_problem(tmp_path)
    hier = models.load_petab(tmp_path / "problem.yaml", solver=gs.Tsit5())
    assert hier.inner_parameter_ids == ("sigma",)
    res = _result_at(hier, [0.0, 0.0], loss=0.0)  # the names are checked before any solve
    with pytest.raises(ValueError, match=r"'sigma' \(sigma\) is an inner parameter of "
                                         r"hierarchical optimisation.*hierarchical=False"):
        inference.profile(hier, res, parameters=["k", "sigma"])
    # a fit without hierarchical optimisation: profile it on problem.full
    full = _result_at(hier.full, [0.0, 0.0, 0.0], loss=0.0)
    with pytest.raises(ValueError, match=r"it estimates \['sigma'\].*problem\.full"):
        inference.profile(hier, full)
    # the other way round: a hierarchical fit on the full problem lacks the inner ones
    with pytest.raises(ValueError, match=r"it lacks \['sigma'\]"):
        inference.profile(hier.full, res)


def test_plot_draws_each_profile_against_the_threshold(decay_profile):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = decay_profile.plot()
    try:
        assert len(axes) == 3
        assert [ax.get_xlabel() for ax in axes] == ["A0 (log10)", "k (log10)",
                                                    "sigma (log10)"]
        # no priors: a likelihood ratio (the fit's objective is "map", priors uniform);
        # the y label once per row, so that it does not run into the panel on its left
        assert not decay_profile.priors
        assert [ax.get_ylabel() for ax in axes] == ["likelihood ratio", "", ""]
        assert axes[0].figure.get_layout_engine() is not None
        ax = axes[1]
        threshold = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        np.testing.assert_allclose(threshold[0].get_ydata(), np.exp(-THRESHOLD))
        curve = ax.get_lines()[0]
        np.testing.assert_allclose(curve.get_xdata(), decay_profile.paths["k"].values)
        np.testing.assert_allclose(curve.get_ydata(), decay_profile.paths["k"].ratio)
        with pytest.raises(ValueError, match="not profiled"):
            decay_profile.plot(["nope"])
    finally:
        plt.close("all")


def test_plot_labels_do_not_overlap(decay_profile):
    # ids as long as Boehm's ("Epo_degradation_BaF3 (log10)"), two rows: no label or tick
    # label runs into another panel or into another panel's labels
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    old = decay_profile
    name = {p: f"{p}_degradation_BaF3"[:20] for p in old.parameter_ids}
    prof = dataclasses.replace(old, parameter_ids=tuple(name.values()), **{
        f: {name[p]: v for p, v in getattr(old, f).items()}
        for f in ("scales", "estimate", "intervals", "identifiable", "stop_reasons",
                  "paths")})
    axes = prof.plot(ncols=2)
    try:
        fig = axes[0].figure
        fig.canvas.draw()
        r = fig.canvas.get_renderer()

        def drawn(ax):  # the labels, and the tick labels inside the view (the others
            # are not drawn)
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            return [ax.xaxis.label, ax.yaxis.label,
                    *(t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1),
                    *(t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1)]

        texts = [(i, t.get_window_extent(r)) for i, ax in enumerate(axes)
                 for t in drawn(ax) if t.get_text() and t.get_visible()]
        panels = [ax.get_window_extent(r) for ax in axes]
        for i, a in texts:
            for j, b in texts:
                assert i == j or not a.overlaps(b), (i, j)
            for j, b in enumerate(panels):
                assert i == j or not a.overlaps(b), (i, j)
        legend = fig.legends[0].get_window_extent(r)
        assert not any(legend.overlaps(b) for _, b in texts)
        assert not any(legend.overlaps(b) for b in panels)
    finally:
        plt.close("all")
