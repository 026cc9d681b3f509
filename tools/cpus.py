"""Print how many CPUs this process may use: the CPUs it may run on, further limited by a
cgroup CPU quota (a container given "2 CPUs" on a larger host sees all the host's CPUs in
``nproc`` but gets two CPUs' time). `make test` starts this many pytest workers, at most 4.

Usage: ``python3 tools/cpus.py [cap]``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path


def _quota() -> float | None:
    """CPUs' worth of time the cgroup allows (v2 ``cpu.max``, else v1), or None."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return quota / period
    except (OSError, ValueError):
        pass
    return None


def cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


if __name__ == "__main__":
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else None
    n = cpus()
    print(min(n, cap) if cap else n)
