"""How many CPUs this process may use (standard library only: `make test` loads this file by
path, before any package is installed).

The CPUs it may run on (its affinity mask: taskset, a batch scheduler's allocation), further
limited by a cgroup CPU quota: a container given 2 CPUs on a larger host sees every host
CPU in its affinity and in ``nproc``, but gets two CPUs' time, and more threads or
compiler processes than that only take turns.
"""

from __future__ import annotations

import math
import os
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


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, at most the cgroup quota (rounded up)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)
