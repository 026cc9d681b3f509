"""The variational start of a random-effects hierarchy (`inference.sampling._advi.advi_start`):
mean-field ADVI against its closed form on Gaussian potentials, and the sampler's use of
it (where its chains start, what it reports)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import gradsolve as gs
import inference
from inference.sampling._advi import advi_start


class _Gaussian:
    """A posterior ``Normal(m, inv(P))`` over ``u`` (no ODE)."""

    def __init__(self, m, P):
        self.m, self.P = jnp.asarray(m), jnp.asarray(P)

    def log_density(self, u, mesh=None, **kw):
        r = u - self.m
        return -0.5 * r @ self.P @ r, None


def _precision(d, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (Q * np.logspace(-1, 1, d)) @ Q.T


def test_mean_field_fit_of_a_correlated_gaussian_is_its_closed_form():
    """The mean-field Gaussian closest to ``Normal(m, inv(P))`` in KL(q || p) has mean ``m``
    and variances ``1 / P_ii`` (Bishop 2006, section 10.1.2): the fit must reach both from a
    start two sds away and ten times too narrow."""
    d = 5
    P = _precision(d)
    m = np.linspace(-1.0, 1.0, d)
    sd = 1.0 / np.sqrt(np.diag(P))
    centre = m + 2.0 * sd
    starts, var, info = advi_start(_Gaussian(m, P), centre, np.diag(np.linalg.inv(P)),
                                   jax.random.PRNGKey(0), 4, steps=1500)
    assert info["ok"] == 1 and info["fewest_finite_draws"] == info["draws"]
    np.testing.assert_allclose(var, 1.0 / np.diag(P), rtol=0.25)
    # the chains' starts are draws from the fit: within a few of its sds of the mean
    assert starts.shape == (4, d)
    assert np.all(np.abs(starts - m) < 5.0 * np.sqrt(var))
    # the fitted mean, through the average of many draws from the fit
    many, _, _ = advi_start(_Gaussian(m, P), centre, np.diag(np.linalg.inv(P)),
                            jax.random.PRNGKey(0), 4000, steps=1500)
    assert np.all(np.abs(many.mean(0) - m) < 0.15 * sd)


def test_failed_draws_are_left_out_and_a_failed_fit_keeps_the_centre():
    class HalfFailing(_Gaussian):
        def log_density(self, u, mesh=None, **kw):
            lp, _ = super().log_density(u)
            return jnp.where(u[0] > 3.0, -jnp.inf, lp), None

    P, m = np.eye(2), np.zeros(2)
    _, var, info = advi_start(HalfFailing(m, P), np.array([0.5, 0.5]), np.ones(2),
                              jax.random.PRNGKey(1), 2, steps=300)
    assert info["ok"] == 1 and np.all(np.isfinite(var))

    class Failing(_Gaussian):
        def log_density(self, u, mesh=None, **kw):
            return -jnp.inf + 0.0 * jnp.sum(u), None

    centre = np.array([0.5, -0.5])
    starts, var, info = advi_start(Failing(m, P), centre, np.ones(2), jax.random.PRNGKey(1),
                                   3, steps=20)
    assert info["ok"] == 0
    np.testing.assert_array_equal(starts, np.repeat(centre[None], 3, 0))


def _decay(t, y, p):
    return -p["k"] * y


def _non_centred(data):
    ts, obs = data
    k_pop = numpyro.sample("k_pop", dist.LogNormal(0.0, 0.5))
    tau = numpyro.sample("tau", dist.HalfNormal(0.5))
    with numpyro.plate("units", obs.shape[0]):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
    sol = inference.ode("decay", _decay, 0.0, 4.0, jnp.ones((obs.shape[0], 1)),
                        {"k": k_pop * jnp.exp(tau * eta)}, ts=ts, solver=gs.Tsit5())
    numpyro.sample("obs", dist.Normal(sol.ys[..., 0], 0.01), obs=obs)


def test_a_hierarchy_starts_among_its_draws_not_at_its_mode():
    """Thirty units, each measured precisely: draws of the posterior have the standardised
    random effects ``eta`` spread as their standard-normal prior (about 1) and ``tau`` near
    the spread of the units' log rates; the chains' ADVI starts must be there (the joint
    mode shrinks ``eta`` and inflates ``tau``)."""
    from inference.problem._policy import MeshPolicy
    from inference.problem._program import problem_for
    from inference.sampling._warmup import start

    rng = np.random.default_rng(0)
    n, ts = 30, jnp.linspace(0.5, 4.0, 5)
    log_k = np.log(0.8) + 0.3 * rng.normal(size=n)
    obs = np.exp(-np.outer(np.exp(log_k), ts)) + 0.01 * rng.normal(size=(n, 5))
    data = (ts, jnp.asarray(obs))
    problem = problem_for(_non_centred, data, rtol=1e-6, atol=1e-8, max_steps=None)
    policy = MeshPolicy.checked("sample", "always", record_tol_factor=0.1)
    u0, metric, _, info = start(problem, policy, data, init="advi", num_chains=4,
                                key=jax.random.PRNGKey(0), init_jitter=0.05, seed=0,
                                fit_kwargs=dict(n_starts=4), max_steps=None,
                                target_accept=0.9, dense_mass=False)
    assert "mean-field ADVI" in info.init and info.init_fit["advi_ok"] == 1
    assert metric.shape == (problem.space.dim,)
    x = problem.space.from_unconstrained(jnp.asarray(u0))
    eta_sd = np.std(np.asarray(x["eta"]), axis=1)
    tau = np.asarray(x["tau"])
    assert np.all((eta_sd > 0.6) & (eta_sd < 1.4)), eta_sd
    sd_log_k = float(np.std(log_k))
    assert np.all(np.abs(tau - sd_log_k) < 0.35 * sd_log_k), (tau, sd_log_k)
