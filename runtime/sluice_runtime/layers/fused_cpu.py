"""RMSNorm (with the residual add) and rotary embedding on the CPU, each one native pass
(fused_cpu.cpp) instead of several torch kernels, for float32 and bfloat16 CPU tensors.

float32 keeps torch's arithmetic operation for operation (only the order of the norm's sum of
squares differs), so greedy outputs still match transformers token for token; GPUs keep torch
(and CUDA graphs capture it).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import native_build

SOURCE = Path(__file__).with_name("fused_cpu.cpp")
# The norm keeps one float32 row on the stack.
MAX_HIDDEN = 16384
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}

_pointer = ctypes.c_void_p


def _library() -> ctypes.CDLL | None:
    return native_build.load(SOURCE, "fused CPU layer ops")


def applies(dtype: torch.dtype, device: torch.device) -> bool:
    return dtype in _SUFFIX and device.type == "cpu" and _library() is not None


def norm_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Rows of a 2-D CPU tensor, with a weight of its dtype, that fit the kernel's row buffer."""
    return (applies(x.dtype, x.device) and weight.dtype == x.dtype and x.dim() == 2
            and x.shape[-1] <= MAX_HIDDEN)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> torch.Tensor:
    """weight * norm(x), or with a residual: residual += x in place, then weight * norm(residual)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    getattr(_library(), f"sluice_rms_norm_{_SUFFIX[x.dtype]}")(
        _pointer(x.data_ptr()), _pointer(residual.data_ptr() if residual is not None else None),
        _pointer(weight.data_ptr()), _pointer(out.data_ptr()), ctypes.c_long(x.shape[0]),
        ctypes.c_int(x.shape[1]), ctypes.c_float(eps))
    return out


def rotary_(x: torch.Tensor, heads: int, head_dim: int, positions: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> None:
    """Rotates x [T, heads, head_dim] in place (any row stride, heads contiguous within a row);
    positions int64 [T]; cos and sin the float32 [max_positions, head_dim] tables."""
    getattr(_library(), f"sluice_rotary_{_SUFFIX[x.dtype]}")(
        _pointer(x.data_ptr()), ctypes.c_long(x.shape[0]), ctypes.c_long(x.stride(0)), ctypes.c_int(heads),
        ctypes.c_int(head_dim), _pointer(positions.data_ptr()), _pointer(cos.data_ptr()),
        _pointer(sin.data_ptr()))
