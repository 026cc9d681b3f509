"""The optimiser objects of `inference.optimize` and `inference.fit(problem, optimizer=...)`.

Independent references: closed-form optima (a linear least-squares problem, Rosenbrock's
function with and without bounds, the maximum-likelihood decay rate of y' = -k y under
log-normal noise, which is a linear regression of log y on t), and `fit_population`'s own
optimum for the population problem.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import inference
import models
from inference.optimize import BFGS, LBFGSB, AbstractOptimizer, LevenbergMarquardt, Optax
from conftest import ClosedFormProblem
from inference.problem._abstract import AbstractProblem


class _Aux:
    error_ratio = jnp.zeros(())


class Residuals(ClosedFormProblem, AbstractProblem):
    """A problem with no ODE: objective ``0.5 * sum(r(u)**2) + 3`` inside ``bounds``."""

    count_failures_by_default = False
    least_squares = True

    def __init__(self, r, dim, lower=None, upper=None):
        self.r, self.dim = r, dim
        self.lo = np.full(dim, -np.inf) if lower is None else np.asarray(lower, float)
        self.hi = np.full(dim, np.inf) if upper is None else np.asarray(upper, float)

    def names(self):
        return tuple(f"x[{i}]" for i in range(self.dim))

    def bounds(self):
        return self.lo.copy(), self.hi.copy()

    def sample_starts(self, key, n):
        lo = np.where(np.isfinite(self.lo), self.lo, -2.0)
        hi = np.where(np.isfinite(self.hi), self.hi, 2.0)
        return np.asarray(jax.random.uniform(key, (n, self.dim), minval=lo, maxval=hi))

    def residuals(self, u, mesh=None, *, prior=True):
        u = jnp.asarray(u)
        return (self.r(u) if u.ndim == 1 else jax.vmap(self.r)(u)), _Aux()

    def objective(self, u, mesh=None, *, prior=True):
        r, aux = self.residuals(u)
        return 0.5 * jnp.sum(r**2, axis=-1) + 3.0, aux


    def record(self, u, tol_factor=1.0):
        return jnp.zeros(np.shape(u)[:-1] + (1,))


def rosenbrock(u):
    """Rosenbrock's function as residuals: 0.5 sum r^2 = (1 - x)^2 + 100 (y - x^2)^2."""
    return jnp.sqrt(2.0) * jnp.stack([1.0 - u[0], 10.0 * (u[1] - u[0] ** 2)])


L = np.array([[2.0, 0.3, -0.1], [0.0, 1.0, 0.5], [0.4, 0.0, 1.5], [1.0, -1.0, 0.2]])
C = np.array([0.7, -1.2, 0.4])


def linear(u):
    return jnp.asarray(L) @ (u - jnp.asarray(C))


X0 = np.array([[-1.5, 1.5, 0.0], [1.0, 1.0, 1.0], [0.0, -0.5, 1.9]])


@pytest.mark.parametrize("opt", [LevenbergMarquardt(200), LBFGSB(500), BFGS(500)],
                         ids=["lm", "lbfgsb", "bfgs"])
def test_each_optimiser_reaches_the_linear_least_squares_optimum(opt):
    """u* = C (L has full column rank), objective 3 there, from every start."""
    res = opt.minimize(Residuals(linear, 3), X0, progress=False)
    np.testing.assert_allclose(res.x, np.broadcast_to(C, X0.shape), atol=1e-5)
    np.testing.assert_allclose(res.value, 3.0, atol=1e-9)
    assert res.converged.all() and res.history.shape[1] == len(X0)


@pytest.mark.parametrize("opt", [LevenbergMarquardt(500), LBFGSB(500)], ids=["lm", "lbfgsb"])
def test_bounded_optimisers_reach_rosenbrocks_bounded_optimum(opt):
    """With x <= 0.5 the minimum of (1 - x)^2 + 100 (y - x^2)^2 is at (0.5, 0.25), value
    0.25 (+ 3); without the bound at (1, 1)."""
    prob = Residuals(rosenbrock, 2, lower=[-2.0, -2.0], upper=[0.5, 2.0])
    x0 = np.array([[-1.2, 1.0], [0.0, -1.0], [0.4, 1.9]])
    res = opt.minimize(prob, x0, progress=False)
    np.testing.assert_allclose(res.x, [[0.5, 0.25]] * 3, atol=1e-5)
    np.testing.assert_allclose(res.value, 3.25, atol=1e-8)


def test_bfgs_reaches_rosenbrocks_minimum_and_refuses_bounds():
    res = BFGS(1000).minimize(Residuals(rosenbrock, 2), np.array([[-1.2, 1.0]]), progress=False)
    np.testing.assert_allclose(res.x, [[1.0, 1.0]], atol=1e-4)
    with pytest.raises(ValueError, match="BFGS moves the coordinates freely"):
        BFGS().minimize(Residuals(rosenbrock, 2, lower=[-2, -2], upper=[2, 2]),
                        np.zeros((1, 2)))


@pytest.mark.parametrize("opt", [LevenbergMarquardt(200), LBFGSB(500), BFGS(500)],
                         ids=["lm", "lbfgsb", "bfgs"])
def test_a_masked_coordinate_stays_and_the_others_reach_their_conditional_optimum(opt):
    """Holding x[0] of Rosenbrock's function at a: the optimum over y is y = a^2, value
    (1 - a)^2 (+ 3)."""
    x0 = np.array([[0.3, -1.0], [-0.7, 1.5]])
    res = opt.minimize(Residuals(rosenbrock, 2), x0, mask=np.array([True, False]),
                       progress=False)
    np.testing.assert_array_equal(res.x[:, 0], x0[:, 0])
    np.testing.assert_allclose(res.x[:, 1], x0[:, 0] ** 2, atol=1e-5)
    np.testing.assert_allclose(res.value, 3.0 + (1 - x0[:, 0]) ** 2, atol=1e-8)


def test_reversed_bounds_and_a_bad_mask_are_refused_naming_them():
    prob = Residuals(linear, 3, lower=[0.0, 1.0, -1.0], upper=[1.0, 0.0, 1.0])
    for opt in (LevenbergMarquardt(), LBFGSB()):
        with pytest.raises(ValueError, match=r"bounds of 'x\[1\]' are \[1, 0\]: the lower"):
            opt.minimize(prob, np.zeros((1, 3)))
    with pytest.raises(ValueError, match="`mask` must be a bool array of shape"):
        LBFGSB().minimize(Residuals(linear, 3), X0, mask=np.array([1, 0, 0]))
    with pytest.raises(ValueError, match="`mask` holds every coordinate"):
        LBFGSB().minimize(Residuals(linear, 3), X0, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="`max_iter` must be an int >= 1"):
        LevenbergMarquardt(0)


class _Untouchable(Residuals):
    """A problem whose evaluation or starts fail the test: `fit` must refuse before them."""

    def residuals(self, u, mesh=None, *, prior=True):
        raise AssertionError("the problem was evaluated before the bad argument was refused")

    def sample_starts(self, key, n):
        raise AssertionError("starts were drawn before the bad argument was refused")


@pytest.mark.parametrize("method", ["auto", "lm", "lbfgs", "global"])
def test_fit_of_a_problem_object_names_bad_input_before_any_work(method):
    """Reversed bounds, an unknown parameter and zero starts are refused by `fit` with the
    coordinate or argument named, before a start is drawn or the objective evaluated."""
    reversed_ = _Untouchable(linear, 3, lower=[0.0, 1.0, -1.0], upper=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"the bounds of 'x\[1\]' are \[1, 0\]: the lower"):
        inference.fit(reversed_, method=method, progress=False)
    ok = _Untouchable(linear, 3)
    with pytest.raises(ValueError, match=r"`init` has unknown key\(s\) \['nope'\] and "
                       r"missing parameters \['x\[0\]', 'x\[1\]', 'x\[2\]'\]"):
        inference.fit(ok, init={"nope": 1.0}, method=method, progress=False)
    with pytest.raises(ValueError, match="`n_starts` must be an int >= 1, got 0"):
        inference.fit(ok, n_starts=0, method=method, progress=False)


def test_fit_of_a_problem_object_starts_at_a_given_dict():
    """``init`` by coordinate name on a problem without a ParamSpace: the first start,
    the LM's result the least-squares solution (the linear system's ``C``)."""
    init = {"x[0]": 0.1, "x[1]": 0.2, "x[2]": 0.3}
    res = inference.fit(Residuals(linear, 3), init=init, method="lm", progress=False)
    np.testing.assert_allclose(res.starts[0], [0.1, 0.2, 0.3])
    np.testing.assert_allclose([res.params[f"x[{i}]"] for i in range(3)], C, atol=1e-6)


def test_a_deadline_stops_an_optimiser_with_its_best_point():
    res = LevenbergMarquardt(10_000, gtol=0.0, ftol=0.0).minimize(
        Residuals(rosenbrock, 2), np.array([[-1.2, 1.0]]), deadline=0.0, progress=False)
    assert res.reason[0] == "deadline" and np.isfinite(res.value[0])


def test_fit_takes_an_optimiser_of_ones_own():
    """The recipe of docs/architecture.md: a subclass with `minimize` is a fit's optimiser,
    its result mapped back to the problem's coordinates by name."""

    class GridSearch(AbstractOptimizer):
        name = "grid"

        def minimize(self, problem, x0, *, mask=None, deadline=None, progress=None,
                     prior=True):
            self.deadline = deadline
            grid = np.stack(np.meshgrid(*[np.linspace(-2, 2, 81)] * 2), -1).reshape(-1, 2)
            f = np.asarray(problem.objective(grid)[0])
            best = grid[np.argmin(f)]
            n = len(x0)
            return inference.optimize.OptimizeResult(
                x=np.tile(best, (n, 1)), value=np.full(n, f.min()),
                converged=np.ones(n, bool), n_iter=np.ones(n, int),
                reason=np.full(n, "grid"), history=np.full((1, n), f.min()))

    opt = GridSearch()
    t0 = time.monotonic()
    res = inference.fit(Residuals(rosenbrock, 2), optimizer=opt, n_starts=2, max_time=60.0)
    assert res.method == "grid" and res.parameter_ids == ("x[0]", "x[1]")
    assert res.params == {"x[0]": pytest.approx(1.0), "x[1]": pytest.approx(1.0)}
    assert res.loss == pytest.approx(3.0)
    # fit's max_time is the object's deadline
    assert t0 + 60.0 <= opt.deadline <= time.monotonic() + 60.0
    with pytest.raises(ValueError, match=r"`jacobian` does not apply to an optimizer object"):
        inference.fit(Residuals(rosenbrock, 2), optimizer=opt, jacobian=True)
    with pytest.raises(ValueError, match=r"`checkpoint` does not apply to an optimizer"):
        inference.fit(Residuals(rosenbrock, 2), optimizer=opt, checkpoint="x.pkl")


# --------------------------------------------------------------- each kind through fit
TS = np.linspace(0.5, 5.0, 10)
NOISE = np.array([0.05, -0.03, 0.08, -0.06, 0.02, 0.04, -0.07, 0.01, -0.02, 0.03])
YS = np.exp(-0.8 * TS + NOISE)


def _decay_mle():
    """y = exp(-k t) observed with LogNormal(log y, sigma) noise: log y_i = -k t_i + e_i,
    so k* = -sum(t log y) / sum(t^2) and sigma*^2 = the mean squared residual."""
    k = -np.sum(TS * np.log(YS)) / np.sum(TS**2)
    sigma = np.sqrt(np.mean((np.log(YS) + k * TS) ** 2))
    return k, sigma


@pytest.fixture(scope="module")
def decay_model():
    import numpyro.distributions as dist

    m = models.ODEModel(
        name="decay_ln", vector_field=lambda t, y, p: -p["k"] * y,
        priors={"k": dist.LogNormal(0.0, 1.0), "sigma": dist.LogNormal(-2.0, 1.0)},
        y0=jnp.array([1.0]),
        noise=lambda p, y: dist.LogNormal(jnp.log(y), p["sigma"]))
    return m, models.Dataset(ts=TS, ys=YS[:, None])


@pytest.mark.parametrize("method", ["optax", "lbfgs"])
def test_an_ode_model_through_fit_reaches_the_closed_form_mle(decay_model, method):
    m, data = decay_model
    k, sigma = _decay_mle()
    kw = dict(steps=3000, optimizer=None) if method == "optax" else {}
    res = inference.fit(m, data, method=method, objective="mle", n_starts=2, seed=0,
                        rtol=1e-10, atol=1e-12, progress=False, **kw)
    tol = 2e-3 if method == "optax" else 1e-5
    assert float(res.params["k"]) == pytest.approx(k, rel=tol)
    assert float(res.params["sigma"]) == pytest.approx(sigma, rel=10 * tol)


def test_a_program_through_fit_reaches_the_closed_form_mle():
    import numpyro
    import numpyro.distributions as dist

    def program(data):
        k = numpyro.sample("k", dist.LogNormal(0.0, 1.0))
        sigma = numpyro.sample("sigma", dist.LogNormal(-2.0, 1.0))
        sol = inference.ode("y", lambda t, y, p: -p["k"] * y, 0.0, 5.0, jnp.ones(1),
                            {"k": k}, ts=data["ts"])
        numpyro.sample("obs", dist.LogNormal(jnp.log(sol.ys[:, 0]), sigma), obs=data["obs"])

    k, sigma = _decay_mle()
    res = inference.fit(program, {"ts": jnp.asarray(TS), "obs": jnp.asarray(YS)},
                        method="lbfgs", objective="mle", n_starts=2, rtol=1e-10,
                        atol=1e-12, progress=False)
    assert res.method == "lbfgs"
    assert float(res.params["k"]) == pytest.approx(k, rel=1e-5)
    assert float(res.params["sigma"]) == pytest.approx(sigma, rel=1e-4)


def test_a_petab_problem_through_fit_with_an_optimiser_object(tmp_path):
    """The PEtab decay problem's closed-form optimum (test_petab_fit's reference), by the
    LM object and by L-BFGS-B named as a method."""
    from test_petab_fit import _decay_mle as petab_mle
    from test_petab_fit import _decay_problem

    problem = _decay_problem(tmp_path)
    x_ref, nll_ref = petab_mle()
    for kw in (dict(optimizer=LevenbergMarquardt(300)), dict(method="lbfgs")):
        res = inference.fit(problem, n_starts=3, seed=1, objective="mle", progress=False,
                            **kw)
        assert res.loss == pytest.approx(nll_ref, abs=1e-6), kw
        np.testing.assert_allclose([res.params[p] for p in problem.parameter_ids], x_ref,
                                   atol=1e-4)


@pytest.mark.slow  # ~60 s: two population fits of theophylline
def test_a_population_problem_through_fit_reaches_fit_populations_optimum():
    from inference.population._problem import PopulationProblem

    m, data = models.theophylline(), models.load_dataset("theophylline")
    ref = inference.fit_population(m, data, progress=False)
    res = inference.fit(PopulationProblem(m, data), method="bfgs", progress=False)
    assert res.loss == pytest.approx(0.5 * ref.ofv, abs=1e-4)


def test_bad_fit_arguments_are_named(decay_model):
    m, data = decay_model
    with pytest.raises(ValueError, match="`n_starts` must be an int >= 1, got 0"):
        inference.fit(m, data, n_starts=0)
    with pytest.raises(ValueError, match=r"`init` has unknown key\(s\) \['kk'\]"):
        inference.fit(m, data, init={"kk": 1.0, "sigma": 0.1}, method="lbfgs")
    with pytest.raises(ValueError, match="`method` must be one of 'auto', 'optax', 'lm'"):
        inference.fit(m, data, method="newton")
    with pytest.raises(ValueError, match="needs residuals"):
        inference.fit(m, data, method="lm")
    with pytest.raises(ValueError, match="`method`='lbfgs' and an optimizer object"):
        inference.fit(m, data, method="lbfgs", optimizer=LBFGSB())
    with pytest.raises(ValueError, match="`rerecord` does not apply to `model` of type "
                       "ODEModel .*method='lbfgs'"):
        inference.fit(m, data, method="lbfgs", rerecord="always")
    with pytest.raises(ValueError, match="`optimizer` must be an optimiser object"):
        inference.fit(m, data, optimizer="adam")
    assert isinstance(Optax(), AbstractOptimizer)
