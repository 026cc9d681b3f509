"""NUTS against the lockstep ensemble sampler (BlackJAX's ChEES-HMC), ESS per second.

Each model is sampled by ``inference.sample`` with NUTS (its defaults: 2 chains, or
``--nuts-chains``) and with ``inference.sampling.ChEES`` (``--chees-chains``, 16 by
default), in one process, ``--repeat`` times each (the second run of a sampler finds its
programs compiled: what a user gets from the second call on). Reported per run: wall
seconds (the MAP start, warmup and sampling, compiles included), warmup and sampling
seconds, the smallest bulk ESS over every parameter (ArviZ), ESS/s on the wall time and on
the sampling phase alone, the largest R-hat, divergences, leapfrog steps per draw; and the
route (JAX platform, device, the replay driver).

Models: ``lynx`` (lynx–hare, 8 parameters), ``schools`` (eight schools, non-centred,
through an ODE site: a random-effects hierarchy), ``theo`` (theophylline, 12 subjects, a
population: 30 parameters), ``boehm`` (the PEtab benchmark Boehm_JProteomeRes2014 at
``inference.sample(problem)``'s defaults).

Usage::

    python benchmarks/bench_samplers.py                                 # lynx, schools
    python benchmarks/bench_samplers.py --models lynx,schools,theo --repeat 2
    python benchmarks/bench_samplers.py --models boehm --samplers chees --warmup 500
    python benchmarks/bench_samplers.py --models boehm --samplers default   # sample(problem)
    python benchmarks/bench_samplers.py --platform tpu --float32 --models lynx,theo \\
        --nuts-chains 64 --chees-chains 128                             # on the chip

Writes ``--json`` (default ``benchmarks/results/bench_samplers_<platform>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings


def _args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", choices=("cpu", "tpu", "gpu"), default="cpu")
    ap.add_argument("--models", default="lynx,schools")
    ap.add_argument("--samplers", default="nuts,chees",
                    help="comma-separated: nuts, chees, default (no sampler named)")
    ap.add_argument("--nuts-chains", type=int, default=None, help="default: NUTS's (2)")
    ap.add_argument("--chees-chains", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=None,
                    help="warmup iterations (default: the sampler's, as `sample` without it)")
    ap.add_argument("--samples", type=int, default=None,
                    help="draws a chain (default: 1,000 for a named sampler; sample's own "
                         "default, the sampler's, for 'default')")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--float32", action="store_true", help="single precision (the chip's)")
    ap.add_argument("--json", default=None)
    return ap.parse_args()


A = _args() if __name__ == "__main__" else None
if A is not None:
    os.environ.setdefault("JAX_PLATFORMS", A.platform)

import jax  # noqa: E402

if A is None or not A.float32:
    jax.config.update("jax_enable_x64", True)

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

import inference  # noqa: E402
import models  # noqa: E402
from inference.sampling import ChEES  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
HALF = float(np.log(2.0))


def _decay(t, y, p):
    return -y


def eight_schools(data):
    """Non-centred eight schools, the school effects halved by an ODE site and doubled
    back by the likelihood (so the sampler runs on its mesh machinery)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", 8):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
    theta = mu + tau * eta
    sol = inference.ode("decay", _decay, 0.0, HALF, theta[:, None], {}, ts=np.array([HALF]))
    with numpyro.plate("observations", 8):
        numpyro.sample("obs", dist.Normal(2.0 * sol.ys[:, 0, 0], SIGMA), obs=Y)


def model(name: str):
    """``(model, data)`` of a benchmark model."""
    if name == "lynx":
        return models.lynx_hare(), models.load_dataset("lynx_hare")
    if name == "schools":
        return eight_schools, None
    if name == "theo":
        return models.theophylline(), models.load_dataset("theophylline")
    if name == "boehm":
        return models.load_petab("Boehm_JProteomeRes2014"), None
    raise SystemExit(f"unknown model {name!r}")


def route(m, data) -> str:
    """The JAX platform and device, and the replay driver of the sampler's potential."""
    from inference.petab._problem import problem_of

    dev = jax.devices()[0]
    problem = problem_of(m, data, solver=None, rtol=None, atol=None, max_steps=None)
    driver = getattr(getattr(problem, "replay_driver", None), "name", None)
    return (f"{dev.platform} ({dev.device_kind}, {jax.device_count()} device(s)); replay: "
            f"{driver or 'each ode site on gs.solve default driver'}")


def run(m, data, sampler: str, a) -> dict:
    kw = dict(seed=a.seed, progress=False)
    if a.warmup is not None:
        kw["num_warmup"] = a.warmup
    if a.samples is not None or sampler != "default":
        kw["num_samples"] = 1000 if a.samples is None else a.samples
    if sampler == "default":
        pass  # what sample picks where the call names no sampler
    elif sampler == "chees":
        kw["sampler"] = ChEES(num_chains=a.chees_chains)
    else:
        kw["sampler"] = "nuts"
        if a.nuts_chains:
            kw["num_chains"] = a.nuts_chains
    t = time.perf_counter()
    idata = inference.sample(m, data, **kw)
    wall = time.perf_counter() - t
    s = az.summary(idata, round_to="none")
    at = idata.posterior.attrs
    ess = float(s.ess_bulk.min())
    ss = idata.sample_stats
    return dict(sampler=sampler if sampler != "default" else f"default ({at['kernel']})",
                chains=int(at["num_chains"]), wall_s=wall,
                warmup_s=float(at["warmup_time_s"]), sampling_s=float(at["sampling_time_s"]),
                min_ess_bulk=ess, ess_per_s=ess / wall,
                ess_per_s_sampling=ess / float(at["sampling_time_s"]),
                max_rhat=float(s.r_hat.max()), divergences=int(ss["diverging"].sum()),
                leapfrog_per_draw=float(ss["n_steps"].mean()),
                mesh_policy=at["mesh_policy"], n_records=int(at["n_records"]),
                worst=str(s.ess_bulk.idxmin()))


def main() -> None:
    a = A
    out = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               command=" ".join(["python"] + sys.argv), host=platform.node(),
               cpu_cores=os.cpu_count(), jax=jax.__version__,
               float64=bool(jax.config.jax_enable_x64), runs={})
    print(f"{out['date']}; {out['command']}; JAX {jax.__version__}, "
          f"{'float64' if out['float64'] else 'float32'}, {os.cpu_count()} CPU cores")
    head = (f"{'model':<8} {'sampler':<6} {'run':>3} {'chains':>6} {'wall s':>7} {'warm s':>7} "
            f"{'samp s':>7} {'minESS':>7} {'ESS/s':>7} {'ESS/s samp':>10} {'Rhat':>5} "
            f"{'div':>4} {'steps':>6}  worst")
    for name in a.models.split(","):
        m, data = model(name)
        r = route(m, data)
        print(f"\n{name}: route {r}\n{head}", flush=True)
        rows = out["runs"][name] = dict(route=r, runs=[])
        for i in range(a.repeat):
            for sampler in a.samplers.split(","):
                x = dict(run(m, data, sampler, a), run=i + 1)
                rows["runs"].append(x)
                print(f"{name:<8} {x['sampler']:<6} {i + 1:>3} {x['chains']:>6} "
                      f"{x['wall_s']:7.1f} "
                      f"{x['warmup_s']:7.1f} {x['sampling_s']:7.2f} {x['min_ess_bulk']:7.0f} "
                      f"{x['ess_per_s']:7.1f} {x['ess_per_s_sampling']:10.1f} "
                      f"{x['max_rhat']:5.3f} {x['divergences']:4d} "
                      f"{x['leapfrog_per_draw']:6.1f}  {x['worst']}", flush=True)
    path = a.json or os.path.join(os.path.dirname(__file__), "results",
                                  f"bench_samplers_{a.platform}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
