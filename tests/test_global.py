"""The global search as an optimiser of any problem (`inference.optimize._global`).

Independent references: closed forms. Rastrigin's function (a local minimum near every
integer offset from its minimiser, the global one 0 at a known point) through the problem
interface, bounded and unbounded; the stagnation rule on a run whose best creeps by a
known relative amount per generation; a limit of time measured by the wall clock.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.optimize._global import CMAKernel, GlobalSearch
from inference.optimize._scipy import LBFGSB
from conftest import ClosedFormProblem
from inference.problem._abstract import AbstractProblem

D = 4
X_STAR = np.array([0.7, -1.3, 0.4, 1.9])


class ClosedForm(ClosedFormProblem, AbstractProblem):
    """A problem whose objective is a closed form of ``u (D,)`` or ``(n, D)`` (no ODE):
    ``f(u) = offset + rastrigin(u - X_STAR) (+ ripple)``, inside ``[-5.12, 5.12]^D`` or
    unbounded (starts then N(0, 2^2))."""

    count_failures_by_default = False

    def __init__(self, bounded: bool = True, offset: float = 0.0, ripple: float = 0.0):
        self.bounded, self.offset, self.ripple = bounded, offset, ripple
        self.n_evals = 0

    def names(self):
        return tuple(f"x[{i}]" for i in range(D))

    def bounds(self):
        b = 5.12 if self.bounded else np.inf
        return np.full(D, -b), np.full(D, b)

    def sample_starts(self, key, n):
        if self.bounded:
            return np.asarray(jax.random.uniform(key, (n, D), minval=-5.12, maxval=5.12))
        return np.asarray(2.0 * jax.random.normal(key, (n, D)))

    def objective(self, u, mesh=None, *, prior=True):
        z = jnp.asarray(u) - X_STAR
        f = 10.0 * D + jnp.sum(z**2 - 10.0 * jnp.cos(2.0 * jnp.pi * z), axis=-1)
        # a deterministic ripple: a noisy-looking objective whose values never settle
        f = f + self.ripple * jnp.sum(jnp.sin(1e6 * jnp.asarray(u) * jnp.arange(1, D + 1)),
                                      axis=-1)
        return self.offset + f, None

    def fingerprint(self):
        return dict(kind="closed form", bounded=self.bounded, offset=self.offset,
                    ripple=self.ripple)



def _rastrigin_minima_near(x):
    """The local minima of Rastrigin's function lie near the integer offsets from X_STAR:
    the one a point ``x (D,)`` rounds to."""
    return X_STAR + np.round(np.asarray(x) - X_STAR)


@pytest.mark.parametrize("bounded", [True, False])
def test_global_search_finds_rastrigins_minimum_through_the_interface(bounded):
    problem = ClosedForm(bounded=bounded)
    x0 = problem.sample_starts(jax.random.PRNGKey(3), 2)
    # a local fit from the same starts stops in a local minimum
    local = LBFGSB().minimize(problem, x0)
    assert np.all(local.value > 0.9)
    res = GlobalSearch(seed=3, max_iter=400, local=LBFGSB()).minimize(problem, x0)
    best = int(np.argmin(res.value))
    assert res.value[best] < 1e-10
    np.testing.assert_allclose(res.x[best], X_STAR, atol=1e-6)
    # one row per start given, the kept points they were refined from, the runs
    assert res.x.shape == (2, D) and res.extra["starts"].shape == (2, D)
    assert res.extra["generations"] == 400 and res.extra["restarts"] >= 1
    # IPOP: the first run (the default population) stopped in a local minimum, the
    # populations doubled at each restart, and a larger one found the global minimum
    pops = np.array([r["popsize"] for r in res.extra["runs"]])
    polished = np.array([r["polished"] for r in res.extra["runs"]])
    np.testing.assert_array_equal(pops, np.minimum(8 * 2 ** np.arange(len(pops)), 8 * 64))
    assert polished[0] > 0.9 and np.min(polished) < 1e-10
    assert pops[np.argmin(polished)] > 8
    if bounded:
        lo, hi = problem.bounds()
        assert np.all((res.extra["starts"] >= lo) & (res.extra["starts"] <= hi))


def test_global_search_returns_by_its_time_limit():
    """With ``max_time`` the generations are unlimited and the call, refinement included,
    returns by the limit (a small slack: one generation or local iteration past it)."""
    problem = ClosedForm(ripple=1.0)  # never converges: only the time stops it
    x0 = problem.sample_starts(jax.random.PRNGKey(0), 3)
    GlobalSearch(seed=0, max_iter=5, local=LBFGSB(20)).minimize(problem, x0)  # compiled
    t0 = time.monotonic()
    res = GlobalSearch(seed=0, max_time=3.0, local=LBFGSB()).minimize(problem, x0)
    wall = time.monotonic() - t0
    assert wall <= 3.0 + 2.0
    assert res.extra["generations"] > 100 and res.extra["search_s"] <= 3.0
    # a deadline given to minimize limits it the same way
    t0 = time.monotonic()
    GlobalSearch(seed=0, local=LBFGSB()).minimize(problem, x0, deadline=t0 + 2.0)
    assert time.monotonic() - t0 <= 2.0 + 2.0


class SlowLocal(LBFGSB):
    """L-BFGS-B that takes ``delay`` seconds more per call (a local fit that compiles)."""

    def __init__(self, delay):
        super().__init__(50)
        self.delay = delay

    def minimize(self, problem, x0, **kw):
        time.sleep(self.delay)
        return super().minimize(problem, x0, **kw)


def test_refinement_gets_at_least_the_time_a_polish_took():
    """The search leaves the final refinement 10 % of the time, or 1.5 times the longest
    polish where that is more: with polishes of 2 s and a limit of 6 s, the first polish
    (the first run ends within a second) moves the search's end from 5.4 s to 3 s, so it
    ends by 5 s (a polish begun before 3 s) instead of 5.4 s or later."""
    problem = ClosedForm()
    x0 = problem.sample_starts(jax.random.PRNGKey(0), 1)
    GlobalSearch(seed=0, max_iter=5, local=LBFGSB(20)).minimize(problem, x0)  # compiled
    t0 = time.monotonic()
    res = GlobalSearch(seed=0, max_time=6.0, local=SlowLocal(2.0)).minimize(problem, x0)
    wall = time.monotonic() - t0
    assert res.extra["runs"][0]["at_s"] < 3.0
    assert res.extra["search_s"] <= 5.2
    assert wall <= 6.0 + 3.0


def test_stagnation_rule_ends_a_creeping_run_and_spares_a_descending_one():
    """A run whose best does not move ends by stagnation after ``1 + 120 + 30 D / lambda``
    generations; one whose best improves by a relative 1e-5 per window after
    ``1 + 2 (120 + 30 D / lambda)``; one improving by 1e-3 per window does not end (the
    population's values spread over 0.01, so TolFun never applies)."""
    kernel = CMAKernel(D, np.zeros(D), np.ones(D))
    window = kernel.constants(kernel.popsize0)["stagnation"]
    assert window == 2 * (120 + int(np.ceil(30 * D / kernel.popsize0)))
    rng = np.random.default_rng(0)
    # a best that does not move at all ends the run after half the window
    s = kernel.start(np.full(D, 0.5), kernel.popsize0)
    for g in range(window):
        u = kernel.ask(s, rng)
        s = kernel.tell(s, u, 1000.0 + rng.uniform(0.01, 0.02, len(u)) * (g > 0))
        if s.why is not None:
            break
    assert s.why == "stagnation" and s.generation == window // 2 + 1
    for per_window, ends in ((1e-5, True), (1e-3, False)):
        s = kernel.start(np.full(D, 0.5), kernel.popsize0)
        for g in range(window + 40):
            u = kernel.ask(s, rng)
            f = 1000.0 * (1.0 - per_window * g / window) + rng.uniform(0, 0.01, len(u))
            s = kernel.tell(s, u, f)
            if s.why is not None:
                break
        if ends:
            assert s.why == "stagnation" and s.generation == window + 1
        else:
            assert s.why is None and s.generation == window + 40


def test_stagnation_restarts_are_counted_in_the_result():
    """An objective of jitter alone (a ripple of amplitude 100 with a period of 6e-6, far
    below any step, on an offset of 1e8) keeps every run from converging; its best falls
    by at most the ripple's range (800), below 1e-4 of its value: each run ends by the
    stagnation rule (no improvement in half its window, or less than 1e-4 in all of it;
    or, by chance, on TolX), and a larger one starts."""
    problem = ClosedForm(offset=1e8, ripple=100.0)
    x0 = problem.sample_starts(jax.random.PRNGKey(1), 1)
    res = GlobalSearch(seed=1, max_iter=1200, local=LBFGSB(5)).minimize(problem, x0)
    runs = res.extra["runs"]
    whys = [r["why"] for r in runs]
    assert res.extra["stagnation_restarts"] == whys.count("stagnation") >= 3
    assert res.extra["restarts"] == len(runs) and whys[0] == "stagnation"
    windows = [2 * (120 + int(np.ceil(30 * D / r["popsize"]))) for r in runs]
    assert all(1 + w // 2 <= r["generations"] <= 1 + w
               for r, w in zip(runs, windows) if r["why"] == "stagnation")


def test_global_search_refuses_what_it_cannot_do():
    problem = ClosedForm()
    x0 = problem.sample_starts(jax.random.PRNGKey(0), 1)
    with pytest.raises(ValueError, match="`max_time`"):
        GlobalSearch(max_time=0)
    with pytest.raises(ValueError, match="`max_iter`"):
        GlobalSearch(max_iter=0)
    with pytest.raises(ValueError, match="`local`"):
        GlobalSearch(local="lm")
    with pytest.raises(ValueError, match="`mask`"):
        GlobalSearch(max_iter=2).minimize(problem, x0, mask=np.array([True] + [False] * 3))
    with pytest.raises(ValueError, match=r"`x0`'s coordinate 'x\[1\]'"):
        GlobalSearch(max_iter=2).minimize(problem, np.array([[0.0, 9.0, 0.0, 0.0]]))


@pytest.mark.slow  # ~50-120 s: an ODE model's search and a multistart to compare with; the
# search through the interface runs in the normal suite on Rastrigin's function above
def test_fit_of_an_ode_model_by_the_global_search_reaches_the_better_of_two_optima():
    """`inference.fit(ODEModel, data, method="global")`: lynx–hare's MAP objective has two
    local optima (an L-BFGS-B multistart of 8 starts stops at 126.690 or 171.194); 30
    generations of the search (unbounded coordinates, L-BFGS-B polish) reach the better one
    in both rows it returns."""
    import inference
    import models

    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    ref = inference.fit(model, data, method="lbfgs", n_starts=8, seed=0, progress=False)
    assert ref.losses[-1] > ref.loss + 40
    res = inference.fit(model, data, method="global", steps=30, n_starts=2, seed=0,
                        progress=False)
    assert res.method == "global" and len(res.losses) == 2
    np.testing.assert_allclose(res.losses, ref.loss, rtol=1e-8)
