"""`inference.sample` with its chains split over CPU devices (``chain_method="parallel"``)
gives the draws of the same chains vectorised on one device, up to rounding (XLA sums a
matrix product in another order at another batch size, and NUTS amplifies such rounding
over long runs of long trees); run in a subprocess with two host devices, which JAX must be
given before it starts."""

import os
import subprocess
import sys

import pytest

import inference
import models

CODE = r"""
import jax, numpy as np
jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_enable_x64", True)
import inference, models
from inference.sampling import _sample
assert len(jax.devices()) == 2
# a whole run (lynx-hare: short trees, the chains stay within rounding of each other)
kw = dict(num_warmup=150, num_samples=100, num_chains=2, seed=3, progress=False)
model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
a = inference.sample(model, data, chain_method="vectorized", **kw)
b = inference.sample(model, data, chain_method="auto", **kw)
assert a.posterior.attrs["chain_method"] == "vectorized"
assert b.posterior.attrs["chain_method"] == "parallel", b.posterior.attrs["chain_method"]
assert b.posterior.attrs["chain_devices"] == 2
for k in a.posterior.data_vars:
    np.testing.assert_allclose(b.posterior[k].values, a.posterior[k].values, rtol=1e-6,
                               atol=1e-9, err_msg=k)
np.testing.assert_array_equal(b.sample_stats["n_steps"].values, a.sample_stats["n_steps"].values)
# a population program's chains, iteration by iteration: NUTS amplifies rounding over
# hundreds of iterations of long trees, so compare the first ones
model, data = models.theophylline(), models.load_dataset("theophylline")
o = dict(kw, num_warmup=50, kernel="nuts", rerecord=None, checkpoint=None,
         checkpoint_every=250, target_accept=None, rtol=1e-6, atol=1e-8, solver=None,
         max_steps=None, frozen_tol_factor=0.1, dense_mass=None, max_tree_depth=10,
         init_jitter=0.05, fit_kwargs=None, count_failures=None, max_retunes=3,
         chain_method="vectorized",
         init={"lKa": 0.45, "lCl": -3.2, "lKe": -2.45, "omega": np.array([0.6, 0.25]),
               "sigma": 0.7, "eta": np.zeros((12, 2))})
out = []
for method in ("vectorized", "parallel"):
    problem, policy, oo = _sample._settled(model, data, dict(o, chain_method=method))
    fp = _sample._fingerprint(problem, policy, oo)
    kernel, _, state, _ = _sample._first_state(problem, policy, data, oo, fp)
    assert kernel.settings["devices"] == (2 if method == "parallel" else 1)
    out.append(kernel.run(state, 10)[1])
for x, y in zip(*out):
    np.testing.assert_allclose(np.asarray(y, float), np.asarray(x, float), rtol=1e-8,
                               atol=1e-10)
print("OK")
"""


@pytest.mark.slow  # ~10 s: several host devices
def test_parallel_chains_draw_what_vectorised_chains_draw():
    env = dict(os.environ, GRADSOLVE_KERNEL_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")


def test_chain_method_is_checked():
    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    with pytest.raises(ValueError, match="`chain_method` must be"):
        inference.sample(model, data, chain_method="pmap", num_warmup=10, num_samples=10)
    # one device here: parallel chains cannot be had, and the error says how
    with pytest.raises(ValueError, match="jax_num_cpu_devices"):
        inference.sample(model, data, chain_method="parallel", num_warmup=10, num_samples=10)
