"""The only places the runtime writes, so it can serve from a read-only root filesystem.

Two directories take every write: SLUICE_CACHE_DIR, for what is built once and worth keeping (converted
models, compiled kernels, downloads, and the compile caches of Triton and torch), and the temporary directory
(TMPDIR), for scratch (the C++ compiler's files). Libraries whose caches default to the home directory are
pointed under SLUICE_CACHE_DIR unless their own variable is set, so an unwritable HOME costs nothing. Both
directories are checked at start: a pod that forgot a volume learns it from one line, not from a traceback
in the middle of a conversion or a kernel build.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .cache_dir import sluice_cache_dir

# Each library's own variable and its directory under SLUICE_CACHE_DIR. HF_HOME itself stays, so a token
# saved by `huggingface-cli login` is still read from it.
LIBRARY_CACHES = {
    "HF_HUB_CACHE": "huggingface/hub",
    "HF_ASSETS_CACHE": "huggingface/assets",
    "HF_XET_CACHE": "huggingface/xet",
    "HF_MODULES_CACHE": "huggingface/modules",  # transformers' remote code
    "TRITON_HOME": "triton",  # compiled GPU kernels (.triton/cache) and Triton's dumps
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "CUDA_CACHE_PATH": "nv-compute-cache",  # the CUDA driver's JIT cache, else ~/.nv/ComputeCache
}

class UnwritableDir(Exception):
    """A directory the runtime must write to cannot be written; the message says which and what to set."""


def prepare() -> None:
    """Check SLUICE_CACHE_DIR and the temporary directory, and point the libraries' caches into the former.

    Call before torch, transformers or triton are imported: they read their variables at import."""
    cache = sluice_cache_dir()
    _check_writable(cache, "SLUICE_CACHE_DIR", "the runtime's cache (converted models, compiled kernels)")
    temporary = os.environ.get("TMPDIR")
    if temporary:
        _check_writable(Path(temporary), "TMPDIR", "scratch files")
    else:
        try:
            tempfile.gettempdir()
        except FileNotFoundError:
            raise UnwritableDir("no writable temporary directory (/tmp, /var/tmp or the working directory); "
                                "set TMPDIR to a writable directory, e.g. an emptyDir volume") from None
    for variable, name in LIBRARY_CACHES.items():
        os.environ.setdefault(variable, str(cache / name))


def _check_writable(directory: Path, variable: str, purpose: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UnwritableDir(f"{variable} ({directory}), for {purpose}, is not writable: {exc.strerror or exc}; "
                            f"set {variable} to a writable directory (with a read-only root filesystem, a "
                            "volume such as an emptyDir)") from None
