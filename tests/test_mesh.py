"""`gs.Mesh` row algebra against independent references.

The references are replays and records of the same trajectories made another way: a
trajectory's record does not depend on the other trajectories of its ensemble, so cutting,
scattering or joining rows must give what recording (or replaying) those rows directly
gives, and padding a mesh adds zero-length steps that leave replay values bitwise unchanged.
Exponential decay (a closed form) with rates spread over 40x gives a ragged ensemble.
"""

import dataclasses
import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsolve as gs
from conftest import decay

T1 = 4.0
TS = jnp.linspace(0.0, T1, 9)
K = jnp.array([0.3, 1.0, 4.0, 12.0])
Y0 = jnp.array([[1.0], [2.0], [3.0], [4.0]])


def _p(k):
    return {"k": jnp.asarray(k)[..., None]}


def _record(y0, k):
    return gs.record(decay, 0.0, T1, y0, _p(k), ts=TS)


def _array_leaves(mesh):
    return [x for x in jax.tree_util.tree_leaves(mesh) if eqx.is_array(x)]


def _assert_same_rows(a, b):
    """Same trajectories: every per-trajectory field and params leaf equal (``times``
    compared at a common capacity, padding filled), shared t0/t1 equal."""
    cap = max(a.capacity, b.capacity)
    a, b = a.to_host().with_capacity(cap), b.to_host().with_capacity(cap)
    for name in gs.Mesh.PER_TRAJECTORY:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.t0, b.t0)
    np.testing.assert_array_equal(a.t1, b.t1)


@pytest.fixture(scope="module")
def rec():
    """The ragged ensemble (device mesh), its replay and its host copy."""
    mesh = _record(Y0, K)
    n_steps = np.asarray(mesh.n_steps)
    assert len(set(n_steps.tolist())) == 4, n_steps  # ragged: every row a different length
    return mesh, gs.replay(decay, mesh, Y0, _p(K)), mesh.to_host()


def test_per_trajectory_fields_declared_once():
    names = {f.name for f in dataclasses.fields(gs.Mesh)}
    assert set(gs.Mesh.PER_TRAJECTORY) <= names
    shared = names - set(gs.Mesh.PER_TRAJECTORY) - {"params"}
    assert shared == {"t0", "t1", "solver", "rtol", "atol", "controller"}


@pytest.mark.parametrize("rows", [np.array([2, 0]), np.array([True, False, True, True]),
                                  [3]], ids=["ints", "mask", "list"])
def test_select_replays_rows(rec, rows):
    mesh, sol, host = rec
    idx = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows)
    for m in (mesh, host):
        sub = m.select(rows)
        assert sub.n == len(idx) and sub.capacity == m.capacity
        out = gs.replay(decay, sub, Y0[idx], _p(K[idx]))
        np.testing.assert_array_equal(out.ys, np.asarray(sol.ys)[idx])
        np.testing.assert_array_equal(sub.params["k"], np.asarray(K)[idx, None])


def test_scatter_equals_recording_combined_params(rec):
    mesh, _, host = rec
    rows, k_new = np.array([3, 1]), jnp.array([25.0, 0.1])
    sub = _record(Y0[rows], k_new)
    k_all = K.at[rows].set(k_new)
    direct = _record(Y0, k_all)
    for m in (host, mesh):
        out = m.scatter(rows, sub)
        assert out.capacity == max(m.capacity, sub.capacity)
        _assert_same_rows(out, direct)
        assert out.trim().capacity == direct.capacity
        np.testing.assert_array_equal(
            gs.replay(decay, out.to_device(), Y0, _p(k_all)).ys,
            gs.replay(decay, direct, Y0, _p(k_all)).ys,
        )
    # a mask names the same rows (in row order), a single mesh counts as one row
    mask = np.array([False, True, False, False])
    _assert_same_rows(host.scatter(mask, sub.to_host().row(1)),
                      host.scatter([1], sub.to_host().select([1])))
    _assert_same_rows(host.scatter(np.array([1, 3]), sub.to_host().select([1, 0])),
                      host.scatter(rows, sub.to_host()))


def test_capacity_changes_leave_replay_bitwise_unchanged(rec):
    mesh, sol, host = rec
    longest = int(np.max(host.n_steps))
    pow2 = max(16, 1 << (longest - 1).bit_length())
    variants = {
        "grow": mesh.with_capacity(mesh.capacity + 37),
        "exact": mesh.with_capacity(longest),
        "trim_exact": mesh.with_capacity(200).trim(exact=True),
        "trim_host": host.with_capacity(200).trim(),
        "padded": mesh.padded(),
    }
    assert variants["grow"].capacity == mesh.capacity + 37
    assert variants["exact"].capacity == longest == variants["trim_exact"].capacity
    assert variants["trim_host"].capacity == pow2
    grown = np.asarray(variants["grow"].times)
    np.testing.assert_array_equal(grown[:, -1], np.asarray(mesh.times)[np.arange(4), host.n_steps])
    for name, m in variants.items():
        out = gs.replay(decay, m, Y0, _p(K))
        np.testing.assert_array_equal(out.ys, sol.ys, err_msg=name)
        np.testing.assert_array_equal(out.y1, sol.y1, err_msg=name)


def test_concatenate_equals_record_of_both(rec):
    mesh, sol, host = rec
    a, b = _record(Y0[:1], K[:1]), _record(Y0[1:], K[1:])
    both = gs.Mesh.concatenate([a, b])
    assert both.n == 4 and both.capacity == max(a.capacity, b.capacity)
    _assert_same_rows(both, mesh)
    np.testing.assert_array_equal(gs.replay(decay, both, Y0, _p(K)).ys, sol.ys)
    # host parts stay host; single meshes count as one row each
    joined = gs.Mesh.concatenate([host.row(i) for i in range(4)])
    assert all(isinstance(x, np.ndarray) for x in _array_leaves(joined))
    _assert_same_rows(joined, host)


def test_repeat_row_batch_unbatch_round_trip(rec):
    mesh, sol, host = rec
    for i in range(4):
        single = host.row(i)
        assert not single.is_ensemble and single.n == 1
        assert int(single.n_steps) == int(host.n_steps[i])
        np.testing.assert_array_equal(
            gs.replay(decay, single.to_device(), Y0[i], _p(K[i])).ys, sol.ys[i])
        _assert_same_rows(single.repeat(1).unbatch(), single)
        _assert_same_rows(host.select([i]).unbatch(), single)
        assert single.row(0) is single and single.unbatch() is single
    _assert_same_rows(mesh.row(2), host.row(2))
    three = host.row(1).repeat(3)
    assert three.n == 3
    out = gs.replay(decay, three.to_device(), jnp.tile(Y0[1], (3, 1)), _p(jnp.full(3, K[1])))
    np.testing.assert_array_equal(out.ys, np.broadcast_to(sol.ys[1], (3,) + sol.ys[1].shape))
    # batch: per-trajectory fields get the axis (params left alone); identity on ensembles
    single = mesh.row(0)
    batched = single.batch()
    assert batched.n == 1 and mesh.batch() is mesh
    for name in gs.Mesh.PER_TRAJECTORY:
        np.testing.assert_array_equal(getattr(batched, name), getattr(single.repeat(1), name))
    assert batched.params is single.params


def test_chains_under_vmap_equal_per_row_replays(rec):
    mesh, sol, host = rec

    def one(m, y0, k):
        return gs.replay(decay, m, y0, _p(k)).ys

    # an ensemble of `count` rows: chain i gets row i
    stack = host.chains(4, capacity=100)
    for x in _array_leaves(stack):
        assert isinstance(x, jax.Array) and x.shape[0] == 4
    assert stack.times.shape == (4, 101)
    np.testing.assert_allclose(jax.vmap(one)(stack, Y0, K), sol.ys, rtol=1e-13, atol=0)
    # a single mesh: broadcast, every chain replays the same mesh at its own parameters
    single = host.row(3)
    stack = single.chains(3)
    assert all(x.shape[0] == 3 for x in _array_leaves(stack))
    ks = jnp.array([12.0, 6.0, 2.0])
    per_row = np.stack([one(single.to_device(), Y0[3], kk) for kk in ks])
    np.testing.assert_allclose(jax.vmap(one)(stack, jnp.tile(Y0[3], (3, 1)), ks), per_row,
                               rtol=1e-13, atol=0)


def test_union_contains_all_nodes_and_matches_closed_form(rec):
    mesh, _, host = rec
    # a failed record (its own nodes, status MAX_STEPS) must add nothing to the union
    row = host.row(1).repeat(1)
    failed = dataclasses.replace(row, times=row.times * (1 - 1e-3 * (row.times < T1)),
                                 status=np.array([gs.Status.MAX_STEPS], np.int32))
    parts = [mesh.row(0), mesh.select([1, 2, 3]), failed]
    u = gs.Mesh.union(parts)
    assert not u.is_ensemble and int(u.status) == gs.Status.OK
    assert all(isinstance(x, np.ndarray) for x in _array_leaves(u))
    assert np.all(np.diff(u.times) > 0) and int(u.n_steps) == len(u.times) - 1
    for i in range(4):
        nodes = np.asarray(host.times[i, : int(host.n_steps[i]) + 1])
        assert np.isin(nodes, u.times).all()
    np.testing.assert_array_equal(u.times[u.save_index], TS)
    for i in range(4):
        ys = gs.replay(decay, u.to_device(), Y0[i], _p(K[i])).ys
        exact = np.asarray(Y0[i]) * np.exp(-float(K[i]) * np.asarray(TS))[:, None]
        np.testing.assert_allclose(ys, exact, rtol=1e-5, atol=1e-9)
    # a failed row adds nothing; only failed rows, or save times not in the union, raise
    np.testing.assert_array_equal(gs.Mesh.union(parts[:2]).times, u.times)
    with pytest.raises(ValueError, match="meshes"):
        gs.Mesh.union([failed])
    moved = dataclasses.replace(host.row(0), ts=np.asarray(TS) + 1e-3)
    with pytest.raises(RuntimeError, match="save times missing"):
        gs.Mesh.union([moved])


def test_merge_is_as_fine_as_each_part_with_fewer_steps_than_the_union(rec):
    mesh, _, host = rec
    parts = [host.row(i) for i in range(4)]
    merged, union = gs.Mesh.merge(parts), gs.Mesh.union(parts)
    assert int(merged.status) == gs.Status.OK and int(merged.n_steps) == len(merged.times) - 1
    assert int(merged.n_steps) < int(union.n_steps)
    assert int(merged.n_steps) >= max(int(host.n_steps[i]) for i in range(4))
    np.testing.assert_array_equal(merged.times[merged.save_index], TS)
    # every merged step is no longer than the step any part takes where it starts
    for i in range(4):
        x = np.unique(np.asarray(host.times[i, : int(host.n_steps[i]) + 1]))
        a, b = merged.times[:-1], merged.times[1:]
        j = np.clip(np.searchsorted(x, a, side="right") - 1, 0, len(x) - 2)
        assert np.all(b - a <= (x[j + 1] - x[j]) * (1 + 1e-12))
    # so each part's trajectory replays on it within the tolerance of its own mesh
    for i in range(4):
        sol = gs.replay(decay, merged.to_device(), Y0[i], _p(K[i]))
        exact = np.asarray(Y0[i]) * np.exp(-float(K[i]) * np.asarray(TS))[:, None]
        np.testing.assert_allclose(sol.ys, exact, rtol=1e-5, atol=1e-9)
        assert float(sol.error_ratio) <= 1.0


def test_host_meshes_stay_numpy(rec):
    mesh, _, host = rec
    assert all(isinstance(x, jax.Array) for x in _array_leaves(mesh))
    single = host.row(0)
    # any eager JAX op on these NumPy leaves would need a transfer to the device
    with jax.transfer_guard("disallow_explicit"):
        results = {
            "to_host": host,
            "select": host.select([3, 1]),
            "mask": host.select(np.array([True, False, False, True])),
            "scatter": host.scatter([0, 2], host.select([2, 0])),
            "grow": host.with_capacity(300),
            "cut": host.with_capacity(int(np.max(host.n_steps))),
            "trim": host.with_capacity(300).trim(),
            "padded": host.padded(),
            "concatenate": gs.Mesh.concatenate([host, single]),
            "repeat": single.repeat(2),
            "row": single,
            "unbatch": host.select([1]).unbatch(),
            "batch": single.batch(),
            "union": gs.Mesh.union([host]),
        }
    for name, m in results.items():
        kinds = {type(x) for x in _array_leaves(m)}
        assert kinds == {np.ndarray}, (name, kinds)
    dev = host.select([0]).to_device()
    assert all(isinstance(x, jax.Array) for x in _array_leaves(dev))


def test_to_device_gives_what_jnp_asarray_gives_without_compiling(rec):
    """A host mesh on the device: every leaf as ``jnp.asarray`` makes it (dtype, weak type,
    values), by transfers alone (``jnp.asarray`` of a NumPy array compiles a program per
    shape in JAX 0.10; a new shape here must not)."""
    _, _, host = rec
    odd = host.with_capacity(int(np.max(host.n_steps)) + 7)   # leaf shapes not seen before
    seen = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            dev = odd.to_device()
    finally:
        logger.removeHandler(handler)
    assert not [m for m in seen if "Compiling" in m], seen
    for a, b in zip(_array_leaves(dev), _array_leaves(odd), strict=True):
        ref = jnp.asarray(b)
        assert isinstance(a, jax.Array)
        assert a.dtype == ref.dtype and a.weak_type == ref.weak_type and a.shape == ref.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(ref))


def test_bad_arguments_raise_naming_them(rec):
    mesh, _, host = rec
    longest = int(np.max(host.n_steps))
    for m in (host, mesh):
        with pytest.raises(ValueError, match="`cap`"):
            m.with_capacity(longest - 1)
        for cap in (0, 2.5, True):
            with pytest.raises(ValueError, match="`cap`"):
                m.with_capacity(cap)
        for rows in (np.array([True, False]), [0, 4], [-5], np.zeros((2, 2), int), [0.5],
                     3):
            with pytest.raises(ValueError, match="`rows`"):
                m.select(rows)
        with pytest.raises(ValueError, match="`rows`"):
            m.scatter([0, 1], m.select([2]))
        with pytest.raises(ValueError, match="`rows`"):
            m.scatter([1, 1], m.select([2, 3]))
        with pytest.raises(ValueError, match="`i`"):
            m.row(4)
        with pytest.raises(ValueError, match="`count`"):
            m.chains(3)
        with pytest.raises(ValueError, match="ensemble"):
            m.repeat(2)
        with pytest.raises(ValueError, match="row"):
            m.unbatch()
        with pytest.raises(ValueError, match="single-trajectory"):
            m.row(0).select([0])
        with pytest.raises(ValueError, match="`count`"):
            m.row(0).repeat(0)
    with pytest.raises(ValueError, match="meshes"):
        gs.Mesh.concatenate([])
    other = dataclasses.replace(host.row(0), t1=np.asarray(2 * T1))
    with pytest.raises(ValueError, match="`t1`"):
        gs.Mesh.concatenate([host, other])
