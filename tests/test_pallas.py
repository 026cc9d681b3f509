"""The Pallas driver (`gs.drivers.Pallas`), run through the Pallas interpreter in float64
(``Pallas(interpret=True)``: the same kernels as on the chip, on CPU), against independent
references: the lanes replay (`gs.drivers.Lanes`, XLA) on the same mesh, and the XLA record
loop (`gs.drivers.Batched`), without and with known-time events (jumps, tstops, doses).
Compiles are the cost here (a few seconds per kernel), so each test checks several things
on one compiled program."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from gradsolve.drivers import auto as _auto
from gradsolve.drivers.pallas import _layout
from conftest import lotka_volterra

PALLAS = gs.drivers.Pallas(interpret=True)
LANES = gs.drivers.Lanes()


class HeunEuler(gs.AbstractExplicitRK):
    """A 2(1) pair without FSAL: the kernels' other path, and small programs to compile."""

    tableau: ClassVar = gs.ButcherTableau(
        a=np.array([[0.0, 0.0], [1.0, 0.0]]), b=np.array([0.5, 0.5]),
        b_error=np.array([-0.5, 0.5]), c=np.array([0.0, 1.0]), fsal=False)
    order: ClassVar = 2
    embedded_order: ClassVar = 1


def forced(t, y, p):
    """Non-autonomous, transcendental, parameters as a dict with a vector leaf."""
    a, w = p["a"], p["w"]
    return jnp.stack([y[1], -a[0] * y[0] - a[1] * jnp.sin(y[1]) + jnp.exp(-0.1 * t) * jnp.cos(w * t)])


def _forced_problem(n=40):
    rng = np.random.default_rng(3)
    p = {"a": jnp.asarray(rng.uniform(0.5, 2.0, (n, 2))), "w": jnp.asarray(rng.uniform(0.5, 3.0, n))}
    y0 = jnp.asarray(rng.uniform(-1.0, 1.0, (n, 2)))
    return forced, y0, p, jnp.linspace(0.0, 6.0, 7)


def _max_rel(a, b) -> float:
    out = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-300))
        out = max(out, rel if np.isfinite(rel) else np.inf)  # (max(0.0, nan) is 0.0)
    return out


@pytest.fixture(scope="module")
def forced_mesh():
    f, y0, p, ts = _forced_problem()
    mesh = gs.record(f, 0.0, 6.0, y0, p, ts=ts, rtol=1e-7, atol=1e-9, driver=gs.drivers.Batched())
    assert np.all(np.asarray(mesh.status) == 0)
    assert len(set(np.asarray(mesh.n_steps).tolist())) > 3  # ragged: each its own n_steps
    return f, y0, p, ts, mesh


def test_layout_round_trip():
    blocks = _layout.blocks_for(300)
    assert (blocks.rows, blocks.n_blocks) == (8, 1)
    assert _layout.blocks_for(32768) == _layout.Blocks(32768, 32, 8)
    x = jnp.arange(300 * 6.0).reshape(300, 2, 3)
    lanes = _layout.to_lanes(x, blocks)
    assert lanes.shape == (2, 3, 8, 128)
    np.testing.assert_array_equal(lanes[1, 2, 0, 5], x[5, 1, 2])  # trajectory 5: row 0, lane 5
    np.testing.assert_array_equal(_layout.from_lanes(lanes, blocks), x)


def _replay_and_grad(f, y0, ts, driver, moved: bool):
    """One compiled program per driver: the replay's outputs and the gradient of a loss
    of them w.r.t. ``y0``, the parameters and (``moved``) the save times, for a mesh given
    as an argument (so meshes of one shape share the program)."""
    def loss(y, q, tt, mesh):
        s = gs.replay(f, mesh, y, q, ts=tt if moved else None, driver=driver)
        return jnp.sum(jnp.sin(s.ys)) + jnp.sum(s.y1 ** 2), (s.ys, s.y1, s.error_ratio, s.route)

    fn = eqx.filter_jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    return lambda mesh, p: fn(y0, p, ts, mesh)


def test_replay_values_and_gradients_equal_lanes(forced_mesh):
    """Ragged mesh, non-autonomous field, dict parameters: states at the save times,
    final states, error ratios and the gradients w.r.t. y0, every parameter leaf and the
    (moved) save times equal the lanes replay's on the same mesh."""
    f, y0, p, ts, mesh = forced_mesh
    (_, (ys, y1, err, route)), grads = _replay_and_grad(f, y0, ts, PALLAS, True)(mesh, p)
    (_, (ys_l, y1_l, err_l, _)), grads_l = _replay_and_grad(f, y0, ts, LANES, True)(mesh, p)
    assert route == "gradsolve-pallas"
    assert _max_rel((ys, y1, err), (ys_l, y1_l, err_l)) <= 1e-10
    assert np.all(np.asarray(err) <= 1.0)  # the mesh holds
    assert _max_rel(grads, grads_l) <= 1e-10
    assert float(np.max(np.abs(np.asarray(grads[2])))) > 0  # save times carry a gradient


def test_replay_without_save_times_and_failed_trajectories(forced_mesh):
    """A solver without FSAL, the adjoint without node-time cotangents (save times not
    differentiated), and a failed trajectory: NaN for it, the others unchanged."""
    f, y0, p, ts, _ = forced_mesh
    mesh = gs.record(f, 0.0, 6.0, y0, p, ts=ts, rtol=1e-4, atol=1e-6, solver=HeunEuler(),
                     driver=gs.drivers.Batched())
    run = _replay_and_grad(f, y0, ts, PALLAS, False)
    (_, (ys, y1, err, _)), grads = run(mesh, p)
    (_, (ys_l, y1_l, err_l, _)), grads_l = _replay_and_grad(f, y0, ts, LANES, False)(mesh, p)
    assert _max_rel((ys, y1, err, grads), (ys_l, y1_l, err_l, grads_l)) <= 1e-10
    broken = eqx.tree_at(lambda m: m.status, mesh, mesh.status.at[3].set(gs.Status.MAX_STEPS))
    ys_b = np.asarray(run(broken, p)[0][1][0])
    assert np.all(np.isnan(ys_b[3]))
    keep = np.arange(y0.shape[0]) != 3
    np.testing.assert_array_equal(ys_b[keep], np.asarray(ys)[keep])


def oral(t, y, p):
    """Absorption from a depot into a central compartment, with a zero-order input into it
    from ``p["on"]`` to ``p["off"]`` (tstops there)."""
    rate = jnp.where((t >= p["on"]) & (t < p["off"]), 2.0, 0.0)
    return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] - p["k"] * y[1] + rate])


# ~20 s in interpret mode on a CPU (where the Pallas driver is never chosen); the replay's
# values and gradients against the lanes replay stay in the normal suite
# (test_replay_values_and_gradients_equal_lanes), and events and doses on the other drivers
# in test_events.py and test_doses.py
@pytest.mark.slow
def test_events_and_doses_equal_lanes():
    """Known-time events (FSAL: the carried stage restarts after each jump and tstop node)
    from doses (boluses, ragged with +inf padding; an infusion: two rate jumps of an extra
    state) merged with jumps of one's own (at t0, twice at once on one row, at a save time
    (read before the jump), at t1) and tstops. The Pallas record takes the XLA record's
    steps, jumps and tstops; on its mesh the Pallas replay's values and its gradients
    w.r.t. y0, the parameters, the save times, the jump times and sizes and every dose
    field equal the lanes replay's: ``gs.solve(..., doses=..., driver=Pallas())``, a record
    then a replay, agrees with the lanes driver's."""
    n = 10
    rng = np.random.default_rng(2)
    p = {"ka": jnp.asarray(rng.uniform(0.8, 1.5, n)), "k": jnp.asarray(rng.uniform(0.1, 0.4, n)),
         "on": jnp.full((n,), 15.0), "off": jnp.full((n,), 17.0)}
    y0 = jnp.asarray(rng.random((n, 2)))
    ts = jnp.array([0.0, 3.5, 6.5, 9.0, 12.5, 15.5, 18.5, 21.5, 24.0])  # 9.0: a jump time
    bolus_t = jnp.asarray(np.stack([rng.uniform(0.2, 1.0, n), rng.uniform(8.2, 8.8, n)], 1))
    bolus_t = bolus_t.at[4, 1].set(jnp.inf)
    dose = (bolus_t, jnp.asarray(rng.uniform(100, 300, (n, 2))),
            jnp.asarray(rng.uniform(3.1, 4.0, (n, 1))), jnp.asarray(rng.uniform(50, 150, (n, 1))),
            jnp.asarray(rng.uniform(1.0, 2.5, (n, 1))))
    jt = jnp.tile(jnp.array([0.0, 9.0, 24.0]), (n, 1)).at[2, 1].set(0.0).at[6, 2].set(jnp.inf)
    js = jnp.where(jnp.isfinite(jt)[..., None], jnp.asarray(rng.uniform(1, 5, (n, 3, 2))), 0.0)
    kw = dict(tstops=jnp.array([15.0, 17.0]), rtol=1e-6, atol=1e-6)

    def doses(bt, ba, it, ia, idur):
        return [gs.Bolus(time=bt, amount=ba, cmt=0),
                gs.Infusion(time=it, amount=ia, duration=idur, cmt=1)]

    mesh = gs.record(oral, 0.0, 24.0, y0, p, ts=ts, doses=doses(*dose), jumps=(jt, js),
                     driver=PALLAS, **kw)
    ref = gs.record(oral, 0.0, 24.0, y0, p, ts=ts, doses=doses(*dose), jumps=(jt, js),
                    driver=gs.drivers.Batched(), **kw)
    for name in ("n_steps", "status", "save_index", "jump_index", "tstop_index"):
        np.testing.assert_array_equal(np.asarray(getattr(mesh, name)),
                                      np.asarray(getattr(ref, name)), err_msg=name)
    assert mesh.jump_index.shape[-1] == 7  # 2 boluses, the infusion's 2 changes, 3 own
    np.testing.assert_allclose(np.asarray(mesh.times), np.asarray(ref.times), rtol=1e-9)

    def run(driver):
        def loss(y, q, tt, a, b, *d):
            s = gs.replay(oral, mesh, y, q, ts=tt, jumps=(a, b), doses=doses(*d),
                          driver=driver)
            return (jnp.sum(jnp.sin(s.ys / 30)) + jnp.sum((s.y1 / 30) ** 2),
                    (s.ys, s.y1, s.error_ratio))

        return jax.jit(jax.value_and_grad(loss, argnums=range(10), has_aux=True))(
            y0, p, ts, jt, js, *dose)

    (_, (ys, y1, err)), grads = run(PALLAS)
    (_, (ys_l, y1_l, err_l)), grads_l = run(LANES)
    assert _max_rel((ys, y1), (ys_l, y1_l)) <= 1e-10
    # the error ratio (a difference of stages: digits cancel) to rounding of the states
    assert _max_rel(err, err_l) <= 1e-8 and np.all(np.asarray(err) <= 1.0)
    for g, g_l in zip(grads, grads_l):
        assert _max_rel(g, g_l) <= 1e-10
    # every one carries a gradient (but the input's switching times: a step of f there)
    grads[1].pop("on"), grads[1].pop("off")
    assert all(np.any(np.asarray(x) != 0) for x in jax.tree_util.tree_leaves(grads))


def test_record_accepts_the_same_steps_as_the_xla_record():
    """Same accepted and rejected steps, save nodes and statuses as the XLA record loop, on
    a ragged ensemble (its meshes replayed: `test_solve_under_jit_...`)."""
    n = 150
    rng = np.random.default_rng(0)
    p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.4 * (rng.random((n, 4)) - 0.5)))
    y0 = jnp.asarray(1 + 0.5 * rng.random((n, 2)))
    ts = jnp.linspace(0.0, 10.0, 11)
    kw = dict(ts=ts, rtol=1e-6, atol=1e-8, max_steps=256)
    ref = gs.record(lotka_volterra, 0.0, 10.0, y0, p, driver=gs.drivers.Batched(), **kw)
    mesh = gs.record(lotka_volterra, 0.0, 10.0, y0, p, driver=PALLAS, **kw)
    assert len(set(np.asarray(ref.n_steps).tolist())) > 3
    for name in ("n_steps", "n_rejected", "status", "save_index"):
        np.testing.assert_array_equal(np.asarray(getattr(mesh, name)),
                                      np.asarray(getattr(ref, name)), err_msg=name)
    # Same steps; their times agree to rounding (each step's error estimate cancels, so
    # last-bit differences in f between the two evaluations move the next step size).
    np.testing.assert_allclose(np.asarray(mesh.times), np.asarray(ref.times), rtol=1e-8,
                               atol=1e-10)
    np.testing.assert_allclose(np.asarray(mesh.y_last), np.asarray(ref.y_last), rtol=1e-8)
    np.testing.assert_allclose(np.asarray(mesh.dt_next), np.asarray(ref.dt_next), rtol=1e-6)


def test_record_in_chunks_of_mesh_rows_equals_one_window():
    """With a VMEM budget too small for a block's whole mesh, the record kernel writes its
    node rows chunk by chunk (lanes that fill a chunk wait for the block's others there):
    the same mesh, bit for bit, as one window, also under ``jax.vmap``."""
    from gradsolve.drivers.pallas._field import pallas_field
    from gradsolve.drivers.pallas._record import pallas_record, record_window

    n, k, max_steps = 150, 11, 256
    rng = np.random.default_rng(0)
    p = jnp.asarray(np.array([1.5, 1.0, 3.0, 1.0]) * (1 + 0.4 * (rng.random((2, n, 4)) - 0.5)))
    y0 = jnp.asarray(1 + 0.5 * rng.random((2, n, 2)))
    ts = jnp.broadcast_to(jnp.linspace(0.0, 10.0, k), (n, k))
    solver = gs.Tsit5()
    field = pallas_field(lotka_volterra, solver, y0[0], p[0]).field
    lane = 8 * 128 * 8  # float64 bytes of one (8, 128) block
    # the fixed buffers (40 pipelined blocks, 14 of state) and 64 node rows, double-buffered
    budget = lane * (2 * 40 + 14) + 2 * lane * 64
    window = record_window(max_steps + 1, 2, 4, k, 8, budget=budget)
    assert window.n_chunks == 5 and window.chunk == 56 and window.rows == 8
    assert record_window(max_steps + 1, 2, 4, k, 8).n_chunks == 1

    def run(y, q, budget=None):
        return pallas_record(field, lotka_volterra, solver, gs.PIDController(), 0.0, 10.0, y,
                             q, ts, 1e-6, 1e-8, None, max_steps, True, True,
                             vmem_budget=budget)

    with pytest.raises(ValueError, match="20000 save times, 0 jumps and 0 tstops"):
        record_window(max_steps + 1, 2, 4, 20000, 4)  # far past VMEM even at 8 node rows
    one = [jax.jit(run)(y0[i], p[i]) for i in range(2)]
    chunked = jax.jit(jax.vmap(lambda y, q: run(y, q, budget)))(y0, p)
    assert int(np.max(np.asarray(chunked.n_steps))) > window.chunk  # lanes crossed chunks
    assert len(set(np.asarray(chunked.n_steps).ravel().tolist())) > 3  # and waited there
    for i in range(2):
        for name in ("times", "n_steps", "n_rejected", "status", "save_index", "y_last",
                     "dt_next"):
            np.testing.assert_array_equal(np.asarray(getattr(chunked, name)[i]),
                                          np.asarray(getattr(one[i], name)), err_msg=name)


def test_solve_under_jit_with_spare_capacity_and_moved_times():
    """``gs.solve`` under ``jit``: the record kernel at full capacity (slots past each
    trajectory's steps unspecified), then the replay with moved, duplicated and pinned save
    times: its gradient (the adjoint kernel) agrees with the lanes driver's solve."""
    f, y0, p, _ = _forced_problem(10)
    ts = jnp.array([0.0, 1.0, 2.5, 2.5, 4.0, 6.0])

    def run(driver):
        def loss(y, q, tt):
            # 57-140 steps a trajectory: every one fits, with capacity to spare
            s = gs.solve(f, 0.0, 6.0, y, q, ts=tt, max_steps=256, solver=HeunEuler(),
                         rtol=1e-2, atol=1e-4, driver=driver)
            return jnp.sum(s.ys ** 2)

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(y0, p, ts)

    out, ref = run(PALLAS), run(LANES)
    # the two records take the same steps, at times equal to rounding (see above)
    assert _max_rel(out, ref) <= 1e-7
    assert np.all(np.isfinite(np.asarray(out[2])))


def test_reasons_say_where_it_does_not_apply(monkeypatch):
    y0, p = jnp.ones((3, 2)), jnp.ones((3, 4))
    assert PALLAS.replay_reason(lotka_volterra, gs.Tsit5(), y0, p) is None
    assert PALLAS.record_reason(lotka_volterra, gs.Dopri5(), y0, p) is None
    # an implicit Diffrax method is not one the kernels run (Rosenbrock methods are:
    # tests/test_pallas_rosenbrock.py)
    import diffrax
    from gradsolve._solver.diffrax_adapter import as_solver

    kvaerno = as_solver(diffrax.Kvaerno5(), "solver")
    assert "explicit" in PALLAS.replay_reason(lotka_volterra, kvaerno, y0, p)
    for reason in (PALLAS.replay_reason, PALLAS.record_reason):  # events run too
        assert reason(lotka_volterra, gs.Tsit5(), y0, p, events=True) is None
    # a primitive Mosaic does not lower is named
    reason = PALLAS.replay_reason(lambda t, y, q: -jnp.expm1(q[0] * y), gs.Tsit5(), y0, p)
    assert "`expm1`" in reason and "Mosaic" in reason
    # off the chip the compiled kernels do not run
    assert "TPU" in gs.drivers.Pallas().replay_reason(lotka_volterra, gs.Tsit5(), y0, p)
    with pytest.raises(ValueError, match="TPU"):
        gs.replay(lotka_volterra, gs.record(lotka_volterra, 0.0, 1.0, y0, p), y0, p,
                  driver=gs.drivers.Pallas())
    # on a TPU: float64 is refused, float32 runs
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert "float64 is not implemented in Mosaic" in gs.drivers.Pallas().replay_reason(
        lotka_volterra, gs.Tsit5(), y0, p)
    assert gs.drivers.Pallas().replay_reason(lotka_volterra, gs.Tsit5(), y0.astype(jnp.float32),
                                             p.astype(jnp.float32)) is None


def test_auto_picks_pallas_only_on_a_tpu_where_it_applies(monkeypatch):
    y32, p32 = jnp.ones((3, 2), jnp.float32), jnp.ones((3, 4), jnp.float32)
    for kind in ("record", "replay"):
        assert not isinstance(gs.drivers.Auto().choose(kind, lotka_volterra, gs.Tsit5(), y32, p32),
                              gs.drivers.Pallas)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    for kind in ("record", "replay"):
        chosen = gs.drivers.Auto().choose(kind, lotka_volterra, gs.Tsit5(), y32, p32)
        assert isinstance(chosen, gs.drivers.Pallas) and not chosen.interpret
        # float64, a stiff solver in float64: the next driver in the order; a stiff one in
        # float32: Pallas (tests/test_pallas_rosenbrock.py); events: Pallas still
        assert not isinstance(_auto.Auto().choose(kind, lotka_volterra, gs.Tsit5(),
                                                  y32.astype(jnp.float64),
                                                  p32.astype(jnp.float64)), gs.drivers.Pallas)
        assert not isinstance(_auto.Auto().choose(kind, lotka_volterra, gs.Rodas5P(),
                                                  y32.astype(jnp.float64),
                                                  p32.astype(jnp.float64)), gs.drivers.Pallas)
        assert isinstance(_auto.Auto().choose(kind, lotka_volterra, gs.Rodas5P(), y32, p32),
                          gs.drivers.Pallas)
        assert isinstance(_auto.Auto().choose(kind, lotka_volterra, gs.Tsit5(), y32, p32,
                                              events=True), gs.drivers.Pallas)
    assert gs.drivers.by_route("gradsolve-pallas") is gs.drivers.Pallas


def test_kernels_lower_for_the_chip():
    """The kernels (record, replay, adjoint with node-time cotangents; each with and
    without known-time events) in float32 lower to Mosaic for a TPU, checked here without
    one (JAX lowers Pallas TPU kernels on any host; compiling them needs the chip,
    ``benchmarks/tpu_session.sh``)."""
    from gradsolve._events import Events, ReplayEvents
    from gradsolve.drivers.base import ReplayLayout, ReplayNodes
    from gradsolve.drivers.pallas._field import pallas_field
    from gradsolve.drivers.pallas._record import pallas_record
    from gradsolve.drivers.pallas._replay import pallas_replay

    n, k, s1, f32 = 300, 5, 33, jnp.float32
    y0, p = jnp.ones((n, 2), f32), jnp.ones((n, 4), f32)
    solver = gs.Tsit5()
    field = pallas_field(lotka_volterra, solver, y0, p).field
    times = jnp.tile(jnp.linspace(0.0, 1.0, s1, dtype=f32), (n, 1))
    save = jnp.tile(jnp.arange(k, dtype=jnp.int32) * 8, (n, 1))
    jidx = jnp.tile(jnp.array([10, 20], jnp.int32), (n, 1))
    ev = ReplayEvents(jidx, jidx - 1, times[:, 9:11], jnp.ones((n, 2, 2), f32),
                      jnp.concatenate([jidx, jidx + 3], axis=1))
    nodes = ReplayNodes(times, jnp.full((n,), s1 - 1, jnp.int32), save, times[:, :k] * 1,
                        jnp.ones((n, k), bool))
    layout = ReplayLayout(None, 8, "tpu")

    def grad(y, q, tm, jt, js, with_events):
        def loss(y, q, tm, jt, js):
            ev_ = ev._replace(jump_times=jt, jump_sizes=js) if with_events else None
            out = pallas_replay(field, lotka_volterra, solver,
                                nodes._replace(tsave=tm, events=ev_), y, q, 1e-5, 1e-7, True,
                                layout, False)
            return jnp.sum(out.ys ** 2)
        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(y, q, tm, jt, js)

    def record(y, q, jt, js, with_events):
        events = Events(jt, js, jnp.full((n, 1), 0.5, f32)) if with_events else None
        return pallas_record(field, lotka_volterra, solver, gs.PIDController(), f32(0.0),
                             f32(1.0), y, q, times[:, :k], f32(1e-5), f32(1e-7), None, 64,
                             False, False, events).times

    def chunked(y, q):  # mesh rows in chunks (a small VMEM budget), under jax.vmap
        return jax.vmap(lambda y, q: pallas_record(
            field, lotka_volterra, solver, gs.PIDController(), f32(0.0), f32(1.0), y, q,
            times[:, :k], f32(1e-5), f32(1e-7), None, 512, False, False, None,
            vmem_budget=2**20).times)(y, q)

    text = jax.jit(chunked).trace(y0[None], p[None]).lower(lowering_platforms=("tpu",))
    assert "tpu_custom_call" in text.as_text()
    for with_events in (False, True):
        grad_args = (y0, p, times[:, :k], ev.jump_times, ev.jump_sizes)
        for fn, args in ((grad, grad_args), (record, (y0, p, ev.jump_times, ev.jump_sizes))):
            try:
                text = jax.jit(fn, static_argnums=len(args)).trace(*args, with_events).lower(
                    lowering_platforms=("tpu",)).as_text()
            except ValueError as e:  # a lowering rule that asks the (absent) chip its version
                if "TPU device kind" in str(e):
                    pytest.skip(f"this JAX lowers a rule only on a TPU: {e}")
                raise
            assert "tpu_custom_call" in text
