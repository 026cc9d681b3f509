"""Rodas5P on the compiled CPU kernel (`gs.drivers.Kernel`) on three PEtab problems:
the gradient of the objective (the negative log-likelihood, without hierarchical
optimisation, w.r.t. the estimated parameters on their PEtab scale) on one fixed recorded
mesh, i.e. the replay's discrete adjoint.

- Against fourth-order central differences of the same fixed-mesh objective: 1e-6
  relative (1e-9 of the largest component absolute). On a fixed mesh the objective is a
  smooth function of the parameters, so the differences resolve its derivative to ~1e-10;
  differences of re-recorded adaptive solves (`tests/test_petab.py`) only resolve ~1e-4.
- Against the XLA replay (`gs.drivers.Batched`, JAX's AD) of the same mesh: value and
  gradient to 1e-10 relative.
- That the kernel ran both ways: every solve's route, and the kernel's own adjoint (its
  ``_bwd`` call) in the gradient's program.

Problems (states, estimated parameters, conditions): Boehm_JProteomeRes2014 (8, 9, 1) and
Fujita_SciSignal2010 (9 species and 1 switch state for its EGF input's end, 19, 6) from
``tests/data/petab``, and Armistead_CellDeathDis2024 (4, 14, 2; noise proportional to the
state) and Zheng_PNAS2012 (15 states, more than the 10 the unrolled step allowed; a
pre-equilibration, replayed like the other solves) from the benchmark collection where it
is checked out (``../shared``). Each is
taken at its nominal parameters moved 2 % of each bound range towards the range's middle
(off the optimum, so no gradient component is only rounding), its mesh recorded there by
the kernel at the problem's tolerances (rtol 1e-8, atol 1e-12).

The fixed mesh: `models.PetabProblem.log_likelihood` takes ``solve=``, a function that runs
each of the problem's solves; here one records the mesh and another replays it with the
driver asked for. (`PetabProblem.record` and ``replay_residuals`` keep a mesh too, but
replay with `gs.drivers.Auto`, which runs Rosenbrock methods on the XLA drivers.)

Fujita's switch times (the end of its EGF input, per condition) are not estimated: the
problem passes them without a derivative, so the kernel's own adjoint runs (the kernel
hands a replay whose jump times carry a derivative to the batched driver's adjoint).

Slow tier (``make test-all``): each problem builds its own Rodas5P kernel, the XLA
replay and its gradient compile too. On two cores with an empty kernel cache ~2.3 minutes
in all (setup: Boehm 49 s, Fujita 58 s, Armistead 17 s); with the kernels cached
(``~/.cache/gradsolve/kernels``) ~1 minute, the XLA compiles dominating.
"""

import re
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

pytest.importorskip("petab")
pytest.importorskip("libsbml")

import gradsolve as gs  # noqa: E402
import models  # noqa: E402
from conftest import kernel_builds  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not kernel_builds(),
                       reason="no working C++ compiler: the kernel falls back to XLA"),
]

KERNEL, XLA = gs.drivers.Kernel(), gs.drivers.Batched()
DATA = Path(__file__).parent / "data" / "petab"
COLLECTION = Path(__file__).resolve().parents[2] / "shared" / "petab-benchmark-collection"

PROBLEMS = [
    pytest.param(DATA / "Boehm_JProteomeRes2014", id="Boehm"),
    pytest.param(DATA / "Fujita_SciSignal2010", id="Fujita"),
    pytest.param(COLLECTION / "Armistead_CellDeathDis2024", id="Armistead",
                 marks=pytest.mark.skipif(not COLLECTION.is_dir(),
                                          reason="the benchmark collection is not here")),
    pytest.param(COLLECTION / "Zheng_PNAS2012", id="Zheng",
                 marks=pytest.mark.skipif(not COLLECTION.is_dir(),
                                          reason="the benchmark collection is not here")),
]


def _objective(problem, meshes, driver, routes):
    """The negative log-likelihood at ``x`` with every solve a replay of ``meshes[name]``
    on ``driver`` (each replay's route added to ``routes``)."""
    def replay(name, f, t0, t1, y0, params, *, ts=None, jumps=None):
        sol = gs.replay(f, meshes[name], y0, params, jumps=jumps, driver=driver)
        routes.add(sol.route)
        return sol

    return lambda x: -problem.log_likelihood(x, solve=replay)


@pytest.fixture(scope="module", params=PROBLEMS)
def case(request):
    problem = models.load_petab(request.param, hierarchical=False, solver=gs.Rodas5P())
    lo, hi = (np.asarray(b) for b in problem.bounds)
    x0 = np.asarray(problem.nominal)
    x = x0 + 0.02 * (hi - lo) * np.sign((lo + hi) / 2 - x0)

    meshes = {}

    def record(name, f, t0, t1, y0, params, *, ts=None, jumps=None):
        mesh = gs.record(f, t0, t1, y0, params, ts=ts, solver=problem.solver,
                         rtol=problem.rtol, atol=problem.atol, max_steps=problem.max_steps,
                         jumps=jumps, driver=KERNEL)
        meshes[name] = mesh
        return gs.replay(f, mesh, y0, params, jumps=jumps, driver=KERNEL)

    recorded = -float(problem.log_likelihood(x, solve=record))  # outside jit: concrete meshes
    routes_k, routes_x = set(), set()
    obj_k = _objective(problem, meshes, KERNEL, routes_k)
    obj_x = _objective(problem, meshes, XLA, routes_x)
    value_k, grad_k = jax.jit(jax.value_and_grad(obj_k))(x)
    value_x, grad_x = jax.jit(jax.value_and_grad(obj_x))(x)
    program = str(jax.make_jaxpr(jax.grad(obj_k))(x))
    return SimpleNamespace(problem=problem, x=x, meshes=meshes, recorded=recorded,
                           objective=jax.jit(obj_k), value_k=float(value_k),
                           grad_k=np.asarray(grad_k), value_x=float(value_x),
                           grad_x=np.asarray(grad_x), routes_k=routes_k, routes_x=routes_x,
                           targets=set(re.findall(r"target_name=(\S+)", program)))


def test_the_kernel_runs_the_replay_and_its_adjoint(case):
    assert isinstance(case.problem.solver, gs.Rodas5P)
    for mesh in case.meshes.values():
        assert np.all(np.asarray(mesh.status) == 0)
    assert case.routes_k == {"gradsolve-kernel"}
    assert case.routes_x == {"gradsolve-batched"}
    assert any(t.endswith("_fwd") for t in case.targets), case.targets
    assert any(t.endswith("_bwd") for t in case.targets), case.targets
    # the replay of the mesh at the point it was recorded gives the recorded solve's value
    assert case.value_k == pytest.approx(case.recorded, rel=1e-12)


def test_kernel_matches_the_xla_replay_on_the_same_mesh(case):
    assert case.value_k == pytest.approx(case.value_x, rel=1e-10)
    scale = np.abs(case.grad_x).max()
    np.testing.assert_allclose(case.grad_k, case.grad_x, rtol=1e-10, atol=1e-12 * scale)


def test_kernel_gradient_against_central_differences_on_the_mesh(case):
    # Fourth-order central differences on the parameter scale: at h = 3e-4 their
    # truncation (h^4) and rounding (eps |f| / h) both stay near 1e-10 of the gradient
    h = 3e-4
    x, f = case.x, case.objective
    fd = np.empty_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        v = [float(f(x + k * e)) for k in (2, 1, -1, -2)]
        fd[i] = (-v[0] + 8 * v[1] - 8 * v[2] + v[3]) / (12 * h)
    scale = np.abs(fd).max()
    np.testing.assert_allclose(case.grad_k, fd, rtol=1e-6, atol=1e-9 * scale)
