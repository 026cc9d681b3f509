"""Shared fixtures: float64 for the whole suite (set here, never by importing gradsolve)
and small reference problems."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# At conftest import, before any test module builds arrays at collection time.
jax.config.update("jax_enable_x64", True)


def lotka_volterra(t, y, p):
    """dx = a x - b x y, dy = -c y + d x y; p = [a, b, c, d]."""
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


def van_der_pol(t, y, p):
    """y'' - mu (1 - y^2) y' + y = 0 as a first-order system; p = {"mu": mu}."""
    return jnp.stack([y[1], p["mu"] * (1 - y[0] ** 2) * y[1] - y[0]])


def decay(t, y, p):
    return -p["k"] * y


def robertson(t, y, k):
    r1 = k[0] * y[0]
    r2 = k[1] * y[1] ** 2
    r3 = k[2] * y[1] * y[2]
    return jnp.stack([-r1 + r3, r1 - r2 - r3, r2])


# Carpenter (2018), "Predator-Prey Population Dynamics: the Lotka-Volterra model in Stan":
# posterior means and sds of the lynx–hare model (independent reference for fit/sample).
REF_MEAN = {
    "theta": np.array([0.55, 0.028, 0.80, 0.024]),
    "z_init": np.array([33.9, 5.9]),
    "sigma": np.array([0.25, 0.25]),
}
REF_SD = {
    "theta": np.array([0.065, 0.004, 0.091, 0.0036]),
    "z_init": np.array([2.9, 0.53]),
    "sigma": np.array([0.045, 0.045]),
}


@pytest.fixture(scope="module")
def lynx():
    """The lynx–hare model and the embedded Hudson's Bay Company data."""
    import models

    return models.lynx_hare(), models.load_dataset("lynx_hare")


@pytest.fixture
def lv_ensemble():
    """32 Lotka–Volterra trajectories with parameters spread +-10 %, 21 save times on [0, 10]."""
    n = 32
    key = jax.random.PRNGKey(0)
    base = jnp.array([1.5, 1.0, 3.0, 1.0])
    p = base * (1 + 0.2 * (jax.random.uniform(key, (n, 4)) - 0.5))
    y0 = jnp.tile(jnp.array([1.0, 1.0]), (n, 1)) * (1 + 0.1 * jax.random.uniform(jax.random.PRNGKey(1), (n, 2)))
    ts = jnp.linspace(0.0, 10.0, 21)
    return lotka_volterra, y0, p, ts


def kernel_builds() -> bool:
    """Whether this machine builds the compiled CPU kernel (a C++ compiler and jaxlib's FFI
    headers): tests of the `gs.drivers.Kernel` driver skip where it does not."""
    import warnings

    import gradsolve as gs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gs.drivers.Kernel().replay_reason(lotka_volterra, gs.Tsit5(), jnp.ones((2, 2)),
                                                 jnp.ones((2, 4))) is None


def pytest_configure(config):
    # Identical programs built by different Python callables compile once per run.
    import os
    import tempfile

    cache = os.environ.get("GRADSOLVE_TEST_JAX_CACHE") or os.path.join(tempfile.gettempdir(), "gradsolve-jax-cache")
    # Under pytest-xdist (`make test` runs two workers) each worker keeps its own folder:
    # JAX writes cache entries in place, without a lock (`jax._src.lru_cache.LRUCache.put`
    # with no size limit), so a worker could read another's half-written entry (a
    # warning, which the tests that turn every warning into an error would fail on).
    # The compiled-kernel cache is shared: its writes are atomic (`os.replace`).
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        cache = os.path.join(cache, worker)
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def one_reaction_sbml(model_id: str, species: str, initial: str, parameters, rate: str,
                      *, consumed: bool):
    """An SBML document of one species (amounts in a unit compartment) whose initial amount
    is the formula ``initial`` and which one reaction of kinetic law ``rate`` consumes
    (``consumed``) or produces; ``parameters`` are the constant parameters' ids."""
    import libsbml

    doc = libsbml.SBMLDocument(3, 2)
    m = doc.createModel()
    m.setId(model_id)
    c = m.createCompartment()
    c.setId("cell"), c.setSize(1.0), c.setConstant(True)
    sp = m.createSpecies()
    for setter, v in (("setId", species), ("setCompartment", "cell"), ("setInitialAmount", 0.0),
                      ("setHasOnlySubstanceUnits", True), ("setBoundaryCondition", False),
                      ("setConstant", False)):
        getattr(sp, setter)(v)
    for pid in parameters:
        q = m.createParameter()
        q.setId(pid), q.setValue(1.0), q.setConstant(True)
    ia = m.createInitialAssignment()
    ia.setSymbol(species), ia.setMath(libsbml.parseL3Formula(initial))
    r = m.createReaction()
    r.setId("r1"), r.setReversible(False)
    ref = r.createReactant() if consumed else r.createProduct()
    ref.setSpecies(species), ref.setStoichiometry(1.0), ref.setConstant(True)
    r.createKineticLaw().setMath(libsbml.parseL3Formula(rate))
    return doc


def write_petab(path, doc, *, observables: dict, measurements: dict, parameters: dict,
                conditions: dict | None = None):
    """A PEtab v1 problem written into the folder ``path``: the SBML document ``doc``
    (``model.xml``) and the tables, each given as column -> values (one condition ``c0``
    unless ``conditions``); returns the path of its ``problem.yaml``."""
    import libsbml
    import pandas as pd

    path.mkdir(parents=True, exist_ok=True)
    libsbml.writeSBMLToFile(doc, str(path / "model.xml"))
    for name, table in (("conditions", conditions or {"conditionId": ["c0"]}),
                        ("observables", observables), ("measurements", measurements),
                        ("parameters", parameters)):
        pd.DataFrame(table).to_csv(path / f"{name}.tsv", sep="\t", index=False)
    (path / "problem.yaml").write_text(
        "format_version: 1\nparameter_file: parameters.tsv\nproblems:\n"
        "- condition_files: [conditions.tsv]\n  measurement_files: [measurements.tsv]\n"
        "  observable_files: [observables.tsv]\n  sbml_files: [model.xml]\n")
    return path / "problem.yaml"



class ClosedFormProblem:
    """Mixin for a test problem whose objective is a closed form (no ODE, no mesh): the
    `inference.AbstractProblem` methods about meshes and data, for subclasses that also
    subclass `AbstractProblem` and give names, bounds, starts and the objective."""

    space = source = None

    def log_density(self, u, mesh=None, **kw):
        value, aux = self.objective(u)
        return -value, aux

    def fingerprint(self):
        return {"kind": type(self).__name__}

    def record(self, u, tol_factor=1.0):
        return None

    def ragged_replay(self, u, mesh):
        return False

    def error_ratio(self, u, mesh):
        import jax.numpy as jnp

        return jnp.zeros(())

    def observed_data(self):
        return {}, {}, {}

def killed_then_resumed(monkeypatch, run, path, die_after):
    """``run(path)`` interrupted (``KeyboardInterrupt``) right after the checkpoint whose
    state satisfies ``die_after(state)``, then ``run(path)`` again: the resumed result."""
    import inference._checkpoint as ckpt

    real_save = ckpt.save

    def save_then_die(p, fingerprint, state, *info):
        real_save(p, fingerprint, state, *info)
        if die_after(state):
            raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(path)
    monkeypatch.setattr(ckpt, "save", real_save)
    return run(path)


def central_differences(fn, args, eps=1e-6):
    """Central differences of scalar ``fn(*args)`` w.r.t. every entry of each array in ``args``."""
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
    """Each gradient in ``got`` equals ``want`` (central differences) to ``rtol``, with an
    absolute floor of ``rtol`` times the largest entry."""
    for j, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=rtol * np.max(np.abs(w)),
                                   err_msg=f"argument {j}")
