"""Attention backends: one interface, a torch reference for the CPU, GPU kernels behind the same calls."""
from __future__ import annotations

import logging
import os

import torch

from ...model_load_error import ModelLoadError
from .base import AttentionBackend, AttentionMetadata, SequenceSpan
from .torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "SequenceSpan", "TorchAttentionBackend",
           "select_backend"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "triton", "flash-attn")


def select_backend(device: str | torch.device, name: str = "auto", dtype: torch.dtype = torch.float32,
                   head_dim: int = 64) -> AttentionBackend:
    """auto: flash-attn where it is importable and can serve the model on CUDA, else Triton on CUDA, else torch."""
    device = torch.device(device)
    if name == "auto":
        if device.type != "cuda":
            return TorchAttentionBackend()
        name = "flash-attn" if _flash_attn_fits(dtype, head_dim) else "triton"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ModelLoadError("--attention-backend triton needs --device cuda (or TRITON_INTERPRET=1 to run "
                                 "the kernels in Triton's interpreter on the CPU, for tests)")
        try:
            from .triton_backend import TritonAttentionBackend
        except ImportError as exc:
            raise ModelLoadError(f"--attention-backend triton needs the triton package (pip install "
                                 f"'sluice[gpu]'): {exc}") from None
        return TritonAttentionBackend(device)
    if name == "flash-attn":
        problem = _flash_attn_problem(device, dtype, head_dim)
        if problem:
            raise ModelLoadError(f"--attention-backend flash-attn: {problem}")
        from .flash_backend import FlashAttentionBackend

        return FlashAttentionBackend()
    raise ModelLoadError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")


def _flash_attn_fits(dtype: torch.dtype, head_dim: int) -> bool:
    problem = _flash_attn_problem(torch.device("cuda"), dtype, head_dim)
    if problem:
        log.info("attention: Triton kernels, not flash-attn (%s)", problem)
    return problem is None


def _flash_attn_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    if device.type != "cuda":
        return "flash-attn runs only on CUDA devices; use --device cuda"
    if dtype not in (torch.float16, torch.bfloat16):
        return "flash-attn computes in float16 or bfloat16; use --dtype bfloat16 or --attention-backend triton"
    if head_dim % 8 or head_dim > 256:
        return f"flash-attn supports head dimensions up to 256 in multiples of 8, this model has {head_dim}"
    try:
        import flash_attn  # noqa: F401
    except ImportError as exc:
        return f"the flash_attn package is not importable ({exc})"
    return None
