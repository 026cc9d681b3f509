"""Dose record fields and record types beyond plain doses: lag time and bioavailability
(`gs.Bolus`/`gs.Infusion` ``lag=``, ``bioavailability=``), against the closed forms of
one-compartment kinetics (oral Bateman function, IV infusion) with gradients w.r.t. the
dose fields and the model's parameters against central differences of those closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs

TS = np.linspace(0.0, 24.0, 33)
TIGHT = dict(rtol=1e-10, atol=1e-12)


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


def central_differences(fn, args, eps=1e-6):
    out = []
    for j, a in enumerate(args):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            up = [x.copy() for x in args]
            dn = [x.copy() for x in args]
            up[j][idx] += eps
            dn[j][idx] -= eps
            g[idx] = (fn(*up) - fn(*dn)) / (2 * eps)
        out.append(g)
    return out


def assert_grads(got, want, rtol=1e-6):
    for j, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=rtol * np.max(np.abs(w)),
                                   err_msg=f"argument {j}")


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
    np.testing.assert_allclose(central(*map(jnp.asarray, args)), exact(*args), rtol=1e-8,
                               atol=1e-8)
    w = np.cos(np.arange(TS.size))
    loss = lambda *a: jnp.sum(central(*a) * w)
    assert_grads(jax.grad(loss, argnums=tuple(range(5)))(*map(jnp.asarray, args)),
                 central_differences(lambda *a: float(np.sum(exact(*a) * w)), args))


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
