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
