"""The mesh capacity against the device's memory (`gradsolve._record.mesh_capacity`): on an
accelerator the default capacity of a large ensemble shrinks until its node times fit, and a
capacity that cannot fit at all is refused before anything is allocated. A CPU reports no
device memory, so these tests set a small artificial one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from gradsolve import _record
from conftest import lotka_volterra

LANES = gs.drivers.Lanes()
N = 64
PER_SLOT = (4 + 2) * 8 * N  # float64 node times and states: 4 + d values a slot


def _problem():
    rng = np.random.default_rng(0)
    p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.4 * (rng.random((N, 4)) - 0.5)))
    y0 = jnp.asarray(1 + 0.5 * rng.random((N, 2)))
    return y0, p, jnp.linspace(0.0, 3.0, 7)


def _loss(y0, ts, **kw):
    def loss(q):
        sol = gs.solve(lotka_volterra, 0.0, 3.0, y0, q, ts=ts, rtol=1e-6, atol=1e-8,
                       driver=LANES, **kw)
        return jnp.sum(sol.ys ** 2), (sol.ys, sol.mesh.times.shape[1] - 1, sol.stats["status"])
    return loss


def test_default_capacity_shrinks_to_fit_and_solves_the_same(monkeypatch):
    """A quarter of the device holds 65 node slots a trajectory: the default capacity is 64
    (4096 halved), and the solve under ``jit`` and its gradient equal those of a capacity
    chosen by hand (the steps taken do not depend on it); so does the eager solve (its
    mesh grows no further)."""
    y0, p, ts = _problem()
    ref = jax.jit(jax.value_and_grad(_loss(y0, ts, max_steps=256), has_aux=True))(p)
    assert ref[0][1][1] == 256
    steps = int(np.max(np.asarray(gs.record(lotka_volterra, 0.0, 3.0, y0, p, ts=ts, rtol=1e-6,
                                            atol=1e-8, driver=LANES).n_steps)))
    assert 16 < steps <= 64  # fits the sized capacity, with room for one halving less
    monkeypatch.setattr(_record, "_DEVICE_MEMORY", 4 * PER_SLOT * 65)
    (val, (ys, cap, status)), grad = jax.jit(jax.value_and_grad(_loss(y0, ts), has_aux=True))(p)
    assert cap == 64 and np.all(np.asarray(status) == 0)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(ref[0][1][0]), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref[1]), rtol=1e-12)
    eager = gs.solve(lotka_volterra, 0.0, 3.0, y0, p, ts=ts, rtol=1e-6, atol=1e-8, driver=LANES)
    np.testing.assert_allclose(np.asarray(eager.ys), np.asarray(ref[0][1][0]), rtol=1e-13)
    assert eager.mesh.capacity <= 64


def test_capacity_that_cannot_fit_is_refused_before_recording(monkeypatch):
    """``max_steps=4096`` where the device holds 65 slots a trajectory: a ``ValueError``
    naming what it needs and what fits, before any record runs; a default capacity that
    the trajectories outgrow fails as ``max_steps`` reached."""
    y0, p, ts = _problem()
    mem = PER_SLOT * 65
    monkeypatch.setattr(_record, "_DEVICE_MEMORY", mem)

    def no_record(*a, **k):
        raise AssertionError("recorded before refusing")

    with monkeypatch.context() as m:
        m.setattr(_record, "record_batched", no_record)
        with pytest.raises(ValueError) as e:
            gs.solve(lotka_volterra, 0.0, 3.0, y0, p, ts=ts, max_steps=4096, driver=LANES)
    need_gb = PER_SLOT * 4097 / 1e9
    msg = str(e.value)
    assert msg.startswith("gs.solve: max_steps=4,096 for 64 trajectories")
    assert f"{need_gb:.1f} GB" in msg and "max_steps=64 or less" in msg
    assert f"at most {mem // (6 * 8 * 4097)} trajectories per call" in msg
    # the default shrinks to 16 here (65 slots / 4 a quarter), too few for these
    with pytest.raises(RuntimeError, match="max_steps"):
        gs.solve(lotka_volterra, 0.0, 3.0, y0, p, ts=ts, rtol=1e-6, atol=1e-8, driver=LANES)
