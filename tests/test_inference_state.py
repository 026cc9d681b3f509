"""The inference architecture: one mesh policy, fits as explicit state, the model interface.

Independent references: hand-computed policy decisions; the closed-form solution of
exponential decay with scipy.stats densities; plain NumPyro's ``log_density``; an
uninterrupted run for checkpoint resumption.
"""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
import pytest
from scipy import stats

import gradsolve as gs
import inference
import models
from conftest import killed_then_resumed
from inference import MeshPolicy


# ------------------------------------------------------------------------------ the policy


def test_mesh_policy_decisions_by_hand():
    p = MeshPolicy(drift_tol=0.1, error_ratio_max=1.0, record_tol_factor=0.5)
    alive = np.array([True, True, True, True, False])
    drift = np.array([0.05, 0.2, 0.0, 0.0, 9.0])
    err = np.array([0.9, 0.1, 1.5, np.nan, 9.0])
    # after a step: drift past 0.1 (row 1), error ratio past 1 (row 2) or not a number
    # (row 3); dead rows never
    np.testing.assert_array_equal(p.rerecord_after(alive, drift, err),
                                  [False, True, True, True, False])
    # redo now: beyond 4x the bound or a non-finite loss
    loss = np.array([1.0, np.inf, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(p.redo(alive, loss, np.array([4.1, 0.0, 3.9, 0.0, 9.0])),
                                  [True, True, False, False, False])
    assert not MeshPolicy(rerecord="never").redo(alive, loss, err).any()
    np.testing.assert_array_equal(MeshPolicy(rerecord="always").rerecord_after(
        alive, np.zeros(5), np.zeros(5)), alive)
    # urgency = max(drift / drift_tol, err / error_ratio_max); the padding takes the
    # most urgent others above 0.25
    urg = p.urgency(np.array([0.01, 0.05, 0.02, 0.0]), np.array([0.1, 0.0, 0.9, 0.3]))
    np.testing.assert_allclose(urg, [0.1, 0.5, 0.9, 0.3])
    fill = p.fill(np.ones(4, bool), np.array([False, False, False, True]), urg)
    np.testing.assert_array_equal(fill, [2, 1])
    # drift is relative, per row, largest coordinate
    x, x0 = np.array([[1.0, 2.2], [0.5, 0.5]]), np.array([[1.0, 2.0], [1.0, 0.5]])
    np.testing.assert_allclose(MeshPolicy.drift(x, x0), [0.1, 0.5])
    # error ratios are reported in the requested tolerances' units
    assert p.error_ratio(1.2) == pytest.approx(0.6)
    assert p.settled(0.009, 1.0) and not p.settled(0.011, 0.5) and not p.settled(0.0, 1.01)
    assert p.holds_for_all(np.array([0.1, 0.5])) and not p.holds_for_all(np.array([0.51]))
    with pytest.raises(ValueError, match="`rerecord` must be 'auto', 'always' or 'never'"):
        MeshPolicy.checked("fit", "warmup")
    with pytest.raises(ValueError, match="`drift_tol` must be a positive number"):
        MeshPolicy.checked("fit", "auto", drift_tol=0.0)


# ------------------------------------------------------------------------------ the interface


class Decay:
    """A user's model that is NOT a models.ODEModel: dy/dt = -k y, y(0) = 2, Normal noise.

    It provides exactly what inference.InferenceModel lists."""

    name = "decay_by_hand"
    priors = {"k": dist.LogNormal(0.0, 0.5), "sigma": dist.HalfNormal(1.0)}
    defaults = {"k": jnp.asarray(1.0), "sigma": jnp.asarray(0.5)}
    t0 = 0.0
    observed = (0,)
    observed_names = ("y",)
    solver = gs.Tsit5()

    @staticmethod
    def vector_field(t, y, p):
        return -p["k"] * y

    def check_params(self, params):
        shape = np.shape(params["k"])
        return shape[0] if shape else None

    def initial_state(self, params):
        n = self.check_params(params)
        return jnp.full((() if n is None else (n,)) + (1,), 2.0)

    def sample_prior(self, key, n=None):
        k1, k2 = jax.random.split(key)
        shape = () if n is None else (n,)
        return {"k": self.priors["k"].sample(k1, shape),
                "sigma": self.priors["sigma"].sample(k2, shape)}

    def log_prior(self, params):
        return sum(self.priors[k].log_prob(params[k]) for k in self.priors)

    def noise(self, params, y_pred):
        return dist.Normal(y_pred, params["sigma"]).to_event(2)

    def observe(self, params, ts, ys):
        return ys

    def observations(self, params, y_pred):
        return self.noise(params, y_pred)

    def log_likelihood_from_prediction(self, params, y_pred, ys):
        if self.check_params(params) is None:
            return self.noise(params, y_pred).log_prob(ys)
        return jax.vmap(lambda p, y: self.noise(p, y).log_prob(ys))(params, y_pred)


TS = np.linspace(0.25, 3.0, 12)
YS = (2.0 * np.exp(-0.8 * TS) + 0.03 * np.cos(7 * TS))[:, None]


def _closed_form_log_posterior(k, s):
    pred = 2.0 * np.exp(-k * TS)
    return (stats.lognorm(0.5).logpdf(k) + stats.halfnorm.logpdf(s)
            + stats.norm(pred, s).logpdf(YS[:, 0]).sum())


def test_a_user_model_meets_inference_through_the_interface():
    m, data = Decay(), models.Dataset(ts=TS, ys=YS)
    assert isinstance(m, inference.InferenceModel)
    assert isinstance(models.lynx_hare(), inference.InferenceModel)
    p = {"k": jnp.asarray(0.7), "sigma": jnp.asarray(0.2)}
    lp = float(jax.jit(lambda q: inference.log_density(m, data, q, rtol=1e-10,
                                                       atol=1e-12))(p))
    assert abs(lp - _closed_form_log_posterior(0.7, 0.2)) < 1e-7 * abs(lp)
    # the NumPyro program evaluates the same posterior, by plain NumPyro
    from numpyro.infer.util import log_density as np_log_density

    prog = inference.numpyro_model(m, data, rtol=1e-10, atol=1e-12)
    assert abs(float(np_log_density(prog, (), {}, p)[0]) - lp) < 1e-9
    with pytest.raises(ValueError, match="InferenceModel"):
        inference.log_density(object(), data, p)


def test_fit_losses_are_the_log_posterior_of_the_closed_form():
    """FitResult.losses (a fresh adaptive mesh at the final point) equal minus the closed
    form's log posterior there, and the fit's optimum is SciPy's."""
    from scipy import optimize

    m, data = Decay(), models.Dataset(ts=TS, ys=YS)
    res = inference.fit(m, data, n_starts=4, steps=800, optimizer=optax.adam(3e-2),
                        progress=False, rtol=1e-8, atol=1e-10)
    k, s = float(res.params["k"]), float(res.params["sigma"])
    assert abs(res.loss + _closed_form_log_posterior(k, s)) < 1e-6
    ref = optimize.minimize(lambda v: -_closed_form_log_posterior(*v), [0.5, 0.1],
                            method="Nelder-Mead",
                            options=dict(xatol=1e-10, fatol=1e-12, maxiter=4000)).x
    np.testing.assert_allclose([k, s], ref, rtol=1e-3)


# ------------------------------------------------------------------------------ state


def test_fit_checkpoint_is_the_state_and_resumes_a_pending_rerecord(tmp_path):
    """With rerecord='always' every step leaves a re-record pending: a fit cut after 5
    steps and resumed to 10 makes it first, and ends bit for bit where an uninterrupted
    10-step fit ends."""
    m, data = Decay(), models.Dataset(ts=TS, ys=YS)
    kw = dict(n_starts=3, seed=2, rerecord="always", progress=False,
              optimizer=optax.adam(5e-2))
    clean = inference.fit(m, data, steps=10, **kw)
    path = tmp_path / "cut.pkl"
    inference.fit(m, data, steps=5, checkpoint=path, **kw)
    with open(path, "rb") as fh:
        state = pickle.load(fh).state
    assert isinstance(state, inference.FitState)
    assert state.step == 5 and len(state.history) == 5 and state.pending.all()
    resumed = inference.fit(m, data, steps=10, checkpoint=path, **kw)
    for k in clean.all_params:
        np.testing.assert_array_equal(resumed.all_params[k], clean.all_params[k])
    np.testing.assert_array_equal(resumed.loss_history, clean.loss_history)
    # the first record, one before each of steps 2..10, the final one
    assert resumed.n_records == clean.n_records == 11


def test_sample_killed_in_warmup_resumes_to_the_same_draws(tmp_path, monkeypatch):
    """The sampler's checkpoint is its state: killed right after the first warmup window
    (its per-chain meshes just re-recorded), a resumed run gives the uninterrupted draws."""
    m, data = Decay(), models.Dataset(ts=TS, ys=YS)
    kw = dict(num_warmup=30, num_samples=60, num_chains=2, seed=4, progress=False,
              init={"k": jnp.asarray(0.8), "sigma": jnp.asarray(0.1)})
    clean = inference.sample(m, data, **kw)

    def first_window_done(state):
        if state.iteration != 10:
            return False
        assert isinstance(state, inference.SampleState) and state.window == 1
        return True

    resumed = killed_then_resumed(
        monkeypatch, lambda path: inference.sample(m, data, checkpoint=path, **kw),
        tmp_path / "warm.pkl", first_window_done)
    for k in ("k", "sigma"):
        np.testing.assert_array_equal(resumed.posterior[k].values, clean.posterior[k].values)
    np.testing.assert_array_equal(resumed.sample_stats["n_steps"].values,
                                  clean.sample_stats["n_steps"].values)


def test_a_checkpoint_of_the_earlier_format_is_refused_naming_the_file(tmp_path, monkeypatch):
    """A checkpoint written before the sampler's state and report were separated (one
    24-field state) is refused with an error naming the file and what to do."""
    from collections import namedtuple

    import inference.sampling._chains as chains_module
    from inference._checkpoint import Checkpoint

    fields = ("chains mesh capacity solve_max_steps iteration window draws u0 init init_fit "
              "n_records record_failures failures_warmup failures_sampling warmup_time "
              "sampling_time sampling_mesh target_accept sampling_tol_factor late_divergences "
              "adaptations mesh_probes late_steps ragged").split()
    Old = namedtuple("SampleState", fields)
    path = tmp_path / "old.pkl"
    with monkeypatch.context() as mp:  # pickled under the name the earlier class had
        mp.setattr(Old, "__module__", "inference.sampling._chains")
        mp.setattr(chains_module, "SampleState", Old)
        with open(path, "wb") as fh:
            pickle.dump(Checkpoint({"version": 3}, Old(*range(len(fields)))), fh)
    m, data = Decay(), models.Dataset(ts=TS, ys=YS)
    with pytest.raises(ValueError, match=r"old\.pkl.*older format.*remove it"):
        inference.sample(m, data, num_warmup=10, num_samples=10, checkpoint=path,
                         init={"k": jnp.asarray(0.8), "sigma": jnp.asarray(0.1)})


def test_sample_a_user_model_against_quadrature():
    """NUTS on a model that is not an ODEModel: posterior means and sds of (k, sigma)
    match a 2-D quadrature of the closed-form posterior, within Monte Carlo error."""
    import arviz as az

    m, data = Decay(), models.Dataset(ts=TS, ys=YS)
    idata = inference.sample(m, data, num_warmup=300, num_samples=1000, num_chains=2, seed=0,
                             init="prior", progress=False)
    k = np.linspace(0.6, 1.0, 401)
    s = np.linspace(0.005, 0.15, 400)
    K, S = np.meshgrid(k, s, indexing="ij")
    pred = 2.0 * np.exp(-K[..., None] * TS)
    logp = (stats.lognorm(0.5).logpdf(K) + stats.halfnorm.logpdf(S)
            + stats.norm(pred, S[..., None]).logpdf(YS[:, 0]).sum(-1))
    w = np.exp(logp - logp.max())
    w /= w.sum()
    summary = az.summary(idata, var_names=["k", "sigma"], round_to="none")
    for name, grid in (("k", K), ("sigma", S)):
        mean = float(np.sum(w * grid))
        sd = float(np.sqrt(np.sum(w * (grid - mean) ** 2)))
        row = summary.loc[name]
        assert abs(row["mean"] - mean) < 4 * row["mcse_mean"] + 1e-12, (name, row, mean)
        assert abs(row["sd"] / sd - 1) < 0.15, (name, row["sd"], sd)
    assert int(idata.sample_stats["diverging"].sum()) == 0


def test_inference_imports_have_no_cycle_and_generic_methods_never_name_the_importer():
    """tools/walks.py's import graph of inference/, from the source: no import cycle
    between modules or folders, no private name imported from another folder, and the
    folders of generic methods (optimize/, sampling/, population/, profiles/) never import
    the PEtab importer (a PEtab problem reaches them through ``problem_of``)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "walks.py"
    spec = importlib.util.spec_from_file_location("walks", path)
    walks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walks)
    g = walks.imports()
    assert g["cycles"] == [] and g["folder_cycles"] == []
    assert g["private"] == []
    assert g["importer"] == []
    for generic in walks.GENERIC:
        assert "petab" not in g["folders"].get(generic, set()), generic
    # the registration the generic methods rely on: a PEtab problem is a known kind
    from inference.problem._program import _KINDS
    from inference.petab._problem import is_petab

    assert any(is_kind is is_petab for is_kind, _ in _KINDS)
