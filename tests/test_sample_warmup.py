"""The sampler's warmup answers divergences: when the end of warmup (or the first draws)
diverges, `inference.sample` re-adapts the step size at a higher ``target_accept``, says so
in the result, and a run killed after a re-adaptation resumes to the same draws.

The posterior is the centred eight-schools model (Rubin 1981; the classic funnel on which
NUTS diverges at its default target), written as a NumPyro program whose school effects
pass through an ODE site (``y' = -y`` over ``log 2`` halves them; the likelihood doubles
them back), so it runs on the sampler's mesh machinery."""

import numpy as np
from scipy import stats
import numpyro
import numpyro.distributions as dist
import pytest

import inference
from conftest import killed_then_resumed
from inference.sampling._chains import Draws
from inference.sampling._warmup import REACH, counted_late, late_iterations, late_steps, tail_points

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
HALF = float(np.log(2.0))


def decay(t, y, p):
    return -y


def centred_eight_schools(data):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", 8):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
    sol = inference.ode("decay", decay, 0.0, HALF, theta[:, None], {}, ts=np.array([HALF]))
    with numpyro.plate("observations", 8):
        numpyro.sample("obs", dist.Normal(2.0 * sol.ys[:, 0, 0], SIGMA), obs=Y)


# the diagonal metric at 0.8: the funnel diverges late in warmup, which the response answers
RUN = dict(num_warmup=500, num_samples=300, num_chains=4, init="prior", seed=0, target_accept=0.8,
           dense_mass=False, progress=False)


def _sample(**kw):
    return inference.sample(centred_eight_schools, None, **{**RUN, **kw})


@pytest.fixture(scope="module")
def runs():
    with pytest.warns(RuntimeWarning, match="diverged after warmup"):
        plain = _sample(max_retunes=0)
    responded = _sample()
    return plain, responded


def test_late_warmup_is_numpyros_terminal_window_after_its_restart():
    # NumPyro's default schedule ends with a 50-iteration step-size window; its first 10
    # iterations restart dual averaging from 10x the step size and do not count
    assert late_iterations(500) == 40
    assert late_iterations(150) == 40
    assert late_iterations(1) == 0


# The two runs of the funnel (4 chains x 800 iterations each, ~40 s) in the slow tier; the
# rules they rest on (which warmup iterations count as late, which divergences count, how far
# the sampling mesh reaches) are checked directly by the tests below, in the normal suite.
@pytest.mark.slow
def test_divergent_warmup_is_re_adapted_and_reported(runs):
    plain, responded = runs
    p, r = plain.sample_stats.attrs, responded.sample_stats.attrs
    # the same warmup (same seed) diverged late; only the responding run re-adapted
    assert p["retunes"] == 0 and p["target_accept"] == 0.8
    assert p["mass_matrix"] == "diagonal"  # as asked
    assert "not re-adapted (max_retunes=0)" in p["divergence_response"]
    assert p["divergences"] == int(plain.sample_stats["diverging"].sum()) > 0
    assert r["retunes"] >= 1
    assert r["target_accept"] == pytest.approx(1 - 0.2 / 2 ** r["retunes"])
    assert r["target_accept_requested"] == 0.8
    assert "step size re-adapted at 0.9" in r["divergence_response"]
    # a higher target: smaller steps, higher acceptance. The divergence counts are not
    # compared: on a centred funnel they depend mostly on whether a chain sits in the neck,
    # which a higher target does not reliably prevent (the program gave 341 -> 98 at
    # 500 + 1,000 draws, and this run 43 -> 125 after a change that moved the meshes only at
    # rounding level).
    step = lambda i: float(i.sample_stats["step_size"].values[:, -1].mean())
    acc = lambda i: float(i.sample_stats["acceptance_rate"].values.mean())
    assert step(responded) < step(plain)
    assert acc(responded) > acc(plain)


@pytest.mark.slow  # a third run of the funnel; resuming is checked in the normal suite by
# test_inference_state.py::test_sample_killed_in_warmup_resumes_to_the_same_draws
def test_a_run_killed_after_re_adapting_resumes_to_the_same_draws(runs, tmp_path, monkeypatch):
    _, responded = runs
    resumed = killed_then_resumed(
        monkeypatch, lambda path: _sample(checkpoint=path), tmp_path / "run.pkl",
        lambda state: state.retunes > 0)
    for k in ("mu", "tau", "theta"):
        np.testing.assert_array_equal(resumed.posterior[k].values, responded.posterior[k].values)
    assert resumed.sample_stats.attrs["divergence_response"] == \
        responded.sample_stats.attrs["divergence_response"]


def test_late_divergences_count_only_at_step_sizes_near_the_final_one():
    # dual averaging's terminal window still tries steps well above the one it settles on;
    # a divergence there predicts nothing of the sampling phase
    C, n = 2, 50
    diverging = np.zeros((C, n), bool)
    step = np.full((C, n), 0.1)
    diverging[0, 5] = True      # before the late iterations (the window's restart)
    diverging[0, 20], step[0, 20] = True, 0.11    # near chain 0's final step size
    diverging[1, 30], step[1, 30] = True, 0.25    # 2.5x chain 1's final step size
    diverging[1, 40], step[1, 40] = True, 0.05    # smaller than it
    draws = Draws(np.zeros((C, n, 1)), diverging, np.ones((C, n), int), step,
                  *(np.zeros((C, n)),) * 3)
    late = late_steps(draws, start=450, num_warmup=500)
    assert late == ((0, 0.11), (1, 0.25), (1, 0.05))
    assert counted_late(late, np.array([0.1, 0.1])) == 2
    assert counted_late(late, np.array([0.1, 0.2])) == 3
    assert counted_late((), np.array([0.1, 0.1])) == 0


def test_the_sampling_mesh_reaches_as_far_as_the_draws_will():
    """`tail_points` extrapolates each end of each margin from warmup's draws to the
    ``1 / n_draws`` quantile the sampling phase reaches: on an exponential tail (Laplace)
    it finds that quantile; on a Gaussian one (lighter than exponential) it errs a little
    beyond it; and it stays within `REACH` (uniform: light; Cauchy: too heavy to
    extrapolate)."""
    rng = np.random.default_rng(0)
    n, n_draws = 1000, 2000
    z = np.stack([rng.laplace(0.0, 1.0, n), rng.normal(0.0, 1.0, n),
                  rng.uniform(-1.0, 1.0, n), rng.standard_cauchy(n)], axis=1)
    scale = np.array([np.sqrt(2.0), 1.0, 1.0 / np.sqrt(3.0), 1.0])
    pts = tail_points(z, scale, n_draws)
    D = z.shape[1]
    centre = z.mean(axis=0)
    up, down = np.diag(pts[:D]) - centre, centre - np.diag(pts[D:])
    laplace = stats.laplace.ppf(1.0 - 1.0 / n_draws)               # 6.91
    for r in (up[0], down[0]):
        assert abs(r / laplace - 1.0) < 0.15, r
    gauss = stats.norm.ppf(1.0 - 1.0 / n_draws)                    # 3.29
    for r in (up[1], down[1]):
        assert gauss - 0.1 < r < 4.5, r
    np.testing.assert_allclose([up[2], down[2]], REACH[0] * scale[2], rtol=1e-12)
    np.testing.assert_allclose([up[3], down[3]], REACH[1] * scale[3], rtol=1e-12)
    # the points move one coordinate each
    off = pts - centre
    assert np.count_nonzero(np.abs(off) > 1e-12) == 2 * D


def test_progress_counts_each_draw_once_after_a_restart(monkeypatch):
    # the second sampling chunk leaves the mesh: both chunks' draws become warmup and the
    # sampling phase starts again, so the bar must end at num_warmup + num_samples
    from inference.sampling import _sample, _warmup
    from inference.sampling._chains import SampleInfo, SampleState

    C, n, D = 2, 10, 3

    def chunk(run, s, info):
        k = min(n, run.total - s.iteration)
        d = Draws(np.zeros((C, k, D)), np.zeros((C, k), bool), *([np.ones((C, k))] * 5))
        return s._replace(iteration=s.iteration + k), info._replace(draws=info.draws + (d,))

    calls = []

    def left(base, s, info):
        calls.append(len(info.draws))
        return np.zeros((1, D)) if len(calls) == 2 else np.zeros((0, D))

    monkeypatch.setattr(_sample, "sampling_chunk", chunk)
    monkeypatch.setattr(_warmup, "left_mesh", left)
    monkeypatch.setattr(_warmup, "dense_diverged", lambda run, s, info: False)
    monkeypatch.setattr(_warmup, "freeze_mesh", lambda run, s, info, z, where: (s, info))
    counted = []
    run = _warmup.Run(None, 5, 5 + 30, 0, 1000, lambda s, i: None,
                      lambda n, state=None: counted.append(n), {})
    s = SampleState(**dict.fromkeys(SampleState._fields))._replace(iteration=5,
                                                                  mesh_probes=0)
    info = SampleInfo(**dict.fromkeys(SampleInfo._fields))._replace(
        draws=(), error_ratios=(), tail_draws=(), sampling_time=0.0, warmup_time=0.0,
        failures_warmup=0, failures_sampling=0)
    s, info = _sample.draw(run, s, info)
    assert s.iteration == run.total and sum(d.z.shape[1] for d in info.draws) == 30
    assert 5 + sum(counted) == run.total and -10 in counted
