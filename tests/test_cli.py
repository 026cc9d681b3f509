"""The `gradsolve` console command."""

import subprocess
import sys

import pytest

import gradsolve_cli


def test_help_lists_commands(capsys):
    assert gradsolve_cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out


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
    ],
)
def test_bad_cli_values_are_argparse_errors(argv, needle):
    proc = subprocess.run([sys.executable, "-m", "gradsolve_cli", *argv], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
