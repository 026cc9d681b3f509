"""inference.sample: NUTS with replay gradients, returning ArviZ InferenceData.

Independent references: Carpenter's published Stan posterior for lynx–hare (fast test),
plain NumPyro NUTS on ``diffrax.diffeqsolve`` (slow test).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import inference
import models

from conftest import killed_then_resumed, REF_MEAN, REF_SD  # noqa: E402  (Carpenter's posterior)


def test_sample_lynx_hare_short_run(lynx, tmp_path):
    m, data = lynx
    idata = inference.sample(m, data, num_warmup=200, num_samples=200, num_chains=2,
                             seed=0, progress=False)
    idata.to_netcdf(tmp_path / "run.nc")  # every attribute is a NetCDF type
    post = idata.posterior
    assert post["theta"].shape == (2, 200, 4)
    assert post["z_init"].shape == (2, 200, 2)
    assert post["sigma"].shape == (2, 200, 2)
    for k in REF_MEAN:
        v = post[k].values
        assert np.all(np.isfinite(v))
        mean = v.reshape(-1, v.shape[-1]).mean(axis=0)
        z = (mean - REF_MEAN[k]) / REF_SD[k]
        assert np.all(np.abs(z) < 3), (k, mean, z)
        sd = v.reshape(-1, v.shape[-1]).std(axis=0)
        assert np.all((sd > 0.5 * REF_SD[k]) & (sd < 2.0 * REF_SD[k])), (k, sd)
    ss = idata.sample_stats
    for name in ("diverging", "tree_depth", "n_steps", "step_size", "energy", "lp",
                 "acceptance_rate", "error_ratio"):
        assert ss[name].shape == (2, 200), name
    assert int(ss["diverging"].sum()) == 0
    assert np.all(ss["error_ratio"].values <= 1.0)
    assert 0 < ss.attrs["max_error_ratio"] <= 1.0
    assert ss.attrs["record_failures"] == 0 and ss.attrs["solver_failures_sampling"] == -1
    assert idata.observed_data["obs"].shape == (21, 2)
    assert "MAP fit" in post.attrs["init"]
    assert post.attrs["mesh_policy"] == "warmup"
    assert post.attrs["mass_matrix"] == "dense"  # 8 parameters: the default dense metric
    print(f"\nlynx-hare 2x(200+200): warmup {post.attrs['warmup_time_s']:.1f}s, sampling "
          f"{post.attrs['sampling_time_s']:.1f}s, total {post.attrs['wall_time_s']:.1f}s, "
          f"max error ratio {ss.attrs['max_error_ratio']:.3f}")


def test_sample_checkpoint_resume(lynx, tmp_path, monkeypatch):
    """A run killed right after a checkpoint resumes to the same draws as a clean run."""
    m, data = lynx
    kw = dict(num_warmup=50, num_samples=200, num_chains=2, seed=1, progress=False,
              init=dict(m.defaults), checkpoint_every=100)
    clean = inference.sample(m, data, checkpoint=tmp_path / "clean.pkl", **kw)

    path = tmp_path / "killed.pkl"
    # 50 warmup + 100 draws: killed right after this checkpoint
    resumed = killed_then_resumed(
        monkeypatch, lambda p: inference.sample(m, data, checkpoint=p, **kw), path,
        lambda state: state.iteration == 150)
    for k in ("theta", "z_init", "sigma"):
        np.testing.assert_allclose(resumed.posterior[k].values, clean.posterior[k].values,
                                   rtol=1e-10)
    np.testing.assert_array_equal(resumed.sample_stats["n_steps"].values,
                                  clean.sample_stats["n_steps"].values)
    with pytest.raises(ValueError, match="different run"):
        inference.sample(m, data, checkpoint=path, **dict(kw, num_samples=300))
    other = models.Dataset(ts=data.ts, ys=np.asarray(data.ys) * 1.5)
    with pytest.raises(ValueError, match="different run.*'data'"):
        inference.sample(m, other, checkpoint=path, **kw)
    with pytest.raises(ValueError, match="different run.*'target_accept'"):
        inference.sample(m, data, checkpoint=path, **dict(kw, target_accept=0.9))


def test_sample_counts_solver_failures():
    """Van der Pol whose prior reaches stiff, step-hungry values of mu with a small step
    budget: solves fail in part of the prior, the sampler still works and counts them."""
    import numpyro.distributions as dist

    base = models.van_der_pol(1.0)
    m = base.replace(priors={"mu": dist.LogNormal(jnp.log(3.0), 1.5),
                             "sigma": base.priors["sigma"]})
    data = m.simulate(jax.random.PRNGKey(0), {"mu": 1.0, "sigma": 0.1}, np.linspace(0.5, 8, 16))
    idata = inference.sample(m, data, num_warmup=150, num_samples=150, num_chains=2, seed=2,
                             init="prior", rerecord="always", max_steps=100, progress=False)
    a = idata.posterior.attrs
    print(f"\nVan der Pol: solver failures warmup={a['solver_failures_warmup']}, "
          f"sampling={a['solver_failures_sampling']}")
    assert a["solver_failures_warmup"] + a["solver_failures_sampling"] > 0
    # every evaluation solved adaptively: the error ratio, measured at draws on their own
    # meshes, is what the controller accepted (<= 1), not NaN
    assert 0 < a["max_error_ratio"] <= 1.0 + 1e-6
    assert np.isfinite(idata.sample_stats["error_ratio"].values).sum() > 0
    mu = idata.posterior["mu"].values
    assert np.all(np.isfinite(mu))
    assert abs(float(mu.mean()) - 1.0) < 0.05


def test_sample_rejects_bad_arguments(lynx):
    m, data = lynx
    with pytest.raises(ValueError, match="kernel"):
        inference.sample(m, data, kernel="mala")
    with pytest.raises(ValueError, match="rerecord"):
        inference.sample(m, data, rerecord="sometimes")
    with pytest.raises(ValueError, match="num_chains"):
        inference.sample(m, data, num_chains=0)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="target_accept"):
            inference.sample(m, data, target_accept=bad)
    with pytest.raises(ValueError, match="`init` must be"):
        inference.sample(m, data, init="mode")
    with pytest.raises(ValueError, match="`rtol` must be a positive number"):
        inference.sample(m, data, rtol=-1e-6)
    for name, bad in (("num_samples", -1), ("num_chains", True), ("num_warmup", 2.5)):
        with pytest.raises(ValueError, match=f"`{name}` must be an int"):
            inference.sample(m, data, **{name: bad})
    # a MAP fit's keyword misspelt: refused at once, not after the model is traced
    with pytest.raises(ValueError, match=r"`fit_kwargs` has unknown key\(s\) \['nstarts'\]; "
                       r"inference.fit takes \['init', 'optimizer', 'steps', 'n_starts'"):
        inference.sample(m, data, fit_kwargs={"nstarts": 4})
    # a truthy string was a dense metric; a string or a float failed deep inside
    with pytest.raises(ValueError, match="`dense_mass` must be None, True or False, got 'no'"):
        inference.sample(m, data, dense_mass="no")
    with pytest.raises(ValueError, match="`frozen_tol_factor` must lie in"):
        inference.sample(m, data, frozen_tol_factor="0.1")
    with pytest.raises(ValueError, match="`seed` must be an int, got 0.5"):
        inference.sample(m, data, seed=0.5)


# ------------------------------------------------------------------------------ slow


def _numpyro_diffrax_reference(m, data, num_warmup, num_samples, seed=0):
    """Plain NumPyro NUTS on diffrax.diffeqsolve (Tsit5, PID rtol 1e-6 atol 1e-8, default
    RecursiveCheckpointAdjoint), the same priors and likelihood."""
    import time

    from numpyro.infer import MCMC, NUTS, init_to_value

    program = inference.diffrax_numpyro_model(m, data)

    mcmc = MCMC(NUTS(program, init_strategy=init_to_value(values=dict(m.defaults))),
                num_warmup=num_warmup, num_samples=num_samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed))
    return mcmc, time.perf_counter() - t0


@pytest.mark.slow
def test_sample_matches_numpyro_on_diffrax(lynx):
    import arviz as az

    m, data = lynx
    idata = inference.sample(m, data, num_warmup=500, num_samples=1000, num_chains=2, seed=0,
                             progress=False)
    mcmc, t_ref = _numpyro_diffrax_reference(m, data, 500, 1000)
    ref = az.from_numpyro(mcmc)
    s_gs = az.summary(idata, var_names=list(m.priors), round_to="none")
    s_ref = az.summary(ref, var_names=list(m.priors), round_to="none")
    print("\ngradsolve:\n", s_gs, "\nnumpyro+diffrax:\n", s_ref)
    ess_gs = az.ess(idata, var_names=list(m.priors)).to_array().min().item()
    ess_ref = az.ess(ref, var_names=list(m.priors)).to_array().min().item()
    t_gs = idata.posterior.attrs["wall_time_s"]
    print(f"min bulk ESS/s: gradsolve {ess_gs / t_gs:.2f} ({t_gs:.0f}s), numpyro+diffrax "
          f"{ess_ref / t_ref:.2f} ({t_ref:.0f}s)")
    for row in s_gs.index:
        a, b = s_gs.loc[row], s_ref.loc[row]
        mcse = np.hypot(a["mcse_mean"], b["mcse_mean"])
        assert abs(a["mean"] - b["mean"]) < 4 * mcse + 1e-12, (row, a["mean"], b["mean"], mcse)
        assert abs(a["sd"] / b["sd"] - 1) < 0.2, (row, a["sd"], b["sd"])
        assert a["r_hat"] < 1.01, (row, a["r_hat"])
    assert int(idata.sample_stats["diverging"].sum()) == 0
    assert idata.sample_stats.attrs["max_error_ratio"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_no_chain_is_stuck_over_seeds(lynx, seed):
    """Plain NUTS from random starts gets stuck in ~8 % of chains on this
    posterior (second mode, degenerate region). MAP-started chains must all mix."""
    import arviz as az

    m, data = lynx
    idata = inference.sample(m, data, num_warmup=500, num_samples=1000, num_chains=4,
                             seed=seed, progress=False)
    rhat = az.rhat(idata)
    worst = max(float(np.max(rhat[k].values)) for k in REF_MEAN)
    assert worst < 1.01, f"seed {seed}: R-hat {worst:.4f}"
    post = idata.posterior
    for k in REF_MEAN:  # every chain in the bulk of Carpenter's posterior
        chain_means = post[k].mean("draw").values  # (chain, ...)
        assert np.all(np.abs(chain_means - REF_MEAN[k]) < 3 * REF_SD[k]), (seed, k, chain_means)


def test_meshes_have_room_to_grow_only_where_padding_is_free(lynx):
    """On the compiled kernel each trajectory replays its own steps, so the sampler gives
    its meshes room for 4x the steps (the sampling mesh, merged and recorded tighter than
    warmup's, then fits the compiled loop); on the XLA drivers every slot is a step."""
    import gradsolve as gs
    from conftest import kernel_builds
    from inference.sampling._chains import capacity
    from inference.problem._problem import Problem

    m, data = lynx
    prob = Problem(m, data)
    u = jnp.asarray(prob.space.to_unconstrained(m.sample_prior(jax.random.PRNGKey(0))))
    mesh = prob.record(u, 0.1).to_host()
    with gs.use_compiled_kernel(False):
        assert not prob.ragged_replay(u, mesh)
    if kernel_builds():
        assert prob.ragged_replay(u, mesh)
    need = int(mesh.n_steps)
    assert capacity(need, ragged=True) >= 4 * need
    assert need <= capacity(need) <= 1.15 * need + 24
