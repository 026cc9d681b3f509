"""Sampler defaults follow what a program is, however it is written.

Theophylline three ways, in one process, 4 chains x (500 + 1,000) each, chains vectorised:

- zoo: ``inference.sample(models.theophylline(), data)``, random effects in a plate;
- program: the same model as a user writes a NumPyro program, its random effects
  ``dist.Normal(0, 1).expand([S, 2]).to_event(2)`` (no plate, as NumPyro's docs write
  them) and an ``inference.ode`` site, under ``inference.sample`` at its defaults;
- numpyro: that program under plain NumPyro ``NUTS`` (its ``inference.ode`` site is then
  ``gs.solve``, a record at every evaluation), started at the zoo run's posterior mean.

Reports wall time (everything counted), the smallest bulk ESS over every latent site
(random effects included), ESS per second, divergences and mean leapfrog steps, and the
ratios program / zoo and program / numpyro.

Usage::

    python benchmarks/bench_program_defaults.py            # 4 x (500 + 1,000)
    python benchmarks/bench_program_defaults.py --quick    # 4 x (200 + 300)
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import inference
import models


def user_program(data):
    """Theophylline written as a NumPyro program with per-subject random effects as one
    ``expand(...).to_event(2)`` site (no plate)."""
    ts, ys = data.observations()
    _, sizes = data.jumps(2)
    dose = np.asarray(sizes)[:, 0, 0]
    S = data.n_subjects
    seen = ~np.isnan(ys)

    def field(t, y, p):
        return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["ke"] * y[1]])

    def program(data):
        lKa = numpyro.sample("lKa", dist.Normal(0.5, 0.5))
        lCl = numpyro.sample("lCl", dist.Normal(-3.2, 0.5))
        lKe = numpyro.sample("lKe", dist.Normal(-2.5, 0.5))
        omega = numpyro.sample("omega", dist.HalfNormal(1.0).expand([2]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([S, 2]).to_event(2))
        ka = jnp.exp(lKa + omega[0] * eta[:, 0])
        cl = jnp.exp(lCl + omega[1] * eta[:, 1])
        ke = jnp.broadcast_to(jnp.exp(lKe), (S,))
        y0 = jnp.stack([jnp.asarray(dose), jnp.zeros(S)], axis=1)
        sol = inference.ode("theophylline_program", field, 0.0, float(ts.max()), y0,
                            {"ka": ka, "ke": ke, "cl": cl}, ts=ts)
        conc = sol.ys[..., 1] * (ke / cl)[:, None]
        conc = jnp.where(jnp.asarray(ts) == 0.0, 0.0, conc)  # t = 0 samples are pre-dose
        numpyro.sample("obs", dist.Normal(jnp.where(seen, conc, 0.0), sigma)
                       .mask(jnp.asarray(seen)).to_event(2),
                       obs=jnp.asarray(np.where(seen, ys, 0.0)))

    return program


def summary(name, idata, wall):
    ess = az.ess(idata)
    mins = min(float(np.min(ess[v].values)) for v in ess.data_vars)
    div = int(np.asarray(idata.sample_stats["diverging"]).sum())
    steps = (float(np.mean(np.asarray(idata.sample_stats["n_steps"])))
             if "n_steps" in idata.sample_stats else float("nan"))
    print(f"{name:>8}: {wall:7.1f} s, min ESS {mins:6.0f}, {mins / wall:6.1f} ESS/s, "
          f"divergences {div}, mean leapfrog steps {steps:.1f}", flush=True)
    return dict(wall=wall, ess=mins, rate=mins / wall, div=div)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)
    nw, ns = (200, 300) if args.quick else (500, 1000)
    data = models.load_dataset("theophylline")
    program = user_program(data)
    out = {}
    t = time.perf_counter()
    zoo = inference.sample(models.theophylline(), data, num_chains=4, num_warmup=nw,
                           num_samples=ns, seed=0, progress=False)
    out["zoo"] = summary("zoo", zoo, time.perf_counter() - t)
    t = time.perf_counter()
    idata = inference.sample(program, data, num_chains=4, num_warmup=nw, num_samples=ns,
                             seed=0, progress=False)
    out["program"] = summary("program", idata, time.perf_counter() - t)
    mean = {k: jnp.asarray(zoo.posterior[k].mean(("chain", "draw")).values)
            for k in ("lKa", "lCl", "lKe", "omega", "sigma", "eta")}
    t = time.perf_counter()
    mcmc = numpyro.infer.MCMC(
        numpyro.infer.NUTS(program, init_strategy=numpyro.infer.init_to_value(values=mean)),
        num_warmup=nw, num_samples=ns, num_chains=4, chain_method="vectorized",
        progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), data, extra_fields=("diverging", "num_steps"))
    # MCMC.run returns before vectorised chains finish (JAX dispatches asynchronously): the
    # clock stops when the draws exist
    jax.block_until_ready((mcmc.get_samples(), mcmc.get_extra_fields()))
    wall = time.perf_counter() - t
    plain = az.from_numpyro(mcmc)   # (ArviZ names NumPyro's num_steps n_steps)
    out["numpyro"] = summary("numpyro", plain, wall)
    p, z, n = out["program"], out["zoo"], out["numpyro"]
    print(f"program / zoo: time {p['wall'] / z['wall']:.2f}x, min ESS {p['ess'] / z['ess']:.2f}x; "
          f"program / plain NumPyro + gs.solve: ESS/s {p['rate'] / n['rate']:.2f}x")


if __name__ == "__main__":
    main()
