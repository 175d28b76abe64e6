"""Half-precision (bfloat16, float16) linear layers on the CPU, in the fastest form this CPU has.

Where oneDNN computes bfloat16 natively (cpu_isa.CpuPaths.onednn_bf16), torch's plain linear
re-lays out the weight into oneDNN's blocked format on every call; for the small batches of a
decode step that reorder is a large share of the matmul, so the weight is packed once at load
(about 1.2-1.4x per linear at 8-64 rows). Where oneDNN does not (AVX2 and below; float16 without
AVX512-FP16 or AMX), torch's half-precision matmul is an emulation 3-8x slower than float32 at
16-256 rows; the layer then widens its input and weight to float32 per call (1.1-1.25x float32's
time) and keeps the weight in half precision, the memory the user asked for. Either way a single
row (batch-1 decode) stays on the plain path: it is memory-bound, so half the bytes win there.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

# The batch size oneDNN tunes the packed layout for: a typical decode batch.
BATCH_HINT = 32
PACKED = "packed for oneDNN"
WIDENED = "computed in float32"


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _rows(x) < 2:
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def _widened_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _rows(x) < 2:
        return F.linear(x, self.weight, self.bias)
    bias = None if self.bias is None else self.bias.float()
    return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def prepare_linears(model: nn.Module, native: dict[torch.dtype, bool]) -> tuple[str | None, int]:
    """Gives every half-precision CPU linear of `model` its fast forward. `native` says per dtype
    whether oneDNN computes it natively. Returns how they compute (PACKED, WIDENED or None) and how many."""
    mode, count = None, 0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        # A row-parallel layer across ranks all-reduces in its own forward, which must stay.
        if type(module).forward is not nn.Linear.forward and getattr(getattr(module, "tp", None), "size", 1) > 1:
            continue
        dtype = module.weight.dtype
        if dtype not in (torch.bfloat16, torch.float16) or module.weight.device.type != "cpu":
            continue
        if native.get(dtype, False):
            if dtype != torch.bfloat16 or not packing_available():
                continue  # oneDNN's plain path is already native
            module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), BATCH_HINT)
            module.forward = types.MethodType(_packed_forward, module)
            mode = PACKED
        else:
            module.forward = types.MethodType(_widened_forward, module)
            mode = WIDENED
        count += 1
    return mode, count
