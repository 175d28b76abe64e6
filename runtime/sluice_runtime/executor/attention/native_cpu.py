"""Calls the native CPU decode-attention kernel (paged_decode_cpu.cpp, built by native_build)."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ... import native_build

SOURCE = Path(__file__).with_name("paged_decode_cpu.cpp")
_ENTRY_POINTS = {torch.float32: "sluice_paged_decode_f32", torch.bfloat16: "sluice_paged_decode_bf16"}
# Head sizes with a compiled variant (the kernel unrolls over the head size).
HEAD_DIMS = (64, 128)


@functools.cache
def load_library() -> ctypes.CDLL | None:
    library = native_build.load(SOURCE, "CPU decode attention")
    if library is not None:
        for name in _ENTRY_POINTS.values():
            getattr(library, name).restype = ctypes.c_int
        library.sluice_paged_decode_kernel.restype = ctypes.c_char_p
    return library


def kernel_name() -> str:
    """The decode kernel this CPU level's build runs (three-pass AVX-512 or AVX2, or generic), or
    'torch' where the library could not be built."""
    library = load_library()
    return library.sluice_paged_decode_kernel().decode() if library is not None else "torch"


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
