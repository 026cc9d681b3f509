"""The tutorials (``tutorials/NN_name.py``, jupytext percent format) run end to end in quick
mode, and each has a paired ``.ipynb`` whose code cells match the script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
SCRIPTS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
# Tutorials too slow for the default suite even in quick mode (run with `make test-all`).
# 08: NUTS on a 12-subject population, ~1 min quick; 10: a 24-subject FOCE-I fit with
# infusions, VPCs and NUTS, ~5 min quick on a loaded 2-core machine.
# 04 (Rosenbrock solves of Robertson, ~13 s) and 07 (Diffrax side by side, ~30 s): what they
# show is tested in the normal suite (test_stiff.py, test_drivers.py's Diffrax driver).
# 11 (a TPU tutorial; off the chip it builds a CPU kernel and compiles Diffrax, ~1 min):
# what it shows is tested by test_pallas.py. 02, 03, 05, 06 (7-35 s each): fitting,
# sampling, sharding and ODEModel are tested in their own files; the quickstart (01) runs
# in the normal suite, and every notebook's pairing below.
SLOW: set[str] = {"02_fit_lynx_hare", "03_bayes_lynx_hare", "04_stiff_robertson",
                  "05_many_devices", "06_bring_your_own_model", "07_next_to_diffrax",
                  "08_population_pk", "09_petab_boehm", "10_population_fit_diagnostics",
                  "11_on_a_tpu"}


def test_tutorials_exist():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, id=s.stem, marks=[pytest.mark.slow] if s.stem in SLOW else []) for s in SCRIPTS],
)
def test_tutorial_runs(script, tmp_path):
    env = dict(os.environ)
    env.update(GRADSOLVE_TUTORIAL_QUICK="1", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # the tutorials must run on a single device
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
    )
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_notebook_paired(script):
    jupytext = pytest.importorskip("jupytext")
    nb_path = script.with_suffix(".ipynb")
    assert nb_path.exists(), f"missing {nb_path.name}: run `jupytext --to ipynb tutorials/{script.name}`"
    py_nb = jupytext.read(script)
    ipynb = jupytext.read(nb_path)

    def code(nb):
        return [c.source.strip() for c in nb.cells if c.cell_type == "code"]

    assert code(py_nb) == code(ipynb), (
        f"{nb_path.name} has drifted from {script.name}: "
        f"run `jupytext --to ipynb tutorials/{script.name}` (or `jupytext --sync`)"
    )
