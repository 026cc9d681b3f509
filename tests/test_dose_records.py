"""Dose record fields and record types beyond plain doses: lag time and bioavailability
(`gs.Bolus`/`gs.Infusion` ``lag=``, ``bioavailability=``), against the closed forms of
one-compartment kinetics (oral Bateman function, IV infusion) with gradients w.r.t. the
dose fields and the model's parameters against central differences of those closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import assert_grads, central_differences

TS = np.linspace(0.0, 24.0, 33)
TIGHT = dict(rtol=1e-10, atol=1e-12)
DRIVER = None  # the default (the compiled kernel on CPU)


def elimination(t, y, p):
    return jnp.stack([-p["k"] * y[0]])


def oral(t, y, p):
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["k"] * y[1]])


def bateman(t, ka, k, tdose, amount):
    """Central amount after an oral bolus ``amount`` at ``tdose`` (first-order absorption)."""
    s = np.maximum(t - tdose, 0.0)
    return np.where(t <= tdose, 0.0,
                    amount * ka / (ka - k) * (np.exp(-k * s) - np.exp(-ka * s)))


def infusion_exact(t, k, start, rate, dur):
    """Amount in one compartment from an input ``rate`` over ``[start, start + dur]``."""
    infused = np.clip(t - start, 0.0, dur)
    after = np.maximum(t - start - dur, 0.0)
    return np.where(t <= start, 0.0,
                    rate / k * (1.0 - np.exp(-k * infused)) * np.exp(-k * after))


# ------------------------------------------------------------ lag and bioavailability
DOSE_TIMES = np.array([0.5, 8.0, 16.0])  # repeated oral doses: superposition


def test_bolus_lag_and_bioavailability_fields():
    """Repeated oral doses with a lag time and F per subject (n = 2): the superposed
    Bateman functions to 1e-8, and the gradient w.r.t. lag, F, amount, ka and k."""
    def central(lag, F, amount, ka, k):
        dose = gs.Bolus(time=DOSE_TIMES, amount=amount[:, None], cmt=0, lag=lag[:, None],
                        bioavailability=F[:, None])
        return gs.solve(oral, 0.0, 24.0, jnp.zeros((2, 2)), {"ka": ka, "k": k}, ts=TS,
                        doses=[dose], **TIGHT).ys[..., 1]

    def exact(lag, F, amount, ka, k):
        return np.stack([sum(bateman(TS, ka[i], k[i], t + lag[i], F[i] * amount[i])
                             for t in DOSE_TIMES) for i in range(2)])

    args = [np.array([0.37, 1.21]), np.array([0.8, 0.65]), np.array([320.0, 250.0]),
            np.array([1.3, 0.9]), np.array([0.15, 0.3])]
    w = np.cos(np.arange(TS.size))

    def loss(*a):
        c = central(*a)
        return jnp.sum(c * w), c

    # values and gradient from one jitted program (un-jitted, the transform compiles
    # hundreds of small programs)
    (_, got), g = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(5)), has_aux=True))(
        *map(jnp.asarray, args))
    np.testing.assert_allclose(got, exact(*args), rtol=1e-8, atol=1e-8)
    assert_grads(g, central_differences(lambda *a: float(np.sum(exact(*a) * w)), args))


@pytest.mark.parametrize("by", ["rate", "duration"])
def test_infusion_lag_and_bioavailability(by):
    """F with RATE given lengthens the infusion (``F amount / rate``); with DUR given it
    raises the rate (``F amount / dur``), NONMEM's convention. Closed form and gradients
    w.r.t. lag, F, amount, the rate or duration, and k."""
    def ys(lag, F, amount, how, k):
        dose = gs.Infusion(time=jnp.array([1.0, 12.5]), amount=amount, cmt=0, lag=lag,
                           bioavailability=F, **{by: how})
        return gs.solve(elimination, 0.0, 24.0, jnp.zeros(1), {"k": k}, ts=TS, doses=[dose],
                        **TIGHT).ys[:, 0]

    def exact(lag, F, amount, how, k):
        if by == "rate":
            rate, dur = how, F * amount / how
        else:
            rate, dur = F * amount / how, how
        return sum(infusion_exact(TS, k, t + lag, rate, dur) for t in (1.0, 12.5))

    args = [np.array(0.63), np.array(0.7), np.array(300.0),
            np.array(55.0 if by == "rate" else 2.35), np.array(0.25)]
    np.testing.assert_allclose(ys(*map(jnp.asarray, args)), exact(*args), rtol=1e-8, atol=1e-8)
    w = np.sin(np.arange(TS.size) + 0.3)
    assert_grads(jax.grad(lambda *a: jnp.sum(ys(*a) * w), argnums=tuple(range(5)))(
        *map(jnp.asarray, args)),
        central_differences(lambda *a: float(np.sum(exact(*a) * w)), args))


def test_bad_lag_and_bioavailability():
    with pytest.raises(ValueError, match="negative `lag`"):
        gs.DoseSchedule([gs.Bolus(0.0, 1.0, lag=-0.5)])
    with pytest.raises(ValueError, match="negative `bioavailability`"):
        gs.DoseSchedule([gs.Infusion(0.0, 1.0, rate=1.0, bioavailability=-0.1)])
    with pytest.raises(ValueError, match="`lag`"):
        gs.solve(elimination, 0.0, 5.0, jnp.zeros((2, 1)), {"k": jnp.ones(2)},
                 doses=[gs.Bolus(jnp.zeros((2, 1)), 5.0, lag=jnp.zeros((3, 1)))])


# ------------------------------------------------------------------ steady-state doses
II_TERMS = 400  # superposition terms for a dose repeated "forever" (exp(-0.15 * 12 * 400))


@pytest.mark.slow
def test_steady_state_oral_dose_with_lag_against_superposition():
    """NONMEM SS = 1: an oral dose (lag, F) at steady state at tau, every II, after an
    earlier dose the steady state replaces, and a later dose: against the superposition
    sum over the past doses; gradients w.r.t. amount, F, lag, II, tau, ka and k."""
    def central(amount, F, lag, ii, tau, ka, k):
        ss = gs.SteadyState(gs.Bolus(tau, amount, cmt=0, lag=lag, bioavailability=F),
                            interval=ii)
        doses = [gs.Bolus(0.0, 200.0, cmt=0), ss, gs.Bolus(tau + 11.0, 30.0, cmt=0)]
        return gs.solve(oral, 0.0, 24.0, jnp.zeros(2), {"ka": ka, "k": k}, ts=TS,
                        doses=doses, driver=DRIVER, **TIGHT).ys[:, 1]

    def exact(amount, F, lag, ii, tau, ka, k):
        before = np.where(TS <= tau, bateman(TS, ka, k, 0.0, 200.0), 0.0)
        after = sum(bateman(TS, ka, k, tau + lag - j * ii, F * amount) for j in range(II_TERMS))
        return before + np.where(TS > tau, after + bateman(TS, ka, k, tau + 11.0, 30.0), 0.0)

    args = [np.array(150.0), np.array(0.8), np.array(0.37), np.array(12.0), np.array(4.3),
            np.array(1.3), np.array(0.15)]
    np.testing.assert_allclose(central(*map(jnp.asarray, args)), exact(*args), rtol=1e-8,
                               atol=1e-8)
    w = np.cos(np.arange(TS.size))
    assert_grads(jax.grad(lambda *a: jnp.sum(central(*a) * w), argnums=tuple(range(7)))(
        *map(jnp.asarray, args)),
        central_differences(lambda *a: float(np.sum(exact(*a) * w)), args))


@pytest.mark.slow
def test_steady_state_infusion_and_ss2_against_superposition():
    """An infusion at steady state (SS = 1: the periodic orbit with the input on for its
    duration each interval), and an SS = 2 bolus added to the state it meets; gradients
    w.r.t. the infusion's amount and duration, II and k."""
    def ys(amount, dur, ii, k):
        doses = [gs.SteadyState(gs.Infusion(2.2, amount, duration=dur), interval=ii),
                 gs.SteadyState(gs.Bolus(9.1, 40.0), interval=6.0, add=True)]
        return gs.solve(elimination, 0.0, 24.0, jnp.zeros(1), {"k": k}, ts=TS, doses=doses,
                        driver=DRIVER, **TIGHT).ys[:, 0]

    def exact(amount, dur, ii, k):
        inf = sum(infusion_exact(TS, k, 2.2 - j * ii, amount / dur, dur) for j in range(II_TERMS))
        bol = sum(np.where(TS > 9.1 - 6.0 * j, 40.0 * np.exp(-k * (TS - 9.1 + 6.0 * j)), 0.0)
                  for j in range(II_TERMS))
        return np.where(TS > 2.2, inf, 0.0) + np.where(TS > 9.1, bol, 0.0)

    args = [np.array(300.0), np.array(1.7), np.array(8.0), np.array(0.25)]
    np.testing.assert_allclose(ys(*map(jnp.asarray, args)), exact(*args), rtol=1e-8, atol=1e-8)
    w = np.sin(np.arange(TS.size) + 0.3)
    assert_grads(jax.grad(lambda *a: jnp.sum(ys(*a) * w), argnums=tuple(range(4)))(
        *map(jnp.asarray, args)),
        central_differences(lambda *a: float(np.sum(exact(*a) * w)), args))


def mm(t, y, p):
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["vmax"] * y[1] / (p["km"] + y[1])])


@pytest.mark.slow
def test_steady_state_of_michaelis_menten_against_many_intervals_in_scipy():
    """Nonlinear elimination: the SS = 1 trajectory over an interval against SciPy's
    solve_ivp (Radau, rtol 1e-12) simulating 80 dosed intervals from zero (converged: the
    last two agree to 1e-11); the gradient w.r.t. vmax against central differences."""
    from scipy.integrate import solve_ivp

    p = {"ka": 1.1, "vmax": 20.0, "km": 15.0}
    ii, amount, tau = 12.0, 120.0, 3.0
    ts = np.linspace(tau, tau + ii, 13)[1:]

    def rhs(t, y):
        return [-p["ka"] * y[0], p["ka"] * y[0] - p["vmax"] * y[1] / (p["km"] + y[1])]

    y = np.zeros(2)
    ends = []
    for _ in range(80):
        y[0] += amount
        sol = solve_ivp(rhs, (0.0, ii), y, method="Radau", rtol=1e-12, atol=1e-12,
                        t_eval=ts - tau)
        ends.append(sol.y.T)
        y = sol.y[:, -1].copy()
    np.testing.assert_allclose(ends[-1], ends[-2], rtol=1e-11)

    def central(vmax):
        q = {k: jnp.asarray(v) for k, v in p.items()} | {"vmax": vmax}
        return gs.solve(mm, 0.0, tau + ii, jnp.zeros(2), q, ts=ts, driver=DRIVER,
                        doses=[gs.SteadyState(gs.Bolus(tau, amount), interval=ii)],
                        **TIGHT).ys

    np.testing.assert_allclose(central(jnp.asarray(20.0)), ends[-1], rtol=1e-8)
    loss = lambda v: jnp.sum(central(v)[:, 1])
    g = float(jax.grad(loss)(jnp.asarray(20.0)))
    fd = (float(loss(jnp.asarray(20.0 + 1e-5))) - float(loss(jnp.asarray(20.0 - 1e-5)))) / 2e-5
    assert g == pytest.approx(fd, rel=1e-6)


# ------------------------------------------------------------------------------ resets
def _reset_exact(tau, a0, a_inf, dur, a_re, k):
    """A bolus at 0 and an infusion from 2 (stopped by the reset when it runs past tau);
    the reset at tau with a dose then (EVID 4), and a bolus at 15."""
    before = np.where(TS > 0, a0 * np.exp(-k * TS), 0.0) + infusion_exact(TS, k, 2.0, a_inf / dur, dur)
    after = a_re * np.exp(-k * (TS - tau)) + np.where(TS > 15.0, 20.0 * np.exp(-k * (TS - 15.0)),
                                                      0.0)
    return np.where(TS <= tau, before, after)


def _reset_solve(driver, tau, a0, a_inf, dur, a_re, k):
    doses = [gs.Bolus(0.0, a0), gs.Infusion(2.0, a_inf, duration=dur), gs.Reset(tau),
             gs.Bolus(tau, a_re), gs.Bolus(15.0, 20.0)]
    return gs.solve(elimination, 0.0, 24.0, jnp.zeros((1, 1)), {"k": jnp.reshape(k, (1,))},
                    ts=TS, doses=doses, driver=driver, **TIGHT).ys[0, :, 0]


RESET_ARGS = [np.array(7.1), np.array(100.0), np.array(80.0), np.array(9.0), np.array(60.0),
              np.array(0.2)]


def test_reset_against_the_closed_form():
    """EVID 3/4: everything before the reset forgotten, an infusion running across it
    stopped; the gradient w.r.t. the reset time (with its dose), amounts, duration, k."""
    w = np.cos(np.arange(TS.size) * 0.7)

    def loss(*a):
        y = _reset_solve(DRIVER, *a)
        return jnp.sum(y * w), y

    (_, got), g = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(6)), has_aux=True))(
        *map(jnp.asarray, RESET_ARGS))
    np.testing.assert_allclose(got, _reset_exact(*RESET_ARGS), rtol=1e-8, atol=1e-8)
    assert_grads(g, central_differences(lambda *a: float(np.sum(_reset_exact(*a) * w)),
                                        RESET_ARGS))


@pytest.mark.slow
def test_drivers_agree_on_resets_and_steady_states():
    """The planned ensemble (stretches between restarts, a steady state) on every driver:
    values to 1e-12 and gradients to 1e-11 of the kernel's."""
    def run(driver, a):
        doses = [gs.Bolus(0.0, a[1]), gs.Infusion(2.0, a[2], duration=a[3]), gs.Reset(a[0]),
                 gs.Bolus(a[0], a[4]),
                 gs.SteadyState(gs.Bolus(17.3, a[1]), interval=6.0)]
        return jnp.sum(gs.solve(elimination, 0.0, 24.0, jnp.zeros(1), {"k": a[5]}, ts=TS,
                                doses=doses, driver=driver).ys ** 2)

    a = jnp.asarray(np.array([float(x) for x in RESET_ARGS]))
    outs = [jax.value_and_grad(lambda x: run(drv, x))(a)
            for drv in (gs.drivers.Kernel(), gs.drivers.Lanes(), gs.drivers.Batched())]
    for v, g in outs[1:]:
        np.testing.assert_allclose(v, outs[0][0], rtol=1e-12)
        np.testing.assert_allclose(g, outs[0][1], rtol=1e-11, atol=1e-12)


def test_bad_restarts():
    y0, p = jnp.zeros(1), {"k": 0.3}
    with pytest.raises(ValueError, match="non-positive `interval`"):
        gs.DoseSchedule([gs.SteadyState(gs.Bolus(0.0, 1.0), interval=0.0)])
    with pytest.raises(ValueError, match="use DoseSchedule.plan"):  # a mesh has no restarts
        gs.record(elimination, 0.0, 5.0, y0, p, doses=[gs.Bolus(0.0, 1.0), gs.Reset(2.0)])
    with pytest.raises(ValueError, match="must lie in"):  # the input outlasts the interval
        gs.solve(elimination, 0.0, 5.0, y0, p,
                 doses=[gs.SteadyState(gs.Infusion(1.0, 10.0, duration=3.0), interval=2.0)])


# ------------------------------------------------- reading after the doses at a time
def test_ts_after_reads_the_state_after_the_doses_at_its_time():
    """``ts_after``: a save time at a dose time reads the post-dose state (NONMEM: an
    observation record after a dose record at the same time), the default the pre-dose
    one; at t0, at a later bolus, with ``jumps=`` instead of ``doses=``, after an SS = 1
    dose (its steady-state peak), after a reset (zero) and after a reset with a dose."""
    k, a = 0.08, 400.0
    ts = jnp.array([0.0, 0.0, 5.0, 12.0, 12.0, 20.0])
    after = np.array([False, True, False, False, True, False])
    tn = np.asarray(ts)

    def bolus_sum(times, t, aft):
        return sum(a * np.exp(-k * (t - td)) * ((t > td) | ((t == td) & aft)) for td in times)

    expect = bolus_sum((0.0, 12.0), tn, after)
    for ev in (dict(doses=[gs.Bolus(jnp.array([0.0, 12.0]), a)]),
               dict(jumps=(jnp.array([0.0, 12.0]), jnp.full((2, 1), a)))):
        ys = gs.solve(elimination, 0.0, 20.0, jnp.zeros(1), {"k": k}, ts=ts, ts_after=after,
                      **ev, **TIGHT).ys[:, 0]
        np.testing.assert_allclose(ys, expect, rtol=1e-9, atol=1e-9)
    before = gs.solve(elimination, 0.0, 20.0, jnp.zeros(1), {"k": k}, ts=ts,
                      doses=[gs.Bolus(jnp.array([0.0, 12.0]), a)], **TIGHT).ys[:, 0]
    np.testing.assert_allclose(before, bolus_sum((0.0, 12.0), tn, np.zeros(6, bool)),
                               rtol=1e-9, atol=1e-9)

    ts3, a3 = jnp.array([5.0, 12.0, 12.0, 20.0]), np.array([False, False, True, False])
    t3 = np.asarray(ts3)
    first = a * np.exp(-k * t3)
    peak = a / (1 - np.exp(-k * 12.0))  # the SS = 1 bolus's post-dose steady state
    cases = [([gs.SteadyState(gs.Bolus(12.0, a), interval=12.0)],
              [first[0], first[1], peak, peak * np.exp(-k * 8.0)]),
             ([gs.Reset(12.0)], [first[0], first[1], 0.0, 0.0]),
             ([gs.Reset(12.0), gs.Bolus(12.0, 100.0)],
              [first[0], first[1], 100.0, 100.0 * np.exp(-k * 8.0)])]
    for extra, want in cases:
        ys = gs.solve(elimination, 0.0, 20.0, jnp.zeros(1), {"k": k}, ts=ts3, ts_after=a3,
                      doses=[gs.Bolus(0.0, a)] + extra, **TIGHT).ys[:, 0]
        np.testing.assert_allclose(ys, want, rtol=1e-9, atol=1e-9)


def test_bad_ts_after():
    y0, p = jnp.zeros(1), {"k": 0.3}
    with pytest.raises(ValueError, match="`ts_after` needs `ts`"):
        gs.solve(elimination, 0.0, 5.0, y0, p, ts_after=np.array([True]))
    with pytest.raises(ValueError, match="`ts_after` must have the shape"):
        gs.solve(elimination, 0.0, 5.0, y0, p, ts=jnp.array([1.0, 2.0]),
                 ts_after=np.array([True]))
    with pytest.raises(ValueError, match="booleans"):
        gs.solve(elimination, 0.0, 5.0, y0, p, ts=jnp.array([1.0, 2.0]),
                 ts_after=np.array([1, 0]))


# The SS = 1 variant (~15 s of compiles with cold caches) in the slow tier: an SS = 1 dose
# before t0 is checked against the superposition sum in the normal suite by
# test_shifted_origin_restart_before_t0_and_reads_at_t0_and_t1_on_every_driver and
# test_nonmem_conformance.py::test_SS1_dose_before_t0_starts_the_trajectory_at_its_steady_state,
# and gradients through steady states in test_doses.py::test_steady_state_of_repeated_oral_doses.
@pytest.mark.parametrize("record", [pytest.param("ss_oral", marks=pytest.mark.slow),
                                    "reset_dose"])
def test_a_restart_before_t0_gives_the_right_values_to_t1(record):
    """An SS = 1 oral dose (or an EVID 4 reset and dose) at TIME = -2, before t0 = 0:
    every save time up to t1 (the last 2 h too, which once read the state at t1) against
    the superposition sums; the gradient w.r.t. the dose time, ka and k against central
    differences of them, under jit."""
    ts = np.array([0.0, 1.0, 10.0, 30.0, 46.0, 47.0, 47.9])

    def central(tau, ka, k):
        dose = gs.Bolus(tau, 320.0, cmt=0)
        rec = ([gs.SteadyState(dose, interval=12.0)] if record == "ss_oral"
               else [gs.Reset(tau), dose])
        return gs.solve(oral, 0.0, 47.9, jnp.zeros(2), {"ka": ka, "k": k}, ts=jnp.asarray(ts),
                        doses=rec, **TIGHT).ys[:, 1]

    def exact(tau, ka, k):
        n = II_TERMS if record == "ss_oral" else 1
        return sum(bateman(ts, ka, k, tau - j * 12.0, 320.0) for j in range(n))

    args = [np.array(-2.0), np.array(1.5), np.array(0.08)]
    np.testing.assert_allclose(jax.jit(central)(*map(jnp.asarray, args)), exact(*args),
                               rtol=1e-8, atol=1e-8)
    w = np.cos(np.arange(ts.size))
    assert_grads(jax.jit(jax.grad(lambda *a: jnp.sum(central(*a) * w), argnums=(0, 1, 2)))(
        *map(jnp.asarray, args)),
        central_differences(lambda *a: float(np.sum(exact(*a) * w)), args))


@pytest.mark.slow  # ~13 s: first derivatives of steady states are tested in test_doses.py
def test_hessian_through_a_steady_state_against_the_closed_form():
    """The steady state's derivative rule (the implicit function theorem at y*) is itself
    differentiable, so the Hessian of an SS = 1 oral dose's concentrations w.r.t. log ka
    and log k is the closed form's (a one-step Newton derivative with dG/dy held fixed
    misses the terms in d(dG/dy)/dtheta: 87 % off here)."""
    ts = jnp.array([25.0, 28.0, 35.0])
    w = jnp.array([1.0, -0.5, 0.3])

    def central(th):
        p = {"ka": jnp.exp(th[0]), "k": jnp.exp(th[1])}
        dose = gs.SteadyState(gs.Bolus(24.0, 100.0, cmt=0), interval=12.0)
        return w @ gs.solve(oral, 0.0, 36.0, jnp.zeros(2), p, ts=ts, doses=[dose],
                            rtol=1e-11, atol=1e-13).ys[:, 1]

    def exact(th):
        ka, k = jnp.exp(th[0]), jnp.exp(th[1])
        s = ts - 24.0
        return w @ (100.0 * ka / (ka - k) * (jnp.exp(-k * s) / (1 - jnp.exp(-k * 12.0))
                                              - jnp.exp(-ka * s) / (1 - jnp.exp(-ka * 12.0))))

    th = jnp.array([0.4, -2.5])
    # the Hessian (jacfwd of grad, as jax.hessian) and the gradient it differentiates
    # in one pass: no separate compile of the plain gradient
    hess, grad = jax.jacfwd(lambda x: (jax.grad(central)(x),) * 2, has_aux=True)(th)
    np.testing.assert_allclose(grad, jax.grad(exact)(th), rtol=1e-9)
    np.testing.assert_allclose(hess, jax.hessian(exact)(th), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("driver", [gs.drivers.Kernel(), gs.drivers.Lanes(),
                                    gs.drivers.Batched()], ids=["kernel", "lanes", "batched"])
def test_shifted_origin_restart_before_t0_and_reads_at_t0_and_t1_on_every_driver(driver):
    """A time origin t0 = -7, an SS = 1 oral dose 2 h before it, an IV dose into the
    central compartment at t0 read after it (``ts_after``) and a save at t1: every value
    against the superposition sums, on each driver."""
    t0 = -7.0
    ts = np.array([t0, t0 + 1.0, t0 + 10.0, t0 + 30.0, t0 + 47.9])
    doses = [gs.SteadyState(gs.Bolus(t0 - 2.0, 320.0, cmt=0), interval=12.0),
             gs.Bolus(t0, 50.0, cmt=1)]
    ys = gs.solve(oral, t0, ts[-1], jnp.zeros(2), {"ka": 1.5, "k": 0.08}, ts=jnp.asarray(ts),
                  doses=doses, ts_after=np.array([True, False, False, False, False]),
                  driver=driver, **TIGHT).ys[:, 1]
    exact = (sum(bateman(ts, 1.5, 0.08, t0 - 2.0 - 12.0 * j, 320.0) for j in range(II_TERMS))
             + 50.0 * np.exp(-0.08 * (ts - t0)))
    np.testing.assert_allclose(ys, exact, rtol=1e-8)
