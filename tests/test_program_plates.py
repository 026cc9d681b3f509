"""A program's plates are kept: which latent sites index the trajectories of an ode site's
ensemble (checked against programs whose structure is written out here)."""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

import gradsolve as gs
import inference
import models
from inference.problem._program import problem_for


def decay(t, y, p):
    return -p["k"] * y


def program(data):
    ts, obs = data
    k_pop = numpyro.sample("k_pop", dist.LogNormal(0.0, 0.5))
    with numpyro.plate("arms", 2):
        shift = numpyro.sample("shift", dist.Normal(0.0, 0.1))  # not per trajectory
    with numpyro.plate("units", 3):
        eta = numpyro.sample("eta", dist.Normal(0.0, 0.3))
    k = k_pop * jnp.exp(eta) * (1.0 + 0.0 * jnp.sum(shift))
    sol = inference.ode("decay", decay, 0.0, 4.0, jnp.ones((3, 1)), {"k": k}, ts=ts,
                        solver=gs.Tsit5())
    numpyro.sample("obs", dist.Normal(sol.ys[..., 0], 0.05), obs=obs)


def test_plates_of_a_users_program():
    ts = jnp.linspace(0.5, 4.0, 5)
    obs = jnp.exp(-jnp.outer(jnp.array([0.5, 0.8, 1.1]), ts))
    pb = problem_for(program, (ts, obs), rtol=1e-6, atol=1e-8, max_steps=None)
    assert pb.plates["eta"] == (("units", 3),)
    assert pb.plates["shift"] == (("arms", 2),)
    assert pb.plates["k_pop"] == ()
    assert pb.sizes["decay"] == 3
    assert pb.members("decay") == {"eta": "units"}
    with pytest.raises(ValueError, match="no ode site 'nope'"):
        pb.members("nope")


def test_a_population_programs_subjects():
    model = models.theophylline()
    data = models.load_dataset("theophylline")
    pb = problem_for(model, data, rtol=1e-6, atol=1e-8, max_steps=None)
    (site,) = pb.sites
    assert pb.sizes[site] == data.n_subjects
    members = pb.members(site)
    # the random effects are the only per-subject latent sites of this model
    assert set(members) == {"eta"} and members["eta"] == "subjects"
    assert dict(pb.plates["eta"])["subjects"] == data.n_subjects


def test_sampler_defaults_follow_the_programs_structure():
    """A program with latent sites in a plate keeps the population defaults (re-record at
    every proposal, target 0.9, 0.97 with a dense metric); one whose parameters are shared by every trajectory
    (an ODE model written as a program, an ensemble of conditions) gets an ODE model's.
    The defaults are NUTS's, chosen by the problem's `hierarchical`."""
    from inference.problem._problem import Problem
    from inference.sampling._samplers import NUTS

    def nuts(problem, dense_mass=None):
        o = NUTS().settle(problem, dict(num_chains=None, init=None, rerecord=None,
                                        dense_mass=dense_mass, target_accept=None,
                                        num_warmup=500))
        return o["rerecord"], o["target_accept"], o["init"]

    ts = jnp.linspace(0.5, 4.0, 5)
    obs = jnp.exp(-jnp.outer(jnp.array([0.5, 0.8, 1.1]), ts))
    hier = problem_for(program, (ts, obs), rtol=1e-6, atol=1e-8, max_steps=None)
    assert hier.hierarchical
    assert nuts(hier, False) == ("always", 0.9, "advi")
    assert nuts(hier, True) == ("always", 0.97, "advi")
    assert nuts(hier) == nuts(hier, True)      # 1 parameter: dense by default

    def shared(data):
        ts, obs = data
        k = numpyro.sample("k", dist.LogNormal(0.0, 0.5))
        sol = inference.ode("decay", decay, 0.0, 4.0, jnp.ones((3, 1)),
                            {"k": jnp.full(3, k)}, ts=ts, solver=gs.Tsit5())
        numpyro.sample("obs", dist.Normal(sol.ys[..., 0], 0.05), obs=obs)

    flat = problem_for(shared, (ts, obs), rtol=1e-6, atol=1e-8, max_steps=None)
    assert not flat.hierarchical

    def expanded(data):   # the same random effects as NumPyro's docs write them: no plate
        ts, obs = data
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        sol = inference.ode("decay", decay, 0.0, 4.0, jnp.ones((3, 1)),
                            {"k": jnp.exp(mu + 0.3 * eta)}, ts=ts, solver=gs.Tsit5())
        numpyro.sample("obs", dist.Normal(sol.ys[..., 0], 0.05).to_event(2), obs=obs)

    exp = problem_for(expanded, (ts, obs), rtol=1e-6, atol=1e-8, max_steps=None)
    assert exp.hierarchical and exp.per_trajectory() == ["eta"]
    assert nuts(exp)[::2] == ("always", "advi")
    ode = Problem(models.lynx_hare(), models.load_dataset("lynx_hare"))
    assert nuts(flat, True) == nuts(flat, False) == nuts(ode) == ("warmup", 0.8, "map")
    lynx = problem_for(inference.numpyro_model(models.lynx_hare()),
                       models.load_dataset("lynx_hare"), rtol=1e-6, atol=1e-8,
                       max_steps=None)
    assert not lynx.hierarchical and nuts(lynx)[0] == "warmup"
    theo = problem_for(models.theophylline(), models.load_dataset("theophylline"),
                       rtol=1e-6, atol=1e-8, max_steps=None)
    assert theo.hierarchical and nuts(theo)[0] == "always"



def test_a_small_hierarchy_gets_a_dense_metric_at_a_higher_target():
    """NUTS's settled options: theophylline's 30 parameters are within the dense
    bound at the default warmup (dense, 0.97) and past it at 100 warmup iterations
    (diagonal, 0.9); a target or metric the user gives is kept. With no sampler named
    (ChEES), the same metric rule and start, and BlackJAX's ChEES target."""
    import inspect

    from inference.sampling._sample import _settled

    base = {k: p.default for k, p in inspect.signature(inference.sample).parameters.items()
            if p.default is not inspect.Parameter.empty}
    model, data = models.theophylline(), models.load_dataset("theophylline")
    default = _settled(model, data, dict(base))[2]
    from blackjax.adaptation.chees_adaptation import OPTIMAL_TARGET_ACCEPTANCE_RATE
    assert (default["kernel"], default["dense_mass"], default["target_accept"],
            default["init"]) == ("chees", True, OPTIMAL_TARGET_ACCEPTANCE_RATE, "advi")
    settle = lambda **kw: _settled(model, data, {**base, "sampler": "nuts", **kw})[2]  # noqa: E731
    o = settle()
    assert (o["dense_mass"], o["target_accept"], o["init"]) == (True, 0.97, "advi")
    assert settle(init="map")["init"] == "map"
    o = settle(num_warmup=100)
    assert (o["dense_mass"], o["target_accept"]) == (False, 0.9)
    o = settle(dense_mass=False)
    assert (o["dense_mass"], o["target_accept"]) == (False, 0.9)
    o = settle(target_accept=0.85)
    assert (o["dense_mass"], o["target_accept"]) == (True, 0.85)
