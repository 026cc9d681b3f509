"""inference.log_density / fit / fit_least_squares.

Independent references: SciPy (solve_ivp + scipy.stats) for the log density; known
parameters of synthetic data, with Laplace standard deviations, for fit recovery;
Carpenter's published Stan posterior for the lynx–hare MAP.
"""

import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradsolve as gs
import inference
import models
from inference import ParamSpace

from conftest import REF_MEAN, REF_SD  # noqa: E402  (Carpenter's posterior)


@pytest.fixture(scope="module")
def lv_synthetic():
    """Lotka–Volterra data from known parameters (5 % LogNormal noise, 20 times on [0.5, 10])."""
    m = models.lotka_volterra()
    true = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    true["sigma"] = jnp.asarray(0.05)
    ts = np.linspace(0.5, 10.0, 20)
    data = m.simulate(jax.random.PRNGKey(1), true, ts)
    return m, data, true


def _laplace_sd(model, data, params):
    """Posterior sds from the Hessian of -log p at ``params`` (scalar parameters only)."""
    names = list(model.priors)

    def nlp(v):
        p = {k: v[i] for i, k in enumerate(names)}
        return -inference.log_density(model, data, p, rtol=1e-10, atol=1e-12)

    v = jnp.stack([jnp.asarray(params[k]) for k in names])
    H = np.asarray(jax.jit(jax.hessian(nlp))(v))
    return dict(zip(names, np.sqrt(np.diag(np.linalg.inv(H)))))


# ------------------------------------------------------------------------------ densities


def _scipy_log_density(params, data):
    from scipy import stats
    from scipy.integrate import solve_ivp

    th = np.asarray(params["theta"], float)
    z0 = np.asarray(params["z_init"], float)
    sig = np.asarray(params["sigma"], float)

    def rhs(t, z):
        u, v = z
        return [(th[0] - th[1] * v) * u, (-th[2] + th[3] * u) * v]

    ts = np.asarray(data.ts, float)
    sol = solve_ivp(rhs, (0.0, ts[-1]), z0, t_eval=ts, method="DOP853", rtol=1e-12,
                    atol=1e-12)
    z = sol.y.T
    lp = 0.0
    loc, scale = np.array([1.0, 0.05, 1.0, 0.05]), np.array([0.5, 0.05, 0.5, 0.05])
    lp += np.sum(stats.truncnorm.logpdf(th, (0 - loc) / scale, np.inf, loc=loc, scale=scale))
    lp += np.sum(stats.lognorm.logpdf(z0, s=1.0, scale=10.0))
    lp += np.sum(stats.lognorm.logpdf(sig, s=1.0, scale=np.exp(-1.0)))
    # nansum: a NaN in ys (a missing observation) contributes nothing
    ll = np.nansum(stats.lognorm.logpdf(np.asarray(data.ys), s=sig[None], scale=z))
    return lp, ll


@pytest.mark.parametrize("which", ["defaults", "perturbed"])
def test_log_density_matches_scipy(lynx, which):
    m, data = lynx
    p = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    if which == "perturbed":
        p = {"theta": p["theta"] * jnp.array([1.1, 0.9, 1.05, 0.95]),
             "z_init": p["z_init"] * 1.1, "sigma": jnp.array([0.3, 0.2])}
    lp_ref, ll_ref = _scipy_log_density(p, data)
    f = jax.jit(lambda q: inference.log_density(m, data, q, rtol=1e-10, atol=1e-12))
    got = float(f(p))
    assert abs(got - (lp_ref + ll_ref)) < 1e-6 * max(1.0, abs(lp_ref + ll_ref))
    # the same decomposition as the model's own pieces
    assert abs(float(m.log_prior(p)) - lp_ref) < 1e-10
    # default tolerances: within the solver's accuracy (§7: ~4e-5 between rtol 1e-6, 1e-12)
    got6 = float(jax.jit(lambda q: inference.log_density(m, data, q))(p))
    assert abs(got6 - (lp_ref + ll_ref)) < 1e-3


def _with_gaps(data):
    """Three single missing entries and one missing row (t = 15) as NaN."""
    ys = np.array(data.ys, copy=True)
    ys[3, 0] = ys[8, 1] = ys[12, 0] = np.nan
    ys[15] = np.nan
    return models.Dataset(ts=data.ts, ys=ys)


def test_missing_observations_are_skipped(lynx):
    """NaN in ``Dataset.ys`` is a missing observation: the log density is SciPy's over the
    observed entries; a missing row equals dropping that row; the gradient is finite and
    matches central differences; the NumPyro program agrees."""
    from numpyro.infer.util import log_density as np_log_density

    m, data = lynx
    gaps = _with_gaps(data)
    p = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    lp_ref, ll_ref = _scipy_log_density(p, gaps)
    f = jax.jit(lambda q: inference.log_density(m, gaps, q, rtol=1e-10, atol=1e-12))
    assert abs(float(f(p)) - (lp_ref + ll_ref)) < 1e-6 * abs(lp_ref + ll_ref)
    prog = inference.numpyro_model(m, gaps, rtol=1e-10, atol=1e-12)
    assert abs(float(np_log_density(prog, (), {}, p)[0]) - float(f(p))) < 1e-8

    keep = np.arange(data.ts.shape[0]) != 15
    ys_rest = np.array(gaps.ys)[keep]
    dropped = models.Dataset(ts=np.asarray(data.ts)[keep], ys=ys_rest)
    ld_drop = inference.log_density(m, dropped, p, rtol=1e-10, atol=1e-12)
    assert abs(float(ld_drop) - float(f(p))) < 1e-6

    g = jax.grad(f)(p)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in g.values())
    h = 1e-6
    for i in range(4):
        e = jnp.zeros(4).at[i].set(h * p["theta"][i])
        fd = (f(dict(p, theta=p["theta"] + e)) - f(dict(p, theta=p["theta"] - e))) / (2 * e[i])
        assert abs(float(g["theta"][i]) - float(fd)) < 1e-4 * max(1.0, abs(float(fd)))


@pytest.mark.slow  # four fits (~18 s); the density and gradient they minimise are checked
# with and without the missing row by test_missing_observations_are_skipped
def test_fits_skip_missing_observations(lynx):
    """MAP and Levenberg–Marquardt fits with a missing row equal the fits without that row
    (to solver tolerance)."""
    m, data = lynx
    gaps = _with_gaps(data)
    keep = np.arange(data.ts.shape[0]) != 15
    dropped = models.Dataset(ts=np.asarray(data.ts)[keep], ys=np.array(gaps.ys)[keep])
    init = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    a = inference.fit_least_squares(m, gaps, init=init)
    b = inference.fit_least_squares(m, dropped, init=init)
    for k in ("theta", "z_init", "sigma"):
        np.testing.assert_allclose(a.params[k], b.params[k], rtol=1e-4)
    assert abs(float(a.loss) - float(b.loss)) < 1e-5 * float(b.loss)
    kw = dict(init=init, steps=300, optimizer=optax.adam(0.02), progress=False)
    fa, fb = inference.fit(m, gaps, **kw), inference.fit(m, dropped, **kw)
    assert np.isfinite(fa.loss) and abs(float(fa.loss) - float(fb.loss)) < 1e-4 * abs(float(fb.loss))


def test_log_density_is_minus_inf_outside_the_prior_support(lynx):
    """Outside the support (a negative scale) the log density is -inf, eagerly as under jit,
    with a finite (zero) gradient; fits refuse such an ``init`` by name."""
    m, data = lynx
    p = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    bad = dict(p, sigma=jnp.array([-0.1, 0.2]))
    assert float(inference.log_density(m, data, bad)) == -np.inf
    f = jax.jit(lambda q: inference.log_density(m, data, q))
    assert float(f(bad)) == -np.inf and np.isfinite(float(f(p)))
    g = jax.grad(f)(bad)
    assert all(np.all(np.asarray(v) == 0) for v in g.values())
    ens = {k: jnp.stack([p[k], bad[k]]) for k in p}
    out = np.asarray(jax.jit(lambda q: inference.log_density(m, data, q))(ens))
    assert np.isfinite(out[0]) and out[1] == -np.inf
    for fn in (inference.fit, inference.fit_least_squares):
        with pytest.raises(ValueError, match="`init` lies outside.*sigma"):
            fn(m, data, init=bad)


def test_log_density_wants_concrete_observation_times(lynx):
    m, data = lynx
    p = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    with pytest.raises(ValueError, match="`data.ts` is traced"):
        jax.jit(lambda d, q: inference.log_density(m, d, q))(data, p)
    # traced observations are fine (vmap over data sets with the same times)
    ys = jnp.stack([data.ys, data.ys * 1.1])
    lp = jax.vmap(lambda y: inference.log_density(m, models.Dataset(ts=data.ts, ys=y), p))(ys)
    assert lp.shape == (2,) and np.all(np.isfinite(np.asarray(lp)))


def test_log_density_ensemble_grad_and_numpyro_program(lynx):
    from numpyro.infer.util import log_density as np_log_density

    m, data = lynx
    p = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    pe = {k: jnp.stack([v, v * 1.05, v * 0.95]) for k, v in p.items()}
    f = jax.jit(lambda q: inference.log_density(m, data, q))
    ens = np.asarray(f(pe))
    assert ens.shape == (3,)
    assert abs(ens[0] - float(f(p))) < 1e-9
    g = jax.jit(jax.grad(lambda q: inference.log_density(m, data, q)))(p)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in g.values())
    # central differences on theta[0]
    eps = 1e-6
    d = jnp.zeros(4).at[0].set(eps)
    fd = (float(f(dict(p, theta=p["theta"] + d))) - float(f(dict(p, theta=p["theta"] - d)))) / (2 * eps)
    assert abs(float(g["theta"][0]) - fd) < 1e-4 * max(1.0, abs(fd))
    prog = inference.numpyro_model(m, data)
    lp_np, _ = np_log_density(prog, (), {}, p)
    assert abs(float(lp_np) - float(f(p))) < 1e-9
    # a failing solve is -inf, not NaN, and its gradient is finite
    fail = jax.jit(lambda q: inference.log_density(m, data, q, max_steps=25))
    assert float(fail(p)) == -np.inf
    gf = jax.jit(jax.grad(lambda q: inference.log_density(m, data, q, max_steps=25)))(p)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in gf.values())


def test_param_space_roundtrip_and_jacobian(lynx):
    m, _ = lynx
    sp = ParamSpace(m.priors)
    assert sp.dim == 8 and sp.labels()[0] == "theta[0]"
    p = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    u = sp.to_unconstrained(p)
    back = sp.from_unconstrained(u)
    for k in p:
        np.testing.assert_allclose(back[k], p[k], rtol=1e-12)

    def flat_x(u):
        x = sp.from_unconstrained(u)
        return jnp.concatenate([jnp.ravel(x[k]) for k in m.priors])

    J = jax.jacfwd(flat_x)(u)
    np.testing.assert_allclose(float(sp.log_abs_det_jacobian(u)),
                               np.linalg.slogdet(np.asarray(J))[1], rtol=1e-10)
    ue = jnp.stack([u, u + 0.1])
    assert sp.log_abs_det_jacobian(ue).shape == (2,)
    # scalar parameters (Lotka–Volterra zoo model)
    lv = models.lotka_volterra()
    s2 = ParamSpace(lv.priors)
    assert s2.dim == 5
    np.testing.assert_allclose(s2.from_unconstrained(s2.to_unconstrained(lv.defaults))["gamma"], 3.0)


# ------------------------------------------------------------------------------ fits


def test_fit_recovers_synthetic_lotka_volterra(lv_synthetic):
    m, data, true = lv_synthetic
    res = inference.fit(m, data, n_starts=64, steps=1500, optimizer=optax.adam(3e-2),
                        progress=False, seed=0)
    print(f"\nLV synthetic fit: n_records={res.n_records}, n_grad_evals={res.n_grad_evals}, "
          f"wall={res.wall_time:.1f}s, best loss={res.loss:.4f}")
    assert res.all_params["alpha"].shape == (64,)
    assert res.loss_history.shape == (1500, 64)
    assert res.n_records * 5 < res.n_grad_evals
    sd = _laplace_sd(m, data, res.params)
    for k in true:
        z = (float(res.params[k]) - float(true[k])) / sd[k]
        assert abs(z) < 3, (k, float(res.params[k]), float(true[k]), sd[k])
        assert abs(float(res.params[k]) / float(true[k]) - 1) < 0.15
    # several starts agree on the optimum
    assert np.sum(res.losses < res.loss + 0.01) >= 3
    assert np.all(res.max_error_ratio[res.status == 0] <= 4.0)


def test_fit_lynx_hare_map_near_reference_posterior(lynx):
    m, data = lynx
    res = inference.fit(m, data, n_starts=16, steps=1000, progress=False, seed=0)
    print(f"\nlynx-hare MAP: {res}")
    for k in REF_MEAN:
        z = (np.asarray(res.params[k]) - REF_MEAN[k]) / REF_SD[k]
        assert np.all(np.abs(z) < 2), (k, np.asarray(res.params[k]), z)
    assert res.n_records < res.n_grad_evals / 3


def test_fit_drifting_parameters_rerecords_and_converges():
    """Start with every rate halved (period far off): the mesh must be re-recorded on the
    way, and the fit still reaches the optimum."""
    m = models.lotka_volterra()
    true = {k: jnp.asarray(v) for k, v in m.defaults.items()}
    true["sigma"] = jnp.asarray(0.05)
    data = m.simulate(jax.random.PRNGKey(1), true, np.linspace(0.25, 4.0, 20))
    init = dict(true)
    for k in ("alpha", "beta", "gamma", "delta"):
        init[k] = true[k] * 0.5
    init["sigma"] = jnp.asarray(0.2)
    res = inference.fit(m, data, init=init, steps=2000, optimizer=optax.adam(3e-2),
                        progress=False)
    print(f"\ndrifting fit: n_records={res.n_records}, n_grad_evals={res.n_grad_evals}")
    assert res.n_records > 5
    assert res.n_records < res.n_grad_evals / 10
    for k in ("alpha", "beta", "gamma", "delta"):
        assert abs(float(res.params[k]) / float(true[k]) - 1) < 0.1, k
    # with a frozen mesh (never re-recorded) the replayed loss is no longer the adaptive one
    frozen = inference.fit(m, data, init=init, steps=2000, optimizer=optax.adam(3e-2),
                           progress=False, rerecord="never")
    assert frozen.n_records == 2  # the first and the final one
    assert frozen.max_error_ratio[0] > 1.0


def test_fit_checkpoint_resume_matches_clean_run(lynx, tmp_path):
    m, data = lynx
    kw = dict(n_starts=4, seed=3, checkpoint_every=10, progress=False)
    clean = inference.fit(m, data, steps=60, checkpoint=tmp_path / "clean.pkl", **kw)
    # 1) a run cut short (steps=30) then resumed to 60 steps
    path = tmp_path / "cut.pkl"
    part = inference.fit(m, data, steps=30, checkpoint=path, **kw)
    assert part.n_steps == 30
    resumed = inference.fit(m, data, steps=60, checkpoint=path, **kw)
    # 2) a run interrupted by KeyboardInterrupt (from the callback) at step 25
    path2 = tmp_path / "kill.pkl"

    def kill(step, info):
        if step == 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        inference.fit(m, data, steps=60, checkpoint=path2, callback=kill, **kw)
    with open(path2, "rb") as fh:
        assert pickle.load(fh).state.step == 25
    killed = inference.fit(m, data, steps=60, checkpoint=path2, **kw)
    for r in (resumed, killed):
        assert r.n_steps == 60
        for k in clean.all_params:
            np.testing.assert_allclose(r.all_params[k], clean.all_params[k], rtol=1e-10, atol=0)
        np.testing.assert_allclose(r.loss_history, clean.loss_history, rtol=1e-10)
        np.testing.assert_allclose(r.losses, clean.losses, rtol=1e-10)
        assert r.n_records == clean.n_records and r.n_grad_evals == clean.n_grad_evals
    # a checkpoint of another fit is refused
    with pytest.raises(ValueError, match="different fit"):
        inference.fit(m, data, steps=60, checkpoint=path, objective="mle", **kw)
    # ... and so is one resumed with other starts, data, optimizer or solver
    other_data = models.Dataset(ts=data.ts, ys=np.asarray(data.ys) * 1.5)
    changes = [("n_starts", {**kw, "n_starts": 8}, data), ("data", kw, other_data),
               ("optimizer", {**kw, "optimizer": optax.sgd(1e-3)}, data),
               ("solver", {**kw, "solver": gs.Dopri5()}, data),
               ("max_steps", {**kw, "max_steps": 2048}, data)]
    for what, kw2, data2 in changes:
        with pytest.raises(ValueError, match=f"different fit.*'{what}'"):
            inference.fit(m, data2, steps=60, checkpoint=path, **kw2)
    # a new learning rate for the same optimizer is allowed (same state structure)
    lr = inference.fit(m, data, steps=60, checkpoint=path, **{**kw, "optimizer": optax.adam(5e-3)})
    assert lr.n_steps == 60
    assert not any(p.name.startswith("cut.pkl.tmp") for p in tmp_path.iterdir())


def test_fit_redraws_failing_starts():
    """Van der Pol with a prior reaching the stiff regime and a small step budget: starts
    whose record fails are re-drawn; the fit still returns finite results."""
    import numpyro.distributions as dist

    base = models.van_der_pol(1.0)
    m = base.replace(priors={"mu": dist.LogNormal(jnp.log(3.0), 1.5),
                             "sigma": base.priors["sigma"]})
    data = m.simulate(jax.random.PRNGKey(0), {"mu": 1.0, "sigma": 0.1}, np.linspace(0.5, 8, 16))
    res = inference.fit(m, data, n_starts=16, steps=150, max_steps=120, progress=False,
                        optimizer=optax.adam(5e-2))
    print(f"\nVan der Pol fit: redrawn={res.n_redrawn}, failed later={int(np.sum(res.status))}")
    assert res.n_redrawn > 0
    assert np.isfinite(res.loss)
    assert np.all(np.isinf(res.losses[res.status != 0]))
    assert abs(float(res.params["mu"]) - 1.0) < 0.3


@pytest.mark.slow  # ~13 s; the batched LM is checked against SciPy's optimum in the normal
# suite (test_fit_least_squares_matches_scipy_least_squares)
def test_fit_least_squares(lv_synthetic, lynx):
    m, data, true = lv_synthetic
    res = inference.fit_least_squares(m, data)
    print(f"\nLM fit: {res}")
    for k in ("alpha", "beta", "gamma", "delta"):
        assert abs(float(res.params[k]) / float(true[k]) - 1) < 0.1
    assert abs(float(res.params["sigma"]) - 0.05) < 0.015  # residual RMS
    assert res.status[0] == 0 and res.max_error_ratio[0] <= 1.0
    # it agrees with the gradient fit's optimum up to the prior (weak here)
    mh, dh = lynx
    r2 = inference.fit_least_squares(mh, dh, n_starts=4, seed=1)
    for k in ("theta", "z_init"):
        z = (np.asarray(r2.params[k]) - REF_MEAN[k]) / REF_SD[k]
        assert np.all(np.abs(z) < 2), (k, z)


def test_fit_least_squares_matches_scipy_least_squares():
    """The batched LM behind fit_least_squares reaches SciPy's least-squares optimum of the
    same residuals (a closed-form decay y = A exp(-k t) with unknown A and k; noise that is
    not of the model's form, so the residuals do not vanish), from the defaults and from
    prior draws; sigma is the residuals' RMS."""
    import numpyro.distributions as dist
    from scipy import optimize

    m = models.ODEModel(
        name="decay_a", vector_field=lambda t, y, p: -p["k"] * y,
        priors={"A": dist.LogNormal(np.log(2.0), 0.5), "k": dist.LogNormal(0.0, 0.5),
                "sigma": dist.HalfNormal(1.0)},
        y0=lambda p: jnp.reshape(p["A"], (1,)), defaults={"A": 1.0, "k": 1.5, "sigma": 0.1},
    )
    ts = np.linspace(0.25, 6.0, 15)
    ys = (2.3 * np.exp(-0.65 * ts) + 0.04 * np.cos(4 * ts) + 0.02 * np.sin(11 * ts))[:, None]
    data = models.Dataset(ts=ts, ys=ys)

    def resid(p):
        return ys[:, 0] - p[0] * np.exp(-p[1] * ts)

    ref = optimize.least_squares(resid, [1.0, 1.0], method="lm", xtol=1e-15, ftol=1e-15,
                                 gtol=1e-15)
    loss_ref = 0.5 * float(np.sum(ref.fun**2))
    for kw in (dict(), dict(n_starts=6, seed=3)):
        res = inference.fit_least_squares(m, data, rtol=1e-10, atol=1e-12, **kw)
        assert res.objective == "least_squares" and np.all(res.status == 0)
        assert abs(res.loss / loss_ref - 1) < 1e-6, (res.loss, loss_ref)
        np.testing.assert_allclose([float(res.params["A"]), float(res.params["k"])], ref.x,
                                   rtol=1e-5)
        assert float(res.params["sigma"]) == pytest.approx(np.sqrt(2 * loss_ref / len(ts)),
                                                           rel=1e-6)
        assert np.all(res.converged)
        np.testing.assert_allclose(res.losses, loss_ref, rtol=1e-6)


def test_fit_rejects_bad_arguments(lynx):
    m, data = lynx
    with pytest.raises(ValueError, match="objective"):
        inference.fit(m, data, objective="bogus", steps=1)
    with pytest.raises(ValueError, match="n_starts"):
        inference.fit(m, data, n_starts=0, steps=1)
    with pytest.raises(ValueError, match="rerecord"):
        inference.fit(m, data, rerecord="sometimes", steps=1)
    with pytest.raises(ValueError, match="`optimizer`"):
        inference.fit(m, data, optimizer=0.01, steps=1)
    for name in ("drift_tol", "error_ratio_max", "rtol", "atol"):
        for bad in (0.0, -1e-6):
            with pytest.raises(ValueError, match=f"`{name}` must be a positive number, got {bad}"):
                inference.fit(m, data, steps=1, **{name: bad})
    with pytest.raises(ValueError, match="max_redraws"):
        inference.fit(m, data, max_redraws=-1, steps=1)
    with pytest.raises(RuntimeError, match="single given `init` is not re-drawn"):
        inference.fit(m, data, init=m.defaults, max_steps=25, steps=1)
    with pytest.raises(ValueError, match="missing parameters"):
        inference.fit_least_squares(m, data, init={"thetaa": 1.0})
    with pytest.raises(ValueError, match="theta"):
        inference.fit_least_squares(m, data, init=dict(m.defaults, theta=jnp.ones(3)))


def test_a_bad_init_is_refused_naming_the_key_or_the_parameter(lynx):
    """An unknown key, or a start that is not finite (``inf`` for a positive parameter lies
    in its support and became ``u = inf``, a NaN fit), is refused before any solve, by
    every fitter and the sampler."""
    m, data = lynx
    names = str(sorted(m.priors, key=list(m.priors).index))
    typo = dict(m.defaults, thetaa=1.0)
    z_inf = dict(m.defaults, z_init=np.array([np.inf, 1.0]))
    sigma_nan = dict(m.defaults, sigma=np.array([0.1, np.nan]))
    runs = (lambda init: inference.fit(m, data, init, steps=1, progress=False),
            lambda init: inference.fit_least_squares(m, data, init),
            lambda init: inference.sample(m, data, init=init, num_warmup=1, num_samples=1,
                                          progress=False))
    for run in runs:
        with pytest.raises(ValueError, match=r"`init` has unknown key\(s\) \['thetaa'\]; "
                           r"the parameters are " + re.escape(names)):
            run(typo)
        with pytest.raises(ValueError, match=r"`init`\['z_init'\] is not finite"):
            run(z_inf)
        with pytest.raises(ValueError, match=r"`init`\['sigma'\] is not finite"):
            run(sigma_nan)


def test_fit_least_squares_names_its_bad_arguments(lynx):
    m, data = lynx
    for name, bad in (("n_starts", 0), ("max_iter", -1), ("max_rerecords", 0),
                      ("n_starts", 2.0), ("lm_rtol", -1.0)):
        with pytest.raises(ValueError, match=f"`{name}` must be"):
            inference.fit_least_squares(m, data, **{name: bad})


def test_fit_refuses_keywords_it_does_not_take(lynx):
    """Unknown keywords (a PEtab global search's option given for an ODE model) are a
    ValueError listing what fit takes, not a TypeError."""
    m, data = lynx
    with pytest.raises(ValueError, match=r"unknown keyword argument\(s\) \['max_generations'\] "
                       r"for `model` of type ODEModel \(fitted by Optax; \['max_generations', "
                       r"'local'\] are the global search's, method='global'\); fit takes \['init', "
                       r"'optimizer', 'steps'"):
        inference.fit(m, data, max_generations=3)
    with pytest.raises(ValueError, match="`steps` must be an int >= 0, got True"):
        inference.fit(m, data, steps=True)
    # values that were taken silently (a truthy string) or failed deep inside JAX
    with pytest.raises(ValueError, match="`jacobian` must be True or False, got 'no'"):
        inference.fit(m, data, jacobian="no")
    with pytest.raises(ValueError, match="`seed` must be an int, got 1.5"):
        inference.fit(m, data, seed=1.5)


def test_fit_tells_a_non_finite_likelihood_from_a_failed_solve(lynx):
    """Negative data under LogNormal noise: the solves succeed, the likelihood is -inf; the
    error says so instead of suggesting a stiff solver."""
    m, data = lynx
    ys = np.array(data.ys, copy=True)
    ys[3, 0] = -1.0
    bad = models.Dataset(ts=data.ts, ys=ys)
    with pytest.raises(RuntimeError, match="non-finite loss") as info:
        inference.fit(m, bad, n_starts=2, steps=1, max_redraws=1, progress=False)
    assert "Rodas5P" not in str(info.value)


@pytest.mark.slow  # ~13 s; a user's log-likelihood in the density against SciPy is
# test_models.py::test_user_log_likelihood_model (normal suite), the fits that minimise such
# densities the tests above
def test_fit_with_a_plain_log_likelihood():
    """A user vector field plus a log-likelihood function (here Student-t, not a
    noise distribution). The MAP is checked against SciPy on the closed-form solution
    y = y0 exp(-k t)."""
    import numpyro.distributions as dist
    from scipy import optimize, stats

    def student_t(p, y_pred, ys):
        return jnp.sum(dist.StudentT(4.0, y_pred, p["s"]).log_prob(ys))

    m = models.ODEModel(
        name="decay_t", vector_field=lambda t, y, p: -p["k"] * y,
        priors={"k": dist.LogNormal(0.0, 0.5), "s": dist.LogNormal(-2.0, 0.5)},
        y0=jnp.array([2.0]), log_likelihood=student_t,
    )
    ts = np.linspace(0.5, 5.0, 12)
    ys = (2.0 * np.exp(-0.7 * ts) + 0.02 * np.sin(5 * ts) + 0.3 * (ts == ts[4]))[:, None]
    data = models.Dataset(ts=ts, ys=ys)

    def neg_log_post(x):
        k, s = x
        pred = 2.0 * np.exp(-k * ts)
        return -(stats.lognorm(0.5).logpdf(k) + stats.lognorm(0.5, scale=np.exp(-2.0)).logpdf(s)
                 + stats.t(4.0, loc=pred, scale=s).logpdf(ys[:, 0]).sum())

    ref = optimize.minimize(neg_log_post, [0.5, 0.1], method="Nelder-Mead",
                            options=dict(xatol=1e-10, fatol=1e-12, maxiter=5000)).x
    p_ref = {"k": jnp.asarray(ref[0]), "s": jnp.asarray(ref[1])}
    np.testing.assert_allclose(float(inference.log_density(m, data, p_ref)),
                               -neg_log_post(ref), rtol=0, atol=1e-6)
    res = inference.fit(m, data, n_starts=4, steps=1500, progress=False)
    np.testing.assert_allclose([float(res.params["k"]), float(res.params["s"])], ref, rtol=1e-3)



# ----------------------------------------------------- the compiled loop of Optax steps
def _per_step(monkeypatch):
    """Make `fit` take its steps one host round trip at a time (`FitKernel.step`, the
    loop the compiled one replaces): the reference the chunked loop must reproduce."""
    from inference.optimize._optax import FitKernel

    monkeypatch.setattr(FitKernel, "advance", lambda self, s, k: self.step(s))


def _assert_same_fit(a, b, rtol=1e-12):
    """Two fits took the same path: iterates, loss histories, final losses and counts."""
    assert a.n_steps == b.n_steps
    np.testing.assert_allclose(a.loss_history, b.loss_history, rtol=rtol, atol=0)
    np.testing.assert_allclose(a.losses, b.losses, rtol=rtol, atol=0)
    for k in a.all_params:
        np.testing.assert_allclose(a.all_params[k], b.all_params[k], rtol=rtol, atol=0)
    np.testing.assert_allclose(a.max_error_ratio, b.max_error_ratio, rtol=rtol, atol=0)
    assert a.n_records == b.n_records and a.n_grad_evals == b.n_grad_evals
    np.testing.assert_array_equal(a.n_records_per_start, b.n_records_per_start)
    np.testing.assert_array_equal(a.status, b.status)


def test_the_compiled_loop_takes_the_per_step_loops_path(lynx, monkeypatch):
    """Lynx–hare at a learning rate whose steps outrun their meshes: starts are
    re-recorded between steps and some steps are redone on fresh meshes, in the middle of
    a compiled chunk; chunks of 50 and of 3 steps give the per-step loop's fit."""
    from inference.optimize import Optax
    from inference.problem._problem import Problem

    # the host's re-records (the loop in place records every start: another path)
    monkeypatch.setattr(Problem, "records_in_place", False)
    m, data = lynx
    kw = dict(n_starts=4, seed=1, progress=False)
    chunked = {k: inference.fit(m, data, optimizer=Optax(optax.adam(0.1), max_iter=30,
                                                          chunk=k), **kw) for k in (50, 3)}
    _per_step(monkeypatch)
    ref = inference.fit(m, data, optimizer=Optax(optax.adam(0.1), max_iter=30), **kw)
    assert ref.n_records > 5                      # re-records on the way
    assert ref.n_grad_evals > ref.n_steps + 2     # and redone steps (first and final: +2)
    for res in chunked.values():
        _assert_same_fit(res, ref)


def test_rerecorded_rows_scattered_on_the_device_give_the_host_merges_fit(lynx, monkeypatch):
    """A re-record sends only its rows to the device mesh; the fit equals the one whose
    every re-record rebuilds the whole mesh on the host (`gs.Mesh.scatter` there). (The
    host's re-records: those of a problem that cannot record inside the compiled loop.)"""
    from inference.optimize import Optax
    from inference.optimize._optax import FitKernel
    from inference.problem._problem import Problem

    monkeypatch.setattr(Problem, "records_in_place", False)

    m, data = lynx
    kw = dict(n_starts=4, seed=1, progress=False)
    puts = []
    put = FitKernel.merge

    def counted(self, s, rows, sub):
        out = put(self, s, rows, sub)
        puts.append(out["mesh_host"] is None)
        return out

    monkeypatch.setattr(FitKernel, "merge", counted)
    res = inference.fit(m, data, optimizer=Optax(optax.adam(0.1), max_iter=30), **kw)
    assert sum(puts) > 5  # rows scattered on the device
    monkeypatch.setattr(FitKernel, "_capacity", lambda self, *a: -1)  # always on the host
    ref = inference.fit(m, data, optimizer=Optax(optax.adam(0.1), max_iter=30), **kw)
    _assert_same_fit(res, ref, rtol=0)


def _host_records(monkeypatch) -> list:
    """The rows of each record `FitKernel` makes on the host (appended as they happen)."""
    from inference.optimize._optax import FitKernel

    rows, inner = [], FitKernel.record

    def counted(self, u, which, fill=None):
        rows.append(np.asarray(which).copy())
        return inner(self, u, which, fill)

    monkeypatch.setattr(FitKernel, "record", counted)
    return rows


def _four_fast_starts(lynx):
    """Lynx–hare, 4 starts, Adam at 0.1 for 30 steps: steps that outrun their meshes."""
    opt = inference.optimize.Optax(optax.adam(0.1), max_iter=30)
    return inference.fit(*lynx, optimizer=opt, n_starts=4, seed=1, progress=False)


def _first_start_fails_in_place(monkeypatch, status: gs.Status) -> None:
    """Make every in-loop record (`Problem.record_in_place`) report start 0 failed with
    ``status`` (its other rows as recorded)."""
    import equinox as eqx

    from inference.problem._problem import Problem

    inner = Problem.record_in_place

    def failing(self, u, mesh, tol_factor=1.0):
        new = inner(self, u, mesh, tol_factor)
        return eqx.tree_at(lambda x: x.status, new, new.status.at[0].set(int(status)))

    monkeypatch.setattr(Problem, "record_in_place", failing)


def test_an_ode_models_starts_are_rerecorded_inside_the_compiled_loop(lynx, monkeypatch):
    """Lynx–hare, 16 starts: the re-records happen inside the compiled loop (the host
    records the first and the final meshes, and any start that outgrows the capacity),
    and the fit reaches the best loss, parameters and starts-at-best of the fit whose
    every re-record is the host's (`FitKernel.record`, `gs.Mesh.scatter`)."""
    from inference.problem._problem import Problem

    m, data = lynx
    kw = dict(n_starts=16, seed=0, steps=300, progress=False)
    host = _host_records(monkeypatch)
    res = inference.fit(m, data, **kw)
    assert res.n_records > len(host) + 20      # most records in the loop
    monkeypatch.setattr(Problem, "records_in_place", False)
    host.clear()
    ref = inference.fit(m, data, **kw)
    assert ref.n_records == len(host)          # every record the host's
    np.testing.assert_allclose(res.loss, ref.loss, rtol=1e-6)
    for k in res.params:
        np.testing.assert_allclose(res.params[k], ref.params[k], rtol=1e-3)
    at_best = lambda r: np.sum(np.asarray(r.losses) < r.loss + 0.1)
    assert at_best(res) == at_best(ref)
    np.testing.assert_array_equal(res.status, ref.status)


def test_a_start_that_outgrows_the_loops_capacity_is_recorded_by_the_host(lynx,
                                                                         monkeypatch):
    """A start whose in-loop record runs out of steps (here start 0's, every time, as
    if it needed more than the compiled capacity) stops the loop before the step; the
    host records it (at the full step capacity) and the fit goes on to the losses of the
    fit without the failures."""
    ref = _four_fast_starts(lynx)
    _first_start_fails_in_place(monkeypatch, gs.Status.MAX_STEPS)
    host = _host_records(monkeypatch)
    res = _four_fast_starts(lynx)
    again = [r for r in host[1:-1]]            # not the first and final records
    assert again and all(0 in r for r in again)
    assert res.n_records_per_start[0] >= len(again)
    np.testing.assert_array_equal(res.status, ref.status)
    np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-3)


def test_a_start_whose_solve_fails_in_the_loop_is_frozen_there(lynx, monkeypatch):
    """A start whose in-loop record fails with a non-finite solve (start 0, from its
    first re-record on) is frozen in the loop, as the host freezes one: reported
    failed with an infinite loss, never recorded by the host again, its mesh row
    replaying no step; the other starts fit as without it."""
    ref = _four_fast_starts(lynx)
    _first_start_fails_in_place(monkeypatch, gs.Status.NONFINITE)
    host = _host_records(monkeypatch)
    from inference.optimize._optax import FitKernel

    finals, final = [], FitKernel.final
    monkeypatch.setattr(FitKernel, "final",
                        lambda self, s: finals.append(s) or final(self, s))
    res = _four_fast_starts(lynx)
    assert res.status[0] != 0 and not np.isfinite(res.losses[0])
    assert all(0 not in r for r in host[1:])
    steps = np.asarray(finals[0].mesh.n_steps)   # the frozen start replays no step
    assert steps[0] == 0 and np.all(steps[1:] > 0)
    np.testing.assert_array_equal(res.status[1:], ref.status[1:])
    np.testing.assert_allclose(res.losses[1:], ref.losses[1:], rtol=1e-3)
    assert res.loss_history[-1][0] == np.inf


def test_the_compiled_loop_with_a_mask_reaches_the_closed_form_conditional_optimum(
        monkeypatch):
    """Exponential decay with LogNormal noise, sigma held at its start (``mask``): the
    chunked loop follows the per-step loop, keeps sigma, and reaches the closed-form
    k* = -sum(t log y) / sum(t^2) (for any fixed sigma)."""
    import numpyro.distributions as dist

    from inference.optimize import Optax

    ts = np.linspace(0.5, 5.0, 10)
    ys = np.exp(-0.8 * ts + np.array([0.05, -0.03, 0.08, -0.06, 0.02, 0.04, -0.07, 0.01,
                                      -0.02, 0.03]))
    k_star = -np.sum(ts * np.log(ys)) / np.sum(ts**2)
    m = models.ODEModel(
        name="decay_masked", vector_field=lambda t, y, p: -p["k"] * y,
        priors={"k": dist.LogNormal(0.0, 1.0), "sigma": dist.LogNormal(-2.0, 1.0)},
        y0=jnp.array([1.0]), noise=lambda p, y: dist.LogNormal(jnp.log(y), p["sigma"]))
    data = models.Dataset(ts=ts, ys=ys[:, None])
    mask = np.array([False, True])  # (k, sigma): sigma held

    class Masked(Optax):
        def minimize(self, problem, x0, **kw):
            assert list(problem.space.names) == ["k", "sigma"]
            return super().minimize(problem, x0, mask=mask, **kw)

    kw = dict(n_starts=3, seed=0, objective="mle", rtol=1e-10, atol=1e-12, progress=False)
    fits = {k: inference.fit(m, data, optimizer=Masked(optax.adam(0.05), max_iter=40,
                                                       chunk=k), **kw) for k in (50, 7)}
    long = inference.fit(m, data, optimizer=Masked(optax.adam(0.05), max_iter=1500), **kw)
    _per_step(monkeypatch)
    ref = inference.fit(m, data, optimizer=Masked(optax.adam(0.05), max_iter=40), **kw)
    for res in fits.values():
        _assert_same_fit(res, ref)
    starts = inference.fit(m, data, optimizer=Masked(max_iter=0), **kw)
    np.testing.assert_array_equal(long.all_params["sigma"], starts.all_params["sigma"])
    np.testing.assert_allclose(long.all_params["k"], k_star, rtol=1e-6)


def test_a_start_far_past_the_others_steps_is_frozen_where_the_capacity_costs(lynx):
    """Where the replay's cost follows the mesh capacity (not `ragged`: the TPU's kernels),
    a start whose fresh mesh needs more than `STEP_RATIO` times the live starts' median
    steps is frozen (as one whose solve fails) instead of growing every start's mesh; where
    each trajectory pays its own steps (the CPU kernel) there is no limit."""
    import equinox as eqx

    from inference.optimize import Optax
    from inference.optimize._optax import MIN_STEP_LIMIT, STEP_RATIO, FitKernel

    m, data = lynx
    problem = inference.problem._problem.Problem(m, data)
    kernel = Optax(max_iter=5).kernel(problem)
    u0 = np.asarray(problem.sample_starts(jax.random.PRNGKey(0), 8))
    s = kernel.init(u0, jax.random.PRNGKey(1), max_redraws=0, can_redraw=False)
    assert kernel.ragged and kernel.step_limit(s) == np.inf
    kernel.ragged = False
    steps = np.asarray(s.mesh_host.n_steps)
    assert kernel.step_limit(s) == max(STEP_RATIO * np.median(steps[s.alive]),
                                       MIN_STEP_LIMIT, s.mesh.capacity)
    inner = FitKernel.record

    def long_first(self, u, rows, fill=None):  # start 0 needs 10,000 steps
        sub, got = inner(self, u, rows, fill)
        return eqx.tree_at(lambda x: x.n_steps, sub,
                           np.where(got == 0, 10_000, np.asarray(sub.n_steps))), got

    kernel.record = long_first.__get__(kernel)
    moved = s._replace(u=s.u + 0.05)
    out = kernel.rerecord(moved, np.array([True, True] + [False] * 6), np.zeros(8))
    assert not out.alive[0] and out.alive[1:].all()
    np.testing.assert_array_equal(out.u[0], s.u_rec[0])      # back to its last good point
    np.testing.assert_array_equal(out.u_rec[1], moved.u[1])  # start 1 re-recorded there
    assert out.mesh.capacity == s.mesh.capacity


def test_a_start_that_outgrows_a_capacity_that_may_not_grow_is_frozen_in_the_loop(
        lynx, monkeypatch):
    """Where the capacity may not grow (`FitKernel.step_limit` at the capacity: here a
    replay that pays for the capacity, and a ratio of 1), a start whose in-loop record runs
    out of steps is frozen in the loop, as the host would freeze it, and never goes to the
    host; the other starts fit as without it."""
    from inference.optimize import _optax
    from inference.problem._problem import Problem

    monkeypatch.setattr(Problem, "ragged_replay", lambda self, u, mesh: False)
    monkeypatch.setattr(_optax, "STEP_RATIO", 1)
    monkeypatch.setattr(_optax, "MIN_STEP_LIMIT", 1)
    ref = _four_fast_starts(lynx)
    _first_start_fails_in_place(monkeypatch, gs.Status.MAX_STEPS)
    host = _host_records(monkeypatch)
    res = _four_fast_starts(lynx)
    assert res.status[0] != 0 and not np.isfinite(res.losses[0])
    assert all(0 not in r for r in host[1:])
    np.testing.assert_array_equal(res.status[1:], ref.status[1:])
    np.testing.assert_allclose(res.losses[1:], ref.losses[1:], rtol=1e-3)
