"""The runtime's thread count follows its cgroup's CPU quota (a pod's CPU limit), not the node's core count."""
from __future__ import annotations

import os

import pytest

from sluice_runtime.executor.cpu_budget import usable_cpus

CORES = len(os.sched_getaffinity(0))


def _v1(root, quota: int, period: int = 100_000):
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


def test_no_quota_leaves_the_cores(tmp_path):
    assert usable_cpus(tmp_path) == CORES
    assert usable_cpus(_v1(tmp_path, -1)) == CORES
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == CORES


@pytest.mark.parametrize("quota,expected", [(100_000, 1), (50_000, 1), (150_000, 2), (10_000_000, CORES)])
def test_a_cgroup_v1_quota_caps_the_threads(tmp_path, quota, expected):
    assert usable_cpus(_v1(tmp_path, quota)) == min(expected, CORES)


def test_a_cgroup_v2_quota_caps_the_threads(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert usable_cpus(tmp_path) == CORES

