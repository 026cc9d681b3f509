"""The `gradsolve` console command."""

import subprocess
import sys

import pytest

import gradsolve_cli


def test_help_lists_commands(capsys):
    assert gradsolve_cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out and "build-cache" in out


def test_demo_help():
    out = subprocess.run([sys.executable, "-m", "gradsolve_cli", "demo", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--out" in out and "--quick" in out


@pytest.mark.slow
def test_demo_quick_writes_outputs(tmp_path):
    subprocess.run([sys.executable, "-m", "gradsolve_cli", "demo", "--quick", "--n", "50",
                    "--out", str(tmp_path)], check=True, timeout=900)
    for name in ("summary.csv", "lynx_hare.nc", "trace.png", "posterior_predictive.png"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["demo", "--n", "0"], "--n"),
        (["bench", "--problems", "foo"], "--problems"),
        (["bench", "--sizes", "abc"], "--sizes"),
        (["build-cache", "no_colon"], "is not MODULE:ATTR"),
        (["build-cache", "json:no_such_attr"], "has no 'no_such_attr'"),
    ],
)
def test_bad_cli_values_are_argparse_errors(argv, needle):
    proc = subprocess.run([sys.executable, "-m", "gradsolve_cli", *argv], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, needle", [
    (["dem"], "unknown command 'dem'; did you mean 'demo'?"),
    (["buildcache"], "did you mean 'build-cache'?"),
    (["frobnicate"], "unknown command 'frobnicate'. The commands: demo, bench, build-cache."),
    (["--quick", "demo"], "follow the command, e.g. gradsolve demo --quick"),
    (["demo", "--qick"], "unrecognized argument '--qick'; did you mean --quick?"),
    (["build-cache", "--x46", "m:f"], "did you mean --x64?"),
])
def test_cli_mistakes_suggest_the_right_spelling(capsys, argv, needle):
    """Misspelt commands and options are answered with the nearest ones (argparse's
    usage error, exit status 2), before anything runs."""
    with pytest.raises(SystemExit) as info:
        gradsolve_cli.main(argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err

def test_version(capsys):
    import gradsolve

    assert gradsolve_cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gradsolve {gradsolve.__version__}"


def test_bench_help_names_its_real_json_default_and_columns():
    out = subprocess.run([sys.executable, "-m", "gradsolve_cli", "bench", "--help"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    flat = " ".join(out.split())  # argparse may wrap "gradsolve-bench.json" after the hyphen
    assert "(default: gradsolve-bench.json)" in flat or "(default: gradsolve- bench.json)" in flat
    assert "grad/fwd" in out and "ratio" in out and "diffrax ms / gs grad ms" in out


def test_build_cache_help():
    out = subprocess.run([sys.executable, "-m", "gradsolve_cli", "build-cache", "--help"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "MODULE:ATTR" in out and "--cache" in out and "--x64" in out


def test_build_cache_of_a_missing_module_is_one_line_naming_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gradsolve_cli", "build-cache",
                           "nope_module:kernels"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no module named 'nope_module'" in lines[0], proc.stderr


def test_build_cache_reports_an_import_error_inside_the_module(tmp_path):
    # the module exists but imports something missing: that is the module's error, shown
    (tmp_path / "broken_kernels.py").write_text("import nope_dependency\n")
    proc = subprocess.run([sys.executable, "-m", "gradsolve_cli", "build-cache",
                           "broken_kernels:kernels"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and "nope_dependency" in proc.stderr


def test_demo_names_the_lynx_hare_parameter_components():
    """The demo's summary and trace plot label theta, z_init and sigma by name, not index."""
    az = pytest.importorskip("arviz")
    import numpy as np

    import models

    rng = np.random.default_rng(0)
    idata = az.from_dict(posterior={"theta": rng.random((2, 5, 4)),
                                    "z_init": rng.random((2, 5, 2)),
                                    "sigma": rng.random((2, 5, 2))})
    posterior = gradsolve_cli._named_components(idata.posterior, models.lynx_hare())
    assert list(az.summary(posterior, kind="stats").index) == [
        "theta[alpha]", "theta[beta]", "theta[gamma]", "theta[delta]",
        "z_init[hare]", "z_init[lynx]", "sigma[hare]", "sigma[lynx]"]
