"""Conformance with NONMEM's (PREDPP's) dose-record rules: each case a NONMEM-style table
(a dict of columns) read by `models.PopulationDataset.from_table`, predicted by a
`models.PopulationModel` (one-compartment oral/IV: `models.theophylline()`; two-compartment
IV: `models.two_compartment_oral()`, doses into CMT 2), and compared with CLOSED-FORM
superposition written here: the Bateman function, the IV bolus exponential, the
zero-order infusion, the two-compartment bi-exponential macro-constants, and steady state
as the geometric series over infinitely many past doses.

The expected values come from NONMEM's documented semantics (the NONMEM help pages for
ADDL, SS, EVID, MDV, the SS dose event record, and PREDPP Guide VI chapter V), never from
this code's output. Cases that predict are batched per model (every case a subject of one
table, one ensemble prediction), so the file compiles a few solves, not one per case.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from conftest import assert_grads, central_differences

RTOL = 1e-6                      # predictions vs the closed forms (the solve: rtol 1e-10)
KA, KE, CL = 1.5, 0.08, 0.04     # theophylline-like: 1/h, 1/h, L/h/kg
V = CL / KE                      # 0.5 L/kg
TWO = dict(cl=5.0, v1=50.0, q=10.0, v2=100.0)   # two compartments (CL, V1, Q, V2)
ONE_P = dict(ka=KA, ke=KE, v=V)


# =============================================================== closed forms (numpy)
def one_cpt_terms(p, cmt):
    """Central amount per unit dose into ``cmt`` (1 gut, 2 central) of the one-compartment
    model with first-order absorption: ``sum c exp(-lam s)`` as ``[(c, lam), ...]``.
    CMT 1: the Bateman function ``ka/(ka-ke) (exp(-ke s) - exp(-ka s))``; CMT 2:
    ``exp(-ke s)``."""
    ka, ke = p["ka"], p["ke"]
    if cmt == 1:
        r = ka / (ka - ke)
        return [(r, ke), (-r, ka)]
    return [(1.0, ke)]


def two_cpt_terms(p):
    """Central amount per unit IV bolus of the two-compartment model: the standard
    macro-constants ``(alpha - k21)/(alpha - beta) e^{-alpha s} + (k21 - beta)/(alpha -
    beta) e^{-beta s}``, alpha and beta the roots of ``l^2 - (k10+k12+k21) l + k10 k21``."""
    k10, k12, k21 = p["cl"] / p["v1"], p["q"] / p["v1"], p["q"] / p["v2"]
    s = k10 + k12 + k21
    disc = np.sqrt(s * s - 4.0 * k10 * k21)
    alpha, beta = (s + disc) / 2.0, (s - disc) / 2.0
    return [((alpha - k21) / (alpha - beta), alpha), ((k21 - beta) / (alpha - beta), beta)]


def bolus(t, td, amt, terms):
    """A bolus ``amt`` at ``td``; at ``t == td`` the state before it (0)."""
    s = np.maximum(np.asarray(t, float) - td, 0.0)
    return np.where(np.asarray(t) > td, amt * sum(c * np.exp(-lam * s) for c, lam in terms), 0.0)


def infusion(t, td, amt, dur, terms):
    """A zero-order input of ``amt`` at rate ``amt / dur`` over ``[td, td + dur]``: the
    integral of the bolus response, ``R sum c/lam (1 - e^{-lam min(s, D)}) e^{-lam (s-D)+}``."""
    s = np.asarray(t, float) - td
    on, off = np.clip(s, 0.0, dur), np.maximum(s - dur, 0.0)
    return amt / dur * sum(c / lam * (1.0 - np.exp(-lam * on)) * np.exp(-lam * off)
                           for c, lam in terms)


def _geometric(lam, ii):
    """``sum_{n >= 1} exp(-lam n II) = e^{-lam II} / (1 - e^{-lam II})``."""
    return np.exp(-lam * ii) / (1.0 - np.exp(-lam * ii))


def ss_bolus(t, td, amt, ii, terms):
    """A bolus at steady state at ``td``: itself plus the implied doses at ``td - n II``
    (n >= 1, the geometric series), for ``t > td`` (0 at and before ``td``: before the SS
    record, the state is whatever earlier records left; SS = 1 replaces it)."""
    s = np.maximum(np.asarray(t, float) - td, 0.0)
    past = amt * sum(c * np.exp(-lam * s) * _geometric(lam, ii) for c, lam in terms)
    return np.where(np.asarray(t) > td, bolus(t, td, amt, terms) + past, 0.0)


def ss_infusion(t, td, amt, dur, ii, terms):
    """An infusion at steady state at ``td`` (``dur < II``): itself plus the implied ones
    at ``td - n II``, each ended (``s + n II > D``): ``R sum c/lam (1 - e^{-lam D})
    e^{-lam (s - D)} e^{-lam II} / (1 - e^{-lam II})``."""
    s = np.maximum(np.asarray(t, float) - td, 0.0)
    past = amt / dur * sum(c / lam * (1.0 - np.exp(-lam * dur)) * np.exp(-lam * (s - dur))
                           * _geometric(lam, ii) for c, lam in terms)
    return np.where(np.asarray(t) > td, infusion(t, td, amt, dur, terms) + past, 0.0)


def test_closed_forms_are_the_superposition_they_claim():
    """The steady-state closed forms equal the direct sum over 600 past doses, and the
    infusion form the limit of many small boluses (a check of the checks)."""
    t = np.linspace(-3.0, 40.0, 87)
    for terms in (one_cpt_terms(ONE_P, 1), one_cpt_terms(ONE_P, 2), two_cpt_terms(TWO)):
        direct = sum(bolus(t, 5.0 - 12.0 * n, 100.0, terms) for n in range(600))
        np.testing.assert_allclose(ss_bolus(t, 5.0, 100.0, 12.0, terms),
                                   np.where(t > 5.0, direct, 0.0), rtol=1e-12, atol=1e-12)
        direct = sum(infusion(t, 5.0 - 8.0 * n, 60.0, 3.0, terms) for n in range(600))
        np.testing.assert_allclose(ss_infusion(t, 5.0, 60.0, 3.0, 8.0, terms),
                                   np.where(t > 5.0, direct, 0.0), rtol=1e-12, atol=1e-12)
        n = 24000  # midpoint rule; cell edges on the grid's half hours
        many = bolus(t[:, None], 2.0 + (np.arange(n) + 0.5) * 3.0 / n, 60.0 / n, terms)
        np.testing.assert_allclose(infusion(t, 2.0, 60.0, 3.0, terms), many.sum(axis=1),
                                   rtol=1e-7, atol=1e-9)


# ========================================================================== tables
COLUMNS = ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "RATE", "DUR", "SS", "II", "ADDL", "MDV")


def dose(t, amt, cmt=1, **kw):
    """A dose record (EVID 1, MDV 1)."""
    return dict(TIME=t, AMT=amt, EVID=1, CMT=cmt, MDV=1, **kw)


def obs(*ts, cmt=2):
    """Observation records (EVID 0) at ``ts``, from the central compartment."""
    return [dict(TIME=t, DV=1.0, EVID=0, CMT=cmt, MDV=0) for t in ts]


def reset(t, evid=3, **kw):
    """A reset record (EVID 3), or a reset-and-dose (EVID 4, with AMT/CMT in ``kw``)."""
    return dict(TIME=t, EVID=evid, MDV=1, **({"CMT": 1} | kw))


def flat(*parts):
    out = []
    for p in parts:
        out.extend(p if isinstance(p, list) else [p])
    return out


def table(subjects, columns=COLUMNS, **constant):
    """A NONMEM-style table (dict of columns, "." for missing) of ``subjects``: ID ->
    list of row dicts, rows in table order. ``constant`` columns (e.g. WT) on every row."""
    rows = [dict(r, ID=sid) for sid, rs in subjects.items() for r in rs]
    cols = list(columns) + [c for r in rows for c in r if c not in columns]
    cols = list(dict.fromkeys(cols))
    out = {c: [r.get(c, ".") for r in rows] for c in cols}
    for k, v in constant.items():
        out[k] = [v] * len(rows)
    return out


def observed_times(rows):
    return np.array([r["TIME"] for r in rows if r.get("EVID") == 0], float)


# ========================================================================== models
def predict(model, theta, data):
    """``model.predict(theta, data)`` (rtol 1e-10) as one jitted program (``data`` is
    concrete; the eager path compiles hundreds of small programs, the jitted one once)."""
    return jax.jit(lambda th: model.predict(th, data))(theta)


def one_theta(S, lka=np.log(KA), lcl=np.log(CL), lke=np.log(KE), **extra):
    """Latent values of `models.theophylline` without random effects: ka, CL, ke."""
    return {"lKa": jnp.asarray(lka), "lCl": jnp.asarray(lcl), "lKe": jnp.asarray(lke),
            "omega": jnp.zeros(2), "eta": jnp.zeros((S, 2)), "sigma": jnp.asarray(1.0),
            **{k: jnp.asarray(v) for k, v in extra.items()}}


def two_theta(S, lcl=np.log(TWO["cl"]), lv1=np.log(TWO["v1"]), lq=np.log(TWO["q"]),
              lv2=np.log(TWO["v2"])):
    """Latent values of `models.two_compartment_oral` without random effects (WT 70)."""
    return {"lKa": jnp.asarray(0.0), "lCl": jnp.asarray(lcl), "lV1": jnp.asarray(lv1),
            "lQ": jnp.asarray(lq), "lV2": jnp.asarray(lv2), "omega": jnp.zeros(3),
            "eta": jnp.zeros((S, 3)), "sigma_add": jnp.asarray(0.1),
            "sigma_prop": jnp.asarray(0.1)}


DOSE_PARAMETERS = ("ALAG1", "F1", "F2", "D2", "R2")
DP_DEFAULT = {"ALAG1": 0.0, "F1": 1.0, "F2": 1.0, "D2": 1.0, "R2": 1.0}


def with_dose_parameters(model):
    """``model`` whose NONMEM dose parameters ALAG1, F1, F2, D2, R2 are per-subject
    latent values of the same names (each ``(S,)``)."""
    return model.replace(dose_parameters=lambda th, p: {k: th[k] for k in DOSE_PARAMETERS})


# ===================================================================== batched cases
# Every case: a function of the parameters p returning (rows, expected concentrations at
# the observation rows). A batch puts each case of a group in one table (one subject each)
# and predicts them together; a test checks its own subject.
GROUPS: dict[str, dict] = {"bolus": {}, "schedule": {}, "dose_parameters": {}, "two": {},
                           "two_schedule": {}}


def case(group, **dose_parameters):
    def register(fn):
        GROUPS[group][fn.__name__] = (fn, dose_parameters)
        return fn
    return register


class Batch:
    def __init__(self, group):
        self.cases = GROUPS[group]
        self.names = list(self.cases)
        self.group = group
        self.two_compartment = group in ("two", "two_schedule")
        subjects = {i + 1: fn(self.params())[0] for i, (fn, _) in enumerate(self.cases.values())}
        self.data = models.PopulationDataset.from_table(
            table(subjects, **({"WT": 70.0} if self.two_compartment else {})))
        self.pred = np.asarray(self.predict())

    def params(self, **over):
        if self.two_compartment:
            return dict(TWO) | over
        return ONE_P | (DP_DEFAULT if self.group == "dose_parameters" else {}) | over

    def model(self):
        if self.two_compartment:
            return models.two_compartment_oral()
        if self.group == "dose_parameters":
            return with_dose_parameters(models.theophylline())
        return models.theophylline()

    def theta(self, **kw):
        S = len(self.names)
        if self.two_compartment:
            return two_theta(S, **kw)
        dp = {k: np.array([{**DP_DEFAULT, **d}[k] for _, d in self.cases.values()])
              for k in DOSE_PARAMETERS} if self.group == "dose_parameters" else {}
        return one_theta(S, **dp, **kw)

    def predict(self, **kw):
        return predict(self.model(), self.theta(**kw), self.data)

    def check(self, name):
        i = self.names.index(name)
        fn, dp = self.cases[name]
        rows, want = fn(self.params(**dp))
        k = observed_times(rows).size
        assert self.data.subjects[i].ts.size == k
        np.testing.assert_array_equal(self.data.subjects[i].ts, observed_times(rows))
        np.testing.assert_allclose(self.pred[i, :k], want, rtol=RTOL, atol=RTOL * np.max(
            np.abs(want)), err_msg=f"case {name} (subject {i + 1})")


@pytest.fixture(scope="module")
def batch():
    made = {}

    def get(group):
        if group not in made:
            made[group] = Batch(group)
        return made[group]
    return get


# ------------------------------------------------------------- bolus doses (jumps)
@case("bolus")
def addl_oral(p):
    rows = flat(dose(0.0, 100.0, ADDL=3, II=12.0), obs(0.0, 0.5, 1.0, 11.9, 12.0, 13.0, 30.0,
                                                       36.0, 40.0, 47.9))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 1)
    return rows, sum(bolus(t, 12.0 * n, 100.0, terms) for n in range(4)) / p["v"]


def test_ADDL_oral_additional_doses_exactly_like_the_initiating_dose_every_II(batch):
    """NONMEM ADDL help: additional doses are exactly like the initiating dose, every II
    (an observation at an implied dose's time reads the state before it)."""
    batch("bolus").check("addl_oral")


@case("bolus")
def addl_iv(p):
    rows = flat(obs(0.5, 1.0), dose(1.0, 40.0, cmt=2, ADDL=2, II=8.0),
                obs(2.0, 9.0, 17.0, 17.5, 30.0))
    t = observed_times(rows)
    return rows, sum(bolus(t, 1.0 + 8.0 * n, 40.0, one_cpt_terms(p, 2)) for n in range(3)) / p["v"]


def test_ADDL_iv_bolus_additional_doses_every_II(batch):
    """NONMEM ADDL help: ADDL additional IV bolus doses into the central compartment
    (CMT 2), one every II after the initiating dose."""
    batch("bolus").check("addl_iv")


@case("bolus")
def same_time_doses(p):
    rows = flat(obs(1.0), dose(3.0, 100.0), dose(3.0, 50.0), dose(3.0, 20.0, cmt=2),
                obs(3.0, 4.0, 10.0, 24.0))
    t = observed_times(rows)
    oral, iv = one_cpt_terms(p, 1), one_cpt_terms(p, 2)
    post = np.where(t == 3.0, 20.0, 0.0)  # the row at 3 follows the doses: post-dose (R1)
    return rows, (bolus(t, 3.0, 150.0, oral) + bolus(t, 3.0, 20.0, iv) + post) / p["v"]


def test_two_dose_records_at_one_time_both_given(batch):
    """PREDPP Guide VI V.A/V.D: every dose event record is a dose; two at one TIME (and a
    third into CMT 2) superpose; the observation row after them reads the post-dose state
    (the IV amount; the oral doses are still in the gut)."""
    batch("bolus").check("same_time_doses")


@case("bolus")
def late_first_dose(p):
    rows = flat(obs(0.0, 2.0, 5.0), dose(5.0, 100.0), obs(5.5, 8.0, 20.0))
    t = observed_times(rows)
    return rows, bolus(t, 5.0, 100.0, one_cpt_terms(p, 1)) / p["v"]


def test_late_first_dose_observations_before_it_read_zero(batch):
    """PREDPP Guide VI V.C: the system starts empty; observations before a subject's first
    dose (and at its time, before the dose record) read zero."""
    batch("bolus").check("late_first_dose")


@case("bolus")
def mdv_and_other_events(p):
    rows = flat(dose(0.0, 100.0), obs(1.0), dict(TIME=2.0, EVID=2, CMT=2, MDV=1),
                dict(obs(3.0)[0], MDV=1, DV="."), obs(6.0))
    t = observed_times(rows)
    return rows, bolus(t, 0.0, 100.0, one_cpt_terms(p, 1)) / p["v"]


def test_MDV_1_observation_still_predicted_and_EVID_2_skipped(batch):
    """NONMEM MDV help: MDV 1 makes DV missing (the record is still predicted); EVID 2
    (other-type event) is no observation and no dose."""
    b = batch("bolus")
    b.check("mdv_and_other_events")
    s = b.data.subjects[b.names.index("mdv_and_other_events")]
    assert np.isnan(s.ys[1]) and not np.isnan(s.ys[0])


# ----------------------------------------------- infusions, SS and resets (schedule)
@case("schedule")
def rate_infusion(p):
    rows = flat(dose(0.0, 100.0, cmt=2, RATE=25.0), obs(0.0, 1.0, 4.0, 5.0, 12.0))
    t = observed_times(rows)
    return rows, infusion(t, 0.0, 100.0, 4.0, one_cpt_terms(p, 2)) / p["v"]


def test_RATE_infusion_lasts_AMT_over_RATE(batch):
    """NONMEM RATE help / PREDPP Guide VI V.E: RATE > 0 is a zero-order input of AMT at
    RATE, lasting AMT/RATE."""
    batch("schedule").check("rate_infusion")


@case("schedule")
def dur_infusion(p):
    rows = flat(obs(1.0), dose(2.0, 90.0, cmt=2, DUR=3.0), obs(2.5, 5.0, 6.0, 24.0))
    t = observed_times(rows)
    return rows, infusion(t, 2.0, 90.0, 3.0, one_cpt_terms(p, 2)) / p["v"]


def test_DUR_infusion_at_rate_AMT_over_DUR(batch):
    """NONMEM help (DUR): a dose with duration DUR is given at rate AMT/DUR."""
    batch("schedule").check("dur_infusion")


@case("schedule")
def infusion_addl(p):
    rows = flat(dose(0.0, 60.0, cmt=2, RATE=30.0, ADDL=2, II=6.0), obs(1.0, 6.0, 7.0, 13.0, 20.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 2)
    return rows, sum(infusion(t, 6.0 * n, 60.0, 2.0, terms) for n in range(3)) / p["v"]


def test_ADDL_on_an_infusion_repeats_the_infusion(batch):
    """NONMEM ADDL help: additional doses are exactly like the initiating dose (here an
    infusion at the same RATE), every II."""
    batch("schedule").check("infusion_addl")


@case("schedule")
def ss1_oral(p):
    rows = flat(dose(0.0, 100.0, SS=1, II=12.0), obs(0.5, 2.0, 11.9, 12.0, 20.0, 40.0))
    t = observed_times(rows)
    return rows, ss_bolus(t, 0.0, 100.0, 12.0, one_cpt_terms(p, 1)) / p["v"]


def test_SS1_oral_dose_is_the_last_of_infinitely_many_every_II(batch):
    """NONMEM SS dose help: a steady-state dose is the last of a series of implied doses,
    each exactly like it, every II (no dose after it: washout)."""
    batch("schedule").check("ss1_oral")


@case("schedule")
def ss1_iv(p):
    rows = flat(obs(1.0), dose(3.0, 40.0, cmt=2, SS=1, II=24.0), obs(3.5, 10.0, 26.9, 40.0))
    t = observed_times(rows)
    return rows, ss_bolus(t, 3.0, 40.0, 24.0, one_cpt_terms(p, 2)) / p["v"]


def test_SS1_iv_bolus_geometric_series(batch):
    """NONMEM SS help: SS = 1 IV bolus: A e^{-k s} / (1 - e^{-k II}) after the dose."""
    batch("schedule").check("ss1_iv")


@case("schedule")
def ss1_infusion(p):
    rows = flat(obs(1.0), dose(2.0, 60.0, cmt=2, RATE=20.0, SS=1, II=8.0),
                obs(3.0, 5.0, 9.0, 9.9, 30.0))
    t = observed_times(rows)
    return rows, ss_infusion(t, 2.0, 60.0, 3.0, 8.0, one_cpt_terms(p, 2)) / p["v"]


def test_SS1_infusion_at_steady_state(batch):
    """NONMEM SS dose help: a steady-state infusion (AMT, RATE > 0, II): infusions of
    AMT/RATE every II before it, this one running."""
    batch("schedule").check("ss1_infusion")


@case("schedule")
def ss1_replaces_prior_doses(p):
    rows = flat(dose(0.0, 500.0, cmt=2), obs(5.0, 10.0), dose(10.0, 100.0, SS=1, II=12.0),
                obs(11.0, 20.0, 30.0))
    t = observed_times(rows)
    before = bolus(t, 0.0, 500.0, one_cpt_terms(p, 2))
    after = ss_bolus(t, 10.0, 100.0, 12.0, one_cpt_terms(p, 1))
    return rows, np.where(t <= 10.0, before, after) / p["v"]


def test_SS1_zeroes_out_amounts_from_prior_dose_records(batch):
    """NONMEM SS help: SS = 1, compartment amounts resulting from prior dose event records
    are "zeroed out" (reset to the steady state of the given dose)."""
    batch("schedule").check("ss1_replaces_prior_doses")


@case("schedule")
def ss1_with_addl(p):
    rows = flat(dose(0.0, 100.0, SS=1, II=12.0, ADDL=2), obs(6.0, 12.0, 18.0, 30.0, 40.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 1)
    return rows, (ss_bolus(t, 0.0, 100.0, 12.0, terms) + bolus(t, 12.0, 100.0, terms)
                  + bolus(t, 24.0, 100.0, terms)) / p["v"]


def test_SS1_with_ADDL_continues_the_pattern_with_transient_doses(batch):
    """NONMEM ADDL help: ADDL on a steady-state dose continues the pattern of implied doses
    beyond it; the additional doses are non-steady-state doses."""
    batch("schedule").check("ss1_with_addl")


@case("schedule")
def ss2_oral(p):
    rows = flat(dose(0.0, 200.0), obs(4.0), dose(6.0, 100.0, SS=2, II=12.0), obs(7.0, 15.0, 30.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 1)
    return rows, (bolus(t, 0.0, 200.0, terms) + ss_bolus(t, 6.0, 100.0, 12.0, terms)) / p["v"]


def test_SS2_oral_added_to_the_current_state(batch):
    """NONMEM SS help: SS = 2, the amounts are the steady-state amounts of the given dose
    plus whatever they would have been at that time (superposition)."""
    batch("schedule").check("ss2_oral")


@case("schedule")
def ss2_iv(p):
    rows = flat(dose(0.0, 50.0, cmt=2, ADDL=1, II=10.0), obs(5.0),
                dose(5.0, 30.0, cmt=2, SS=2, II=6.0), obs(6.0, 12.0, 25.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 2)
    return rows, (bolus(t, 0.0, 50.0, terms) + bolus(t, 10.0, 50.0, terms)
                  + ss_bolus(t, 5.0, 30.0, 6.0, terms)) / p["v"]


def test_SS2_iv_bolus_keeps_pending_ADDL_doses(batch):
    """NONMEM SS help: SS = 2 adds the steady state to the current amounts (an SS = 2 dose
    cancels nothing: the pending ADDL dose at 10 is still given)."""
    batch("schedule").check("ss2_iv")


@case("schedule")
def ss2_infusion(p):
    rows = flat(dose(0.0, 40.0, cmt=2), obs(1.0), dose(1.0, 60.0, cmt=2, DUR=2.0, SS=2, II=12.0),
                obs(2.0, 3.0, 8.0, 20.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 2)
    return rows, (bolus(t, 0.0, 40.0, terms) + ss_infusion(t, 1.0, 60.0, 2.0, 12.0, terms)) / p["v"]


def test_SS2_infusion_added_to_the_current_state(batch):
    """NONMEM SS help: SS = 2 with an infusion (DUR): its steady state added to the
    amounts the earlier bolus left."""
    batch("schedule").check("ss2_infusion")


@case("schedule")
def evid3_reset(p):
    rows = flat(dose(0.0, 100.0), obs(2.0, 9.0), reset(10.0), obs(11.0),
                dose(12.0, 50.0, cmt=2), obs(13.0, 20.0))
    t = observed_times(rows)
    before = bolus(t, 0.0, 100.0, one_cpt_terms(p, 1))
    after = bolus(t, 12.0, 50.0, one_cpt_terms(p, 2))
    return rows, np.where(t < 10.0, before, after) / p["v"]


def test_EVID3_reset_zeroes_every_compartment(batch):
    """NONMEM EVID help: EVID 3, the kinetic system is re-initialized, the amounts in each
    compartment reset to zero (the gut's unabsorbed dose included)."""
    batch("schedule").check("evid3_reset")


@case("schedule")
def evid4_reset_and_dose(p):
    rows = flat(dose(0.0, 100.0), obs(2.0, 7.0), reset(8.0, evid=4, AMT=60.0, CMT=2),
                obs(9.0, 20.0))
    t = observed_times(rows)
    before = bolus(t, 0.0, 100.0, one_cpt_terms(p, 1))
    after = bolus(t, 8.0, 60.0, one_cpt_terms(p, 2))
    return rows, np.where(t < 8.0, before, after) / p["v"]


def test_EVID4_resets_then_doses(batch):
    """NONMEM EVID help: EVID 4, reset-and-dose event: the system is first reset, and then
    a dose is given."""
    batch("schedule").check("evid4_reset_and_dose")


@case("schedule")
def evid3_stops_infusion(p):
    rows = flat(dose(0.0, 100.0, cmt=2, RATE=10.0), obs(3.0), reset(5.0), obs(6.0, 12.0),
                dose(12.0, 10.0, cmt=2), obs(14.0))
    t = observed_times(rows)
    before = infusion(t, 0.0, 100.0, 10.0, one_cpt_terms(p, 2))
    after = bolus(t, 12.0, 10.0, one_cpt_terms(p, 2))
    return rows, np.where(t < 5.0, before, after) / p["v"]


def test_EVID3_reset_stops_an_infusion_in_progress(batch):
    """PREDPP Guide VI V.B: a reset event re-initializes the system: an infusion in
    progress ends there (its remaining amount is never given)."""
    batch("schedule").check("evid3_stops_infusion")


# ------------------------------------------------- modelled dose parameters (PK block)
@case("dose_parameters", ALAG1=0.75)
def alag1(p):
    rows = flat(dose(0.0, 100.0, ADDL=1, II=12.0), obs(0.5, 1.0, 12.5, 13.0, 20.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 1)
    return rows, sum(bolus(t, 12.0 * n + p["ALAG1"], 100.0, terms) for n in range(2)) / p["v"]


def test_ALAG1_lags_the_dose_and_its_additional_doses(batch):
    """NONMEM dose event help: absorption lag ALAGn applies to the initiating dose and to
    all subsequent additional doses (given at TIME + ALAG)."""
    batch("dose_parameters").check("alag1")


@case("dose_parameters", F1=0.7)
def f1(p):
    rows = flat(dose(1.0, 100.0), obs(2.0, 5.0, 24.0))
    t = observed_times(rows)
    return rows, bolus(t, 1.0, p["F1"] * 100.0, one_cpt_terms(p, 1)) / p["v"]


def test_F1_scales_the_dose(batch):
    """NONMEM dose event help: bioavailability Fn scales the amount of a dose into
    compartment n."""
    batch("dose_parameters").check("f1")


@case("dose_parameters", F2=0.6)
def f2_rate(p):
    rows = flat(dose(0.0, 100.0, cmt=2, RATE=20.0), obs(1.0, 3.0, 4.0, 10.0))
    t = observed_times(rows)
    F = p["F2"]
    return rows, infusion(t, 0.0, F * 100.0, F * 100.0 / 20.0, one_cpt_terms(p, 2)) / p["v"]


def test_F2_with_RATE_shortens_the_infusion(batch):
    """PREDPP Guide VI V.E: with RATE given, F scales the amount at the same rate: the
    infusion lasts F*AMT/RATE."""
    batch("dose_parameters").check("f2_rate")


@case("dose_parameters", D2=2.5, F2=0.8)
def rate_minus_2(p):
    rows = flat(dose(1.0, 80.0, cmt=2, RATE=-2), obs(2.0, 3.4, 4.0, 12.0))
    t = observed_times(rows)
    return rows, infusion(t, 1.0, p["F2"] * 80.0, p["D2"], one_cpt_terms(p, 2)) / p["v"]


def test_RATE_minus_2_uses_the_modelled_duration_D2(batch):
    """NONMEM RATE help: RATE = -2, the duration is modelled (D2); the rate is F2*AMT/D2."""
    batch("dose_parameters").check("rate_minus_2")


@case("dose_parameters", R2=16.0)
def rate_minus_1(p):
    rows = flat(dose(0.0, 80.0, cmt=2, RATE=-1), obs(2.0, 5.0, 6.0, 12.0))
    t = observed_times(rows)
    return rows, infusion(t, 0.0, 80.0, 80.0 / p["R2"], one_cpt_terms(p, 2)) / p["v"]


def test_RATE_minus_1_uses_the_modelled_rate_R2(batch):
    """NONMEM RATE help: RATE = -1, the rate is modelled (R2); the infusion lasts AMT/R2."""
    batch("dose_parameters").check("rate_minus_1")


@case("dose_parameters", ALAG1=0.5, F1=0.9)
def ss1_lag(p):
    rows = flat(dose(0.0, 100.0, SS=1, II=12.0), obs(0.25, 1.0, 6.0, 12.0, 13.0))
    t = observed_times(rows)
    terms, lag = one_cpt_terms(p, 1), p["ALAG1"]
    # implied doses at lag - 12 n, n >= 1, and the SS dose itself at 0 + lag
    want = (sum(bolus(t, lag - 12.0 * n, p["F1"] * 100.0, terms) for n in range(1, 600))
            + bolus(t, lag, p["F1"] * 100.0, terms))
    return rows, want / p["v"]


def test_SS1_with_ALAG1_lags_every_implied_dose(batch):
    """NONMEM SS dose help: absorption lag applies to all implied doses (the steady state
    advanced to II - ALAG in the cycle); bioavailability applies to all of them."""
    batch("dose_parameters").check("ss1_lag")


# --------------------------------------------------------- two compartments (IV, CMT 2)
@case("two")
def two_iv_addl(p):
    rows = flat(dose(0.0, 500.0, cmt=2, ADDL=2, II=12.0), obs(0.5, 2.0, 12.0, 13.0, 30.0, 60.0))
    t = observed_times(rows)
    return rows, sum(bolus(t, 12.0 * n, 500.0, two_cpt_terms(p)) for n in range(3)) / p["v1"]


def test_two_compartment_iv_bolus_ADDL_bi_exponential(batch):
    """NONMEM ADDL help with a two-compartment model: each IV bolus gives the macro-constant
    bi-exponential A e^{-alpha t} + B e^{-beta t}; they superpose."""
    batch("two").check("two_iv_addl")


# The two-compartment infusion, steady-state and reset cases ("two_schedule": a compiled
# program of their own, ~25 s with cold caches) run in the slow tier; each test names the
# one-compartment test of the same records in the normal suite.
@case("two_schedule")
def two_infusion(p):
    rows = flat(dose(1.0, 300.0, cmt=2, RATE=100.0), obs(2.0, 4.0, 5.0, 24.0))
    t = observed_times(rows)
    return rows, infusion(t, 1.0, 300.0, 3.0, two_cpt_terms(p)) / p["v1"]


@pytest.mark.slow  # two_schedule; one compartment: test_RATE_infusion_lasts_AMT_over_RATE
def test_two_compartment_RATE_infusion(batch):
    """PREDPP Guide VI V.E with two compartments: a zero-order input at RATE into the
    central compartment (the integral of the bi-exponential)."""
    batch("two_schedule").check("two_infusion")


@case("two_schedule")
def two_ss1_bolus(p):
    rows = flat(dose(0.0, 500.0, cmt=2, SS=1, II=12.0), obs(0.5, 6.0, 12.0, 30.0))
    t = observed_times(rows)
    return rows, ss_bolus(t, 0.0, 500.0, 12.0, two_cpt_terms(p)) / p["v1"]


@pytest.mark.slow  # two_schedule; one compartment: test_SS1_iv_bolus_geometric_series
def test_two_compartment_SS1_bolus_geometric_series_per_exponential(batch):
    """NONMEM SS help with two compartments: both exponentials summed over the implied
    doses, A e^{-alpha s}/(1 - e^{-alpha II}) + B e^{-beta s}/(1 - e^{-beta II})."""
    batch("two_schedule").check("two_ss1_bolus")


@case("two_schedule")
def two_ss1_infusion(p):
    rows = flat(obs(1.0), dose(2.0, 400.0, cmt=2, DUR=2.0, SS=1, II=8.0), obs(3.0, 4.0, 9.0, 20.0))
    t = observed_times(rows)
    return rows, ss_infusion(t, 2.0, 400.0, 2.0, 8.0, two_cpt_terms(p)) / p["v1"]


@pytest.mark.slow  # two_schedule; one compartment: test_SS1_infusion_at_steady_state
def test_two_compartment_SS1_infusion(batch):
    """NONMEM SS dose help with two compartments: a steady-state infusion (DUR < II), the
    peripheral compartment at its steady state too."""
    batch("two_schedule").check("two_ss1_infusion")


@case("two_schedule")
def two_ss2_and_reset(p):
    rows = flat(dose(0.0, 200.0, cmt=2), obs(3.0), dose(3.0, 100.0, cmt=2, SS=2, II=6.0),
                obs(4.0, 10.0), reset(11.0), obs(12.0), dose(12.0, 50.0, cmt=2), obs(15.0))
    t = observed_times(rows)
    terms = two_cpt_terms(p)
    before = bolus(t, 0.0, 200.0, terms) + ss_bolus(t, 3.0, 100.0, 6.0, terms)
    return rows, np.where(t < 11.0, before, bolus(t, 12.0, 50.0, terms)) / p["v1"]


@pytest.mark.slow  # two_schedule; one compartment: test_SS2_iv_bolus_keeps_pending_ADDL_doses
# and test_EVID3_reset_zeroes_every_compartment
def test_two_compartment_SS2_then_EVID3_resets_the_peripheral_too(batch):
    """NONMEM SS help (SS = 2 adds) and EVID help (EVID 3 resets every compartment, the
    peripheral one included)."""
    batch("two_schedule").check("two_ss2_and_reset")


# ========================================================================= gradients
def test_gradient_of_ADDL_oral_and_iv_predictions_wrt_ka_cl_ke():
    """jax.grad of a weighted sum of ADDL predictions (oral and IV) w.r.t. log ka, log CL,
    log ke against central differences of the closed form."""
    rows = {1: flat(dose(0.0, 100.0, ADDL=2, II=12.0), obs(1.0, 5.0, 13.0, 24.0, 30.0)),
            2: flat(dose(1.0, 40.0, cmt=2, ADDL=1, II=8.0), obs(2.0, 9.5, 20.0))}
    data = models.PopulationDataset.from_table(table(rows))
    model = models.theophylline()
    w = np.where(np.isnan(data.observations()[1]), 0.0,
                 np.cos(np.arange(10.0)).reshape(2, 5))

    def exact(lka, lcl, lke):
        p = dict(ka=np.exp(lka), ke=np.exp(lke), v=np.exp(lcl) / np.exp(lke))
        t1, t2 = observed_times(rows[1]), observed_times(rows[2])
        c1 = sum(bolus(t1, 12.0 * n, 100.0, one_cpt_terms(p, 1)) for n in range(3)) / p["v"]
        c2 = sum(bolus(t2, 1.0 + 8.0 * n, 40.0, one_cpt_terms(p, 2)) for n in range(2)) / p["v"]
        return float(np.sum(c1 * w[0]) + np.sum(c2 * w[1, :3]))

    args = [np.array(np.log(KA)), np.array(np.log(CL)), np.array(np.log(KE))]
    loss = jax.jit(lambda *a: jnp.sum(model.predict(one_theta(2, *a), data) * w))
    assert float(loss(*map(jnp.asarray, args))) == pytest.approx(exact(*args), rel=RTOL)
    assert_grads(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*map(jnp.asarray, args)),
                 central_differences(exact, args), rtol=RTOL)


def test_gradient_of_SS1_infusion_and_EVID4_wrt_cl_ke():
    """jax.grad through a steady-state infusion (SS = 1, RATE) and an EVID 4 reset-and-dose
    w.r.t. log CL and log ke, against central differences of the closed form."""
    rows = {1: flat(dose(2.0, 60.0, cmt=2, RATE=20.0, SS=1, II=8.0), obs(3.0, 6.0, 9.0),
                    reset(10.0, evid=4, AMT=30.0, CMT=2), obs(12.0, 20.0))}
    data = models.PopulationDataset.from_table(table(rows))
    model = models.theophylline()
    w = np.array([[0.3, -1.1, 0.7, 0.9, -0.4]])

    def exact(lcl, lke):
        p = dict(ka=KA, ke=np.exp(lke), v=np.exp(lcl) / np.exp(lke))
        t = observed_times(rows[1])
        terms = one_cpt_terms(p, 2)
        c = np.where(t < 10.0, ss_infusion(t, 2.0, 60.0, 3.0, 8.0, terms),
                     bolus(t, 10.0, 30.0, terms)) / p["v"]
        return float(np.sum(c * w))

    args = [np.array(np.log(CL)), np.array(np.log(KE))]
    loss = jax.jit(lambda lcl, lke: jnp.sum(model.predict(one_theta(1, lcl=lcl, lke=lke),
                                                          data) * w))
    assert float(loss(*map(jnp.asarray, args))) == pytest.approx(exact(*args), rel=RTOL)
    assert_grads(jax.jit(jax.grad(loss, argnums=(0, 1)))(*map(jnp.asarray, args)),
                 central_differences(exact, args), rtol=RTOL)


@pytest.mark.slow
def test_gradient_of_two_compartment_SS1_bolus_wrt_cl_v1_q_v2():
    """jax.grad of two-compartment steady-state (SS = 1) bolus predictions w.r.t. log CL,
    V1, Q, V2 against central differences of the macro-constant closed form."""
    rows = {1: flat(dose(0.0, 500.0, cmt=2, SS=1, II=12.0, ADDL=1), obs(0.5, 6.0, 13.0, 30.0))}
    data = models.PopulationDataset.from_table(table(rows, WT=70.0))
    model = models.two_compartment_oral()
    w = np.array([[1.0, -0.5, 0.8, 2.0]])

    def exact(lcl, lv1, lq, lv2):
        p = dict(cl=np.exp(lcl), v1=np.exp(lv1), q=np.exp(lq), v2=np.exp(lv2))
        t = observed_times(rows[1])
        terms = two_cpt_terms(p)
        c = (ss_bolus(t, 0.0, 500.0, 12.0, terms) + bolus(t, 12.0, 500.0, terms)) / p["v1"]
        return float(np.sum(c * w))

    args = [np.array(np.log(TWO[k])) for k in ("cl", "v1", "q", "v2")]
    loss = jax.jit(lambda *a: jnp.sum(model.predict(two_theta(1, *a), data) * w))
    assert float(loss(*map(jnp.asarray, args))) == pytest.approx(exact(*args), rel=RTOL)
    assert_grads(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(*map(jnp.asarray, args)),
                 central_differences(exact, args), rtol=RTOL)


def test_gradient_wrt_modelled_lag_F_and_duration():
    """jax.grad w.r.t. ALAG1, F1 (an oral dose) and D2 (a RATE = -2 infusion) against
    central differences of the closed form (dose event help: lag, bioavailability and
    modelled duration are parameters of the dose)."""
    rows = {1: flat(dose(0.0, 100.0), obs(0.5, 2.0), dose(6.0, 50.0, cmt=2, RATE=-2),
                    obs(6.5, 8.0, 15.0))}
    data = models.PopulationDataset.from_table(table(rows))
    model = models.theophylline().replace(dose_parameters=lambda th, p: {
        "ALAG1": jnp.reshape(th["lag"], (1,)), "F1": jnp.reshape(th["F"], (1,)),
        "D2": jnp.reshape(th["D"], (1,))})
    w = np.array([[0.7, 1.3, -0.6, 0.4, 1.1]])

    def exact(lag, F, D):
        p = ONE_P
        t = observed_times(rows[1])
        c = (bolus(t, lag, F * 100.0, one_cpt_terms(p, 1))
             + infusion(t, 6.0, 50.0, D, one_cpt_terms(p, 2))) / p["v"]
        return float(np.sum(c * w))

    args = [np.array(0.6), np.array(0.8), np.array(1.5)]
    loss = jax.jit(lambda lag, F, D: jnp.sum(model.predict(one_theta(1, lag=lag, F=F, D=D),
                                                           data) * w))
    assert float(loss(*map(jnp.asarray, args))) == pytest.approx(exact(*args), rel=RTOL)
    assert_grads(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*map(jnp.asarray, args)),
                 central_differences(exact, args), rtol=RTOL)


# ============================================ rules being implemented (may fail for now)
def names(err, *parts):
    """The message of ``err`` names every one of ``parts`` (``row 3`` as a whole word) and
    no issue number or internal document."""
    msg = str(err.value)
    def named(p):
        if p.startswith("row "):  # "row 3", or "rows 1 and 3" / "rows 1, 3"
            return re.search(r"\brows?\s+(?:\d+\s*(?:,|and)\s*)*" + p[4:] + r"\b", msg)
        return re.search(r"(?<!\w)" + re.escape(p) + r"(?!\w)", msg)

    missing = [p for p in parts if not named(p)]
    assert not missing, f"the message {msg!r} does not name {missing}"
    assert not re.search(r"issue|#\d|nonmem_rules|scratch", msg, re.I), msg


def predict_one(rows, model=None, **table_kw):
    """Predictions ``(K,)`` of the one-subject table ``rows`` (theophylline-like values)."""
    data = models.PopulationDataset.from_table(table({1: rows}, **table_kw))
    return np.asarray(predict(model or models.theophylline(), one_theta(1), data))[0], data


# ---- B1: SS = 1 and EVID 4 before the model's t0 (R10)
# (cases of the "schedule" batch: one ensemble prediction with the cases above)
T_BEFORE_T0 = (0.0, 1.0, 6.0, 10.0, 24.0, 45.0, 46.0, 47.0, 47.9)


@case("schedule")
def ss1_before_t0(p):
    rows = flat(dose(-2.0, 100.0, SS=1, II=12.0), obs(*T_BEFORE_T0))
    t = observed_times(rows)
    return rows, ss_bolus(t, -2.0, 100.0, 12.0, one_cpt_terms(p, 1)) / p["v"]


@case("schedule")
def ss1_before_t0_addl(p):
    rows = flat(dose(-2.0, 100.0, SS=1, II=12.0, ADDL=3), obs(*T_BEFORE_T0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 1)
    ss = ss_bolus(t, -2.0, 100.0, 12.0, terms)
    return rows, (ss + sum(bolus(t, -2.0 + 12.0 * n, 100.0, terms) for n in (1, 2, 3))) / p["v"]


def test_SS1_dose_before_t0_starts_the_trajectory_at_its_steady_state(batch):
    """NONMEM SS help: an SS = 1 dose at TIME -2 (before the model's t0 = 0) sets the
    steady state there; every save time up to 47.9 (the last 2 h included) reads it, and
    ADDL continues the pattern."""
    batch("schedule").check("ss1_before_t0")
    batch("schedule").check("ss1_before_t0_addl")


@case("schedule")
def evid4_before_t0(p):
    rows = flat(reset(-2.0, evid=4, AMT=100.0, CMT=1), obs(0.0, 0.5, 3.0, 12.0, 47.9))
    return rows, bolus(observed_times(rows), -2.0, 100.0, one_cpt_terms(p, 1)) / p["v"]


def test_EVID4_before_t0_is_a_restart_and_dose_before_t0(batch):
    """NONMEM EVID help: EVID 4 (reset, then a dose) at TIME -2, before the model's t0 = 0:
    the observations from t0 on (t0 itself included) read that dose's curve."""
    batch("schedule").check("evid4_before_t0")


@case("schedule")
def evid3_before_t0(p):
    rows = flat(reset(-2.0), obs(0.0, 0.5), dose(1.0, 100.0), obs(3.0, 12.0, 47.9))
    return rows, bolus(observed_times(rows), 1.0, 100.0, one_cpt_terms(p, 1)) / p["v"]


def test_EVID3_before_t0_resets_an_empty_system(batch):
    """NONMEM EVID help: EVID 3 at TIME -2 (before t0 = 0) re-initializes the (empty)
    system; a later dose is given as usual."""
    batch("schedule").check("evid3_before_t0")


# ---- B2: SS = 1 cancels pending ADDL doses (R4)
@case("schedule")
def ss1_cancels_addl(p):
    rows = flat(dose(0.0, 100.0, ADDL=5, II=12.0), obs(5.0, 13.0, 29.9, 30.0),
                dose(30.0, 100.0, SS=1, II=8.0), obs(31.0, 36.0, 40.0, 47.9, 50.0, 61.0))
    t = observed_times(rows)
    terms = one_cpt_terms(p, 1)
    before = sum(bolus(t, 12.0 * n, 100.0, terms) for n in range(3))
    return rows, np.where(t <= 30.0, before, ss_bolus(t, 30.0, 100.0, 8.0, terms)) / p["v"]


def test_SS1_dose_cancels_pending_ADDL_doses(batch):
    """NONMEM SS help: with SS = 1, infusions in progress or pending additional doses are
    cancelled: ADDL 5 every 12 h from 0, then SS = 1 every 8 h at 30: no dose at 36, 48, 60."""
    batch("schedule").check("ss1_cancels_addl")


def test_EVID3_reset_cancels_pending_ADDL_doses():
    """NONMEM EVID help: EVID 3 re-initializes the kinetic system; ADDL doses of an earlier
    record still pending at the reset (24, 36) are not given after it (or, where the reader
    cannot say, the table is refused naming the row)."""
    rows = flat(dose(0.0, 100.0, ADDL=3, II=12.0), obs(5.0, 19.9), reset(20.0),
                obs(21.0, 30.0, 40.0))
    try:
        pred, _ = predict_one(rows)
    except ValueError as e:
        assert re.search(r"\brows? .*\b(1|4)\b", str(e)), str(e)
        return
    t = observed_times(rows)
    terms = one_cpt_terms(ONE_P, 1)
    want = np.where(t < 20.0, bolus(t, 0.0, 100.0, terms) + bolus(t, 12.0, 100.0, terms), 0.0)
    np.testing.assert_allclose(pred, want / V, rtol=RTOL, atol=RTOL * want.max() / V)


@pytest.mark.parametrize("what", ["EVID 0 with AMT", "EVID 1 with MDV 0",
                                  "no EVID, AMT with MDV 0"])
def test_observation_and_dose_flags_that_contradict_refused(what):
    """NONMEM EVID help: dose items must be zero on an observation record; MDV help: dose
    records have MDV = 1 (without EVID, AMT > 0 with MDV = 0 is ambiguous): refused naming
    the row."""
    if what == "EVID 0 with AMT":
        t = table({1: flat(dose(0.0, 100.0), dict(obs(1.0)[0], AMT=5.0), obs(2.0))})
    elif what == "EVID 1 with MDV 0":
        t = table({1: flat(dose(0.0, 100.0), dict(dose(1.0, 5.0), MDV=0), obs(2.0))})
    else:
        t = table({1: [dict(TIME=0.0, AMT=100.0, DV=".", CMT=1, MDV=1),
                       dict(TIME=1.0, AMT=5.0, DV=3.0, CMT=2, MDV=0),
                       dict(TIME=2.0, AMT=".", DV=6.0, CMT=2, MDV=0)]},
                  columns=("ID", "TIME", "DV", "AMT", "CMT", "MDV"))
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(t)
    names(err, "row 2")


def test_observations_of_two_compartments_refused_when_the_model_ignores_CMT():
    """NONMEM CMT help: an observation record's CMT says which compartment is observed; a
    model predicting one value per time whatever CMT says cannot honour CMT 1 and CMT 2:
    refused naming the row and column CMT."""
    rows = flat(dose(0.0, 100.0), obs(1.0, cmt=1), obs(2.0))
    with pytest.raises(ValueError) as err:
        predict_one(rows)
    names(err, "row 3", "CMT")


# ---- B3: no EVID column (R2)
@pytest.mark.parametrize("mdv", ["MDV 0", "no MDV"])
def test_without_EVID_rows_with_AMT_0_are_observations(mdv):
    """NONMEM EVID help (NM-TRAN supplies EVID): without an EVID column a row with AMT = 0
    (or missing) is an observation record, never a zero-amount dose."""
    rows = [dict(TIME=0.0, AMT=100.0, DV=".", CMT=1), dict(TIME=1.0, AMT=0.0, DV=5.0, CMT=2),
            dict(TIME=2.0, AMT=0, DV=6.0, CMT=2), dict(TIME=4.0, AMT=".", DV=7.0, CMT=2)]
    cols = ("ID", "TIME", "DV", "AMT", "CMT")
    if mdv == "MDV 0":
        rows = [dict(r, MDV=1 if r["AMT"] == 100.0 else 0) for r in rows]
        cols += ("MDV",)
    data = models.PopulationDataset.from_table(table({1: rows}, columns=cols))
    s = data.subjects[0]
    assert s.ts.size == 3
    np.testing.assert_array_equal(s.ts, [1.0, 2.0, 4.0])
    np.testing.assert_array_equal(s.ys, [5.0, 6.0, 7.0])
    np.testing.assert_array_equal(s.dose_times, [0.0])
    np.testing.assert_array_equal(s.dose_amounts, [100.0])


def test_without_EVID_MDV_1_and_no_AMT_is_an_other_event():
    """NONMEM MDV help: with PREDPP, non-observation records have MDV = 1; without EVID a
    row with no AMT and MDV = 1 is an other-type event (skipped), not an observation."""
    rows = [dict(TIME=0.0, AMT=100.0, DV=".", CMT=1, MDV=1),
            dict(TIME=1.0, AMT=".", DV=".", CMT=2, MDV=1),
            dict(TIME=2.0, AMT=".", DV=6.0, CMT=2, MDV=0)]
    data = models.PopulationDataset.from_table(
        table({1: rows}, columns=("ID", "TIME", "DV", "AMT", "CMT", "MDV")))
    np.testing.assert_array_equal(data.subjects[0].ts, [2.0])


# ---- B4: IDs (R6)
def _two_rows(i1, i2, times=(0.0, 1.0, 0.0, 1.0)):
    return {"ID": [i1, i1, i2, i2], "TIME": list(times), "DV": [".", 1.0, ".", 2.0],
            "AMT": [100.0, ".", 100.0, "."], "EVID": [1, 0, 1, 0], "CMT": [1, 2, 1, 2]}


@pytest.mark.parametrize("a, b", [("01", "1"), ("1.0", "1")])
def test_ID_two_spellings_of_one_number_refused_naming_both_rows(a, b):
    """NONMEM reads ID as a number ("01", "1.0" and "1" would merge there): two spellings
    of one number in a table are refused, naming both rows."""
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(_two_rows(a, b))
    names(err, "row 1", "row 3", "ID")


def test_ID_numeric_1_and_1_point_0_are_one_subject():
    """NONMEM reads ID as a number: the numbers 1 and 1.0 (e.g. a float column) are the
    same individual, the int 1."""
    data = models.PopulationDataset.from_table(_two_rows(1.0, 1, times=(0.0, 1.0, 2.0, 3.0)))
    assert data.n_subjects == 1 and data.ids == (1,) and isinstance(data.ids[0], int)
    np.testing.assert_array_equal(data.subjects[0].ts, [1.0, 3.0])


def test_ID_blocks_1_2_1_refused_naming_the_rows():
    """NONMEM data records: an individual record is a group of CONTIGUOUS records with one
    ID (NONMEM would silently start a new individual); ID blocks 1, 2, 1 are refused."""
    t = {"ID": [1, 1, 2, 2, 1], "TIME": [0.0, 1.0, 0.0, 1.0, 2.0], "DV": [".", 1.0, ".", 2.0, 3.0],
         "AMT": [100.0, ".", 100.0, ".", "."], "EVID": [1, 0, 1, 0, 0], "CMT": [1, 2, 1, 2, 2]}
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(t)
    names(err, "row 5")


# ---- B5: record order at one time (R1)
def test_observation_after_an_iv_bolus_row_reads_the_post_dose_value():
    """PREDPP Guide VI V.A: records at one TIME act in table order: an observation after
    a dose row reads the post-dose state (400/V at t = 0), one before it the pre-dose."""
    rows = flat(obs(0.0), dose(0.0, 400.0, cmt=2), obs(0.0, 1.0, 6.0),
                dose(6.0, 400.0, cmt=2), obs(6.0, 8.0))
    pred, data = predict_one(rows)
    e = lambda t: 400.0 / V * np.exp(-KE * t)
    want = np.array([0.0, 400.0 / V, e(1.0), e(6.0), e(6.0) + 400.0 / V, e(8.0) + e(2.0)])
    np.testing.assert_allclose(pred, want, rtol=RTOL, atol=RTOL * want.max())


@case("schedule")
def obs_after_ss1_row(p):
    rows = flat(dose(0.0, 400.0, cmt=2), obs(4.0), dose(4.0, 400.0, cmt=2, SS=1, II=12.0),
                obs(4.0, 10.0))
    ke, v = p["ke"], p["v"]
    g = 1.0 - np.exp(-ke * 12.0)
    return rows, np.array([400.0 / v * np.exp(-ke * 4.0), 400.0 / v / g,
                           400.0 / v * np.exp(-ke * 6.0) / g])


def test_observation_after_an_SS1_row_reads_the_steady_state_peak(batch):
    """NONMEM SS help and record order: an observation after an SS = 1 row at its TIME
    reads the steady-state peak A/V/(1 - e^{-k II}); one before it the prior state."""
    batch("schedule").check("obs_after_ss1_row")


def test_observation_after_an_EVID3_row_reads_zero_before_it_the_pre_reset_value():
    """NONMEM EVID help and record order: after an EVID 3 row at its TIME the amounts are
    zero; an observation before the reset row reads the pre-reset state."""
    rows = flat(dose(0.0, 400.0, cmt=2), obs(5.0), reset(5.0), obs(5.0),
                dose(7.0, 400.0, cmt=2), obs(9.0))
    pred, _ = predict_one(rows)
    want = np.array([400.0 / V * np.exp(-KE * 5.0), 0.0, 400.0 / V * np.exp(-KE * 2.0)])
    np.testing.assert_allclose(pred, want, rtol=RTOL, atol=RTOL * want.max())


# ---- B6: AMT, CMT, censoring (R3, R8, R9)
def test_negative_AMT_refused_naming_the_row():
    """NONMEM AMT: a dose amount is >= 0; a negative AMT is refused (row, column AMT)."""
    rows = flat(dose(0.0, 100.0), obs(1.0), dose(2.0, -5.0), obs(3.0))
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(table({1: rows}))
    names(err, "row 3", "AMT")


def test_observation_CMT_outside_the_model_refused_naming_row_and_column():
    """NONMEM CMT help: an observation record's CMT names one of the model's compartments;
    CMT = 7 with a 2-state model is refused (subject, row, column CMT)."""
    rows = flat(dose(0.0, 100.0), obs(1.0), obs(2.0, cmt=7))
    with pytest.raises(ValueError) as err:
        data = models.PopulationDataset.from_table(table({1: rows}))
        models.theophylline().predict(one_theta(1), data)
    names(err, "row 3", "CMT", "subject 1")


def test_LLOQ_column_censors_DV_below_it():
    """Beal's M3 (NONMEM's LLOQ convention): an observation with DV below its row's LLOQ is
    censored below at the LLOQ; LLOQ is no covariate."""
    rows = flat(dose(0.0, 100.0), [dict(r, DV=dv, LLOQ=0.5) for r, dv in
                                   zip(obs(1.0, 2.0, 3.0), (3.0, 0.2, 0.7))])
    data = models.PopulationDataset.from_table(table({1: rows}))
    np.testing.assert_array_equal(data.censoring()[0], [0, 1, 0])
    np.testing.assert_array_equal(data.subjects[0].ys, [3.0, 0.5, 0.7])
    assert "LLOQ" not in data.covariate_names


def test_BLQ_without_LLOQ_refused():
    """BLQ = 1 without an LLOQ column (and no CENS) leaves the limit unknown (DV often holds
    0 or LLOQ/2): refused naming the row and column BLQ."""
    rows = flat(dose(0.0, 100.0), [dict(r, BLQ=b) for r, b in zip(obs(1.0, 2.0), (0, 1))])
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(table({1: rows}))
    names(err, "row 3", "BLQ")


# ---- B7: TIME (R10)
@pytest.mark.parametrize("bad", [np.nan, "nan", ".", np.inf])
def test_missing_or_nonfinite_TIME_refused_naming_the_row(bad):
    """NONMEM TIME: every event record has a time; NaN/missing/inf TIME is refused naming
    the row."""
    rows = flat(dose(0.0, 100.0), obs(1.0, 2.0))
    rows[2]["TIME"] = bad
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(table({1: rows}))
    names(err, "row 3", "TIME")


# ---- B8: doses before t0 and SS infusions longer than II (R4, R10)
def test_infusion_before_t0_refused_naming_subject_row_and_TIME():
    """A transient dose before the model's t0 cannot be given (the solve starts at t0):
    refused naming the subject, the row and column TIME."""
    rows = flat(dose(-2.0, 100.0, cmt=2, RATE=20.0), obs(1.0, 2.0))
    with pytest.raises(ValueError) as err:
        data = models.PopulationDataset.from_table(table({1: rows}))
        models.theophylline().predict(one_theta(1), data)
    names(err, "subject 1", "row 1", "TIME")


def test_SS1_infusion_longer_than_II_refused_naming_RATE():
    """NONMEM SS dose help: a steady-state infusion must end within its interval;
    AMT/RATE > II is refused naming the row and column RATE."""
    rows = flat(dose(0.0, 100.0, cmt=2, RATE=5.0, SS=1, II=12.0), obs(1.0, 2.0))
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(table({1: rows}))
    names(err, "row 1", "RATE")


# ---- B9: comment column C, ID missing (R6, R7)
def test_C_comment_column_rows_skipped():
    """NM-TRAN $DATA IGNORE=C (the default comment flag): rows whose C starts with "C" are
    skipped entirely; C is never a covariate."""
    rows = [dict(dose(0.0, 100.0), C="."), dict(obs(1.0)[0], C="C"),
            dict(obs(2.0)[0], C="."), dict(dose(3.0, 1e6), C="C"), dict(obs(4.0)[0], C=".")]
    data = models.PopulationDataset.from_table(table({1: rows}))
    s = data.subjects[0]
    np.testing.assert_array_equal(s.ts, [2.0, 4.0])
    np.testing.assert_array_equal(s.dose_amounts, [100.0])
    assert "C" not in data.covariate_names


@pytest.mark.parametrize("bad", [np.nan, "."])
def test_missing_ID_refused(bad):
    """NONMEM ID: every data record belongs to an individual; a missing (NaN) ID is
    refused naming the row."""
    t = _two_rows(1, 2)
    t["ID"][3] = bad
    with pytest.raises(ValueError) as err:
        models.PopulationDataset.from_table(t)
    names(err, "row 4", "ID")
