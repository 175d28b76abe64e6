"""How many CPUs this process may really use: the cores it may run on, capped by its cgroup's CPU quota.

torch starts a thread per core it may run on. In a container with a CPU limit (a CFS quota) on a larger node
that is the node's cores, not the pod's share: the threads then wait on each other at every barrier while the
quota throttles them. The quota is read from cgroup v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us` over
`cpu.cfs_period_us`); no quota leaves the core count.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _quota_cpus(root: Path) -> float | None:
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """The cores this process may run on, or fewer when its cgroup's quota allows fewer (rounded up: a quota of
    1.5 CPUs keeps two threads busy most of the time)."""
    cores = len(os.sched_getaffinity(0))
    quota = _quota_cpus(root)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))
