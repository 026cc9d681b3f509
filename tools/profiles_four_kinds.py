"""Draw docs/figures/profiles_four_kinds.png: `inference.profile` on the four kinds of
problem, one panel each, every panel drawn by the one `ProfileResult.plot`.

- an `ODEModel`: the zoo's lynx–hare, ``theta[0]`` (the log of the prey's growth rate);
- a NumPyro program with an `inference.ode` site: exponential decay ``y' = -k y`` with
  log-normal noise, ``k`` (its coordinate is ``log k``);
- a population model: theophylline's FOCE-I fit (`fit_population`), ``lCl``;
- a PEtab problem: Boehm_JProteomeRes2014 (hierarchical), ``Epo_degradation_BaF3``.

Usage (about 5-10 minutes on two cores; prints each profile's interval and time)::

    python tools/profiles_four_kinds.py [--out docs/figures/profiles_four_kinds.png]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

import gradsolve as gs  # noqa: E402
import inference  # noqa: E402
import models  # noqa: E402

TS = np.linspace(0.5, 8.0, 12)


def decay_program(ys):
    """``y' = -k y`` from ``y(0) = A``, observed with log-normal noise."""
    k = numpyro.sample("k", dist.LogNormal(0.0, 1.0))
    a = numpyro.sample("A", dist.LogNormal(1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    sol = inference.ode("decay", lambda t, y, p: -p["k"] * y, 0.0, float(TS[-1]),
                        jnp.reshape(a, (1,)), {"k": k}, ts=jnp.asarray(TS), max_steps=256)
    numpyro.sample("obs", dist.LogNormal(jnp.log(sol.ys[:, 0]), sigma), obs=ys)


def _runs():
    """``(title, ProfileResult, parameter)`` of each kind, timed."""
    out = []

    t = time.perf_counter()
    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    res = inference.fit(model, data, n_starts=8, seed=0, progress=False)
    prof = inference.profile(model, res, data, parameters=["theta[0]"], progress=False)
    out.append(("ODEModel: lynx–hare", prof, "theta[0]", time.perf_counter() - t))

    t = time.perf_counter()
    rng = np.random.default_rng(0)
    ys = 3.0 * np.exp(-0.4 * TS) * np.exp(0.1 * rng.normal(size=TS.size))
    res = inference.fit(decay_program, ys, {"k": 0.5, "A": 2.5, "sigma": 0.2},
                        steps=1000, progress=False)
    prof = inference.profile(decay_program, res, ys, parameters=["k"], progress=False)
    out.append(("NumPyro program: decay", prof, "k", time.perf_counter() - t))

    t = time.perf_counter()
    model, data = models.theophylline(), models.load_dataset("theophylline")
    fit = inference.fit_population(model, data, progress=False)
    prof = inference.profile(model, fit, data, parameters=["lCl"], progress=False)
    out.append(("population: theophylline (FOCE-I)", prof, "lCl", time.perf_counter() - t))

    t = time.perf_counter()
    problem = models.load_petab("Boehm_JProteomeRes2014")
    res = inference.fit(problem, n_starts=20, seed=1, progress=False)
    prof = inference.profile(problem, res, parameters=["Epo_degradation_BaF3"],
                             progress=False)
    out.append(("PEtab: Boehm_JProteomeRes2014", prof, "Epo_degradation_BaF3",
                time.perf_counter() - t))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures/profiles_four_kinds.png")
    args = ap.parse_args()
    gs.enable_x64()
    gs.ensure_compilation_cache()
    runs = _runs()
    fig, axes = plt.subplots(1, 4, figsize=(13.6, 3.3), layout="constrained")
    for ax, (title, prof, p, secs) in zip(axes, runs):
        prof.plot([p], axes=[ax])
        ax.set_title(title, fontsize="medium")
        lo, hi = prof.intervals[p]
        print(f"{title}: {p} ({prof.scales[p]}) {prof.estimate[p]:.4f} in [{lo:.4f}, "
              f"{hi:.4f}], {prof.n_rounds} rounds, {prof.n_evals} evaluations, "
              f"{secs:.0f} s with its fit", flush=True)
    for ax in axes[1:]:
        legend = ax.get_legend()
        if legend is not None:
            legend.remove()
    fig.suptitle("inference.profile on the four kinds of problem (95 % likelihood-ratio "
                 "intervals)", fontsize="medium")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print("wrote", args.out, jax.devices()[0].platform)


if __name__ == "__main__":
    main()
