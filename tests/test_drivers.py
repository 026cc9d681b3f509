"""The drivers (`gs.drivers`): how a record, a replay or a solve runs.

Every driver that applies replays ONE recorded mesh to the batched driver's values and
gradients (w.r.t. ``y0``, every ``params`` leaf and ``ts``) to rounding, on ragged
ensembles; the batched driver itself is checked against independent references (Diffrax
``StepTo`` on the same mesh, central differences, ``d y(t_j)/d t_j = f(t_j, y_j)``).
``Solution.route`` names the driver that ran; an explicit driver that does not apply is a
``ValueError`` giving its reason; the Diffrax driver's adaptive solve is
``jax.vmap(diffrax.diffeqsolve)``; drivers are static under ``jit``; ``gs.clear_caches``
changes no value.
"""

import functools
import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import decay, kernel_builds, lotka_volterra, van_der_pol
from gradsolve.drivers.kernel.driver import ROSENBROCK_MAX_STATES

RTOL = 1e-12  # same steps on the same mesh: agreement to rounding (float64)
RECORD_TOL = dict(rtol=1e-7, atol=1e-9)

DRIVERS = {
    "Kernel": gs.drivers.Kernel,
    "Lanes": gs.drivers.Lanes,
    "Batched": gs.drivers.Batched,
    "Diffrax": gs.drivers.Diffrax,
}
ROUTES = {
    "Kernel": "gradsolve-kernel",
    "Lanes": "gradsolve-lanes",
    "Batched": "gradsolve-batched",
    "Diffrax": "diffrax-diffeqsolve",
}
SOLVERS = {"Tsit5": gs.Tsit5, "Dopri5": gs.Dopri5, "Vern7": gs.Vern7}
TWINS = {"Tsit5": diffrax.Tsit5, "Dopri5": diffrax.Dopri5}  # Diffrax takes the same steps


def forced(t, y, p):
    """Non-autonomous and transcendental; a dict parameter with a per-state vector leaf."""
    return -p["k"] * y + jnp.sin(t)


def coupled(t, y, p):
    """A matrix in nested dict parameters (``dot_general``), forcing and a cubic term."""
    return p["lin"]["A"] @ y + p["b"] * jnp.cos(t) - 0.1 * y ** 3


@functools.cache
def _problem(name):
    """``(f, t1, y0 (n, d), params, ts)``: ragged ensembles (parameters spread so that
    step counts differ), ``ts`` (k = 6, both ends pinned, interior ones mesh nodes) or None."""
    if name == "lv":
        n = 6
        p = jnp.array([1.5, 1.0, 3.0, 1.0]) * jnp.geomspace(0.6, 2.0, n)[:, None]
        y0 = jnp.ones((n, 2)) * jnp.linspace(0.8, 1.2, n)[:, None]
        return lotka_volterra, 4.0, y0, p, jnp.linspace(0.0, 4.0, 6)
    if name == "vdp":
        n = 5
        p = {"mu": jnp.linspace(0.3, 2.5, n)}
        y0 = jnp.stack([jnp.linspace(1.0, 2.0, n), jnp.zeros(n)], axis=1)
        return van_der_pol, 4.0, y0, p, None
    if name == "forced":
        n = 7
        p = {"k": jnp.stack([jnp.geomspace(0.2, 5.0, n), jnp.linspace(1.0, 0.5, n)], axis=1)}
        y0 = jnp.stack([jnp.linspace(-1.0, 1.0, n), jnp.ones(n)], axis=1)
        return forced, 3.0, y0, p, jnp.array([0.0, 0.4, 1.1, 1.7, 2.5, 3.0])
    if name == "coupled":
        n = 8
        rng = np.random.default_rng(7)
        rot = jnp.array([[-0.5, 1.0], [-1.0, -0.5]])
        a = jnp.asarray(rng.normal(size=(n, 2, 2))) + rot * jnp.linspace(0.5, 3.0, n)[:, None, None]
        p = {"lin": {"A": a}, "b": jnp.asarray(rng.normal(size=(n, 2)))}
        return coupled, 3.0, jnp.asarray(rng.normal(size=(n, 2))), p, None
    raise KeyError(name)


# (problem, solver) pairs: every problem once, every solver at least once (each pair costs
# compiled-kernel builds and XLA compiles, the Diffrax driver's the most); Tsit5/Dopri5 also
# run on the Diffrax driver, with and without a time-dependent field.
CASES = [("lv", "Tsit5"), ("vdp", "Vern7"), ("forced", "Dopri5"), ("coupled", "Vern7")]
# Fields the lanes replay must take (few states, short expressions); `coupled` (a matrix
# product) may go either way (`gs.drivers.Lanes` decides by the size of the field).
LANES_FIELDS = {"lv", "vdp", "forced"}


KERNEL = kernel_builds()


def _expected_to_apply(problem, solver, driver):
    """True/False: must (not) apply; None: either."""
    if driver == "Batched":
        return True
    if driver == "Kernel":
        return KERNEL  # explicit solvers, translatable fields, a compiler
    if driver == "Lanes":
        return True if problem in LANES_FIELDS else None
    return solver in TWINS  # Diffrax: gs.Tsit5/gs.Dopri5 run as their Diffrax twins


@functools.cache
def _mesh(problem, solver):
    f, t1, y0, p, ts = _problem(problem)
    mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, solver=SOLVERS[solver](), **RECORD_TOL)
    steps = np.asarray(mesh.n_steps)
    assert np.all(np.asarray(mesh.status) == 0)
    assert len(set(steps.tolist())) >= 3, steps  # ragged
    return mesh


@functools.cache
def _save_times(problem, solver):
    """``None`` without ``ts``; else ``(n, k)`` save times for the replays: the recorded ones
    with each interior one moved by a quarter of the gap to its nearer neighbouring node (so
    its node moves, crossing none); the ends stay pinned."""
    if _problem(problem)[4] is None:
        return None
    mesh = _mesh(problem, solver)
    times, idx = np.asarray(mesh.times), np.asarray(mesh.save_index)
    rows = np.arange(times.shape[0])[:, None]
    inner = idx[:, 1:-1]
    gap = np.minimum(times[rows, inner] - times[rows, inner - 1],
                     times[rows, inner + 1] - times[rows, inner])
    moved = np.asarray(mesh.ts).copy()
    moved[:, 1:-1] += 0.25 * gap * np.where(np.arange(inner.shape[1]) % 2, -1.0, 1.0)
    return jnp.asarray(moved)


def _loss(sol):
    return jnp.sum(sol.ys ** 2) + jnp.sum(sol.y1)


@functools.cache
def _replayed(problem, solver, driver):
    """Values, error ratio and gradients of ``_loss`` of one driver's replay of the mesh:
    a dict. With ``ts``, the replay is given `_save_times` (interior ones move their node,
    differentiably); Diffrax's ``ts`` gradient is not part of its contract."""
    f, _, y0, p, ts = _problem(problem)
    mesh = _mesh(problem, solver)
    drv = DRIVERS[driver]()
    routes = []

    def loss(y, q, tt):
        sol = gs.replay(f, mesh, y, q, ts=tt, driver=drv)
        routes.append(sol.route)
        return _loss(sol), (sol.ys, sol.y1, sol.error_ratio)

    tt = _save_times(problem, solver)
    argnums = (0, 1) if tt is None or driver == "Diffrax" else (0, 1, 2)
    (_, (ys, y1, err)), grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(y0, p, tt)
    out = {"ys": ys, "y1": y1, "error_ratio": err, "g_y0": grads[0], "g_p": grads[1],
           "g_ts": grads[2] if len(grads) == 3 else None}
    assert set(routes) == {ROUTES[driver]}, routes
    return out


@functools.cache
def _plain_ys(problem, solver):
    """The batched replay's states at the recorded save times (``ts`` not given)."""
    f, _, y0, p, _ = _problem(problem)
    return gs.replay(f, _mesh(problem, solver), y0, p, driver=gs.drivers.Batched()).ys


def _agree(got, want, rtol=RTOL, what=""):
    """Norm-wise relative agreement of every leaf: ``|a - b| <= rtol * max(|b|, tiny)``."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want), what
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                            jax.tree_util.tree_leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        name = what + jax.tree_util.keystr(path)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert np.all(np.isfinite(a)), name
        err, scale = np.linalg.norm(a - b), max(np.linalg.norm(b), np.finfo(np.float64).tiny)
        assert err <= rtol * scale, f"{name}: |a - b| = {err:.3e}, |b| = {scale:.3e} ({err / scale:.2e} relative)"


# --- 1. every driver that applies equals the batched driver on one mesh ---------------------


# A kernel build (~10 s) is most of a Kernel case: Lotka-Volterra with Tsit5 on the kernel
# is compared with the XLA replay in test_kernel.py (test_kernel_matches_xla_replay), and
# Vern7 on the kernel here with `coupled` (nested dict parameters), so those two Kernel
# cases run in the slow tier.
SLOW_CASES = {("lv", "Tsit5", "Kernel"), ("vdp", "Vern7", "Kernel")}


@pytest.mark.parametrize("problem, solver, driver", [
    pytest.param(p, s, d, id=f"{p}-{s}-{d}",
                 marks=[pytest.mark.slow] if (p, s, d) in SLOW_CASES else [])
    for p, s in CASES for d in DRIVERS])
def test_replay_drivers_agree_with_batched(problem, solver, driver):
    f, _, y0, p, ts = _problem(problem)
    mesh = _mesh(problem, solver)
    drv = DRIVERS[driver]()
    reason = drv.replay_reason(f, SOLVERS[solver](), y0, p)
    expected = _expected_to_apply(problem, solver, driver)
    if expected is not None:
        assert (reason is None) == expected, reason
    if reason is not None:
        assert isinstance(reason, str) and reason.strip()
        with pytest.raises(ValueError, match=re.escape(reason)):
            gs.replay(f, mesh, y0, p, driver=drv)
        return
    got, ref = _replayed(problem, solver, driver), _replayed(problem, solver, "Batched")
    for key in ("ys", "y1", "g_y0", "g_p"):
        _agree(got[key], ref[key], what=key)
    if got["g_ts"] is not None:
        _agree(got["g_ts"], ref["g_ts"], what="g_ts")
        assert np.abs(np.asarray(got["g_ts"])[:, 1:-1]).max() > 0  # interior ts are nodes
    err = np.asarray(got["error_ratio"])
    if driver == "Diffrax":
        assert np.all(np.isnan(err))  # Diffrax reports no per-step error on a fixed mesh
    else:
        # The error estimate is a difference of close solutions: rounding shows sooner.
        np.testing.assert_allclose(err, ref["error_ratio"], rtol=1e-6)
        if ts is None:  # replayed where it was recorded (moved save times change steps)
            assert np.all(err <= 1.0 + 1e-6)


# --- 1b. the batched driver against independent references, once per problem ---------------

REFERENCE_SOLVER = dict(CASES)
# Diffrax StepTo on the same mesh (a twin solver needed), or central differences (cheaper).
REFERENCE = {"lv": "stepto", "vdp": "fd", "forced": "fd", "coupled": "fd"}


def _diffrax_stepto(f, dsolver, times, y0, p, ts):
    """Diffrax on the given nodes: states at ``ts`` (if any) and at the last node."""
    saveat = diffrax.SaveAt(t1=True) if ts is None else diffrax.SaveAt(ts=ts, t1=True)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, a: f(t, y, a)), dsolver, times[0], times[-1], None, y0,
        args=p, saveat=saveat, stepsize_controller=diffrax.StepTo(ts=times),
        max_steps=len(times) + 1)
    return sol.ys


@pytest.mark.parametrize("problem", sorted(REFERENCE_SOLVER))
def test_batched_replay_against_an_independent_reference(problem):
    solver = REFERENCE_SOLVER[problem]
    f, _, y0, p, ts = _problem(problem)
    mesh = _mesh(problem, solver)
    ref = _replayed(problem, solver, "Batched")
    tsave = _save_times(problem, solver)
    i = 3  # one member of the ensemble
    pi = jax.tree_util.tree_map(lambda x: x[i], p)
    ti = None if ts is None else tsave[i]
    if REFERENCE[problem] == "stepto":
        # Diffrax with StepTo on trajectory i's nodes (the save nodes moved to ``tsave``):
        # values and gradients.
        times = np.array(mesh.times[i, : int(mesh.n_steps[i]) + 1])
        if ts is not None:
            times[np.asarray(mesh.save_index[i])] = np.asarray(ti)
        times = jnp.asarray(times)

        def one(y, q):
            ys = _diffrax_stepto(f, TWINS[solver](), times, y, q, ti)
            body = ys[:-1] if ts is not None else ys[-1:]
            return jnp.sum(body ** 2) + jnp.sum(ys[-1]), ys

        (_, ys), (g_y, g_p) = jax.jit(jax.value_and_grad(one, argnums=(0, 1), has_aux=True))(y0[i], pi)
        _agree(ref["ys"][i], ys[:-1] if ts is not None else ys[-1:], what="ys")
        _agree(ref["y1"][i], ys[-1], what="y1")
        _agree(ref["g_y0"][i], g_y, what="g_y0")
        _agree(jax.tree_util.tree_map(lambda x: x[i], ref["g_p"]), g_p, what="g_p")
    else:
        # Central differences of the batched replay on the same mesh: one entry of each
        # params leaf and of y0 of trajectory i.
        def loss(y, q):
            return float(_loss(gs.replay(f, mesh, y, q, ts=tsave, driver=gs.drivers.Batched())))

        eps = 1e-5
        leaves, treedef = jax.tree_util.tree_flatten(p)
        g_leaves = jax.tree_util.tree_leaves(ref["g_p"])
        for j, (leaf, g) in enumerate(zip(leaves, g_leaves)):
            idx = (i,) + (0,) * (leaf.ndim - 1)

            def moved(s, j=j, leaf=leaf, idx=idx):
                new = list(leaves)
                new[j] = leaf.at[idx].add(s)
                return jax.tree_util.tree_unflatten(treedef, new)

            fd = (loss(y0, moved(eps)) - loss(y0, moved(-eps))) / (2 * eps)
            np.testing.assert_allclose(np.asarray(g)[idx], fd, rtol=1e-6)
        fd = (loss(y0.at[i, 1].add(eps), p) - loss(y0.at[i, 1].add(-eps), p)) / (2 * eps)
        np.testing.assert_allclose(np.asarray(ref["g_y0"])[i, 1], fd, rtol=1e-6)
    if ts is not None:
        # A save time is a mesh node: d y(t_j) / d t_j = f(t_j, y_j) to the solver's
        # accuracy, so d loss / d t_j = 2 y_j . f(t_j, y_j) (pinned ends included).
        yj = np.asarray(ref["ys"][i])
        fj = np.stack([np.asarray(f(ti[j], ref["ys"][i, j], pi)) for j in range(len(ti))])
        expected = 2 * np.sum(yj * fj, axis=1)
        np.testing.assert_allclose(np.asarray(ref["g_ts"])[i], expected, rtol=1e-4,
                                   atol=1e-5 * np.abs(expected).max())


# --- 2. route names the driver that ran ------------------------------------------------------


def _decay_ensemble(states: int = 1):
    """``y' = -k y``, ``y(0) = 1`` (``states`` copies): closed form ``exp(-k t)``."""
    return decay, jnp.ones((3, states)), {"k": jnp.array([[0.5], [1.0], [2.0]])}


def test_auto_route_names_the_driver_that_ran():
    f, _, y0, p, ts = _problem("lv")
    mesh = _mesh("lv", "Tsit5")
    order = ["Kernel", "Lanes", "Batched"]
    first = next(d for d in order if DRIVERS[d]().replay_reason(f, gs.Tsit5(), y0, p) is None)
    assert first == ("Kernel" if KERNEL else "Lanes")
    for drv in (None, gs.drivers.Auto()):
        kw = {} if drv is None else {"driver": drv}
        sol = gs.replay(f, mesh, y0, p, **kw)
        assert sol.route == ROUTES[first]
        _agree(sol.ys, _plain_ys("lv", "Tsit5"))
    # A stiff solver: the kernel where it builds (Rosenbrock methods in loop form), else
    # the batched driver (the lanes replay takes explicit solvers only).
    fd, yd, kd = _decay_ensemble()
    sol = gs.replay(fd, _stiff_mesh("Rodas5P"), yd, kd)
    assert sol.route == ("gradsolve-kernel" if KERNEL else "gradsolve-batched")
    np.testing.assert_allclose(sol.y1, np.exp(-np.asarray(kd["k"])), rtol=1e-5)
    tsd = jnp.array([0.5, 1.0])
    # No error estimate: Diffrax in constant steps dt0, i.e. explicit Euler exactly.
    sol = gs.solve(fd, 0.0, 1.0, yd, kd, ts=tsd, solver=diffrax.Euler(), dt0=0.05)
    assert sol.route == "diffrax-diffeqsolve" and sol.mesh is None
    euler = (1 - 0.05 * np.asarray(kd["k"])) ** np.array([10, 20])
    np.testing.assert_allclose(sol.ys[..., 0], euler, rtol=1e-12)


def test_by_route_names_each_driver_and_the_kernel_alone_is_ragged():
    for key, route in ROUTES.items():
        assert gs.drivers.by_route(route) is DRIVERS[key]
        assert DRIVERS[key].ragged == (key == "Kernel")
    with pytest.raises(ValueError, match="no driver is named 'nope'"):
        gs.drivers.by_route("nope")


@pytest.mark.skipif(not KERNEL, reason="needs the compiled kernel")
def test_ragged_replay_is_unchanged_by_unused_step_slots():
    # what `ragged` lets a caller do: give a mesh room to grow without changing a value
    f, _, y0, p, ts = _problem("lv")
    mesh = _mesh("lv", "Tsit5")
    roomy = mesh.to_host().with_capacity(4 * mesh.capacity).to_device()
    loss = lambda m: jax.value_and_grad(
        lambda q: jnp.sum(gs.replay(f, m, y0, q, driver=gs.drivers.Kernel()).ys ** 2))(p)
    (v1, g1), (v2, g2) = loss(mesh), loss(roomy)
    assert float(v1) == float(v2)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))


def test_diffrax_solver_replays_on_the_batched_and_diffrax_drivers():
    """A Diffrax solver with an error estimate records a mesh; the batched driver replays it
    through the solver's own ``step``, the Diffrax driver with ``StepTo``: same values, and
    the closed form ``exp(-k t)``."""
    fd, yd, kd = _decay_ensemble()
    ts = jnp.array([0.5, 1.0])
    mesh = gs.record(fd, 0.0, 1.0, yd, kd, ts=ts, solver=diffrax.Bosh3(), rtol=1e-8, atol=1e-10)
    batched = gs.replay(fd, mesh, yd, kd, driver=gs.drivers.Batched())
    assert batched.route == "gradsolve-batched/diffrax.Bosh3"
    assert gs.replay(fd, mesh, yd, kd).route == batched.route  # Auto
    ref = gs.replay(fd, mesh, yd, kd, driver=gs.drivers.Diffrax())
    # the driver's name (the solver may be appended, as for the batched driver)
    assert ref.route in (ROUTES["Diffrax"], ROUTES["Diffrax"] + "/diffrax.Bosh3"), ref.route
    _agree((ref.ys, ref.y1), (batched.ys, batched.y1))
    np.testing.assert_allclose(batched.ys[..., 0], np.exp(-np.asarray(kd["k"]) * np.asarray(ts)), rtol=1e-6)


# --- 3. inapplicable explicit choices --------------------------------------------------------


class OwnStepRodas5P(gs.Rodas5P):
    """Rodas5P with a ``step`` of its own: the kernel translates such a step whole, on at
    most ROSENBROCK_MAX_STATES states (Rodas5P itself runs on any number)."""

    def step(self, f, t0, h, y0, params, state):
        return super().step(f, t0, h, y0, params, state)


SOLVERS_ALL = {**SOLVERS, "Rodas5P": gs.Rodas5P, "Rosenbrock23": gs.Rosenbrock23,
               "OwnStepRodas5P": OwnStepRodas5P}


@functools.cache
def _stiff_mesh(solver, states: int = 1):
    fd, yd, kd = _decay_ensemble(states)
    return gs.record(fd, 0.0, 1.0, yd, kd, solver=SOLVERS_ALL[solver]())


# The kernel runs a Rosenbrock method with a step of its own on at most
# ROSENBROCK_MAX_STATES states: refused past it
_ROSENBROCK_PAST_CAP = ROSENBROCK_MAX_STATES + 1


@pytest.mark.parametrize("driver, solver", [("Kernel", "OwnStepRodas5P"),
                                            ("Lanes", "Rosenbrock23"),
                                            ("Diffrax", "Vern7")])
def test_inapplicable_explicit_driver_is_a_value_error_with_its_reason(driver, solver):
    if solver == "Vern7":  # a case of the replay test: its mesh is already recorded
        f, t1, y0, p, _ = _problem("vdp")
        mesh = _mesh("vdp", solver)
    else:
        states = _ROSENBROCK_PAST_CAP if driver == "Kernel" else 1
        (f, y0, p), t1 = _decay_ensemble(states), 1.0
        mesh = _stiff_mesh(solver, states)
    drv, slv = DRIVERS[driver](), SOLVERS_ALL[solver]()
    reason = drv.replay_reason(f, slv, y0, p)
    assert isinstance(reason, str) and reason.strip()
    with pytest.raises(ValueError, match=re.escape(reason)):
        gs.replay(f, mesh, y0, p, driver=drv)
    with pytest.raises(ValueError) as info:
        gs.solve(f, 0.0, t1, y0, p, solver=slv, driver=drv)
    # gs.solve may refuse at its record (Kernel) or at its replay; the Diffrax driver solves
    # without recording, so its refusal must be about the solver.
    record_reason = drv.record_reason(f, slv, y0, p)
    allowed = [reason] if driver == "Diffrax" or record_reason is None else [reason, record_reason]
    assert any(r in str(info.value) for r in allowed), str(info.value)
    if driver == "Kernel":
        assert isinstance(record_reason, str) and record_reason.strip()
        with pytest.raises(ValueError, match=re.escape(record_reason)):
            gs.record(f, 0.0, t1, y0, p, solver=slv, driver=drv)
    # the batched driver takes every gradsolve solver
    assert gs.drivers.Batched().replay_reason(f, slv, y0, p) is None
    assert gs.drivers.Batched().record_reason(f, slv, y0, p) is None


def test_diffrax_driver_does_not_record():
    f, _, y0, p, ts = _problem("lv")
    reason = gs.drivers.Diffrax().record_reason(f, gs.Tsit5(), y0, p)
    assert isinstance(reason, str) and reason.strip()
    with pytest.raises(ValueError, match=re.escape(reason)):
        gs.record(f, 0.0, 4.0, y0, p, ts=ts, driver=gs.drivers.Diffrax())


def test_reasons_are_none_where_a_driver_applies():
    f, _, y0, p, _ = _problem("lv")
    tsit = gs.Tsit5()
    if KERNEL:
        assert gs.drivers.Kernel().record_reason(f, tsit, y0, p) is None
        assert gs.drivers.Kernel().replay_reason(f, tsit, y0, p) is None
    assert gs.drivers.Lanes().replay_reason(f, tsit, y0, p) is None
    assert gs.drivers.Lanes().record_reason(f, tsit, y0, p) is None  # the XLA record loop
    assert gs.drivers.Diffrax().replay_reason(f, tsit, y0, p) is None
    assert gs.drivers.Diffrax().replay_reason(f, gs.Dopri5(), y0, p) is None
    for drv in DRIVERS.values():
        assert isinstance(drv.name, str) and drv.name == drv().name
    assert [DRIVERS[d].name for d in DRIVERS] == [ROUTES[d] for d in DRIVERS]
    # a field with a while loop is not translated: neither the kernel nor the lanes replay take it
    looped = lambda t, y, q: jax.lax.while_loop(lambda c: c[0] < 2,
                                                lambda c: (c[0] + 1, c[1] * q[0]), (0, -y))[1]
    for drv in (gs.drivers.Kernel(), gs.drivers.Lanes()):
        reason = drv.replay_reason(looped, tsit, y0, p)
        assert isinstance(reason, str) and reason.strip()
    assert gs.drivers.Batched().replay_reason(looped, tsit, y0, p) is None


def test_diffrax_driver_reason_accepts_diffrax_solvers():
    """The Diffrax driver applies to Diffrax solvers, passed as a user passes them to
    ``gs.record``/``gs.solve`` (``solver=diffrax.Bosh3()``); the kernel and the lanes
    replay (gradsolve's explicit solvers only) do not."""
    f, _, y0, p, _ = _problem("lv")
    assert gs.drivers.Batched().replay_reason(f, diffrax.Bosh3(), y0, p) is None
    assert gs.drivers.Diffrax().replay_reason(f, diffrax.Bosh3(), y0, p) is None
    for drv in (gs.drivers.Kernel(), gs.drivers.Lanes()):
        reason = drv.replay_reason(f, diffrax.Bosh3(), y0, p)
        assert isinstance(reason, str) and reason.strip()


# --- 4. the Diffrax driver's adaptive solve ----------------------------------------------------


def test_diffrax_solve_is_vmapped_diffeqsolve_and_agrees_with_auto():
    """The Diffrax driver's adaptive solve is ``jax.vmap(diffrax.diffeqsolve)`` with
    ``PIDController`` at the same tolerances, to rounding (its gradients on a mesh are the
    replay test's); gradsolve's own solve takes its own mesh and agrees to tolerance."""
    f, t1, y0, p, ts = _problem("lv")
    tol = dict(rtol=1e-8, atol=1e-10)
    sol = gs.solve(f, 0.0, t1, y0, p, ts=ts, driver=gs.drivers.Diffrax(), **tol)
    assert sol.route == "diffrax-diffeqsolve" and sol.mesh is None
    assert np.all(np.isnan(np.asarray(sol.error_ratio)))

    @jax.jit
    def reference(y, q):
        def one(a, b):
            out = diffrax.diffeqsolve(
                diffrax.ODETerm(lambda t, y_, args: f(t, y_, args)), diffrax.Tsit5(), 0.0, t1,
                None, a, args=b, saveat=diffrax.SaveAt(ts=ts, t1=True),
                stepsize_controller=diffrax.PIDController(**tol))
            return out.ys[:-1], out.ys[-1], out.stats["num_accepted_steps"]

        return jax.vmap(one)(y, q)

    ys, y1, steps = reference(y0, p)
    np.testing.assert_array_equal(sol.stats["num_accepted_steps"], steps)
    _agree((sol.ys, sol.y1), (ys, y1))
    auto = gs.solve(f, 0.0, t1, y0, p, ts=ts, **tol)
    assert auto.route == ROUTES["Kernel" if KERNEL else "Lanes"] and auto.mesh is not None
    steps_a = np.asarray(auto.stats["num_accepted_steps"])
    assert np.all(np.abs(steps_a - np.asarray(steps)) <= 0.2 * np.asarray(steps) + 2)
    _agree((auto.ys, auto.y1), (ys, y1), rtol=1e-6)


# --- 5. drivers are static: closed over, or static arguments, under jit ---------------------


def test_drivers_are_hashable_static_modules():
    for name, cls in DRIVERS.items():
        assert cls() == cls() and hash(cls()) == hash(cls())
        assert cls() != gs.drivers.Auto()
        assert isinstance(cls(), gs.drivers.AbstractDriver)
    assert gs.drivers.Kernel() != gs.drivers.Lanes()
    assert len({cls() for cls in DRIVERS.values()}) == len(DRIVERS)


@pytest.mark.parametrize("driver", list(DRIVERS))
def test_replay_under_jit_equals_eager(driver):
    """The driver closed over by a jitted function: the eager values, and for the kernel and
    lanes replays (whose adjoints are their own) the eager gradients w.r.t. y0, params, ts."""
    problem, solver = "lv", "Tsit5"
    f, _, y0, p, ts = _problem(problem)
    mesh = _mesh(problem, solver)
    drv = DRIVERS[driver]()
    if drv.replay_reason(f, SOLVERS[solver](), y0, p) is not None:
        pytest.skip(f"{driver} does not apply here")
    eager = _replayed(problem, solver, driver)

    def loss(y, q, tt):
        sol = gs.replay(f, mesh, y, q, ts=tt, driver=drv)  # drv closed over: static
        return _loss(sol), (sol.ys, sol.y1)

    if driver in ("Kernel", "Lanes"):
        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
        (_, (ys, y1)), grads = fn(y0, p, _save_times(problem, solver))
        _agree([ys, y1, *grads], [eager[k] for k in ("ys", "y1", "g_y0", "g_p", "g_ts")])
    else:  # compiling these gradients again costs seconds: values only
        ys, y1 = jax.jit(lambda a, b: loss(a, b, _save_times(problem, solver))[1])(y0, p)
        _agree([ys, y1], [eager["ys"], eager["y1"]])


def test_driver_as_a_static_argument_of_jit():
    f, t1, y0, p, ts = _problem("lv")
    mesh = _mesh("lv", "Tsit5")

    @functools.partial(jax.jit, static_argnames="driver")
    def ys(q, driver):
        return gs.replay(f, mesh, y0, q, driver=driver).ys

    for name in ("Kernel", "Lanes"):
        if DRIVERS[name]().replay_reason(f, gs.Tsit5(), y0, p) is None:
            _agree(ys(p, driver=DRIVERS[name]()), _plain_ys("lv", "Tsit5"))
    # a record and replay under jit with an explicit driver: a mesh of max_steps slots
    name = "Kernel" if KERNEL else "Batched"
    solve = jax.jit(lambda q: gs.solve(f, 0.0, t1, y0, q, ts=ts, max_steps=256,
                                       driver=DRIVERS[name](), **RECORD_TOL))
    sol = solve(p)
    assert sol.route == ROUTES[name] and sol.mesh.capacity == 256
    np.testing.assert_array_equal(sol.mesh.n_steps, _mesh("lv", "Tsit5").n_steps)
    # nodes move by rounding between the jitted and the eager record (step sizes come from
    # error estimates), so the values agree to far below the tolerance, not to the last bit
    _agree(sol.ys, _plain_ys("lv", "Tsit5"), rtol=1e-9)


# --- 6. clear_caches -------------------------------------------------------------------------


def test_clear_caches_then_the_same_replay_gives_the_same_values():
    f, t1, y0, p, ts = _problem("lv")
    mesh = _mesh("lv", "Tsit5")
    before = {d: gs.replay(f, mesh, y0, p, driver=DRIVERS[d]()) for d in ("Kernel", "Lanes")
              if DRIVERS[d]().replay_reason(f, gs.Tsit5(), y0, p) is None}
    gs.clear_caches()
    for d, sol in before.items():
        again = gs.replay(f, mesh, y0, p, driver=DRIVERS[d]())
        assert again.route == sol.route
        np.testing.assert_array_equal(np.asarray(again.ys), np.asarray(sol.ys))
        np.testing.assert_array_equal(np.asarray(again.y1), np.asarray(sol.y1))


def test_the_abstract_driver_cannot_be_instantiated():
    # Equinox's rule: a class is abstract or final; the base runs nothing
    with pytest.raises(TypeError, match="abstract"):
        gs.drivers.AbstractDriver()
