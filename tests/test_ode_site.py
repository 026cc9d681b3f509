"""`inference.ode`: an ODE solve as a site of a NumPyro program, under plain NumPyro and
under `inference.fit` / `inference.sample` (mesh reuse), checked against closed forms,
central finite differences and an independent optimiser."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.optimize
from numpyro.infer.util import log_density as numpyro_log_density

import gradsolve as gs
import inference
from inference.problem._program import ProgramMesh, ProgramProblem

TS = np.linspace(0.5, 6.0, 12)
DOSE = np.array([4.0, 5.0, 3.5])


def _field(t, y, p):
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["ke"] * y[1]])


def _bateman(ka, ke, dose, t):
    return dose * ka / (ka - ke) * (np.exp(-ke * t) - np.exp(-ka * t))


def _program(data):
    """Three subjects, one shared elimination rate, per-subject absorption."""
    ke = numpyro.sample("ke", dist.LogNormal(np.log(0.3), 0.5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("subjects", 3):
        ka = numpyro.sample("ka", dist.LogNormal(np.log(1.5), 0.5))
    y0 = jnp.stack([jnp.asarray(DOSE), jnp.zeros(3)], -1)
    sol = inference.ode("pk", _field, 0.0, float(TS[-1]), y0,
                        {"ka": ka, "ke": jnp.broadcast_to(ke, (3,))}, ts=TS)
    numpyro.sample("obs", dist.Normal(sol.ys[..., 1], sigma).to_event(2), obs=data)


TRUTH = dict(ka=np.array([1.2, 2.0, 0.9]), ke=0.25, sigma=0.05)


@pytest.fixture(scope="module")
def data():
    clean = np.stack([_bateman(TRUTH["ka"][i], TRUTH["ke"], DOSE[i], TS) for i in range(3)])
    return clean + TRUTH["sigma"] * np.asarray(jax.random.normal(jax.random.PRNGKey(3),
                                                                 clean.shape))


@pytest.fixture(scope="module")
def problem(data):
    return ProgramProblem(_program, data, rtol=1e-6, atol=1e-8, max_steps=4096)


def _closed_form_log_joint(x, data):
    ka, ke, sigma = np.asarray(x["ka"]), float(x["ke"]), float(x["sigma"])
    pred = np.stack([_bateman(ka[i], ke, DOSE[i], TS) for i in range(3)])
    lp = dist.Normal(pred, sigma).log_prob(data).sum()
    lp += dist.LogNormal(np.log(0.3), 0.5).log_prob(ke) + dist.HalfNormal(1.0).log_prob(sigma)
    lp += dist.LogNormal(np.log(1.5), 0.5).log_prob(ka).sum()
    return float(lp)


def test_plain_numpyro_is_gs_solve(data):
    x = {"ka": jnp.asarray(TRUTH["ka"]), "ke": jnp.asarray(0.25), "sigma": jnp.asarray(0.05)}
    lp, tr = numpyro_log_density(_program, (data,), {}, x)
    np.testing.assert_allclose(float(lp), _closed_form_log_joint(x, data), rtol=1e-6)
    sol = tr["pk"]["value"]
    ref = gs.solve(_field, 0.0, float(TS[-1]), jnp.stack([jnp.asarray(DOSE), jnp.zeros(3)], -1),
                   {"ka": x["ka"], "ke": jnp.full(3, 0.25)}, ts=TS, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(sol.ys, ref.ys, rtol=1e-12)


def test_replayed_density_and_gradient(problem, data):
    assert problem.space.names == ("ke", "sigma", "ka") and problem.sizes == {"pk": 3}
    x = {"ka": jnp.asarray(TRUTH["ka"]), "ke": jnp.asarray(0.25), "sigma": jnp.asarray(0.05)}
    u = problem.space.to_unconstrained(x)
    mesh = problem.record(u, 0.1)
    lp, err = problem.log_density(u, mesh, jacobian=False)
    np.testing.assert_allclose(float(lp), _closed_form_log_joint(x, data), rtol=1e-7)
    assert float(err.error_ratio) <= 1.0
    # the replay's gradient is the discrete adjoint of that mesh: central differences of
    # the closed form agree to the solver's accuracy
    g = np.asarray(jax.jit(jax.grad(lambda v: problem.log_density(v, mesh, jacobian=False)[0]))(u))
    h = 1e-5
    fd = []
    for i in range(u.shape[0]):
        e = np.zeros(u.shape[0])
        e[i] = h
        up = problem.space.from_unconstrained(u + e)
        dn = problem.space.from_unconstrained(u - e)
        fd.append((_closed_form_log_joint(up, data) - _closed_form_log_joint(dn, data)) / (2 * h))
    np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-3)
    # an ensemble of points is one vmapped replay of their meshes
    U = jnp.stack([u, u + 0.02, u - 0.02])
    many = problem.record(U, 0.1)
    assert many.n == 3 and many.status.shape == (3,)
    lps, _ = problem.log_density(U, many)
    one = [float(problem.log_density(U[i], problem.record(U[i], 0.1))[0]) for i in range(3)]
    np.testing.assert_allclose(lps, one, rtol=1e-10)


def test_program_mesh_rows(problem):
    u0 = problem.space.to_unconstrained(problem.model.defaults)
    U = jnp.stack([u0 + 0.1 * i for i in range(4)])
    m = problem.record(U)
    assert m.meshes["pk"].n == 12 and m.n_steps.shape == (4,)
    sub = m.select(np.array([2, 0]))
    np.testing.assert_array_equal(sub.meshes["pk"].times[:3], m.meshes["pk"].times[6:9])
    back = m.scatter(np.array([1]), m.select(np.array([3])))
    np.testing.assert_array_equal(back.meshes["pk"].times[3:6], m.meshes["pk"].times[9:12])
    stack = m.chains(4, capacity=m.capacity)
    assert stack.meshes["pk"].times.shape[:2] == (4, 3)
    one = m.row(1)
    assert one.n is None and one.meshes["pk"].n == 3
    assert one.repeat(2).meshes["pk"].n == 6
    merged = ProgramMesh.merge([m])
    assert merged.n is None and merged.meshes["pk"].n == 3
    errs = jax.vmap(lambda v: problem.error_ratio(v, merged))(U)
    assert np.all(np.asarray(errs) <= 1.0)


def test_a_programs_meshes_recorded_in_place_are_the_hosts(problem):
    """`ProgramProblem.record_in_place` (under ``jit``, at a kept mesh's capacity: what a
    fit's compiled loop records) gives the host record's steps, point by point, and
    `ProgramMesh.where` swaps whole points (a point's 3 subjects together)."""
    u0 = problem.space.to_unconstrained(problem.model.defaults)
    U = jnp.stack([u0 + 0.1 * i for i in range(4)])
    host = problem.record(U, 0.5)
    rec = jax.jit(lambda v, m: problem.record_in_place(v, m, 0.5))
    kept = host.to_device()
    dev = rec(U, kept)
    assert dev.meshes["pk"].times.shape == kept.meshes["pk"].times.shape
    np.testing.assert_array_equal(dev.status, 0)
    a, b = dev.meshes["pk"], host.meshes["pk"]
    np.testing.assert_array_equal(a.n_steps, b.n_steps)
    for i in range(a.n):
        k = int(b.n_steps[i]) + 1
        np.testing.assert_allclose(np.asarray(a.times[i, :k]), b.times[i, :k], rtol=1e-12)
    moved = rec(U + 0.3, kept)
    mask = jnp.asarray([True, False, True, False])
    both = jax.jit(lambda m, o: m.where(mask, o))(kept, moved).meshes["pk"]
    rows = np.repeat(np.asarray(mask), 3)
    np.testing.assert_array_equal(np.asarray(both.n_steps),
                                  np.where(rows, moved.meshes["pk"].n_steps, b.n_steps))
    np.testing.assert_array_equal(np.asarray(both.params["ka"]),
                                  np.where(rows, moved.meshes["pk"].params["ka"],
                                           b.params["ka"]))


def test_fit_program_matches_closed_form_optimum(data):
    res = inference.fit(_program, data, n_starts=4, steps=600, seed=1, objective="mle",
                        optimizer=__import__("optax").adam(0.05), progress=False)

    def nll(v):
        x = {"ka": np.exp(v[:3]), "ke": np.exp(v[3]), "sigma": np.exp(v[4])}
        pred = np.stack([_bateman(x["ka"][i], x["ke"], DOSE[i], TS) for i in range(3)])
        return -float(dist.Normal(pred, x["sigma"]).log_prob(data).sum())

    v0 = np.log(np.r_[TRUTH["ka"], TRUTH["ke"], TRUTH["sigma"]])
    ref = scipy.optimize.minimize(nll, v0, method="Nelder-Mead",
                                  options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000))
    np.testing.assert_allclose(res.params["ka"], np.exp(ref.x[:3]), rtol=2e-3)
    np.testing.assert_allclose(res.params["ke"], np.exp(ref.x[3]), rtol=2e-3)
    np.testing.assert_allclose(res.loss, ref.fun, atol=1e-3)


def test_bad_programs(data):
    def twice(d):
        k = numpyro.sample("k", dist.LogNormal(0.0, 1.0))
        for _ in range(2):
            inference.ode("same", lambda t, y, p: -p * y, 0.0, 1.0, jnp.ones(1), k)

    def no_site(d):
        numpyro.sample("k", dist.LogNormal(0.0, 1.0))

    def discrete(d):
        numpyro.sample("n", dist.Poisson(3.0))
        inference.ode("s", lambda t, y, p: -y, 0.0, 1.0, jnp.ones(1), 1.0)

    kw = dict(rtol=1e-6, atol=1e-8, max_steps=64)
    # refused while the program is traced: no compiled CPU kernel of these fields is needed
    # (building one takes seconds)
    with gs.use_compiled_kernel(False):
        with pytest.raises(ValueError, match="two sites are named 'same'"):
            ProgramProblem(twice, None, **kw)
        with pytest.raises(ValueError, match="no inference.ode site"):
            ProgramProblem(no_site, None, **kw)
        with pytest.raises(ValueError, match="discrete"):
            ProgramProblem(discrete, None, **kw)
    with pytest.raises(ValueError, match="`rtol`"):
        inference.ode("s", lambda t, y, p: -y, 0.0, 1.0, jnp.ones(1), 1.0, rtol=-1.0)
    with pytest.raises(ValueError, match="`max_steps`"):
        inference.ode("s", lambda t, y, p: -y, 0.0, 1.0, jnp.ones(1), 1.0, max_steps=0)


@pytest.mark.slow  # ~15 s: the program route of an ODEModel; replayed densities are tested below
def test_an_ode_model_builds_a_program_whose_mesh_is_reused(lynx):
    """`inference.numpyro_model` is an `inference.ode` program: called as ``program(data)``
    under `ProgramProblem` its site is recorded and replayed, and the replayed log density
    and gradient equal `inference.log_density` of the model (the adaptive solution) at the
    same point; a MAP fit of the program matches the model's own fit."""
    m, data = lynx
    prog = inference.numpyro_model(m)
    prob = ProgramProblem(prog, data, rtol=1e-8, atol=1e-10, max_steps=4096)
    assert prob.sizes == {"ode": None}
    x = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    u = prob.space.to_unconstrained(x)
    mesh = prob.record(u, 0.1)
    lp, err = prob.log_density(u, mesh, jacobian=False)
    ref = lambda q: inference.log_density(m, data, q, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(lp), float(ref(x)), rtol=1e-7)
    assert float(err.error_ratio) <= 1.0
    # the gradient w.r.t. the constrained values, through the replayed mesh
    g = jax.grad(lambda v: prob.log_density(prob.space.to_unconstrained(v), mesh,
                                            jacobian=False)[0])(x)
    g_ref = jax.grad(ref)(x)
    for k in x:
        np.testing.assert_allclose(g[k], g_ref[k], rtol=1e-5, atol=1e-6 * float(
            np.max(np.abs(np.asarray(g_ref[k])))))
    # from the same start the same optimiser reaches the same optimum
    start = {k: np.asarray(v) * 1.05 for k, v in m.defaults.items()}
    fit_prog = inference.fit(prog, data, start, steps=400, progress=False)
    fit_model = inference.fit(m, data, start, steps=400, progress=False)
    np.testing.assert_allclose(fit_prog.loss, fit_model.loss, rtol=1e-6)
    for k in x:
        np.testing.assert_allclose(fit_prog.params[k], fit_model.params[k], rtol=1e-4)


def test_default_capacity_reaches_a_posteriors_fast_subjects():
    """A subject absorbing at 1,000/h needs ~7,600 Tsit5 steps over 25 h (the absorption
    mode bounds the explicit step long after the gut is empty): past `gs.solve`'s 4,096 but
    within an ode site's default, which therefore gives the Bateman function where a
    4,096-step solve would give the sampler a cliff of -inf."""
    ts = np.linspace(0.5, 25.0, 11)
    ka, ke, dose = np.array([1.5, 1000.0]), 0.08, np.array([4.0, 4.0])
    y0 = jnp.stack([jnp.asarray(dose), jnp.zeros(2)], -1)
    p = {"ka": jnp.asarray(ka), "ke": jnp.full(2, ke)}
    short = gs.solve(_field, 0.0, 25.0, y0, p, ts=ts, max_steps=4096, throw=False)
    assert not np.all(np.isfinite(np.asarray(short.ys[1])))
    sol = inference.ode("pk", _field, 0.0, 25.0, y0, p, ts=ts)
    assert int(np.max(sol.stats["num_accepted_steps"])) > 4096
    for i in range(2):
        np.testing.assert_allclose(np.asarray(sol.ys[i, :, 1]), _bateman(ka[i], ke, dose[i], ts),
                                   rtol=1e-5)


# ------------------------------------------------------------------ observed sites
DECAY_TS = np.linspace(0.5, 4.0, 8)
DECAY_Y = np.exp(-0.7 * DECAY_TS) + 0.02 * np.sin(7.0 * DECAY_TS)


def _decay_program(observe):
    """``y' = -k y``, ``y(0) = 1`` at `DECAY_TS`; ``observe(pred (k,), sigma, data)`` writes
    the likelihood."""
    def program(data):
        k = numpyro.sample("k", dist.LogNormal(0.0, 1.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        sol = inference.ode("decay", lambda t, y, p: -p * y, 0.0, float(DECAY_TS[-1]),
                            jnp.ones(1), k, ts=DECAY_TS)
        observe(sol.ys[:, 0], sigma, data)
    return program


def test_an_observation_that_broadcasts_the_likelihood_is_refused():
    """``obs (k, 1)`` against a ``(k,)`` prediction makes NumPyro's likelihood ``(k, k)``: each
    observation counted ``k`` times (a posterior sd of 0.0109 where quadrature gives 0.0257)."""
    column = _decay_program(lambda pred, s, y: numpyro.sample("y", dist.Normal(pred, s), obs=y))
    with gs.use_compiled_kernel(False):
        for run in (inference.fit, inference.sample):
            with pytest.raises(ValueError, match=r"observed site 'y': obs has shape \(8, 1\) "
                               r"but the distribution's batch\+event shape is \(8,\)"):
                run(column, DECAY_Y[:, None], progress=False)


def test_legitimate_broadcasting_is_kept_and_its_density_is_the_closed_forms():
    """Parameters that broadcast to exactly obs's shape (``(k, 1)`` predictions against ``(2,)``
    noise scales, ``obs (k, 2)``), and i.i.d. observations of one scalar distribution
    (``obs (k,)``): each log density equals SciPy's sum over the observations."""
    from scipy import stats

    two = np.stack([DECAY_Y, 1.1 * DECAY_Y], axis=1)
    scales = np.array([0.05, 0.1])
    wide = _decay_program(lambda pred, s, y: numpyro.sample(
        "y", dist.Normal(pred[:, None], s * jnp.asarray(scales)), obs=y))
    iid = _decay_program(lambda pred, s, y: numpyro.sample(
        "y", dist.Normal(pred[-1], s), obs=y))
    x = {"k": 0.7, "sigma": 0.5}
    pred = np.exp(-x["k"] * DECAY_TS)
    prior = (stats.lognorm(1.0).logpdf(x["k"]) + stats.halfnorm(scale=1.0).logpdf(x["sigma"]))
    refs = [(wide, two, stats.norm(pred[:, None], x["sigma"] * scales).logpdf(two).sum()),
            (iid, DECAY_Y, stats.norm(pred[-1], x["sigma"]).logpdf(DECAY_Y).sum())]
    with gs.use_compiled_kernel(False):
        for program, data, like in refs:
            problem = ProgramProblem(program, data, rtol=1e-10, atol=1e-12, max_steps=4096)
            u = problem.space.to_unconstrained({k: jnp.asarray(v) for k, v in x.items()})
            lp, _ = problem.log_density(u, jacobian=False)
            np.testing.assert_allclose(float(lp), prior + like, rtol=1e-8)


def test_a_program_that_observes_nothing_is_refused_before_any_work():
    """``obs=None`` by a typo makes the likelihood's site a latent one: a fit would return
    the prior's mode and a sampler the prior (and then failed on the missing
    observed_data). A ``numpyro.factor`` that is 0 at a prior draw is a guard, not data."""
    typo = _decay_program(lambda pred, s, y: numpyro.sample("y", dist.Normal(pred, s), obs=None))

    def guarded(pred, s, y):
        numpyro.factor("solver_failure", jnp.where(jnp.all(jnp.isfinite(pred)), 0.0, -jnp.inf))
        numpyro.sample("y", dist.Normal(pred, s), obs=None)

    with gs.use_compiled_kernel(False):
        for program in (typo, _decay_program(guarded)):
            for run in (inference.fit, inference.sample):
                with pytest.raises(ValueError, match=r"observes no data: none of its sample "
                                   r"sites \['k', 'sigma', 'y'\] has obs="):
                    run(program, DECAY_Y, progress=False)
        # a likelihood written as a factor is data
        factor = _decay_program(lambda pred, s, y: numpyro.factor(
            "ll", dist.Normal(pred, s).log_prob(y).sum()))
        assert ProgramProblem(factor, DECAY_Y, rtol=1e-6, atol=1e-8, max_steps=64).observed == {}


def test_missing_observations_the_distribution_cannot_take_are_refused():
    """NaN in obs gives a NaN log density (a fit's every start non-finite, a sampler's every
    transition divergent) unless the site masks it."""
    data = DECAY_Y.copy()
    data[[2, 5]] = np.nan
    plain = _decay_program(lambda pred, s, y: numpyro.sample("y", dist.Normal(pred, s), obs=y))
    masked = _decay_program(lambda pred, s, y: numpyro.sample(
        "y", dist.Normal(pred, s).mask(~np.isnan(y)), obs=y))
    with gs.use_compiled_kernel(False):
        with pytest.raises(ValueError, match=r"observed site 'y': obs holds 2 NaN value\(s\) "
                           "of 8"):
            inference.fit(plain, data, progress=False)
        ProgramProblem(masked, data, rtol=1e-6, atol=1e-8, max_steps=64)


def test_an_observation_outside_its_distributions_support_is_refused():
    """A DV of 0 under LogNormal noise: the log-likelihood is -inf at every parameter value,
    so every start of a fit and every draw of a sampler fails. Refused at the trace, naming
    the site and the entry; masked out, the same value is accepted."""
    data = DECAY_Y.copy()
    data[3] = 0.0
    plain = _decay_program(lambda pred, s, y: numpyro.sample(
        "y", dist.LogNormal(jnp.log(pred), s), obs=y))
    masked = _decay_program(lambda pred, s, y: numpyro.sample(
        "y", dist.LogNormal(jnp.log(pred), s).mask(y > 0), obs=y))
    with gs.use_compiled_kernel(False):
        for run in (lambda: inference.fit(plain, data, progress=False),
                    lambda: inference.sample(plain, data, num_warmup=2, num_samples=2,
                                             progress=False)):
            with pytest.raises(ValueError, match=r"observed site 'y': obs\[3\] = 0 lies "
                               r"outside the support of its distribution \(LogNormal\)"):
                run()
        ProgramProblem(masked, data, rtol=1e-6, atol=1e-8, max_steps=64)


def test_a_prior_with_reversed_bounds_is_refused_naming_its_site():
    """``Uniform(2, 1)``: every value lies outside its support, so every start's log density
    was -inf and the fit ended, after ten rounds of re-drawing, blaming the data."""
    program = _decay_program(lambda pred, s, y: numpyro.sample(
        "y", dist.Normal(pred, numpyro.sample("scale", dist.Uniform(2.0, 1.0))), obs=y))
    with gs.use_compiled_kernel(False):
        with pytest.raises(ValueError, match=r"parameter 'scale': its prior's support has "
                           r"lower bound 2.0 not below its upper bound 1.0"):
            inference.fit(program, DECAY_Y, progress=False)


@pytest.mark.slow  # ~30 s (a short run); the refusal of a program without data is tested above
def test_a_likelihood_written_as_a_factor_is_sampled():
    """A program whose data enter through ``numpyro.factor`` has no observed_data group: the
    InferenceData is built without it (an AttributeError before), its attributes on the
    groups it has."""
    program = _decay_program(lambda pred, s, y: numpyro.factor(
        "ll", dist.Normal(pred, s).log_prob(y).sum()))
    with gs.use_compiled_kernel(False):
        idata = inference.sample(program, DECAY_Y, num_warmup=30, num_samples=30,
                                 num_chains=1, init="prior", progress=False)
    assert set(idata.groups()) == {"posterior", "sample_stats"}
    assert idata.posterior["k"].shape == (1, 30)
    assert idata.posterior.attrs["mesh_policy"] == idata.sample_stats.attrs["mesh_policy"]
