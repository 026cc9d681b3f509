"""The CPUs this process may use: the affinity mask, limited by a cgroup CPU quota (the
count behind the kernel's compiler processes and threads, and `make test`'s workers)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradsolve import _cpus


@pytest.mark.parametrize("affinity, quota, want", [(8, None, 8), (8, 2.0, 2), (8, 1.5, 2),
                                                   (2, 6.0, 2), (4, 0.2, 1)])
def test_affinity_limited_by_the_quota(monkeypatch, affinity, quota, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)),
                        raising=False)
    monkeypatch.setattr(_cpus, "_quota", lambda: quota)
    assert _cpus.usable_cpus() == want


def test_the_cgroup_v2_quota_is_read(monkeypatch, tmp_path):
    files = {"/sys/fs/cgroup/cpu.max": "150000 100000\n"}
    real = Path.read_text

    def read_text(self, *a, **k):
        if str(self) in files:
            return files[str(self)]
        if str(self).startswith("/sys/fs/cgroup"):
            raise OSError("absent")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert _cpus._quota() == 1.5
    files["/sys/fs/cgroup/cpu.max"] = "max 100000\n"
    assert _cpus._quota() is None


def test_make_tests_worker_count_is_capped():
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "tools" / "cpus.py"), "1"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    out = subprocess.run([sys.executable, str(root / "tools" / "cpus.py")],
                         capture_output=True, text=True, check=True)
    assert int(out.stdout) == _cpus.usable_cpus()
