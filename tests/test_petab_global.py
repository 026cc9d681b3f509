"""The global search of PEtab problems (`inference.fit(problem, method="global")`,
``inference/petab/_global.py``).

Independent references: the closed-form optimum of the one-state decay problem of
``test_petab_fit`` (least squares for ``A0 exp(-k t)``, ``sigma^2 = RSS / n``), reached from
its bounds (six decades per parameter); CMA-ES's kernel alone on a rotated ellipsoid
whose minimum is known.
"""

import numpy as np
import pytest

pytest.importorskip("petab")
pytest.importorskip("libsbml")

import inference  # noqa: E402
import models  # noqa: E402
from inference.petab import _global  # noqa: E402
from inference.petab._global import CMAKernel, mirror  # noqa: E402
from test_petab_fit import _decay_mle, _decay_problem  # noqa: E402

STEPS = 220  # generations: the first run (population 7) ends near 200 on this problem


@pytest.fixture(scope="module")
def decay(tmp_path_factory):
    return _decay_problem(tmp_path_factory.mktemp("decay_global"))


@pytest.fixture(scope="module")
def global_fit(decay):
    return inference.fit(decay, method="global", seed=0, steps=STEPS, n_starts=3)


def test_global_search_reaches_the_closed_form_optimum_from_the_bounds(decay, global_fit):
    x_ref, nll_ref = _decay_mle()
    res = global_fit
    assert res.method == "global" and res.objective == "map"
    assert res.loss == pytest.approx(nll_ref, rel=1e-8)
    x_best = np.array([res.params[p] for p in decay.parameter_ids])
    np.testing.assert_allclose(x_best, x_ref, atol=1e-5)
    # the reported objective is a fresh solve's at the point reported
    assert float(decay.log_likelihood(res.params)) == pytest.approx(-res.loss, rel=1e-10)


def test_global_result_is_a_sorted_waterfall_with_its_starts(decay, global_fit):
    res = global_fit
    n = len(res.losses)
    assert n == 3 and np.all(np.diff(res.losses) >= 0) and np.all(res.status == 0)
    assert res.starts.shape == (n, 3) and res.parameter_ids == tuple(decay.parameter_ids)
    lo, hi = (np.asarray(b) for b in decay.bounds)
    assert np.all((res.starts >= lo) & (res.starts <= hi))
    # the kept points are distinct (1 % of the box apart in some coordinate)
    u = (res.starts - lo) / (hi - lo)
    gaps = np.abs(u[:, None] - u[None]).max(axis=-1)[np.triu_indices(n, 1)]
    assert np.all(gaps > 0.01)
    assert len(res.exit_reasons) == n and len(res.converged) == n
    # the search's best after each generation, then the refinement's iterations
    assert res.loss_history.shape[1] == n and res.n_steps == len(res.loss_history) - 1
    search = res.loss_history[:STEPS, 0]
    assert np.all(np.diff(search) <= 0) and len(res.loss_history) > STEPS
    import matplotlib

    matplotlib.use("Agg")
    assert res.plot_waterfall().get_yscale() == "log"


def test_global_search_is_reproducible_and_seeded(decay, global_fit):
    kw = dict(method="global", steps=20, n_starts=3)
    a, b = inference.fit(decay, seed=4, **kw), inference.fit(decay, seed=4, **kw)
    np.testing.assert_array_equal(a.starts, b.starts)
    np.testing.assert_array_equal(a.losses, b.losses)
    np.testing.assert_array_equal(a.loss_history, b.loss_history)
    for p in decay.parameter_ids:
        np.testing.assert_array_equal(a.all_params[p], b.all_params[p])
    # another seed, another search (the fixture's, seed 0)
    assert not np.array_equal(a.loss_history[:20, 0], global_fit.loss_history[:20, 0])


@pytest.mark.slow  # ~6 s
def test_global_search_resumes_from_its_checkpoint_to_the_same_result(decay, global_fit,
                                                                        tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "global.pkl"
    # interrupted in generation 90 (the state of generation 89 is saved), then resumed
    calls = {"n": 0}
    evaluate = _global._Evaluate.__call__

    def interrupted(self, x):
        calls["n"] += 1
        if calls["n"] == 90:
            raise KeyboardInterrupt
        return evaluate(self, x)

    monkeypatch.setattr(_global._Evaluate, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        inference.fit(decay, method="global", seed=0, steps=STEPS, n_starts=3,
                      checkpoint=path)
    monkeypatch.setattr(_global._Evaluate, "__call__", evaluate)
    res = inference.fit(decay, method="global", seed=0, steps=STEPS, n_starts=3,
                        checkpoint=path)
    np.testing.assert_array_equal(res.starts, global_fit.starts)
    np.testing.assert_array_equal(res.losses, global_fit.losses)
    np.testing.assert_array_equal(res.loss_history, global_fit.loss_history)
    # another seed is another search: refused
    with pytest.raises(ValueError, match="different global fit"):
        inference.fit(decay, method="global", seed=1, steps=STEPS, n_starts=3,
                      checkpoint=path)


def test_global_bad_arguments_are_named(decay):
    with pytest.raises(ValueError, match="`method`"):
        inference.fit(decay, method="cmaes")
    with pytest.raises(ValueError, match="`max_time`"):
        inference.fit(decay, method="global", max_time=-1.0)
    with pytest.raises(ValueError, match="`max_time` applies to method='global'"):
        inference.fit(decay, max_time=10.0)
    with pytest.raises(ValueError, match="`checkpoint` applies to method='global'"):
        inference.fit(decay, method="lm", checkpoint="x.pkl")
    with pytest.raises(ValueError, match="`n_starts`"):
        inference.fit(decay, method="global", n_starts=0)
    with pytest.raises(ValueError, match="`objective`"):
        inference.fit(decay, method="global", objective="ml")
    with pytest.raises(ValueError, match="`init` is missing"):
        inference.fit(decay, method="global", init={"A0": 0.0})
    # the PEtab-only arguments, for another model
    model, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    with pytest.raises(ValueError, match="`method` applies to PEtab problems only"):
        inference.fit(model, data, method="global")
    with pytest.raises(ValueError, match="`max_time` applies to PEtab problems only"):
        inference.fit(model, data, max_time=60.0)


@pytest.mark.slow  # ~16 s: runs until its time limit
def test_global_search_stops_at_max_time(decay):
    res = inference.fit(decay, method="global", seed=0, steps=100000, n_starts=2,
                        max_time=2.0)
    # the search stopped long before its generations (compiling alone takes longer than
    # 2 s, so at most a few generations ran); the refinement still reports two points
    assert res.method == "global" and len(res.losses) == 2
    assert res.n_steps < 1000


# ----------------------------------------------------------------- the kernel alone
def test_mirror_reflects_into_the_box_periodically():
    u = np.array([-2.3, -0.25, 0.0, 0.4, 1.0, 1.25, 2.6, 3.5])
    np.testing.assert_allclose(mirror(u), [0.3, 0.25, 0.0, 0.4, 1.0, 0.75, 0.6, 0.5])


def test_cma_kernel_minimises_a_rotated_ellipsoid():
    # f(x) = sum_i 10^(4 i / (D - 1)) (R (x - x*))_i^2 in a box: CMA-ES learns the
    # rotation and the scales (condition 1e4) and reaches x* to 1e-4 of the box
    d = 6
    rng = np.random.default_rng(0)
    rot, _ = np.linalg.qr(rng.standard_normal((d, d)))
    scales = 10.0 ** (4.0 * np.arange(d) / (d - 1))
    x_star = rng.uniform(0.2, 0.8, d)

    def f(x):
        return np.sum(scales * ((x - x_star) @ rot.T) ** 2, axis=-1)

    kernel = CMAKernel(d, np.zeros(d), np.ones(d))
    s = kernel.start(rng.uniform(size=d), kernel.popsize0)
    for _ in range(2000):
        u = kernel.ask(s, rng)
        s = kernel.tell(s, u, f(kernel.to_params(u)))
        if s.why is not None:
            break
    assert s.why in ("tolx", "tolfun")
    np.testing.assert_allclose(s.best_x, x_star, atol=1e-4)
    assert s.best_f < 1e-7
