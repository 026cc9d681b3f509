"""The sampler's initial metric (`inference.sampling._metric.curvature_metric`): the inverse Hessian
of the potential at the start, against closed forms on a quadratic potential and against
second differences of the log density's values on an ODE posterior."""

import jax.numpy as jnp
import numpy as np
import pytest

import inference
import models
from inference.sampling._metric import curvature_metric
from inference.problem._program import problem_for


class _Ok:
    ok = np.array(True)


class _Quadratic:
    """A posterior whose potential is ``0.5 u^T A u`` (no ODE): its Hessian is ``A``."""

    def __init__(self, A):
        self.A = jnp.asarray(A)

    def record(self, u, tol_factor=1.0):
        return _Ok()

    def log_density(self, u, mesh=None, **kw):
        return -0.5 * u @ self.A @ u, None


def _spd(d, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (Q * np.logspace(-2, 3, d)) @ Q.T


@pytest.mark.parametrize("dense", [True, False])
def test_metric_is_the_inverse_hessian_of_a_quadratic_potential(dense):
    A = _spd(6)
    metric, how = curvature_metric(_Quadratic(A), np.full(6, 0.3), dense=dense)
    cov = np.linalg.inv(A)
    np.testing.assert_allclose(metric, cov if dense else np.diag(cov), rtol=1e-6, atol=1e-12)
    assert "inverse Hessian" in how and "without positive curvature" not in how


def test_directions_without_positive_curvature_get_unit_variance():
    # eigenvalues 4, -1 along the rotated axes: the second direction is not a maximum
    c, s = np.cos(0.4), np.sin(0.4)
    V = np.array([[c, -s], [s, c]])
    A = (V * np.array([4.0, -1.0])) @ V.T
    metric, how = curvature_metric(_Quadratic(A), np.zeros(2), dense=True)
    np.testing.assert_allclose(metric, (V * np.array([0.25, 1.0])) @ V.T, rtol=1e-6)
    assert "1 of 2 directions" in how


def test_metric_of_an_ode_posterior_against_second_differences_of_values():
    m, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    problem = problem_for(m, data, rtol=1e-6, atol=1e-8, max_steps=None)
    fit = inference.fit(m, data, n_starts=4, steps=300, seed=0, progress=False)
    u = np.asarray(problem.space.to_unconstrained(fit.params))
    metric, _ = curvature_metric(problem, u, dense=True)
    # the Hessian by second differences of the potential's values on the same mesh
    mesh = problem.record(u)
    D, h = u.shape[0], 1e-3

    def U(v):
        return -float(problem.log_density(jnp.asarray(v), mesh)[0])

    E = np.eye(D) * h
    H = np.empty((D, D))
    for i in range(D):
        for j in range(D):
            H[i, j] = (U(u + E[i] + E[j]) - U(u + E[i] - E[j]) - U(u - E[i] + E[j])
                       + U(u - E[i] - E[j])) / (4 * h * h)
    lam = np.linalg.eigvalsh(0.5 * (H + H.T))
    assert lam.min() > 0  # a MAP point: the regularisation leaves it alone
    np.testing.assert_allclose(metric, np.linalg.inv(0.5 * (H + H.T)), rtol=2e-3,
                               atol=1e-3 * np.abs(metric).max())


@pytest.mark.slow  # ~8 s
def test_sample_reports_its_initial_metric():
    m, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    r = inference.sample(m, data, num_warmup=50, num_samples=20, num_chains=2, seed=1,
                         progress=False)
    assert "initial metric: inverse Hessian of the potential" in r.sample_stats.attrs["init"]
    r = inference.sample(m, data, num_warmup=50, num_samples=20, num_chains=2, seed=1,
                         init="prior", progress=False)
    assert "initial metric" not in r.sample_stats.attrs["init"]


class _NormalPrior:
    """Priors ``N(0, sd^2)`` on every coordinate, drawn as `inference.sample` draws them."""

    def __init__(self, sd):
        self.sd = np.asarray(sd, dtype=float)

    def sample_prior(self, key, n):
        import jax

        return self.sd * np.asarray(jax.random.normal(key, (n, self.sd.size)))


class _Identity:
    def __init__(self, dim):
        self.dim = dim

    def to_unconstrained(self, x):
        return x


@pytest.mark.parametrize("dense", [True, False])
def test_a_flat_direction_is_capped_at_its_prior_variance(dense):
    """A parameter the data leave flat (curvature 1e-6: the inverse Hessian would say a
    variance of 1e6, clipped to 100) gets its prior's variance (2^2); the identified one
    keeps the inverse curvature (1/4)."""
    problem = _Quadratic(np.diag([4.0, 1e-6]))
    problem.model, problem.space = _NormalPrior([3.0, 2.0]), _Identity(2)
    metric, how = curvature_metric(problem, np.zeros(2), dense=dense)
    var = np.diag(metric) if dense else metric
    np.testing.assert_allclose(var, [0.25, 4.0], rtol=0.1)   # 1,024 prior draws
    if dense:
        assert metric[0, 1] == 0.0
    assert "1 of 2 parameters' variances capped at their prior's" in how
