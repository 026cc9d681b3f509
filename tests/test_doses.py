"""Dose schedules as data (`gs.DoseSchedule`, `gs.Bolus`, `gs.Infusion`): against the
closed forms of one-compartment kinetics (zero-order infusions, single and repeated; oral
doses with a lag time and a bioavailability), gradients w.r.t. every dose field against
central differences of those closed forms, on every driver; a record type written here
(an input whose rate doubles) that runs on every driver with no driver change; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import assert_grads, central_differences

DRIVERS = [gs.drivers.Kernel(), gs.drivers.Lanes(), gs.drivers.Batched()]
IDS = ["kernel", "lanes", "batched"]
# the XLA drivers' compiles are the slow part: every driver in the slow tier, the kernel
# (the CPU default) in the normal suite; test_drivers_agree_to_rounding runs all three
EVERY_DRIVER = [pytest.param(d, id=i, marks=[pytest.mark.slow] if i != "kernel" else [])
                for d, i in zip(DRIVERS, IDS)]
TS = np.linspace(0.0, 12.0, 25)
TIGHT = dict(rtol=1e-10, atol=1e-12)


def elimination(t, y, p):
    return jnp.stack([-p["k"] * y[0]])


def oral(t, y, p):
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["k"] * y[1]])


def infusion_exact(t, k, start, rate, dur):
    """Amount in a one-compartment body from a zero-order input ``rate`` over
    ``[start, start + dur]``, elimination rate ``k``."""
    infused = np.clip(t - start, 0.0, dur)
    after = np.maximum(t - start - dur, 0.0)
    return np.where(t <= start, 0.0,
                    rate / k * (1.0 - np.exp(-k * infused)) * np.exp(-k * after))


def bateman(t, ka, k, tdose, amount):
    """Central amount after an oral bolus ``amount`` at ``tdose`` (first-order absorption)."""
    s = np.maximum(t - tdose, 0.0)
    return np.where(t <= tdose, 0.0,
                    amount * ka / (ka - k) * (np.exp(-k * s) - np.exp(-ka * s)))


# Two repeated infusions per subject (starts and ends off the save times: the closed form
# has a kink there), n = 3 subjects with their own elimination rates.
K = np.array([0.2, 0.5, 1.1])
STARTS = np.array([[0.7, 6.3], [1.1, 5.9], [0.3, 7.1]])
AMTS = np.array([[100.0, 60.0], [80.0, 80.0], [50.0, 120.0]])
DURS = np.array([[2.35, 1.65], [0.95, 2.55], [3.15, 0.45]])


def infusions_exact(k, starts, amts, durs):
    return np.stack([sum(infusion_exact(TS, k[i], starts[i, j], amts[i, j] / durs[i, j],
                                        durs[i, j]) for j in range(starts.shape[1]))
                     for i in range(len(k))])


@pytest.mark.parametrize("driver", EVERY_DRIVER)
@pytest.mark.parametrize("by", ["duration", "rate"])
def test_repeated_infusions_and_their_gradients(driver, by):
    def ys(k, starts, amts, durs):
        how = {"duration": durs} if by == "duration" else {"rate": amts / durs}
        dose = gs.Infusion(time=starts, amount=amts, cmt=0, **how)
        return gs.solve(elimination, 0.0, 12.0, jnp.zeros((3, 1)), {"k": k}, ts=TS,
                        doses=[dose], driver=driver, **TIGHT).ys[..., 0]

    args = [K, STARTS, AMTS, DURS]
    got = ys(*map(jnp.asarray, args))
    assert got.shape == (3, TS.size)
    np.testing.assert_allclose(got, infusions_exact(*args), rtol=1e-8, atol=1e-9)
    weights = np.cos(np.arange(TS.size))  # a loss that weighs every save time
    loss = lambda *a: jnp.sum(ys(*a) * weights)
    exact_loss = lambda *a: float(np.sum(infusions_exact(*a) * weights))
    assert_grads(jax.grad(loss, argnums=(0, 1, 2, 3))(*map(jnp.asarray, args)),
                 central_differences(exact_loss, args))


@pytest.mark.parametrize("driver", EVERY_DRIVER)
def test_oral_dose_with_lag_time_and_bioavailability(driver):
    ka, k, tdose = jnp.array([1.3, 0.8]), jnp.array([0.15, 0.3]), jnp.array([0.5, 1.0])

    def central(lag, F, amount):
        dose = gs.Bolus(time=(tdose + lag)[:, None], amount=(F * amount)[:, None], cmt=0)
        sol = gs.solve(oral, 0.0, 12.0, jnp.zeros((2, 2)), {"ka": ka, "k": k}, ts=TS,
                       doses=gs.DoseSchedule([dose]), driver=driver, **TIGHT)
        assert sol.ys.shape == (2, TS.size, 2)  # no extra state: a bolus needs none
        return sol.ys[..., 1]

    def exact(lag, F, amount):
        return np.stack([bateman(TS, float(ka[i]), float(k[i]), float(tdose[i]) + lag[i],
                                 F[i] * amount[i]) for i in range(2)])

    args = [np.array([0.37, 0.21]), np.array([0.8, 0.65]), np.array([320.0, 250.0])]

    def loss(*a):
        c = central(*a)
        return jnp.sum(c ** 2), c

    (_, got), g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
        *map(jnp.asarray, args))
    np.testing.assert_allclose(got, exact(*args), rtol=1e-8, atol=1e-8)
    assert_grads(g, central_differences(lambda *a: float(np.sum(exact(*a) ** 2)), args))


def test_drivers_agree_to_rounding():
    def run(driver, amts, durs):
        dose = gs.Infusion(time=STARTS, amount=amts, duration=durs, cmt=0)
        return gs.solve(elimination, 0.0, 12.0, jnp.zeros((3, 1)), {"k": jnp.asarray(K)},
                        ts=TS, doses=[dose], driver=driver).ys

    outs = [jax.value_and_grad(lambda a, d: jnp.sum(run(drv, a, d) ** 2), argnums=(0, 1))(
        jnp.asarray(AMTS), jnp.asarray(DURS)) for drv in DRIVERS]
    for v, (ga, gd) in outs[1:]:
        np.testing.assert_allclose(v, outs[0][0], rtol=1e-12)
        np.testing.assert_allclose(ga, outs[0][1][0], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(gd, outs[0][1][1], rtol=1e-11, atol=1e-12)


def test_record_then_replay_at_new_doses():
    """A mesh recorded with an infusion replays another amount and duration: the replay is
    the exact discrete adjoint of its steps (central differences of the same replay) and
    close to the adaptive solution there."""
    y0, p = jnp.zeros((3, 1)), {"k": jnp.asarray(K)}
    dose = lambda a, d: gs.Infusion(time=STARTS, amount=a, duration=d, cmt=0)
    mesh = gs.record(elimination, 0.0, 12.0, y0, p, ts=TS, doses=[dose(AMTS, DURS)])

    @jax.jit  # one compile for the value and all the central differences below
    def replayed(a, d):
        return gs.replay(elimination, mesh, y0, p, doses=[dose(a, d)]).ys[..., 0]

    a2, d2 = AMTS * 1.05, DURS * 1.0005  # ends move by < 0.002, inside their mesh steps
    np.testing.assert_allclose(replayed(jnp.asarray(a2), jnp.asarray(d2)),
                               infusions_exact(K, STARTS, a2, d2), rtol=1e-5, atol=1e-6)
    loss = lambda a, d: float(jnp.sum(replayed(jnp.asarray(a), jnp.asarray(d)) ** 2))
    g = jax.jit(jax.grad(lambda a, d: jnp.sum(replayed(a, d) ** 2), argnums=(0, 1)))(
        jnp.asarray(a2), jnp.asarray(d2))
    assert_grads(g, central_differences(loss, [a2, d2], eps=1e-5), rtol=1e-6)


class DoublingInput(gs.AbstractDose):
    """A record type of this test module: an input at ``rate`` from ``time``, doubled from
    ``time + doubles_after`` on, stopped at ``time + stops_after``."""

    time: jax.Array
    rate: jax.Array
    doubles_after: jax.Array
    stops_after: jax.Array
    cmt: int = 0

    def changes(self, n):
        t = jnp.broadcast_to(self.time, (n, 1))
        r = jnp.broadcast_to(self.rate, (n, 1))
        t2 = t + self.doubles_after
        t3 = t + self.stops_after
        return [gs.DoseChange("rate", self.cmt, t, r),
                gs.DoseChange("rate", self.cmt, t2, r),
                gs.DoseChange("rate", self.cmt, t3, -2 * r)]


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_record_type_of_ones_own_runs_on_every_driver(driver):
    k = jnp.array([0.4, 0.9])

    def ys(rate, doubles):
        dose = DoublingInput(time=jnp.array([[0.6], [1.4]]), rate=rate, doubles_after=doubles,
                             stops_after=jnp.array([[4.3], [3.7]]))
        return gs.solve(elimination, 0.0, 12.0, jnp.zeros((2, 1)), {"k": k}, ts=TS,
                        doses=[dose], driver=driver, **TIGHT).ys[..., 0]

    def exact(rate, doubles):
        # superposition: rate from t0 to t0 + stop, plus rate from t0 + doubles to t0 + stop
        t0, stop = np.array([0.6, 1.4]), np.array([4.3, 3.7])
        return np.stack([infusion_exact(TS, float(k[i]), t0[i], rate[i, 0], stop[i])
                         + infusion_exact(TS, float(k[i]), t0[i] + doubles[i, 0], rate[i, 0],
                                          stop[i] - doubles[i, 0]) for i in range(2)])

    args = [np.array([[30.0], [45.0]]), np.array([[1.3], [2.2]])]

    def loss(*a):
        y = ys(*a)
        return jnp.sum(y), y

    (_, got), g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        *map(jnp.asarray, args))
    np.testing.assert_allclose(got, exact(*args), rtol=1e-8, atol=1e-8)
    assert_grads(g, central_differences(lambda *a: float(np.sum(exact(*a))), args))


def test_bad_doses_are_named():
    y0, p = jnp.zeros((1,)), {"k": 0.3}
    with pytest.raises(ValueError, match="exactly one of `rate` and `duration`"):
        gs.Infusion(time=0.0, amount=10.0, rate=1.0, duration=2.0)
    with pytest.raises(ValueError, match="exactly one of `rate` and `duration`"):
        gs.Infusion(time=0.0, amount=10.0)
    with pytest.raises(ValueError, match="non-positive `rate`"):
        gs.DoseSchedule([gs.Infusion(time=0.0, amount=10.0, rate=-1.0)])
    with pytest.raises(ValueError, match="state 3, but the model has 1"):
        gs.solve(elimination, 0.0, 5.0, y0, p, doses=[gs.Bolus(1.0, 5.0, cmt=3)])
    with pytest.raises(TypeError, match="`doses`"):
        gs.solve(elimination, 0.0, 5.0, y0, p, doses="bolus")
    with pytest.raises(ValueError, match="`time`"):
        gs.solve(elimination, 0.0, 5.0, jnp.zeros((2, 1)), {"k": jnp.ones(2)},
                 doses=[gs.Bolus(jnp.zeros((3, 1)), 5.0)])
    with pytest.raises(ValueError, match="inside"):  # a dose before t0
        gs.solve(elimination, 1.0, 5.0, y0, p, doses=[gs.Bolus(0.5, 5.0)])


# ------------------------------------------------------------ in a NumPyro program
def test_an_ode_site_with_a_modelled_infusion_duration():
    """A program whose infusion duration is a parameter (NONMEM's RATE = -2): its log
    density and gradient under plain NumPyro against the closed form, and a fit through the
    site's mesh reuse recovering the simulated parameters."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer.util import log_density

    import inference

    starts, amts = STARTS[:, :1], AMTS[:, :1]
    truth = {"lk": np.log(0.4), "ldur": np.log(1.7)}
    sigma = 0.5

    def program(data):
        lk = numpyro.sample("lk", dist.Normal(-1.0, 1.0))
        ldur = numpyro.sample("ldur", dist.Normal(0.0, 1.0))
        dose = gs.Infusion(time=starts, amount=amts,
                           duration=jnp.broadcast_to(jnp.exp(ldur), starts.shape), cmt=0)
        sol = inference.ode("body", elimination, 0.0, 12.0, jnp.zeros((3, 1)),
                            {"k": jnp.broadcast_to(jnp.exp(lk), (3,))}, ts=TS, doses=[dose],
                            rtol=1e-10, atol=1e-12)
        numpyro.sample("obs", dist.Normal(sol.ys[..., 0], sigma), obs=data)

    def exact_logp(lk, ldur):
        mean = np.stack([infusion_exact(TS, np.exp(lk), starts[i, 0],
                                        amts[i, 0] / np.exp(ldur), np.exp(ldur))
                         for i in range(3)])
        from scipy.stats import norm
        return (norm.logpdf(lk, -1.0, 1.0) + norm.logpdf(ldur, 0.0, 1.0)
                + norm.logpdf(data, mean, sigma).sum())

    rng = np.random.default_rng(5)
    clean = np.stack([infusion_exact(TS, 0.4, starts[i, 0], amts[i, 0] / 1.7, 1.7)
                      for i in range(3)])
    data = clean + sigma * rng.normal(size=clean.shape)
    at = {"lk": jnp.asarray(-0.8), "ldur": jnp.asarray(0.3)}
    lp = lambda x: log_density(program, (data,), {}, x)[0]
    value, g = jax.jit(jax.value_and_grad(lp))(at)
    assert float(value) == pytest.approx(exact_logp(-0.8, 0.3), rel=1e-7)
    fd = central_differences(lambda a, b: exact_logp(a[()], b[()]),
                             [np.array(-0.8), np.array(0.3)])
    assert_grads([g["lk"], g["ldur"]], fd)
    fit = inference.fit(program, data, steps=300, n_starts=4, seed=0, progress=False)
    assert fit.params["lk"] == pytest.approx(truth["lk"], abs=0.05)
    assert fit.params["ldur"] == pytest.approx(truth["ldur"], abs=0.15)


# ------------------------------------------------------------------- steady state
def _ss_oral_exact(ka, k, tau, amount):
    gut = amount * np.exp(-ka * tau) / (1 - np.exp(-ka * tau))
    central = amount * ka / (ka - k) * (np.exp(-k * tau) / (1 - np.exp(-k * tau))
                                        - np.exp(-ka * tau) / (1 - np.exp(-ka * tau)))
    return np.stack([gut, central], -1)


@pytest.mark.parametrize("driver", EVERY_DRIVER)
def test_steady_state_of_repeated_oral_doses(driver):
    """The pre-dose state of an oral dose every tau, forever: the superposition sum."""
    def ss(ka, k, tau, amount):
        return gs.steady_state(oral, tau, jnp.zeros((2, 2)), {"ka": ka, "k": k},
                               doses=[gs.Bolus(0.0, amount[:, None], cmt=0)], driver=driver,
                               **TIGHT)

    args = [np.array([1.3, 0.7]), np.array([0.2, 0.35]), np.array(12.0), np.array([100.0, 80.0])]
    w = np.array([[1.0, 2.0], [-1.0, 0.5]])

    def loss(*a):
        y = ss(*a)
        return jnp.sum(y * w), y

    (_, got), g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
        *map(jnp.asarray, args))
    np.testing.assert_allclose(got, _ss_oral_exact(*args), rtol=1e-8)
    assert_grads(g, central_differences(lambda *a: float(np.sum(_ss_oral_exact(*a) * w)), args))


def test_steady_state_of_a_repeated_infusion():
    def ss(k, amount, dur):
        return gs.steady_state(elimination, 8.0, jnp.zeros(1), {"k": k},
                               doses=[gs.Infusion(0.0, amount, duration=dur)], **TIGHT)[0]

    def exact(k, amount, dur):
        rate = amount / dur
        return rate / k * (1 - np.exp(-k * dur)) * np.exp(-k * (8.0 - dur)) / (1 - np.exp(-k * 8.0))

    args = [np.array(0.3), np.array(200.0), np.array(1.5)]
    value, g = jax.jit(jax.value_and_grad(ss, argnums=(0, 1, 2)))(*map(jnp.asarray, args))
    assert float(value) == pytest.approx(float(exact(*args)), rel=1e-8)
    assert_grads(g, central_differences(lambda *a: float(exact(*a)), args))


@pytest.mark.slow  # ~17 s of compiles; steady states and their implicit gradients against
# closed forms: test_steady_state_of_repeated_oral_doses[kernel], ..._of_a_repeated_infusion
def test_steady_state_of_a_nonlinear_model_is_a_fixed_point():
    """Michaelis–Menten elimination: no closed form; the state returns to itself after one
    dosed interval, and the implicit gradient equals central differences of the solve."""
    def mm(t, y, p):
        return jnp.stack([-p["ka"] * y[0],
                          p["ka"] * y[0] - p["vmax"] * y[1] / (p["km"] + y[1])])

    p = {"ka": jnp.array(1.1), "vmax": jnp.array(20.0), "km": jnp.array(15.0)}
    dose = [gs.Bolus(0.0, 120.0, cmt=0)]
    y = gs.steady_state(mm, 12.0, jnp.zeros(2), p, doses=dose, **TIGHT)
    again = gs.solve(mm, 0.0, 12.0, y, p, doses=dose, **TIGHT).y1
    np.testing.assert_allclose(again, y, rtol=1e-8)

    def central(vmax):
        return gs.steady_state(mm, 12.0, jnp.zeros(2), {**p, "vmax": vmax}, doses=dose,
                               **TIGHT)[1]

    g = float(jax.grad(central)(jnp.array(20.0)))
    fd = (float(central(jnp.array(20.0 + 1e-5))) - float(central(jnp.array(20.0 - 1e-5)))) / 2e-5
    assert g == pytest.approx(fd, rel=1e-6)


def test_steady_state_bad_input():
    y0, p = jnp.zeros(1), {"k": 0.3}
    with pytest.raises(ValueError, match="`interval` must be positive"):
        gs.steady_state(elimination, 0.0, y0, p, doses=[gs.Bolus(0.0, 1.0)])
    with pytest.raises(ValueError, match="must lie in"):
        gs.steady_state(elimination, 8.0, y0, p, doses=[gs.Infusion(7.0, 1.0, duration=2.0)])
    with pytest.raises(ValueError, match="no dose"):
        gs.steady_state(elimination, 8.0, y0, p, doses=[])


def test_dosed_fields_of_different_models_are_named_and_counted_apart():
    """A dosed field is named after the model's (what the kernel's messages show), and the
    kernel's limit on variants of one vector field's code counts each model's dosed field
    apart (they share the wrapper's code): the limit's warning never hits a new model."""
    from gradsolve.drivers.kernel import driver as kd

    models_ = []
    for i in range(kd._MAX_VARIANTS + 2):
        ns = {}
        exec(f"def field{i}(t, y, p):\n    return -p * y * {i + 1.0}", {}, ns)
        models_.append(ns[f"field{i}"])
    dosed = [gs.DoseSchedule.field(f, 1, (0,)) for f in models_]
    assert dosed[0].__qualname__ == "field0_dosed" and dosed[1] is not dosed[0]
    key = ("solver", 1, "shapes")
    assert not any(kd._too_many_variants(g, key, f"source {i}") for i, g in enumerate(dosed))
    # one model's field with ever new closed-over values still meets the limit
    g = dosed[0]
    over = [kd._too_many_variants(g, key, f"other source {i}")
            for i in range(kd._MAX_VARIANTS + 1)]
    assert over[-1] and not over[0]
