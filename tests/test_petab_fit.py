"""Multistart fits and priors of PEtab problems (`inference.fit`, `inference.sample`,
`models.PetabProblem.log_prior`).

Independent references: SciPy's ``least_squares`` and ``minimize`` on closed forms (the
batched Levenberg–Marquardt on synthetic problems; a one-state PEtab problem whose solution
is ``A0 exp(-k t)``), ``scipy.stats`` densities (every PEtab prior type), AMICI's reference
log-likelihood of Boehm_JProteomeRes2014 (its nominal objective).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

pytest.importorskip("petab")
pytest.importorskip("libsbml")

import gradsolve as gs  # noqa: E402
import inference  # noqa: E402
import models  # noqa: E402
from conftest import one_reaction_sbml, write_petab  # noqa: E402
from inference.optimize._lm import CONVERGED, REASONS, RUNNING, STALLED, LMKernel, MeshTerms  # noqa: E402

DATA = Path(__file__).parent / "data" / "petab"
REFERENCE = json.loads((DATA / "amici_reference.json").read_text())["llh"]

# ----------------------------------------------------------------- the batched LM alone
T = np.linspace(0.0, 4.0, 30)
Y = 2.0 * np.exp(-1.3 * T) + 0.5 + 0.05 * np.random.default_rng(0).standard_normal(30)


def _model(x, t=T):
    return x[0] * np.exp(-x[1] * t) + x[2] if isinstance(x, np.ndarray) else \
        x[0] * jnp.exp(-x[1] * t) + x[2]


def test_lm_matches_scipy_least_squares_with_an_active_bound():
    lower, upper = np.array([-10.0, 0.0, -10.0]), np.array([10.0, 10.0, 0.4])

    def terms(x):
        r = (Y - _model(x)) / 0.05
        return r, jnp.zeros_like(r)

    starts = np.array([[1.0, 1.0, 0.0], [5.0, 3.0, -1.0], [0.1, 0.1, 0.1], [9.0, 9.0, 0.3]])
    s, history = LMKernel(terms, lower=lower, upper=upper).run(starts, 200)
    ref = optimize.least_squares(lambda x: (Y - _model(x)) / 0.05, starts[0],
                                 bounds=(lower, upper), xtol=1e-15, ftol=1e-15, gtol=1e-15)
    assert ref.x[2] == pytest.approx(0.4)  # the bound is active at the optimum
    assert np.all(np.asarray(s.code) == CONVERGED)
    np.testing.assert_allclose(np.asarray(s.f), ref.cost, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(s.x), np.broadcast_to(ref.x, (4, 3)), atol=1e-5)
    # accepted steps only: every start's objective never increases
    assert np.all(np.diff(np.stack(history), axis=0) <= 0)


def test_lm_with_an_estimated_noise_scale_reaches_the_closed_form_mle():
    # normal noise with unknown sigma: F = sum(z^2/2 + log sigma), not a sum of squares;
    # at the optimum sigma^2 = RSS / n for the least-squares curve
    def terms(x):
        sigma = jnp.exp(x[3])
        r = (Y - _model(x[:3])) / sigma
        return r, jnp.full_like(r, x[3])

    lower, upper = np.full(4, -10.0), np.full(4, 10.0)
    s, _ = LMKernel(terms, lower=lower, upper=upper).run(
        np.array([[1.0, 1.0, 0.0, 0.0], [3.0, 0.5, 1.0, -3.0]]), 300)
    ls = optimize.least_squares(lambda x: Y - _model(x), [1.0, 1.0, 0.0], xtol=1e-15,
                                ftol=1e-15, gtol=1e-15)
    n = len(Y)
    sigma = np.sqrt(2 * ls.cost / n)
    f_ref = n * np.log(sigma) + n / 2
    np.testing.assert_allclose(np.asarray(s.f), f_ref, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(s.x)[:, :3], np.broadcast_to(ls.x, (2, 3)), atol=1e-5)
    np.testing.assert_allclose(np.exp(np.asarray(s.x)[:, 3]), sigma, rtol=1e-5)


def test_lm_curvature_of_a_profiled_noise_is_the_schur_complement():
    # sigma profiled out (sigma^2 = RSS / n at every x, as hierarchical optimisation
    # does): F = n/2 log RSS + n/2. Its Fisher information is the Schur complement of the
    # full (x, log sigma) one, J_r^T J_r / sigma^2 (the x-sigma block vanishes); the
    # gradient stays the exact one of F (central differences)
    n = len(Y)

    def terms(x):
        r = Y - _model(x)
        sigma = jnp.sqrt(jnp.sum(r**2) / n)
        return r / sigma, jnp.full_like(r, jnp.log(sigma))

    x0 = np.array([[1.5, 0.8, 0.2]])
    kernel = LMKernel(terms, lower=np.full(3, -10.0), upper=np.full(3, 10.0),
                      profiled=np.ones(n, bool))
    s = kernel.init(x0)
    r = Y - _model(x0[0])
    jr = np.stack([(_model(x0[0] - e) - _model(x0[0] + e)) / 2e-6
                   for e in 1e-6 * np.eye(3)], axis=1)  # d r / dx
    np.testing.assert_allclose(np.asarray(s.h)[0], jr.T @ jr / np.mean(r**2), rtol=1e-6)

    def f(x):
        return n / 2 * np.log(np.sum((Y - _model(x))**2)) + n / 2 - n / 2 * np.log(n)

    fd = [(f(x0[0] + e) - f(x0[0] - e)) / 2e-6 for e in 1e-6 * np.eye(3)]
    np.testing.assert_allclose(np.asarray(s.g)[0], fd, rtol=1e-6)
    assert float(s.f[0]) == pytest.approx(f(x0[0]), rel=1e-12)
    # and from there it reaches the least-squares curve's optimum
    s, _ = kernel.run(np.array([[1.5, 0.8, 0.2], [3.0, 0.5, 1.0]]), 300)
    ls = optimize.least_squares(lambda x: Y - _model(x), [1.0, 1.0, 0.0], xtol=1e-15,
                                ftol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(np.asarray(s.x), np.broadcast_to(ls.x, (2, 3)), atol=1e-5)


def test_lm_does_not_stop_on_the_small_decrease_of_a_heavily_damped_step():
    # after many rejections the damping is large and an accepted step short wherever it
    # is: its small decrease must not count as convergence (a start far from the optimum
    # ended "converged" so on Boehm_JProteomeRes2014); from damping 1e9 every start still
    # reaches SciPy's optimum
    lower, upper = np.full(3, -10.0), np.full(3, 10.0)

    def terms(x):
        r = (Y - _model(x)) / 0.05
        return r, jnp.zeros_like(r)

    starts = np.array([[1.0, 1.0, 0.0], [5.0, 3.0, -1.0], [0.1, 0.1, 0.1]])
    kernel = LMKernel(terms, lower=lower, upper=upper, ftol=1e-6)
    s = kernel.init(starts)._replace(lam=jnp.full(3, 1e9))
    for _ in range(300):
        s = kernel.step(s)
        if not np.any(np.asarray(s.code) == 0):
            break
    ref = optimize.least_squares(lambda x: (Y - _model(x)) / 0.05, starts[0], xtol=1e-15,
                                 ftol=1e-15, gtol=1e-15)
    assert np.all(np.asarray(s.code) == CONVERGED)
    np.testing.assert_allclose(np.asarray(s.f), ref.cost, rtol=1e-6)


def _sixteen_starts():
    """``(on_mesh, lower, upper, starts)``: the decay fit's residuals on a "mesh" (the
    recording point, replayed exactly), its box and 16 spread starts."""
    def on_mesh(x, mesh):
        r = (Y - _model(x)) / 0.05
        return r, jnp.zeros_like(r), jnp.zeros(1)

    starts = np.random.default_rng(3).uniform([0.5, 0.2, -1.0], [4.0, 4.0, 1.0], (16, 3))
    return on_mesh, np.full(3, -10.0), np.full(3, 10.0), starts


@pytest.mark.slow  # ~7 s
def test_lm_grouped_by_mesh_cost_takes_the_same_path_as_one_batch():
    # 16 starts: with a mesh cost of wide spread the kernel evaluates them in groups of 4
    # sorted by that cost; each start's iterations are its own, so the path equals one batch's (a "mesh"
    # here is the recording point, replayed exactly), and both reach SciPy's optimum
    on_mesh, lower, upper, starts = _sixteen_starts()
    runs = []
    # a cost spread over 6 orders of magnitude at the starts (one batch would pad to it)
    for cost in (None, lambda mesh: np.exp(3.0 * np.asarray(mesh)[:, 1])):
        kernel = LMKernel(None, lower=lower, upper=upper,
                          mesh_terms=MeshTerms(lambda x: x, on_mesh, cost))
        runs.append((kernel.run(starts, 300)[0], kernel.n_evals))
    (one, evals_one), (grouped, evals_grouped) = runs
    assert evals_grouped > evals_one  # 4 groups an iteration while more than 4 run
    np.testing.assert_allclose(np.asarray(grouped.x), np.asarray(one.x), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_array_equal(np.asarray(grouped.iters), np.asarray(one.iters))
    ref = optimize.least_squares(lambda x: (Y - _model(x)) / 0.05, starts[0], xtol=1e-15,
                                 ftol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(np.asarray(grouped.f), ref.cost, rtol=1e-8)


def test_lm_run_of_shrinking_batches_takes_the_full_batch_path():
    # 16 starts: run() moves to batches of 4 (gathered from and scattered back into the
    # state by one compiled program a size) once at most 4 run; each start's iterations
    # are its own, so the path equals the full batch stepped to the end, and every start
    # reaches SciPy's optimum
    on_mesh, lower, upper, starts = _sixteen_starts()
    kernel = LMKernel(None, lower=lower, upper=upper,
                      mesh_terms=MeshTerms(lambda x: x, on_mesh))
    run, _ = kernel.run(starts, 300)
    full = kernel.init(starts)
    while np.any(np.asarray(full.code) == RUNNING):
        full = kernel.step(full)
    iters = np.sort(np.asarray(run.iters))
    assert iters[-1] > iters[-5]  # iterations with at most 4 running: the small batch
    np.testing.assert_allclose(np.asarray(run.x), np.asarray(full.x), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(run.iters), np.asarray(full.iters))
    np.testing.assert_array_equal(np.asarray(run.records), np.asarray(full.records))
    ref = optimize.least_squares(lambda x: (Y - _model(x)) / 0.05, starts[0], xtol=1e-15,
                                 ftol=1e-15, gtol=1e-15)
    np.testing.assert_allclose(np.asarray(run.f), ref.cost, rtol=1e-8)


def test_lm_with_record_shares_the_evaluation_and_runs_as_a_fresh_kernel():
    # a second pass at other record tolerances (here: another "mesh", the recording point
    # moved) and ftol: the copy keeps the compiled evaluation and counts afresh, and its
    # run equals that of a kernel built for it
    on_mesh, lower, upper, _ = _sixteen_starts()
    starts = np.array([[1.0, 1.0, 0.0], [5.0, 3.0, -1.0], [0.1, 0.1, 0.1]])
    first = LMKernel(None, lower=lower, upper=upper, ftol=1e-4,
                     mesh_terms=MeshTerms(lambda x: x, on_mesh))
    first.run(starts, 300)
    second = first.with_record(lambda x: x + 1.0, ftol=1e-10)
    fresh = LMKernel(None, lower=lower, upper=upper, ftol=1e-10,
                     mesh_terms=MeshTerms(lambda x: x + 1.0, on_mesh))
    assert second._local_jit is first._local_jit and second.n_evals == 0
    a, b = second.run(starts, 300)[0], fresh.run(starts, 300)[0]
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
    np.testing.assert_array_equal(np.asarray(a.iters), np.asarray(b.iters))
    np.testing.assert_allclose(np.asarray(a.x_rec), np.asarray(b.x_rec))
    assert second.n_evals == fresh.n_evals and second.n_records == fresh.n_records
    assert first.ftol == 1e-4  # the first kernel is left as it was


def test_lm_data_columns_are_never_moved_and_bad_counts_are_named():
    # x = (a, b, c, w): the last column a weight the terms read, not a parameter; the fit
    # of (a, b, c) equals SciPy's with the weight given, and w stays where it started
    def on_mesh(x, mesh):
        r = (Y - _model(x[:3])) / x[3]
        return r, jnp.zeros_like(r), jnp.zeros(1)

    lower, upper = np.array([-10.0, -10.0, -10.0, 0.01]), np.full(4, 10.0)
    starts = np.array([[1.0, 1.0, 0.0, 0.05], [5.0, 3.0, -1.0, 0.1]])
    kernel = LMKernel(None, lower=lower, upper=upper, data_columns=1,
                      mesh_terms=MeshTerms(lambda x: x, on_mesh))
    s, _ = kernel.run(starts, 300)
    np.testing.assert_array_equal(np.asarray(s.x)[:, 3], starts[:, 3])
    assert np.all(np.asarray(s.g)[:, 3] == 0.0) and np.all(np.asarray(s.h)[:, 3] == 0.0)
    for row, w in zip(np.asarray(s.x), starts[:, 3]):
        ref = optimize.least_squares(lambda x: (Y - _model(x)) / w, [1.0, 1.0, 0.0],
                                     xtol=1e-15, ftol=1e-15, gtol=1e-15)
        np.testing.assert_allclose(row[:3], ref.x, atol=1e-5)
    for bad in (-1, 4, 1.5, True):
        with pytest.raises(ValueError, match="data_columns"):
            LMKernel(None, lower=lower, upper=upper, data_columns=bad,
                     mesh_terms=MeshTerms(lambda x: x, on_mesh))


def _why(s):
    return [REASONS[i] for i in np.asarray(s.reason)]


def test_lm_xtol_stops_a_degenerate_minimum_that_ftol_and_gtol_do_not():
    # r = 10 (x0 - 1)^2: a quartic minimum at x0 = 1, F = 50 (x0 - 1)^4, where each
    # Gauss-Newton step halves the distance (linear convergence, F and g vanishing as
    # its 4th and 3rd power); x1 - 2 is solved in one step. With ftol and gtol off only
    # the step size can stop it: steps of (x0 - 1) / 2 <= xtol (1 + |x|) stop within
    # ~ 4 xtol of the closed-form minimum (1, 2); without xtol it runs to the cap
    def terms(x):
        r = jnp.stack([10.0 * (x[0] - 1.0) ** 2, x[1] - 2.0])
        return r, jnp.zeros_like(r)

    starts = np.array([[3.0, 0.0], [-1.0, 5.0]])
    lo, hi = np.full(2, -10.0), np.full(2, 10.0)
    s, _ = LMKernel(terms, lower=lo, upper=hi, ftol=0.0, gtol=0.0, xtol=1e-6).run(starts, 200)
    assert _why(s) == ["xtol", "xtol"] and np.all(np.asarray(s.code) == CONVERGED)
    err = np.abs(np.asarray(s.x) - [1.0, 2.0])
    assert np.all(err[:, 0] <= 1e-5) and np.all(err[:, 0] >= 1e-7)  # stopped by the step
    assert np.all(err[:, 1] <= 1e-12)
    s, _ = LMKernel(terms, lower=lo, upper=hi, ftol=0.0, gtol=0.0).run(starts, 15)
    assert _why(s) == ["max_iter", "max_iter"] and np.all(np.asarray(s.code) == RUNNING)
    assert np.all(np.asarray(s.iters) == 15)


def test_lm_reports_why_each_start_stopped():
    # one start on the flat tail of a logistic (|g| ~ e^-40: stopped by gtol at the
    # plateau F = 0.5^2 / 2), one in the curved part (F falls to 0: ftol or gtol), one
    # whose every trial point is not finite (damping), one not finite at the start
    def terms(x):
        r = jnp.where(x[1] > 1.5, jnp.where(x[0] == 0.3, x[0], jnp.nan),
                      jax.nn.sigmoid(x[0]) - 0.5 + 0.0 * x[1])
        r = jnp.where(x[1] > 2.5, jnp.nan, r)
        return r[None], jnp.zeros(1)

    starts = np.array([[-40.0, 0.0], [2.0, 0.0], [0.3, 2.0], [0.0, 3.0]])
    kernel = LMKernel(terms, lower=[-50.0, 0.0], upper=[50.0, 3.0], ftol=1e-10)
    s, _ = kernel.run(starts, 100)
    why = _why(s)
    assert why[0] == "gtol" and np.asarray(s.f)[0] == pytest.approx(0.125, rel=1e-12)
    assert why[1] in ("ftol", "gtol") and np.asarray(s.f)[1] <= 1e-10
    assert why[2] == "damping" and np.asarray(s.code)[2] == STALLED
    assert why[3] == "not_finite"


# ----------------------------------------------------------------- a one-state PEtab problem
DECAY_T = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0])
DECAY_Y = 3.0 * np.exp(-0.7 * DECAY_T) + np.array(
    [0.11, -0.08, 0.05, -0.12, 0.07, 0.02, -0.04, 0.06])


def _decay_problem(path: Path, noise: str = "normal", priors: dict | None = None):
    """A PEtab problem of dA/dt = -k A, A(0) = A0, observed with noise sd sigma."""
    yaml = _write_decay(path, noise, priors)
    # non-stiff: the explicit default solver compiles in a fraction of Rodas5P's time;
    # sigma estimated by the outer optimiser (hierarchical=False): the closed forms below
    # are those of all three parameters
    return models.load_petab(yaml, solver=gs.Tsit5(), hierarchical=False)


def _write_decay(path: Path, noise: str = "normal", priors: dict | None = None) -> Path:
    """The tables of `_decay_problem` written into ``path``: its YAML file."""
    doc = one_reaction_sbml("decay", "A", "A0", ("A0", "k"), "k * A", consumed=True)
    parameters = {"parameterId": ["A0", "k", "sigma"], "parameterScale": "log10",
                  "lowerBound": 1e-3, "upperBound": 1e3, "nominalValue": [3.0, 0.7, 0.1],
                  "estimate": 1, **(priors or {})}
    yaml = write_petab(
        path, doc,
        observables={"observableId": ["obs_A"], "observableFormula": ["A"],
                     "noiseFormula": ["noiseParameter1_obs_A"], "noiseDistribution": [noise]},
        measurements={"observableId": "obs_A", "simulationConditionId": "c0", "time": DECAY_T,
                      "measurement": DECAY_Y, "noiseParameters": "sigma"},
        parameters=parameters)
    return yaml


def _decay_mle():
    """The closed-form problem's optimum: least squares for (A0, k), sigma^2 = RSS / n."""
    ls = optimize.least_squares(lambda p: DECAY_Y - p[0] * np.exp(-p[1] * DECAY_T), [1.0, 1.0],
                                xtol=1e-15, ftol=1e-15, gtol=1e-15)
    n = len(DECAY_Y)
    sigma = np.sqrt(2 * ls.cost / n)
    return np.log10([*ls.x, sigma]), n / 2 * np.log(2 * np.pi * sigma**2) + n / 2


@pytest.fixture(scope="module")
def decay(tmp_path_factory):
    return _decay_problem(tmp_path_factory.mktemp("decay"))


@pytest.fixture(scope="module")
def decay_fit(decay):
    return inference.fit(decay, n_starts=6, seed=1)


def test_petab_multistart_reaches_the_closed_form_optimum(decay, decay_fit):
    x_ref, nll_ref = _decay_mle()
    res = decay_fit
    assert res.method == "lm" and res.objective == "map"
    assert res.loss == pytest.approx(nll_ref, rel=1e-8)
    x_best = np.array([res.params[p] for p in decay.parameter_ids])
    np.testing.assert_allclose(x_best, x_ref, atol=1e-5)
    assert res.converged[0] and np.all(res.status == 0)
    # each start says why it stopped: every start here converges (Fides' ftol or gtol)
    assert len(res.exit_reasons) == 6 and set(res.exit_reasons) <= {"ftol", "gtol"}


@pytest.mark.slow  # every program traced and compiled afresh (jax.clear_caches); the cheap
# siblings: the waterfall test below (the values) and test_inference_state's import rules
def test_a_petab_fit_reaches_its_solves_through_fit_the_lm_and_the_problem(decay):
    """The call stack of `inference.fit` of a PEtab problem at every ODE step
    (tools/walks.py): `fit`, the Levenberg–Marquardt and the PEtab problem's own file
    (models/), then gradsolve (record or replay, the driver: 2 files on the compiled kernel,
    as Boehm's walk shows), the final values included (recorded and replayed like the
    iterations, not through the importer's adapter and `gs.solve`)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    try:
        from walks import summary, walk
    finally:
        sys.path.pop(0)
    jax.clear_caches()  # a fresh trace: the walk sees the Python frames of every solve
    stacks = walk(lambda: inference.fit(decay, n_starts=2, steps=2, progress=False))
    ours = {f for stack in stacks for f, _ in stack if not f.startswith("gradsolve/")}
    assert ours == {"inference/optimize/_fit.py", "inference/optimize/_lm.py",
                    "models/_petab/_problem.py"}, sorted(ours)
    assert all(summary(stack)[2] == 0 for stack in stacks)  # no return to a file left


def test_petab_waterfall_is_sorted_and_each_loss_is_the_log_likelihood_there(decay,
                                                                              decay_fit):
    res = decay_fit
    assert np.all(np.diff(res.losses) >= 0)
    assert set(res.params) == set(decay.parameter_ids)
    assert float(decay.log_likelihood(res.params)) == pytest.approx(-res.loss, rel=1e-10)
    for i in range(len(res.losses)):
        x = {p: res.all_params[p][i] for p in decay.parameter_ids}
        assert float(decay.log_likelihood(x)) == pytest.approx(-res.losses[i], rel=1e-10)
    # the starts were a Latin hypercube inside the bounds: one per stratum and coordinate
    lo, hi = (np.asarray(b) for b in decay.bounds)
    strata = np.floor((res.starts - lo) / (hi - lo) * len(res.losses)).astype(int)
    for col in strata.T:
        assert sorted(col) == list(range(len(res.losses)))
    import matplotlib

    matplotlib.use("Agg")
    ax = res.plot_waterfall()
    assert ax.get_yscale() == "log"


def test_lm_on_kept_meshes_records_less_than_it_iterates_and_reaches_the_optimum(decay):
    # the objective with a fresh solve at every evaluation, against kept meshes replayed
    # and re-recorded on drift or a too-large error estimate: the closed-form optimum, and
    # the final objective (a replay) within the solver's tolerance of a fresh solve's
    x_ref, nll_ref = _decay_mle()
    const = float(decay.residual_layout().constant)
    lo, hi = decay.bounds
    starts = np.array([[0.0, 0.0, 0.0], [1.0, -1.0, -0.5], [0.5, -0.5, -1.0]])
    mesh_terms = MeshTerms(lambda x: decay.record(x, 0.5), lambda x, m: (
        lambda z, s, e: (z, s, 0.5 * e))(*decay.replay_residuals(x, m)))
    kept = LMKernel(None, lower=lo, upper=hi, mesh_terms=mesh_terms)
    s, history = kept.run(starts, 300)
    assert np.all(np.asarray(s.code) == CONVERGED)
    np.testing.assert_allclose(np.asarray(s.f) - const, nll_ref, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(s.x), np.broadcast_to(x_ref, (3, 3)), atol=1e-4)
    assert kept.n_records < 0.5 * len(history)
    fresh = jax.vmap(lambda x: -decay.log_likelihood(x))
    np.testing.assert_allclose(np.asarray(fresh(s.x)), np.asarray(s.f) - const, rtol=1e-7)


def test_petab_laplace_noise_fits_by_lbfgs(tmp_path):
    problem = _decay_problem(tmp_path, noise="laplace")
    res = inference.fit(problem, n_starts=4, seed=0)
    assert res.method == "lbfgs"
    assert set(res.exit_reasons) <= {"ftol", "gtol", "max_iter", "abnormal"}

    # Laplace: at fixed (A0, k) the scale's optimum is mean |r|; the rest by Nelder-Mead
    def nll(p):
        r = np.abs(DECAY_Y - p[0] * np.exp(-p[1] * DECAY_T))
        b = np.mean(r)
        return len(r) * (np.log(2 * b) + 1)

    ref = optimize.minimize(nll, [3.0, 0.7], method="Nelder-Mead",
                            options=dict(xatol=1e-10, fatol=1e-12, maxiter=5000))
    # L-BFGS-B stops near the kinks of the Laplace likelihood (|r| is not differentiable
    # where a residual vanishes, which is where its optimum lies): 0.002 above here
    assert res.loss <= ref.fun + 0.01
    assert float(problem.log_likelihood(res.params)) == pytest.approx(-res.loss, rel=1e-10)


def test_petab_fit_bad_arguments_are_named(decay):
    with pytest.raises(ValueError, match="`checkpoint`"):
        inference.fit(decay, checkpoint="x.pkl")
    with pytest.raises(ValueError, match="`init` is missing"):
        inference.fit(decay, init={"A0": 0.0})
    with pytest.raises(ValueError, match="`objective`"):
        inference.fit(decay, objective="ml")
    with pytest.raises(ValueError, match="`n_starts` must be an int >= 1, got True"):
        inference.fit(decay, n_starts=True)


def test_petab_init_mistakes_are_refused_naming_the_parameter(decay):
    x_ref, _ = _decay_mle()  # log10 values inside the bounds [-3, 3]
    good = dict(zip(decay.parameter_ids, x_ref))
    # a start given on the linear scale: outside the log10 bounds, not clipped onto them
    with pytest.raises(ValueError, match=r"'A0' \(start 0\) is 30, outside its bounds "
                                         r"\[-3, 3\] on its log10 scale.*given linear\? "
                                         r"its log10 is 1.47712"):
        inference.fit(decay, init={**good, "A0": 30.0})
    with pytest.raises(ValueError, match=r"'k' \(start 1\) is -4, outside"):
        inference.fit(decay, init=np.array([x_ref, [0.0, -4.0, 0.0]]), n_starts=2)
    with pytest.raises(ValueError, match=r"keys \['kk'\] that are not parameters"):
        inference.fit(decay, init={**good, "kk": 0.1})
    with pytest.raises(ValueError, match=r"'sigma' \(start 0\) is nan; starts must be "
                                         "finite"):
        inference.fit(decay, init={**good, "sigma": float("nan")})
    with pytest.raises(ValueError, match=r"'k' \(start 0\) is inf"):
        inference.fit(decay, init=[0.0, np.inf, 0.0], method="global", max_time=1.0)


def test_petab_in_float32_is_refused_naming_enable_x64(tmp_path):
    """Without 64-bit floats, load_petab refuses before reading the tables, and a problem
    loaded in float64 refuses to be fitted once they are switched off, both naming
    gs.enable_x64() (a fresh process: the tests run in float64)."""
    import subprocess
    import sys

    yaml = _write_decay(tmp_path)
    code = f"""
import gradsolve as gs, inference, models
for step in ("load", "fit"):
    try:
        if step == "fit":
            gs.enable_x64()
            problem = models.load_petab({str(yaml)!r}, solver=gs.Tsit5())
            gs.enable_x64(False)
            inference.fit(problem, n_starts=2)
        else:
            models.load_petab({str(yaml)!r})
    except ValueError as e:
        print(step, "REFUSED", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert "load REFUSED load_petab needs 64-bit floats: call gs.enable_x64()" in out.stdout, (
        out.stdout + out.stderr)
    assert "fit REFUSED a PEtab problem is fitted" in out.stdout and "gs.enable_x64()" in (
        out.stdout.split("fit REFUSED")[1]), out.stdout + out.stderr


# ----------------------------------------------------------------- priors
@pytest.mark.parametrize("kinds", [
    ("normal", "logLaplace", "parameterScaleNormal"),
    ("laplace", "logNormal", "parameterScaleLaplace"),
    ("uniform", "parameterScaleUniform", ""),
])
def test_log_prior_against_scipy_stats(tmp_path, kinds):
    params = {"normal": (2.0, 1.5), "laplace": (2.0, 0.7), "uniform": (0.5, 40.0),
              "logNormal": (-0.5, 0.4), "logLaplace": (-0.5, 0.4),
              "parameterScaleNormal": (-1.0, 0.5), "parameterScaleLaplace": (-1.0, 0.5),
              "parameterScaleUniform": (-2.0, 1.0), "": None}
    problem = _decay_problem(tmp_path, priors={
        "objectivePriorType": list(kinds),
        "objectivePriorParameters": [";".join(map(str, params[k])) if params[k] else ""
                                     for k in kinds]})
    lo, hi = 1e-3, 1e3
    rng = np.random.default_rng(3)
    for x in rng.uniform(-2.9, 2.9, size=(5, 3)):
        theta = 10.0**x
        expected_x, expected_theta = 0.0, 0.0
        for k, xi, ti in zip(kinds, x, theta):
            a, b = params[k] if params[k] else (np.log10(lo), np.log10(hi))
            jac = np.log(ti * np.log(10))  # d theta / d x on log10 scale
            if k in ("normal", "laplace"):
                d = stats.norm(a, b) if k == "normal" else stats.laplace(a, b)
                lp = d.logpdf(ti) - np.log(d.cdf(hi) - d.cdf(lo))
                expected_theta += lp
                expected_x += lp + jac
            elif k == "uniform":
                lp = stats.uniform(max(a, lo), min(b, hi) - max(a, lo)).logpdf(ti)
                expected_theta += lp
                expected_x += lp + jac
            elif k in ("logNormal", "logLaplace"):
                base = stats.norm(a, b) if k == "logNormal" else stats.laplace(a, b)
                mass = base.cdf(np.log(hi)) - base.cdf(np.log(lo))
                lp = base.logpdf(np.log(ti)) - np.log(ti) - np.log(mass)  # density of theta
                expected_theta += lp
                expected_x += lp + jac
            else:  # on the parameter scale: the density of x itself
                if k == "parameterScaleUniform" or k == "":
                    lp = stats.uniform(max(a, -3), min(b, 3) - max(a, -3)).logpdf(xi)
                else:
                    d = stats.norm(a, b) if k == "parameterScaleNormal" else stats.laplace(a, b)
                    lp = d.logpdf(xi) - np.log(d.cdf(3.0) - d.cdf(-3.0))
                expected_theta += lp
                expected_x += lp
        if not np.isfinite(expected_x):
            assert float(problem.log_prior(x)) == -np.inf
            continue
        assert float(problem.log_prior(x)) == pytest.approx(expected_x, rel=1e-10)
        assert float(problem.log_prior(x, jacobian=False)) == pytest.approx(expected_theta,
                                                                          rel=1e-10)
    # outside the bounds
    assert float(problem.log_prior(np.array([3.5, 0.0, 0.0]))) == -np.inf


def test_log_prior_density_integrates_to_one_on_the_parameter_scale(tmp_path):
    problem = _decay_problem(tmp_path, priors={
        "objectivePriorType": ["normal", "logLaplace", "parameterScaleNormal"],
        "objectivePriorParameters": ["2.0;1.5", "-0.5;0.4", "-1.0;0.5"]})
    # the prior is a product over coordinates, so its integral over the box is the
    # product of one-dimensional integrals of p_i(x) / p_i(0) = exp(lp(x e_i) - lp(0)),
    # times prod p_i(0) = exp(lp(0))
    grid = np.linspace(-3, 3, 40001)
    lp0 = float(problem.log_prior(np.zeros(3)))
    log_mass = lp0
    for i in range(3):
        x = np.zeros((len(grid), 3))
        x[:, i] = grid
        lp = np.asarray(jax.vmap(problem.log_prior)(jnp.asarray(x)))
        log_mass += np.log(np.trapezoid(np.exp(lp - lp0), grid))
    assert log_mass == pytest.approx(0.0, abs=1e-6)


def test_map_objective_adds_the_given_priors(tmp_path):
    problem = _decay_problem(tmp_path, priors={
        "objectivePriorType": ["", "", "parameterScaleNormal"],
        "objectivePriorParameters": ["", "", "0.0;0.1"]})
    # one start at the maximum likelihood point (most Latin hypercube starts of this problem
    # end on the flat k -> upper bound, where the curve has decayed before the first time)
    res = inference.fit(problem, init=_decay_mle()[0], n_starts=3, seed=0)
    x = res.params
    expected = -float(problem.log_likelihood(x)) - stats.norm(0, 0.1).logpdf(x["sigma"]) + \
        np.log(stats.norm(0, 0.1).cdf(3) - stats.norm(0, 0.1).cdf(-3))
    assert res.loss == pytest.approx(expected, rel=1e-10)
    # the prior pulls sigma towards 1 (log10 0) from the maximum likelihood estimate
    assert _decay_mle()[0][2] + 0.05 < res.params["sigma"] < 0.0


# ----------------------------------------------------------------- sampling
def test_sample_petab_posterior_against_the_closed_form(decay):
    # flat priors in log10 (A0, k, sigma): the draws stay inside the bounds and centre on
    # the closed-form maximum likelihood point (the chains start there, jittered)
    x_ref, _ = _decay_mle()
    idata = inference.sample(decay, num_warmup=100, num_samples=100, num_chains=2, seed=0,
                             init=dict(zip(decay.parameter_ids, x_ref)))
    post = idata.posterior
    assert set(post.data_vars) == set(decay.parameter_ids)
    for p, xr in zip(decay.parameter_ids, x_ref):
        draws = np.asarray(post[p])
        assert draws.shape == (2, 100)
        assert np.all((draws > -3) & (draws < 3))
        assert abs(np.median(draws) - xr) < 3 * np.std(draws)
    assert int(idata.sample_stats.diverging.sum()) == 0


# ----------------------------------------------------------------- Boehm (slow)
@pytest.mark.slow
def test_boehm_multistart_reaches_the_nominal_objective():
    problem = models.load_petab(DATA / "Boehm_JProteomeRes2014", hierarchical=False)
    nominal = -REFERENCE["Boehm_JProteomeRes2014"]
    # a handful of starts: one 0.3 (log10) off the nominal point in every coordinate, the
    # others Latin hypercube draws inside the bounds
    lo, hi = (np.asarray(b) for b in problem.bounds)
    near = np.clip(np.asarray(problem.nominal) + 0.3 * np.sign(np.arange(9) % 2 - 0.5), lo, hi)
    res = inference.fit(problem, init=near, n_starts=4, seed=0)
    assert res.loss <= nominal + 1e-3
    assert np.all(np.diff(res.losses) >= 0)
    assert float(problem.log_likelihood(res.params)) == pytest.approx(-res.loss, rel=1e-9)


@pytest.mark.slow  # 1.5-3 min on 2 shared cores
def test_boehm_hierarchical_multistart_of_the_readme_call_reaches_the_nominal_objective():
    # the README's call (hierarchical optimisation, the default; 20 Latin hypercube
    # starts): seed 1 reached AMICI's nominal objective in none of 20 starts while the
    # LM's curvature counted the profiled noise as a parameter, in 2 of 20 since
    problem = models.load_petab(DATA / "Boehm_JProteomeRes2014")
    res = inference.fit(problem, n_starts=20, seed=1)
    assert res.loss <= -REFERENCE["Boehm_JProteomeRes2014"] + 1e-3
    assert float(problem.log_likelihood(res.params)) == pytest.approx(-res.loss, rel=1e-9)
