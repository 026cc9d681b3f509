"""A PEtab problem behind the interface every method uses (`inference.petab._problem`):
the fit problem's scales, bounds, starts and objective against the closed form; its program's density against the problem's own likelihood and priors, mesh reuse, the
settings it solves at, and `inference.sample` on it against plain NumPyro on the same
program (an adaptive solve at every evaluation) and against checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

pytest.importorskip("petab")
pytest.importorskip("libsbml")

import inference  # noqa: E402
from conftest import killed_then_resumed  # noqa: E402
from inference.petab._problem import (PetabFitProblem, PetabProgramProblem,  # noqa: E402
                                      petab_program)
from test_petab_fit import _decay_mle, _decay_problem  # noqa: E402

PRIORS = {"objectivePriorType": ["", "normal", "parameterScaleNormal"],
          "objectivePriorParameters": ["", "0.7;0.2", "-1.0;0.5"]}


@pytest.fixture(scope="module")
def decay(tmp_path_factory):
    return _decay_problem(tmp_path_factory.mktemp("decay"))


@pytest.fixture(scope="module")
def decay_priors(tmp_path_factory):
    return _decay_problem(tmp_path_factory.mktemp("decay_priors"), priors=PRIORS)


def _sigmoid_x(problem, u):
    lo, hi = (np.asarray(b, float) for b in problem.bounds)
    s = 1.0 / (1.0 + np.exp(-u))
    return lo + (hi - lo) * s, np.sum(np.log(hi - lo) + np.log(s) + np.log1p(-s))


def test_program_density_is_the_petab_posterior_in_sigmoid_coordinates(decay_priors):
    # the program's log density at u: PEtab's log-likelihood plus the table's priors of x
    # (a normal prior of the linear k, a normal prior of log10 sigma, A0 uniform in its
    # bounds), plus log |dx/du| of x = lo + (hi - lo) sigmoid(u), all written out here
    problem = decay_priors
    wrapped = PetabProgramProblem(problem)
    assert wrapped.space.names == problem.parameter_ids
    for u in (np.array([0.3, -0.2, 0.1]), np.array([-1.0, 0.5, -0.4])):
        x, log_jac = _sigmoid_x(problem, u)
        A0, k, sigma = 10.0 ** x
        lp_prior = (-np.log(6.0)                                    # log10 A0 in [-3, 3]
                    + stats.truncnorm.logpdf(k, (1e-3 - 0.7) / 0.2, (1e3 - 0.7) / 0.2,
                                             0.7, 0.2) + np.log(k * np.log(10.0))
                    + stats.truncnorm.logpdf(x[2], (-3 + 1.0) / 0.5, (3 + 1.0) / 0.5,
                                             -1.0, 0.5))
        expected = float(problem.log_likelihood(x)) + lp_prior + log_jac
        lp, _ = wrapped.log_density(jnp.asarray(u))
        assert float(lp) == pytest.approx(expected, rel=1e-10)
        np.testing.assert_allclose(np.asarray(wrapped.to_x(u)), x, rtol=1e-12)


def test_a_kept_mesh_replays_the_fresh_solve_nearby(decay):
    wrapped = PetabProgramProblem(decay)
    u = np.array([0.2, -0.1, -0.3])
    mesh = wrapped.record(u, 0.5)
    near = u + np.array([0.01, -0.02, 0.01])
    lp_replay, err = wrapped.log_density(jnp.asarray(near), mesh)
    lp_fresh, _ = wrapped.log_density(jnp.asarray(near))
    assert float(err.error_ratio) < 1.0
    assert float(lp_replay) == pytest.approx(float(lp_fresh), abs=1e-5)
    # its gradient, against central differences of the fresh solve
    g = np.asarray(jax.grad(lambda v: wrapped.log_density(v, mesh)[0])(jnp.asarray(near)))
    eps = 1e-5
    fd = [(float(wrapped.log_density(jnp.asarray(near + eps * e))[0])
           - float(wrapped.log_density(jnp.asarray(near - eps * e))[0])) / (2 * eps)
          for e in np.eye(3)]
    np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-4)


def test_the_problem_solves_at_its_own_settings_unless_given(decay):
    own = PetabProgramProblem(decay)
    assert (own.rtol, own.atol) == (decay.rtol, decay.atol)
    assert own.petab is decay
    other = PetabProgramProblem(decay, rtol=1e-6, atol=1e-9)
    call = other._calls["simulation"]
    assert (call.rtol, call.atol, other.petab.rtol) == (1e-6, 1e-9, 1e-6)
    assert decay.rtol == 1e-8  # the user's problem is not changed
    assert other.fingerprint() != own.fingerprint()
    with pytest.raises(ValueError, match="`data`"):
        inference.sample(decay, object())


def test_the_fit_problem_reads_the_table_scales_bounds_and_closed_form_objective(
        decay_priors):
    # PetabFitProblem: the coordinates fits and profiles move in (the table's log10
    # scales inside its bounds); its objective is minus PEtab's closed-form decay
    # log-likelihood plus minus the given priors, written out here, and its LM terms
    # (residuals, log noise, penalty, constant) add up to the same
    from test_petab_profile import _nll

    problem = decay_priors
    fp = PetabFitProblem(problem)
    assert fp.names() == ("A0", "k", "sigma") and fp.scales() == ("log10",) * 3
    lo, hi = fp.bounds()
    np.testing.assert_array_equal(lo, [-3.0] * 3)
    np.testing.assert_array_equal(hi, [3.0] * 3)
    starts = fp.sample_starts(jax.random.PRNGKey(0), 8)
    assert starts.shape == (8, 3) and np.all((starts > lo) & (starts < hi))
    # Latin hypercube: each coordinate has one start in each eighth of its range
    for j in range(3):
        assert sorted(np.floor((starts[:, j] + 3.0) / 0.75).astype(int)) == list(range(8))
    x = np.array([0.3, -0.2, -1.1])
    k = 10.0 ** x[1]
    prior = -(stats.truncnorm.logpdf(k, (1e-3 - 0.7) / 0.2, (1e3 - 0.7) / 0.2, 0.7, 0.2)
              + stats.truncnorm.logpdf(x[2], (-3 + 1.0) / 0.5, (3 + 1.0) / 0.5, -1.0, 0.5))
    assert float(fp.objective(x, prior=False)[0]) == pytest.approx(_nll(x), rel=1e-9)
    assert float(fp.objective(x)[0]) == pytest.approx(_nll(x) + prior, rel=1e-9)
    # (a row of an ensemble solves at the tolerances: rtol 1e-8)
    both = np.asarray(fp.objective(np.stack([x, x + 0.1]), prior=False)[0])
    assert both[1] == pytest.approx(_nll(x + 0.1), rel=1e-7)
    terms = fp.residual_terms()
    mesh = terms.record(jnp.asarray(x), 1.0)
    z, s, err = terms.terms(jnp.asarray(x), mesh)
    f = 0.5 * float(np.sum(np.square(z))) + float(np.sum(s)) + float(
        terms.penalty(jnp.asarray(x))) + terms.constant
    assert f == pytest.approx(_nll(x) + prior, rel=1e-7) and float(np.max(err)) <= 1.0
    assert not fp.least_squares  # sigma is estimated: no sum of squares


@pytest.mark.slow  # ~60 s: the PEtab posterior itself is tested against the closed form in test_petab_fit.py
def test_sample_reuses_meshes_and_draws_the_posterior_plain_numpyro_draws(decay):
    from numpyro.infer import MCMC, NUTS

    x_ref, _ = _decay_mle()
    init = dict(zip(decay.parameter_ids, x_ref))
    idata = inference.sample(decay, num_warmup=200, num_samples=400, num_chains=2, seed=0,
                             init=init, progress=False)
    a = idata.posterior.attrs
    assert a["mesh_policy"] == "warmup" and a["n_records"] <= 12
    assert a["rtol"] == decay.rtol and 0 < a["max_error_ratio"] <= 1.0
    assert int(idata.sample_stats.diverging.sum()) == 0
    assert idata.observed_data["measurement"].shape == (8,)
    # the reference: NumPyro's own NUTS on the same program, every ode site solved
    # adaptively at every evaluation
    mcmc = MCMC(NUTS(petab_program(decay), dense_mass=True), num_warmup=200,
                num_samples=400, num_chains=2, chain_method="vectorized", progress_bar=False)
    u0 = np.asarray(PetabProgramProblem(decay).start_point(init))
    mcmc.run(jax.random.PRNGKey(1),
             init_params={p: jnp.full((2,), u0[i]) for i, p in enumerate(decay.parameter_ids)})
    ref = mcmc.get_samples()
    for p in decay.parameter_ids:
        ours, theirs = np.asarray(idata.posterior[p]).ravel(), np.asarray(ref[p])
        assert np.all((ours > -3) & (ours < 3))
        # means within 5 Monte Carlo standard errors (ESS ~ draws / 2 each side)
        se = np.sqrt(np.var(ours) / (len(ours) / 4) + np.var(theirs) / (len(theirs) / 4))
        assert abs(ours.mean() - theirs.mean()) < 5 * se
        assert np.std(ours) == pytest.approx(np.std(theirs), rel=0.3)


@pytest.mark.slow  # ~25 s: resume of a program problem is tested in test_inference_state.py
def test_a_petab_run_killed_after_a_checkpoint_resumes_to_the_same_draws(decay, tmp_path,
                                                                          monkeypatch):
    init = dict(zip(decay.parameter_ids, _decay_mle()[0]))
    kw = dict(num_warmup=50, num_samples=200, num_chains=2, seed=3, init=init,
              checkpoint_every=100, progress=False)
    clean = inference.sample(decay, checkpoint=tmp_path / "clean.pkl", **kw)
    resumed = killed_then_resumed(
        monkeypatch, lambda p: inference.sample(decay, checkpoint=p, **kw),
        tmp_path / "killed.pkl", lambda state: state.iteration == 150)
    for p in decay.parameter_ids:
        np.testing.assert_allclose(resumed.posterior[p].values, clean.posterior[p].values,
                                   rtol=1e-10)
