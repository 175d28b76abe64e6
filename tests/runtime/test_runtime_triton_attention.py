"""The Triton kernels on the CPU: triton_interpreted.py, run in its own process under TRITON_INTERPRET=1.

triton reads the variable when it is imported, and torch imports triton early in this process,
so the interpreted checks cannot run here; a child pytest runs them from a clean start.
"""
import os
import subprocess
import sys
from pathlib import Path

CHECKS = Path(__file__).with_name("triton_interpreted.py")


def test_triton_kernels_match_torch_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(CHECKS)],
        cwd=CHECKS.parents[2], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600)
    report = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and "skipped" not in result.stdout, report
