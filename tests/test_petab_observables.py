"""PEtab observable transformations (lin, log, log10) and noise on a problem written here,
against the closed form of its solution: the log-likelihood and its gradient."""

import jax
import libsbml
import numpy as np
import pytest

import models
from conftest import write_petab

TIMES = [0.5, 1.0, 2.0, 3.5, 5.0]
CONDS = {"c1": 1.0, "c2": 3.0}  # x(0)
# observable id -> (formula, transformation, noise formula)
OBSERVABLES = {"o_lin": ("2 * x", "lin", "0.1"), "o_log": ("x", "log", "0.2"),
               "o_log10": ("x + 0.5", "log10", "noiseParameter1_o_log10"),
               "o_off": ("x - 0.3", "lin", "0.05 + 0.1 * x")}


def _problem(tmp_path):
    """``dx/dt = -d x``, ``x(0)`` per condition; four observables of ``x``, one of them
    with a noise parameter ``s`` (estimated) and one with a value-dependent noise."""
    doc = libsbml.SBMLDocument(3, 1)
    m = doc.createModel()
    m.setId("decay")
    c = m.createCompartment()
    c.setId("cell"), c.setSize(1.0), c.setConstant(True)
    sp_ = m.createSpecies()
    sp_.setId("x"), sp_.setCompartment("cell"), sp_.setInitialConcentration(1.0)
    sp_.setHasOnlySubstanceUnits(False), sp_.setBoundaryCondition(False)
    sp_.setConstant(False)
    p = m.createParameter()
    p.setId("d"), p.setValue(0.4), p.setConstant(True)
    r = m.createRateRule()
    r.setVariable("x")
    r.setMath(libsbml.parseL3Formula("-d * x"))
    rows = [(o, cid, 0.4 + 0.3 * i + 0.1 * j + 0.05 * k, t, "s" if o == "o_log10" else "")
            for i, cid in enumerate(CONDS) for j, t in enumerate(TIMES)
            for k, o in enumerate(OBSERVABLES)]
    return write_petab(
        tmp_path, doc,
        conditions={"conditionId": list(CONDS), "x": list(CONDS.values())},
        observables={"observableId": list(OBSERVABLES),
                     "observableFormula": [f for f, _, _ in OBSERVABLES.values()],
                     "observableTransformation": [t for _, t, _ in OBSERVABLES.values()],
                     "noiseFormula": [n for _, _, n in OBSERVABLES.values()]},
        measurements=dict(zip(("observableId", "simulationConditionId", "measurement", "time",
                               "noiseParameters"), map(list, zip(*rows)))),
        parameters={"parameterId": ["d", "s"], "parameterScale": ["log10", "lin"],
                    "lowerBound": [0.01, 0.01], "upperBound": [10.0, 5.0],
                    "nominalValue": [0.4, 0.3], "estimate": [1, 1]})


def _closed_form(d, s):
    """PEtab's log-likelihood: each measurement's normal density on the observable's
    transformation, with the transformation's Jacobian."""
    llh = 0.0
    for i, x0 in enumerate(CONDS.values()):
        for j, t in enumerate(TIMES):
            x = x0 * np.exp(-d * t)
            for k, (o, (_, trans, _)) in enumerate(OBSERVABLES.items()):
                y = 0.4 + 0.3 * i + 0.1 * j + 0.05 * k
                h = {"o_lin": 2 * x, "o_log": x, "o_log10": x + 0.5, "o_off": x - 0.3}[o]
                sigma = {"o_lin": 0.1, "o_log": 0.2, "o_log10": s,
                         "o_off": 0.05 + 0.1 * x}[o]
                if trans == "log":
                    r, jac = np.log(y) - np.log(h), np.log(y)
                elif trans == "log10":
                    r, jac = np.log10(y) - np.log10(h), np.log(y * np.log(10.0))
                else:
                    r, jac = y - h, 0.0
                llh += -0.5 * (r / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi) - jac
    return llh


@pytest.mark.parametrize("hierarchical", [False, True], ids=["full", "hierarchical"])
def test_transformed_observables_against_the_closed_form(tmp_path, hierarchical):
    problem = models.load_petab(_problem(tmp_path), rtol=1e-10, atol=1e-12,
                                hierarchical=hierarchical)
    if hierarchical:  # s, the noise of the log10 observable, at its optimum inside
        assert list(problem.parameter_ids) == ["d"]
        d = 0.4
        r = [np.log10(0.4 + 0.3 * i + 0.1 * j + 0.05 * 2) - np.log10(x0 * np.exp(-d * t) + 0.5)
             for i, x0 in enumerate(CONDS.values()) for j, t in enumerate(TIMES)]
        s_best = np.sqrt(np.mean(np.square(r)))
        assert float(problem.log_likelihood(np.array([np.log10(d)]))) == pytest.approx(
            _closed_form(d, s_best), rel=1e-8)
        return
    assert list(problem.parameter_ids) == ["d", "s"]
    x = np.array([np.log10(0.4), 0.3])
    exact = lambda v: _closed_form(10.0 ** v[0], v[1])
    assert float(problem.log_likelihood(x)) == pytest.approx(exact(x), rel=1e-8)
    g = np.asarray(jax.grad(problem.log_likelihood)(x))
    h = 1e-5
    fd = [(exact(x + h * e) - exact(x - h * e)) / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)
