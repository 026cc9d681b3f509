"""Population pharmacokinetic models (`PopulationModel`) and a simulated study.

- `theophylline`: the one-compartment first-order-absorption model of the
  Boeckmann–Sheiner–Beal theophylline data (``models.load_dataset("theophylline")``), and
  `theophylline_closed_form`, its Bateman-function solution (an independent check).
- `two_compartment_oral`: two compartments, oral doses, log-normal random effects and a
  weight covariate; `simulated_study` draws a 200-subject multiple-dose study from it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ._population import PopulationDataset
from ._population_model import PopulationModel, _checked_data

__all__ = ["theophylline", "theophylline_closed_form", "two_compartment_oral",
           "simulated_study", "TWO_COMPARTMENT_TRUTH"]


# ----------------------------------------------------------------------------- theophylline
def _theoph_latent(data):
    S = data.n_subjects
    theta = {
        "lKa": numpyro.sample("lKa", dist.Normal(0.5, 0.5)),
        "lCl": numpyro.sample("lCl", dist.Normal(-3.2, 0.5)),
        "lKe": numpyro.sample("lKe", dist.Normal(-2.5, 0.5)),
        "omega": numpyro.sample("omega", dist.HalfNormal(1.0).expand([2]).to_event(1)),
        "sigma": numpyro.sample("sigma", dist.HalfNormal(2.0)),
    }
    with numpyro.plate("subjects", S):
        theta["eta"] = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    return theta


def _theoph_individual(theta, data):
    S = data.n_subjects
    eta, omega = jnp.asarray(theta["eta"]), jnp.asarray(theta["omega"])
    ka = jnp.exp(theta["lKa"] + omega[0] * eta[:, 0])
    cl = jnp.exp(theta["lCl"] + omega[1] * eta[:, 1])
    ke = jnp.broadcast_to(jnp.exp(theta["lKe"]), (S,))
    return {"ka": ka, "ke": ke, "cl": cl}


def _theoph_field(t, y, p):
    a_gut, a_central = y[0], y[1]
    return jnp.stack([-p["ka"] * a_gut, p["ka"] * a_gut - p["ke"] * a_central])


def _theoph_observation(theta, p, ts, ys):
    return ys[..., 1] * (p["ke"] / p["cl"])[:, None]


def _normal_noise(theta, pred):
    return dist.Normal(pred, theta["sigma"])


def theophylline() -> PopulationModel:
    r"""The theophylline population model: one compartment, first-order
    absorption, doses and volumes per kg.

    $$
    \dot a_{gut} = -k_{a,i}\, a_{gut}, \qquad
    \dot a_{central} = k_{a,i}\, a_{gut} - k_e\, a_{central}, \qquad
    c_i(t) = a_{central}(t)\, k_e / cl_i,
    $$

    ``y0 = (dose_i, 0)`` at ``t = 0`` (the oral dose ``AMT``, mg/kg, into ``CMT`` 1, the
    gut); ``conc_ij ~ Normal(c_i(t_ij), sigma)``;
    ``ka_i = exp(lKa + omega[0] eta[i, 0])``, ``cl_i = exp(lCl + omega[1] eta[i, 1])``,
    ``ke = exp(lKe)`` (so the volume is ``cl_i / ke``, L/kg).

    Latent sites (names and shapes): ``lKa ~ Normal(0.5, 0.5)``, ``lCl ~ Normal(-3.2,
    0.5)``, ``lKe ~ Normal(-2.5, 0.5)``, ``omega ~ HalfNormal(1)`` ``(2,)``, ``sigma ~
    HalfNormal(2)``, and the non-centred random effects ``eta ~ Normal(0, 1)`` ``(S, 2)``
    inside ``numpyro.plate("subjects", S)``. Individual parameters ``p = {"ka", "ke",
    "cl"}``, each ``(S,)`` (``ke`` broadcast). The model has a flip-flop mode (``ka`` and
    ``ke`` swapped) that fits the data tens of log-density units worse.

    Data: ``models.load_dataset("theophylline")``, Boeckmann, Sheiner and Beal (1994),
    NONMEM Users Guide Part V, as shipped with R's ``datasets`` package (``Theoph``, public
    domain): 12 subjects, one oral dose each, 11 concentrations (mg/L) over 25 h. The
    closed form is `theophylline_closed_form` (a check, not the implementation).

    Example:
        >>> model, data = models.theophylline(), models.load_dataset("theophylline")
        >>> theta = model.sample_latent(jax.random.key(0), data)
        >>> sorted(theta)            # ['eta', 'lCl', 'lKa', 'lKe', 'omega', 'sigma']
        >>> model.predict(theta, data).shape                          # (12, 11)
    """
    return PopulationModel(
        name="theophylline", vector_field=_theoph_field, state_names=("a_gut", "a_central"),
        latent=_theoph_latent, individual=_theoph_individual,
        observation=_theoph_observation, noise=_normal_noise, t0=0.0, stiff=False,
        obs_name="theophylline concentration (mg/L)",
    )


def theophylline_closed_form(theta, data: PopulationDataset) -> jax.Array:
    """Concentrations ``(S, K)`` of `theophylline` at ``data.observations()`` times, from
    the Bateman function, summed over each subject's doses (superposition):

    ``c(t) = sum_doses dose ka ke / (cl (ka - ke)) (exp(-ke s) - exp(-ka s))``, ``s = t -
    t_dose`` where ``s > 0`` (a sample at a dose time reads the state before that dose).

    A CHECK for tests and reference NumPyro programs, not the implementation (which
    solves the ODE); it recomputes ``ka_i``, ``cl_i``, ``ke`` from ``theta`` itself and
    needs ``ka_i != ke``.

    Args:
        theta: the latent values (``lKa``, ``lCl``, ``lKe``, ``omega``, ``eta``).
        data: a `PopulationDataset` (doses into ``CMT`` 1).

    Returns:
        ``(S, K)`` concentrations (padding slots: at the subject's last time).

    Example:
        >>> c = models.theophylline_closed_form(theta, models.load_dataset("theophylline"))
    """
    data = _checked_data(data, "theophylline_closed_form")
    eta, omega = jnp.asarray(theta["eta"]), jnp.asarray(theta["omega"])
    ka = jnp.exp(theta["lKa"] + omega[0] * eta[:, 0])[:, None, None]
    cl = jnp.exp(theta["lCl"] + omega[1] * eta[:, 1])[:, None, None]
    ke = jnp.exp(theta["lKe"])
    ts, _ = data.observations()
    times, sizes = data.jumps(1)                          # doses into CMT 1: (S, J), (S, J, 1)
    s = ts[:, :, None] - times[:, None, :]               # (S, K, J); -inf for padded doses
    after = s > 0
    s = np.where(after, s, 0.0)
    dose = sizes[:, None, :, 0]
    c = dose * ka * ke / (cl * (ka - ke)) * (jnp.exp(-ke * s) - jnp.exp(-ka * s))
    return jnp.sum(jnp.where(after, c, 0.0), axis=-1)


# ----------------------------------------------------------------------------- two compartments
TWO_COMPARTMENT_TRUTH = {
    "lKa": math.log(1.0), "lCl": math.log(5.0), "lV1": math.log(50.0),
    "lQ": math.log(10.0), "lV2": math.log(100.0),
    "omega": (0.3, 0.25, 0.2), "sigma_add": 0.05, "sigma_prop": 0.1,
}
"""The population values `simulated_study` draws from (``ka`` 1/h, ``cl`` 5 L/h, ``v1`` 50
L, ``q`` 10 L/h, ``v2`` 100 L for a 70 kg subject; between-subject sd 0.3, 0.25, 0.2 of
log ``ka``, ``cl``, ``v1``; additive error 0.05 mg/L, proportional 10%)."""


def _two_cpt_latent(data):
    S = data.n_subjects
    theta = {
        "lKa": numpyro.sample("lKa", dist.Normal(math.log(1.0), 0.5)),
        "lCl": numpyro.sample("lCl", dist.Normal(math.log(5.0), 0.5)),
        "lV1": numpyro.sample("lV1", dist.Normal(math.log(50.0), 0.5)),
        "lQ": numpyro.sample("lQ", dist.Normal(math.log(10.0), 0.5)),
        "lV2": numpyro.sample("lV2", dist.Normal(math.log(100.0), 0.5)),
        "omega": numpyro.sample("omega", dist.HalfNormal(0.5).expand([3]).to_event(1)),
        "sigma_add": numpyro.sample("sigma_add", dist.HalfNormal(0.5)),
        "sigma_prop": numpyro.sample("sigma_prop", dist.HalfNormal(0.5)),
    }
    with numpyro.plate("subjects", S):
        theta["eta"] = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    return theta


def _two_cpt_individual(theta, data):
    S = data.n_subjects
    eta, omega = jnp.asarray(theta["eta"]), jnp.asarray(theta["omega"])
    wt = jnp.asarray(data.covariate("WT"))
    return {
        "ka": jnp.exp(theta["lKa"] + omega[0] * eta[:, 0]),
        "cl": jnp.exp(theta["lCl"] + omega[1] * eta[:, 1]) * (wt / 70.0) ** 0.75,
        "v1": jnp.exp(theta["lV1"] + omega[2] * eta[:, 2]),
        "q": jnp.broadcast_to(jnp.exp(theta["lQ"]), (S,)),
        "v2": jnp.broadcast_to(jnp.exp(theta["lV2"]), (S,)),
    }


def _two_cpt_field(t, y, p):
    a_gut, a_c, a_p = y[0], y[1], y[2]
    c, c_p = a_c / p["v1"], a_p / p["v2"]
    absorbed = p["ka"] * a_gut
    exchange = p["q"] * (c - c_p)
    return jnp.stack([-absorbed, absorbed - p["cl"] * c - exchange, exchange])


def _two_cpt_observation(theta, p, ts, ys):
    return ys[..., 1] / p["v1"][:, None]


def _combined_noise(theta, pred):
    return dist.Normal(pred, theta["sigma_add"] + theta["sigma_prop"] * jnp.abs(pred))


def two_compartment_oral() -> PopulationModel:
    r"""Two-compartment population model with oral first-order absorption (amounts in mg,
    time in h, volumes in L).

    $$
    \dot a_{gut} = -k_{a,i} a_{gut}, \quad
    \dot a_c = k_{a,i} a_{gut} - \frac{cl_i}{v_{1,i}} a_c - q\Big(\frac{a_c}{v_{1,i}} -
    \frac{a_p}{v_2}\Big), \quad
    \dot a_p = q\Big(\frac{a_c}{v_{1,i}} - \frac{a_p}{v_2}\Big), \quad
    c = a_c / v_{1,i}.
    $$

    Doses go into the gut (``CMT`` 1, bioavailability 1), as many as the data hold.
    Individual parameters: ``ka_i = exp(lKa + omega[0] eta[i, 0])``, ``cl_i = exp(lCl +
    omega[1] eta[i, 1]) (WT_i / 70)^0.75`` (allometric, fixed exponent), ``v1_i = exp(lV1 +
    omega[2] eta[i, 2])``, ``q = exp(lQ)``, ``v2 = exp(lV2)``; the data need a ``WT``
    covariate (kg). Observation error: combined additive and proportional, ``DV_ij ~
    Normal(c_ij, sigma_add + sigma_prop |c_ij|)`` (a standard deviation linear in the
    concentration, so it stays positive near zero, e.g. at a pre-dose sample).

    Latent sites: ``lKa ~ Normal(log 1, 0.5)`` (1/h), ``lCl ~ Normal(log 5, 0.5)`` (L/h at
    70 kg), ``lV1 ~ Normal(log 50, 0.5)`` (L), ``lQ ~ Normal(log 10, 0.5)`` (L/h), ``lV2 ~
    Normal(log 100, 0.5)`` (L), ``omega ~ HalfNormal(0.5)`` ``(3,)``, ``sigma_add ~
    HalfNormal(0.5)`` (mg/L), ``sigma_prop ~ HalfNormal(0.5)``, and ``eta ~ Normal(0, 1)``
    ``(S, 3)`` in ``numpyro.plate("subjects", S)`` (non-centred). Typical values of a
    small-molecule oral drug, illustrative (not one drug's label).

    Example:
        >>> model = models.two_compartment_oral()
        >>> data, truth = models.simulated_study(n_subjects=200, seed=0)
        >>> model.predict(truth, data).shape                  # (200, K)
    """
    return PopulationModel(
        name="two_compartment_oral", vector_field=_two_cpt_field,
        state_names=("a_gut", "a_central", "a_peripheral"), latent=_two_cpt_latent,
        individual=_two_cpt_individual, observation=_two_cpt_observation,
        noise=_combined_noise, t0=0.0, stiff=False, obs_name="concentration (mg/L)",
    )


def simulated_study(n_subjects: int = 200, seed: int = 0
                    ) -> tuple[PopulationDataset, dict[str, jax.Array]]:
    """A simulated multiple-dose study of `two_compartment_oral`.

    Every subject takes 100 mg orally every 12 h for 3 days (6 doses, at 0, 12, ..., 60 h)
    and gives 4 to 6 samples at random times in (0, 72] h (never at a dose time);
    weights ``WT ~ Normal(70, 15)`` kg clipped to [40, 120]. The design is built as a
    long-format table and read with `PopulationDataset.from_table`; the concentrations are
    drawn with `PopulationModel.simulate` at `TWO_COMPARTMENT_TRUTH` and random effects
    ``eta ~ Normal(0, 1)`` ``(S, 3)``. Deterministic given ``seed``.

    Args:
        n_subjects: the number of subjects ``S`` (default 200).
        seed: the seed of the design (NumPy) and of the draws (JAX).

    Returns:
        ``(data, truth)``: the `PopulationDataset`, and the latent values used (the
        population values of `TWO_COMPARTMENT_TRUTH` as arrays, and ``eta (S, 3)``), a
        ``theta`` that `two_compartment_oral`'s methods accept.

    Example:
        >>> data, truth = models.simulated_study(n_subjects=200, seed=0)
        >>> data.n_subjects, truth["eta"].shape               # 200, (200, 3)
    """
    if not isinstance(n_subjects, (int, np.integer)) or n_subjects < 1:
        raise ValueError(f"`n_subjects` must be a positive int, got {n_subjects!r}")
    rng = np.random.default_rng(seed)
    dose_times = 12.0 * np.arange(6)
    table = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "WT")}

    def row(i, t, dv, amt, evid, cmt, wt):
        for k, v in zip(table, (i, t, dv, amt, evid, cmt, wt)):
            table[k].append(v)

    for i in range(1, int(n_subjects) + 1):
        wt = float(np.round(np.clip(rng.normal(70.0, 15.0), 40.0, 120.0), 1))
        k = int(rng.integers(4, 7))
        obs = np.sort(np.round(rng.uniform(0.25, 72.0, size=k), 2))
        obs = np.where(np.isin(obs, dose_times), obs + 0.05, obs)   # never at a dose time
        events = [(t, 1, 0) for t in dose_times] + [(t, 0, 1) for t in obs]
        for t, evid, order in sorted(events, key=lambda e: (e[0], e[2])):
            if evid:
                row(i, t, ".", 100.0, 1, 1, wt)
            else:
                row(i, t, 0.0, ".", 0, 2, wt)   # DV a placeholder, simulated below
    design = PopulationDataset.from_table(
        table, name="concentration", units="TIME h; DV mg/L; AMT mg (oral, CMT 1); WT kg",
        source="simulated design (models.simulated_study)")
    key_eta, key_obs = jax.random.split(jax.random.PRNGKey(seed))
    truth = {k: jnp.asarray(v, dtype=jnp.result_type(float))
             for k, v in TWO_COMPARTMENT_TRUTH.items()}
    truth["eta"] = jax.random.normal(key_eta, (int(n_subjects), 3), jnp.result_type(float))
    model = two_compartment_oral()
    data = model.simulate(key_obs, truth, design)
    data.source = (f"simulated from models.two_compartment_oral at TWO_COMPARTMENT_TRUTH "
                   f"(models.simulated_study(n_subjects={n_subjects}, seed={seed}))")
    return data, truth
