"""Samplers as objects (`inference.sampling`): NUTS and HMC under their old names, and
BlackJAX's ChEES-HMC, whose chains step in lockstep on one ensemble mesh.

Independent references: Carpenter's published Stan posterior for lynx–hare (the normal
suite); NUTS on the same model, run beside it (the slow tier: eight schools non-centred,
lynx–hare, the theophylline population): means within 4 Monte Carlo standard errors,
standard deviations within 10 %, R-hat <= 1.01.
"""

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import inference
import models
from conftest import REF_MEAN, REF_SD, killed_then_resumed
from inference.problem._problem import Problem
from inference.sampling import HMC, NUTS, ChEES
from inference.sampling._ensemble import EnsembleKernel
from inference.sampling._samplers import sampler_of
from inference.sampling._warmup import windows


def test_kernel_strings_and_names_map_to_the_sampler_objects(lynx):
    assert sampler_of(None, None) == NUTS()
    assert sampler_of(None, "nuts") == NUTS() and sampler_of(None, "hmc") == HMC()
    assert sampler_of("chees", None) == ChEES()
    custom = ChEES(num_chains=4)
    assert sampler_of(custom, None) is custom
    m, data = lynx
    # refused before any fit or trace
    with pytest.raises(ValueError, match="either `sampler` or `kernel`"):
        inference.sample(m, data, kernel="nuts", sampler=ChEES())
    with pytest.raises(ValueError, match="`sampler` must be one of"):
        inference.sample(m, data, sampler="mala")
    with pytest.raises(ValueError, match="`kernel` must be 'nuts' or 'hmc'"):
        inference.sample(m, data, kernel="chees")


def test_kernel_string_runs_what_the_object_runs(lynx):
    """``kernel="nuts"`` is ``sampler=NUTS(...)``: the same draws, the same attributes
    (a setting of the object, ``max_tree_depth``, as `sample`'s keyword)."""
    m, data = lynx
    kw = dict(num_warmup=20, num_samples=20, seed=3, progress=False, init=dict(m.defaults))
    a = inference.sample(m, data, kernel="nuts", max_tree_depth=3, **kw)
    b = inference.sample(m, data, sampler=NUTS(max_tree_depth=3), **kw)
    np.testing.assert_array_equal(a.posterior["theta"].values, b.posterior["theta"].values)
    assert a.posterior.attrs["kernel"] == b.posterior.attrs["kernel"] == "nuts"
    assert a.posterior["theta"].shape == (2, 20, 4)          # NUTS's 2 chains
    assert b.sample_stats["n_steps"].values.max() <= 2 ** 3 - 1


@pytest.fixture(scope="module")
def chees_lynx(lynx):
    """ChEES on lynx–hare, 8 chains x (150 + 150), with every `Problem.record` call's
    points noted, and the kernels that ran."""
    m, data = lynx
    calls, kernels = [], []
    record, run = Problem.record, EnsembleKernel.run

    def noted(self, u, *a, **k):
        calls.append(np.shape(u))
        return record(self, u, *a, **k)

    def ran(self, *a, **k):
        kernels.append(self)
        return run(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Problem, "record", noted)
        mp.setattr(EnsembleKernel, "run", ran)
        idata = inference.sample(m, data, sampler=ChEES(num_chains=8), num_warmup=150,
                                 num_samples=150, seed=0, progress=False,
                                 init=dict(m.defaults))
    return idata, calls, kernels


def test_chees_chains_share_one_mesh_and_step_in_lockstep(chees_lynx):
    idata, calls, _ = chees_lynx
    C, D = 8, 8
    # one record for all C chains at the start and at every re-record between warmup
    # windows; then the frozen sampling mesh, recorded once at the chains' mean (and,
    # where it does not hold, merged with one record of every point it missed)
    per_chain = [s for s in calls if s == (C, D)]
    assert len(per_chain) == len(windows(150)), calls
    assert all(s == (D,) or s[0] >= C for s in calls), calls   # never chain by chain
    a = idata.posterior.attrs
    assert a["kernel"] == "chees" and a["mesh_policy"] == "warmup"
    assert a["n_records"] >= len(per_chain)
    # lockstep: every chain took the same number of leapfrog steps at every draw, so
    # each step was one replay of the whole ensemble
    n = idata.sample_stats["n_steps"].values
    assert n.shape == (C, 150) and np.all(n == n[:1])
    assert np.all(idata.sample_stats["error_ratio"].values <= 1.0)


def test_chees_loop_compiles_once(chees_lynx):
    """The whitening re-estimated between warmup windows keeps the loop's compiled
    program: the adaptation state it hands back has the dtypes and strong types of the
    one the loop was compiled for (a weakly typed counter compiled it again, seconds a
    run)."""
    (kernel,) = set(chees_lynx[2])
    assert kernel.num_warmup == 150 and not kernel.retune
    assert kernel._loop._cache_size() == 1


def test_chees_lynx_hare_matches_stans_posterior(chees_lynx):
    idata, _, _ = chees_lynx
    post = idata.posterior
    for k in REF_MEAN:
        v = post[k].values.reshape(-1, post[k].shape[-1])
        z = (v.mean(axis=0) - REF_MEAN[k]) / REF_SD[k]
        assert np.all(np.abs(z) < 3), (k, z)
        sd = v.std(axis=0)
        assert np.all((sd > 0.7 * REF_SD[k]) & (sd < 1.4 * REF_SD[k])), (k, sd)
    assert int(idata.sample_stats["diverging"].sum()) == 0


def test_chees_checkpoint_resume(lynx, tmp_path, monkeypatch):
    """A ChEES run killed right after a checkpoint resumes to the same draws."""
    m, data = lynx
    kw = dict(sampler=ChEES(num_chains=4), num_warmup=40, num_samples=200, seed=1,
              progress=False, init=dict(m.defaults), checkpoint_every=100)
    clean = inference.sample(m, data, checkpoint=tmp_path / "clean.pkl", **kw)
    resumed = killed_then_resumed(
        monkeypatch, lambda p: inference.sample(m, data, checkpoint=p, **kw),
        tmp_path / "killed.pkl", lambda state: state.iteration == 140)   # 40 warmup + 100 draws
    np.testing.assert_allclose(resumed.posterior["theta"].values,
                               clean.posterior["theta"].values, rtol=1e-10)
    with pytest.raises(ValueError, match="different run"):
        inference.sample(m, data, checkpoint=tmp_path / "killed.pkl",
                         **dict(kw, sampler=ChEES(num_chains=4, learning_rate=0.05)))


# ------------------------------------------------------------------------------ slow

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
HALF = float(np.log(2.0))


def _decay(t, y, p):
    return -y


def eight_schools(data):
    """Non-centred eight schools (Rubin 1981), the school effects through an ODE site
    (``y' = -y`` over ``log 2`` halves them; the likelihood doubles them back)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", 8):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
    theta = mu + tau * eta
    sol = inference.ode("decay", _decay, 0.0, HALF, theta[:, None], {}, ts=np.array([HALF]))
    with numpyro.plate("observations", 8):
        numpyro.sample("obs", dist.Normal(2.0 * sol.ys[:, 0, 0], SIGMA), obs=Y)


def _agree(a, b):
    """ChEES's posterior ``a`` against NUTS's ``b``: every scalar's mean within 4 Monte
    Carlo standard errors of the difference, its sd within 10 %, both R-hats <= 1.01."""
    import arviz as az

    sa, sb = az.summary(a, round_to="none"), az.summary(b, round_to="none")
    assert sa.r_hat.max() <= 1.01 and sb.r_hat.max() <= 1.01, (sa.r_hat.max(), sb.r_hat.max())
    se = np.hypot(sa.mcse_mean, sb.mcse_mean)
    z = (sa["mean"] - sb["mean"]) / se
    assert np.all(np.abs(z) < 4), z[np.abs(z) >= 4]
    ratio = sa["sd"] / sb["sd"]
    assert np.all(np.abs(ratio - 1) < 0.10), ratio[np.abs(ratio - 1) >= 0.10]


CASES = {
    "eight_schools": lambda: (eight_schools, None, 4),
    "lynx_hare": lambda: (models.lynx_hare(), models.load_dataset("lynx_hare"), 4),
    "theophylline": lambda: (models.theophylline(), models.load_dataset("theophylline"), 4),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_chees_posterior_matches_nuts(case):
    m, data, nuts_chains = CASES[case]()
    kw = dict(num_warmup=500, num_samples=1000, seed=0, progress=False)
    chees = inference.sample(m, data, sampler=ChEES(num_chains=16), **kw)
    nuts = inference.sample(m, data, num_chains=nuts_chains, **kw)
    assert int(chees.sample_stats["diverging"].sum()) == 0
    _agree(chees, nuts)


def _settled_options(model, data, **kw):
    """`sample`'s options for a call with ``kw``, its defaults settled as the call would
    settle them (the sampler chosen, its chains and targets), before any fit or trace."""
    import inspect

    from inference.sampling._sample import _checked_sample_args, _settled

    o = {k: p.default for k, p in inspect.signature(inference.sample).parameters.items()
         if k not in ("model", "data")}
    o.update(kw)
    _checked_sample_args(o)
    return _settled(model, data, o)[2]


def test_default_sampler_is_chees_and_nuts_where_asked(lynx):
    """No sampler named: ChEES on its 16 chains x 250 draws (Stan's 4,000 draws in all) for
    lynx–hare and for a random-effects hierarchy, settled exactly as ``sampler="chees"``
    (the hierarchy keeps its own mesh policy and start); NUTS where the call sets NUTS's
    settings (chains, tree depth, chain method), settled exactly as ``sampler="nuts"``
    with those settings, with NumPyro's 1,000 draws a chain."""
    m, data = lynx
    keys = ("kernel", "num_chains", "num_samples", "target_accept", "dense_mass",
            "rerecord", "init", "max_tree_depth", "devices")
    default = _settled_options(m, data)
    chees = _settled_options(m, data, sampler="chees")
    assert {k: default[k] for k in keys} == {k: chees[k] for k in keys}
    assert default["kernel"] == "chees" and default["num_chains"] == 16
    assert default["num_chains"] * default["num_samples"] == 4000
    assert _settled_options(m, data, sampler="chees", num_samples=7)["num_samples"] == 7
    per_chain = {k: np.stack([np.asarray(v)] * 2) for k, v in m.defaults.items()}
    for kw in (dict(num_chains=2), dict(max_tree_depth=5), dict(chain_method="vectorized"),
               dict(init=per_chain)):
        got = _settled_options(m, data, **kw)
        nuts = _settled_options(m, data, kernel="nuts", **kw)
        assert {k: got[k] for k in keys} == {k: nuts[k] for k in keys}, kw
        assert got["kernel"] == "nuts" and got["num_samples"] == 1000
    theo, tdata = models.theophylline(), models.load_dataset("theophylline")
    got = _settled_options(theo, tdata)
    assert {k: got[k] for k in keys} == {
        k: v for k, v in _settled_options(theo, tdata, sampler="chees").items() if k in keys}
    assert got["kernel"] == "chees" and got["rerecord"] == "always" and got["init"] == "advi"
