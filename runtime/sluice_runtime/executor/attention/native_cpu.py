"""Builds and calls the native CPU decode-attention kernel (paged_decode_cpu.cpp).

The kernel is compiled once per machine with the system C++ compiler (for the host's vector
instructions) into the Sluice cache and loaded with ctypes, which releases the GIL during the
call. It links the same OpenMP runtime torch already loaded, so both share one thread pool. Where
no compiler is available the build fails once, a warning says why, and decode attention falls
back to the pure torch path.
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

import torch

from ...models.loading import sluice_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode_cpu.cpp")
# Reassociating float math lets the compiler turn the dot products into vector sums (about 2x
# here). Not -ffast-math itself: that links crtfastmath, which flushes subnormals to zero for the
# whole process once the library loads, and the kernel's -inf sentinels need real infinities.
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
         "-fno-trapping-math", "-freciprocal-math", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
_ENTRY_POINTS = {torch.float32: "sluice_paged_decode_f32", torch.bfloat16: "sluice_paged_decode_bf16"}
# Set to 0 to measure or debug the pure torch path.
ENV_SWITCH = "SLUICE_NATIVE_KERNELS"


def kernel_cache_dir() -> Path:
    return sluice_cache_dir() / "kernels"


@functools.cache
def load_library() -> ctypes.CDLL | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        log.warning("no C++ compiler found: CPU decode attention uses the slower torch path")
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *FLAGS]).encode()).hexdigest()[:16]
    target = kernel_cache_dir() / f"paged_decode_cpu-{key}.so"
    if not target.exists():
        try:
            _build(compiler, target)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", None) or str(error)
            log.warning("building the CPU decode-attention kernel failed, using the torch path: %s",
                        detail.strip().splitlines()[-1] if detail.strip() else error)
            return None
    library = ctypes.CDLL(str(target))
    for name in _ENTRY_POINTS.values():
        getattr(library, name).restype = ctypes.c_int
    return library


# Head sizes with a compiled variant (the kernel unrolls over the head size).
HEAD_DIMS = (64, 128)


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so concurrent processes never load a half-written file.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True,
                       check=True)
        os.replace(built, target)


def supports(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    return (device.type == "cpu" and dtype in _ENTRY_POINTS and head_dim in HEAD_DIMS
            and load_library() is not None)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, block_size: int, sliding_window: int | None,
                 scale: float) -> torch.Tensor:
    """q [B, Hq, D]; caches [num_slots, Hk, D]; block_tables [B, max_blocks] and context_lens [B] int32."""
    q = q.contiguous()
    out = torch.empty_like(q)
    batch, num_heads, head_dim = q.shape
    entry = getattr(load_library(), _ENTRY_POINTS[q.dtype])
    pointer = ctypes.c_void_p
    status = entry(pointer(q.data_ptr()), pointer(k_cache.data_ptr()), pointer(v_cache.data_ptr()),
          pointer(block_tables.data_ptr()), pointer(context_lens.data_ptr()), ctypes.c_int(batch),
          ctypes.c_int(block_tables.shape[1]), ctypes.c_int(num_heads), ctypes.c_int(k_cache.shape[1]),
          ctypes.c_int(head_dim), ctypes.c_int(block_size), ctypes.c_int(sliding_window or 0),
          ctypes.c_float(scale), pointer(out.data_ptr()))
    if status != 0:
        raise ValueError(f"no native decode kernel for head size {head_dim}")
    return out
