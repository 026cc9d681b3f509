"""`inference.fit_population` (FOCE-I, Laplace) against independent references: a model
whose predictions are linear in the random effects (the Laplace approximation is exact, the
marginal likelihood Gaussian in closed form, maximised by SciPy), and theophylline's
marginal likelihood integrated by Gauss–Hermite quadrature over each subject's two random
effects with the closed-form solution, maximised by SciPy (slow tier)."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.optimize import minimize
from scipy.special import roots_hermitenorm

import inference
import models

T = np.array([0.5, 1.0, 2.0, 3.0, 5.0])


def linear_model():
    """y(t) = a_i + b t with a_i = a + omega eta_i: the ODE y' = b from y(0) = a_i."""
    def latent(data):
        theta = {"a": numpyro.sample("a", dist.Normal(0.0, 10.0)),
                 "b": numpyro.sample("b", dist.Normal(0.0, 10.0)),
                 "omega": numpyro.sample("omega", dist.HalfNormal(2.0)),
                 "sigma": numpyro.sample("sigma", dist.HalfNormal(2.0))}
        with numpyro.plate("subjects", data.n_subjects):
            theta["eta"] = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        return theta

    S = 6

    def individual(theta, data):
        return {"a": theta["a"] + theta["omega"] * theta["eta"],
                "b": jnp.broadcast_to(theta["b"], (S,))}

    class Start(models.PopulationModel):
        def dosing(self, theta, p, data):
            return p["a"][:, None], None

    return Start(name="linear", vector_field=lambda t, y, p: jnp.broadcast_to(p["b"], (1,)),
                 state_names=("y",), latent=latent, individual=individual,
                 observation=lambda th, p, ts, ys: ys[..., 0],
                 noise=lambda th, pred: dist.Normal(pred, th["sigma"]))


def linear_data(rng):
    S, a, b, omega, sigma = 6, 2.0, 0.7, 0.8, 0.3
    subjects = []
    for i in range(S):
        y = a + omega * rng.normal() + b * T + sigma * rng.normal(size=T.size)
        subjects.append(models.Subject(id=i, ts=T, ys=y, obs_cmt=np.zeros(T.size, int),
                                       dose_times=np.zeros(0), dose_amounts=np.zeros(0),
                                       dose_cmt=np.zeros(0, int), covariates={}))
    return models.PopulationDataset(subjects)


def exact_linear_ml(data):
    """The Gaussian marginal likelihood y_i ~ N(a + b t, omega^2 11' + sigma^2 I),
    maximised over (a, b, log omega, log sigma)."""
    Y = np.stack([s.ys for s in data.subjects])

    def nll(x):
        a, b, om, sg = x[0], x[1], np.exp(x[2]), np.exp(x[3])
        C = om ** 2 * np.ones((T.size, T.size)) + sg ** 2 * np.eye(T.size)
        r = Y - (a + b * T)
        _, logdet = np.linalg.slogdet(C)
        quad = np.einsum("ij,jk,ik->i", r, np.linalg.inv(C), r)
        return 0.5 * np.sum(quad) + 0.5 * len(Y) * (logdet + T.size * np.log(2 * np.pi))

    res = minimize(nll, np.array([1.0, 0.5, 0.0, -1.0]), method="Nelder-Mead",
                   options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000))
    return res.x, 2 * res.fun


@pytest.mark.parametrize("method", ["focei", "laplace"])   # "focei": nlmixr2's spelling
def test_linear_random_effects_equal_the_exact_marginal_likelihood(method):
    data = linear_data(np.random.default_rng(0))
    x, ofv = exact_linear_ml(data)
    fit = inference.fit_population(linear_model(), data, method=method,
                                   init={"a": 1.0, "b": 0.5, "omega": 1.0, "sigma": 0.5})
    assert fit.method == {"focei": "foce-i"}.get(method, method)
    assert fit.params["a"] == pytest.approx(x[0], abs=1e-4)
    assert fit.params["b"] == pytest.approx(x[1], abs=1e-4)
    assert fit.params["omega"] == pytest.approx(np.exp(x[2]), rel=1e-3)
    assert fit.params["sigma"] == pytest.approx(np.exp(x[3]), rel=1e-3)
    assert fit.ofv == pytest.approx(ofv, abs=1e-4)
    assert fit.aic == pytest.approx(fit.ofv + 8)
    assert fit.etas.shape == (6, 1) and fit.cwres.shape == (6, T.size)
    # at the exact optimum the objective is stationary, whatever SciPy's stop reason says
    assert fit.max_gradient < 1e-3 and isinstance(fit.message, str) and fit.message


def test_bad_arguments():
    data = linear_data(np.random.default_rng(0))
    with pytest.raises(ValueError, match="`method`"):
        inference.fit_population(linear_model(), data, method="fo")
    with pytest.raises(TypeError, match="PopulationModel"):
        inference.fit_population(models.lynx_hare(), data)


# --------------------------------------------------------------------- theophylline
def quadrature_reference(data, nodes=160):
    """Theophylline's exact marginal likelihood (Gauss–Hermite over each subject's two
    standard-normal random effects, closed-form concentrations) maximised by SciPy; the
    curvature of -2 log L at its optimum (central differences) for standard errors.

    160 nodes a dimension: at 40, -2 log L was off by ~3 near the optimum (the posterior of
    a subject's ka effect is narrow beside the nodes' spacing), and its optimum with it
    (lKa 0.57 instead of ~0.46); 80 and 160 nodes agree to ~0.1."""
    ts, ys = data.observations()
    _, sizes = data.jumps(1)
    dose = np.asarray(sizes)[:, 0, 0]
    z, w = roots_hermitenorm(nodes)
    w = w / w.sum()
    Z1, Z2 = np.meshgrid(z, z, indexing="ij")
    W = np.outer(w, w).ravel()
    Z1, Z2 = Z1.ravel(), Z2.ravel()

    def m2ll(x):
        lka, lcl, lke, lom1, lom2, lsg = x
        ka = np.exp(lka + np.exp(lom1) * Z1)[:, None, None]       # (G, 1, 1)
        cl = np.exp(lcl + np.exp(lom2) * Z2)[:, None, None]
        ke = np.exp(lke)
        t = ts[None]
        c = dose[None, :, None] * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))
        c = np.where(t > 0, c, 0.0)                                # (G, S, K)
        sg = np.exp(lsg)
        ll = np.sum(-0.5 * ((ys[None] - c) / sg) ** 2 - np.log(sg) - 0.5 * np.log(2 * np.pi),
                    axis=2)                                        # (G, S)
        mx = ll.max(axis=0)
        return -2 * np.sum(mx + np.log(np.sum(W[:, None] * np.exp(ll - mx), axis=0)))

    x0 = np.array([0.45, -3.2, -2.45, np.log(0.6), np.log(0.2), np.log(0.7)])
    res = minimize(m2ll, x0, method="BFGS", options=dict(gtol=1e-5))
    x = res.x
    H = np.zeros((6, 6))
    h = 1e-3
    for i in range(6):
        for j in range(6):
            e_i, e_j = np.eye(6)[i] * h, np.eye(6)[j] * h
            H[i, j] = (m2ll(x + e_i + e_j) - m2ll(x + e_i - e_j) - m2ll(x - e_i + e_j)
                       + m2ll(x - e_i - e_j)) / (4 * h * h)
    cov = 2 * np.linalg.inv(H)
    se = np.sqrt(np.diag(cov))
    se_natural = se * np.array([1, 1, 1, np.exp(x[3]), np.exp(x[4]), np.exp(x[5])])
    return x, se_natural


@pytest.mark.slow
def test_theophylline_foce_i_agrees_with_quadrature_and_nlme():
    model, data = models.theophylline(), models.load_dataset("theophylline")
    x, se = quadrature_reference(data)
    fit = inference.fit_population(model, data)
    p = fit.params
    got = np.array([p["lKa"], p["lCl"], p["lKe"], p["omega"][0], p["omega"][1], p["sigma"]])
    ref = np.array([x[0], x[1], x[2], np.exp(x[3]), np.exp(x[4]), np.exp(x[5])])
    print("\nFOCE-I", got.round(4), "\nquadrature ML", ref.round(4))
    np.testing.assert_allclose(got[:3], ref[:3], atol=0.02)          # fixed effects
    np.testing.assert_allclose(got[3:], ref[3:], rtol=0.10)          # SDs
    got_se = np.array([fit.se["lKa"], fit.se["lCl"], fit.se["lKe"], fit.se["omega"][0],
                       fit.se["omega"][1], fit.se["sigma"]])
    print("SE", got_se.round(4), "\nquadrature SE", se.round(4))
    np.testing.assert_allclose(got_se, se, rtol=0.20)
    # nlme's published fit of this model (Lindstrom-Bates, a different approximation)
    np.testing.assert_allclose(got[:3], [0.45, -3.21, -2.43], atol=0.05)


def test_censored_observations_laplace_m3_against_scipy_laplace():
    """Beal's M3 with method='laplace' on the linear model, two observations censored below
    a limit (one early, one late): the objective at the fitted parameters equals an
    independent Laplace approximation (SciPy's mode of each subject's joint density with
    ``norm.logcdf`` for the censored entries, its curvature by central differences), and
    the fit is stationary. FOCE-I refuses censored data, naming the method to use."""
    from scipy.optimize import minimize_scalar
    from scipy.stats import norm

    data = linear_data(np.random.default_rng(1))
    limit = 1.9
    subjects = []
    for s in data.subjects:
        cens = (s.ys < limit).astype(int)
        subjects.append(s._replace(ys=np.where(cens == 1, limit, s.ys), cens=cens))
    data = models.PopulationDataset(subjects)
    assert 1 <= data.censoring().sum() < 10  # some, not all, censored
    with pytest.raises(ValueError, match="laplace"):
        inference.fit_population(linear_model(), data)
    fit = inference.fit_population(linear_model(), data, method="laplace",
                                   init={"a": 1.0, "b": 0.5, "omega": 1.0, "sigma": 0.5})
    assert fit.max_gradient < 1e-3
    a, b, om, sg = (float(fit.params[k]) for k in ("a", "b", "omega", "sigma"))

    def joint(eta, s):
        mu = a + om * eta + b * T
        lp = np.where(s.cens == 1, norm.logcdf((limit - mu) / sg), norm.logpdf(s.ys, mu, sg))
        return np.sum(lp) + norm.logpdf(eta)

    total = 0.0
    for s in data.subjects:
        e = minimize_scalar(lambda x: -joint(x, s), bracket=(-3, 3), tol=1e-12).x
        h = 1e-4
        H = -(joint(e + h, s) - 2 * joint(e, s) + joint(e - h, s)) / h ** 2
        total += joint(e, s) + 0.5 * np.log(2 * np.pi) - 0.5 * np.log(H)
    assert fit.ofv == pytest.approx(-2 * total, abs=1e-5)
    assert np.all(np.isnan(fit.iwres[data.censoring() == 1]))


def test_mode_search_backtracks_where_newton_steps_diverge():
    """``l(x) = -sqrt(1 + x^2)`` (mode 0): Newton's step ``x -> -x^3`` diverges from
    ``|x| > 1``; the search's per-subject backtracking on ``l`` reaches the mode, and
    subjects that start inside converge as undamped Newton does."""
    from inference.population._population_fit import _mode_search

    def newton_step(u, eta):
        x = np.asarray(eta)
        return jnp.asarray(x - x * (1 + x ** 2)), jnp.asarray(-np.sqrt(1 + x[:, 0] ** 2))

    x0 = np.array([[1.5], [-3.0], [0.5], [0.0]])
    undamped = x0.copy()
    for _ in range(5):
        undamped = np.asarray(newton_step(None, undamped)[0])
    assert np.abs(undamped[:2]).min() > 1e10                    # diverged
    eta = np.asarray(_mode_search(newton_step, None, jnp.asarray(x0), 50, 1e-7))
    np.testing.assert_allclose(eta, 0.0, atol=1e-12)


def test_newton_polish_reaches_the_gradient_tolerance_without_the_flat_direction():
    """A quadratic ``u' A u / 2 - b' u`` with eigenvalues 1e3, 1 and 1e-14 (a variance at
    its bound): Newton steps on the gradient with the central-difference Hessian reach
    ``max |g| < 1e-6`` from ``1e-3`` and leave the flat direction alone."""
    from inference.population._population_fit import _newton_polish, _objective_hessian

    rng = np.random.default_rng(0)
    V = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    A = V @ np.diag([1e3, 1.0, 1e-14]) @ V.T
    u_star = rng.normal(size=3)
    b = A @ u_star
    fun = lambda u: (0.5 * u @ A @ u - b @ u, A @ u - b)
    u0 = u_star + 1e-6 * V[:, 0] + 1e-3 * V[:, 1]
    assert np.max(np.abs(fun(u0)[1])) > 1e-4
    u, g = _newton_polish(fun, u0, fun(u0)[1], _objective_hessian(fun, u0))
    assert np.max(np.abs(g)) < 1e-6
    np.testing.assert_allclose(g, fun(u)[1])
    assert abs(V[:, 2] @ (u - u0)) < 1e-6


# --------------------------------------------------------------------- refused at the start
def _with_rows(data):
    """``data`` with each observation's table row (1-based, observations only, in order)."""
    out, row = [], 1
    for s in data.subjects:
        out.append(s._replace(obs_rows=np.arange(row, row + s.ts.size)))
        row += s.ts.size
    return models.PopulationDataset(out)


def test_an_observation_outside_the_noise_support_is_named_before_any_solve():
    """LogNormal noise and a DV <= 0 (subject 2's third observation, table row 13): the
    log-likelihood is -inf at every parameter value. Both methods name the row at once
    (FOCE-I would refuse the noise model anyway; Laplace ran for a while, then failed with
    a singular Hessian)."""
    data = linear_data(np.random.default_rng(0))
    subjects = list(data.subjects)
    subjects[2] = subjects[2]._replace(ys=np.where(np.arange(T.size) == 2, 0.0, subjects[2].ys))
    data = _with_rows(models.PopulationDataset(subjects))
    model = linear_model().replace(
        noise=lambda th, pred: dist.LogNormal(jnp.log(jnp.abs(pred) + 1.0), th["sigma"]))
    for method in ("laplace", "foce-i"):
        with pytest.raises(ValueError, match=r"subject 2, row 13 \(TIME 2, DV 0\)"):
            inference.fit_population(model, data, method=method)
    # the posterior refuses it too, at the program's trace (subject 2, observation 2)
    with pytest.raises(ValueError, match=r"obs\[2, 2\] = 0 lies outside the support of its "
                       r"distribution \(LogNormal\)"):
        inference.sample(model, data, num_warmup=2, num_samples=2, progress=False)


def test_a_start_without_a_finite_likelihood_is_named():
    """A proportional error ``sd = sigma * pred`` and a start whose predictions are all 0:
    every subject's density is degenerate there, so no conditional mode exists; the fit
    names the first row and the prediction instead of failing in the optimiser."""
    data = _with_rows(linear_data(np.random.default_rng(0)))
    model = linear_model().replace(noise=lambda th, pred: dist.Normal(pred, th["sigma"] * pred))
    with pytest.raises(ValueError, match=r"at the start .* subject 0, row 1 .* prediction"
                                         r" there 0"):
        inference.fit_population(model, data, method="laplace",
                                 init={"a": 0.0, "b": 0.0, "omega": 1.0, "sigma": 0.5})


def _run_in_float32(code: str) -> list[str]:
    """``code``'s stdout lines, run in a fresh process with float64 off (this test
    module importable)."""
    import os
    import subprocess
    import sys

    head = f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
    out = subprocess.run([sys.executable, "-c", head + code],
                         env=dict(os.environ, JAX_ENABLE_X64="0"), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return out.stdout.splitlines()


def test_float32_foce_i_is_refused_naming_enable_x64():
    """In float32, FOCE-I (the fit, and the profile of a FOCE-I fit) refuses at once,
    before any kernel is built, naming ``gs.enable_x64()``: on theophylline at the float32
    tolerance floor its gradient stalled at 0.66 (float64: 4e-8) and its SEs were off by
    up to 3x."""
    lines = _run_in_float32("""
import inference, models
from inference.population._population_fit import PopulationFit
data = models.load_dataset("theophylline")
foce = PopulationFit(*([None] * 13), method="foce-i", converged=False, n_iterations=0,
                     wall_time=0.0)
for call in (lambda: inference.fit_population(models.theophylline(), data),
             lambda: inference.profile_intervals(foce, models.theophylline(), data)):
    try:
        call()
    except ValueError as e:
        print("REFUSED", e)
""")
    refused = [ln for ln in lines if ln.startswith("REFUSED")]
    assert len(refused) == 2, lines
    assert all("gs.enable_x64()" in ln and "float64" in ln for ln in refused), refused
    assert "inference.profile_intervals" in refused[1]


@pytest.mark.slow  # ~25 s of CPU: a fresh process and a float32 compile; sibling above
def test_float32_laplace_runs_at_the_floor_with_one_warning():
    """In float32 the Laplace method runs at the 4-epsilon tolerance floor with one
    warning naming ``gs.enable_x64()``, and still finds the linear model's exact marginal
    likelihood optimum (SciPy on its closed form, in float64)."""
    lines = _run_in_float32("""
import warnings
import numpy as np, inference
from test_population_fit import linear_data, linear_model
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fit = inference.fit_population(linear_model(), linear_data(np.random.default_rng(0)),
                                   method="laplace",
                                   init={"a": 1.0, "b": 0.5, "omega": 1.0, "sigma": 0.5})
found = [str(w.message) for w in caught if "float32" in str(w.message)]
print("WARNINGS", len(found))
print("WARNING", found[0])
print("FIT", *(float(fit.params[k]) for k in ("a", "b", "omega", "sigma")), fit.ofv)
""")
    assert "WARNINGS 1" in lines, lines
    warning = next(ln for ln in lines if ln.startswith("WARNING "))
    assert "gs.enable_x64()" in warning and "rtol=4.77e-07 instead of 1e-08" in warning
    got = [float(v) for v in next(ln for ln in lines if ln.startswith("FIT")).split()[1:]]
    x, ofv = exact_linear_ml(linear_data(np.random.default_rng(0)))
    np.testing.assert_allclose(got[:2], x[:2], atol=1e-3)
    np.testing.assert_allclose(got[2:4], np.exp(x[2:]), rtol=1e-2)
    assert got[4] == pytest.approx(ofv, abs=1e-2)


def test_progress_lines_when_stderr_is_not_a_terminal(capfd, monkeypatch):
    """Off a terminal the fit prints a plain line per outer iteration once the interval
    has passed (here 0 s), with the OFV at the accepted point; ``progress=False`` none."""
    from inference import _progress

    monkeypatch.setattr(_progress, "INTERVAL", 0.0)
    data = linear_data(np.random.default_rng(0))
    init = {"a": 1.0, "b": 0.5, "omega": 1.0, "sigma": 0.5}
    fit = inference.fit_population(linear_model(), data, init=init, max_iterations=5)
    lines = [ln for ln in capfd.readouterr().err.splitlines()
             if ln.startswith("fit_population linear (foce-i): ")]
    assert 1 <= len(lines) <= 5 and lines[-1].startswith(
        f"fit_population linear (foce-i): {fit.n_iterations}/5, "), lines
    assert float(lines[-1].rsplit("ofv ", 1)[1]) >= fit.ofv - 1e-6
    inference.fit_population(linear_model(), data, init=init, max_iterations=5, progress=False)
    assert "fit_population" not in capfd.readouterr().err
