"""Compiles our C++ kernels once per machine and loads them with ctypes.

Each source is built with the system C++ compiler for the vector instructions of the CPU level
(cpu_isa: this CPU's, or the lower one SLUICE_CPU_ISA asks for) into the Sluice cache, keyed by
its text, the flags and the CPU's features (so a shared cache never hands one CPU another's
build), and loaded with ctypes, which releases the GIL during calls. The libraries link the
OpenMP runtime torch already loaded, so all share one thread pool. Where no compiler is available
the build fails once, a warning says why, and callers fall back to their pure torch paths.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cache_dir import sluice_cache_dir
from .cpu_isa import cpu_paths

log = logging.getLogger(__name__)

# Reassociating float math lets the compiler turn reductions into vector sums (about 2x for the
# attention dot products). Not -ffast-math itself: that links crtfastmath, which flushes subnormals
# to zero for the whole process once a library loads, and the kernels' -inf sentinels need real
# infinities.
FLAGS = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
         "-fno-trapping-math", "-freciprocal-math", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# Set to 0 to measure or debug the pure torch paths.
ENV_SWITCH = "SLUICE_NATIVE_KERNELS"


def kernel_cache_dir() -> Path:
    return sluice_cache_dir() / "kernels"


@functools.cache
def load(source: Path, what: str) -> ctypes.CDLL | None:
    """The built library of `source`, or None (torch paths) when disabled or unbuildable; `what`
    names the kernels in the warning."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        log.warning("no C++ compiler found: %s uses the slower torch path", what)
        return None
    paths = cpu_paths()
    flags = [*FLAGS, *paths.compile_flags]
    key = hashlib.sha256(source.read_bytes() + " ".join([compiler, *flags, repr(paths)]).encode()).hexdigest()[:16]
    target = kernel_cache_dir() / f"{source.stem}-{key}.so"
    if not target.exists():
        try:
            _build(compiler, flags, source, target)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = (getattr(error, "stderr", None) or str(error)).strip()
            log.warning("building the native %s failed, using the torch path: %s", what,
                        detail.splitlines()[-1] if detail else error)
            return None
    return ctypes.CDLL(str(target))


def _build(compiler: str, flags: list[str], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so concurrent processes never load a half-written file.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run([compiler, *flags, str(source), "-o", str(built)], capture_output=True, text=True,
                       check=True)
        os.replace(built, target)
