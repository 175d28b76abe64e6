"""CPU linear layers in the fastest form this CPU has.

Float32 (cpu_isa.CpuPaths.onednn_fp32): torch's plain linear hands a decode step's small-row
matmuls to MKL, which runs the wide ones (gate_up, the LM head) at about half the speed of oneDNN
with the weight packed once at load (README, the engine's CPU paths). The packed copy replaces the
weight, so memory does not grow; only a weight shared with another layer (the tied embedding) is
kept beside its packed copy.

Half precision: where oneDNN computes bfloat16 natively (cpu_isa.CpuPaths.onednn_bf16), torch's
plain linear re-lays out the weight into oneDNN's blocked format on every call; for the small
batches of a decode step that reorder is a large share of the matmul, so the weight is packed once
at load. Where oneDNN does not (AVX2 and below; float16 without AVX512-FP16 or AMX), torch's
half-precision matmul is an emulation 3-8x slower than float32 at 16-256 rows; the layer then
widens its input and weight to float32 per call and keeps the weight in half precision, the memory
the user asked for. Either way a single row (batch-1 decode) stays on the plain half-precision
path: it is memory-bound, so half the bytes win there.
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
    if _rows(x) < 2 and self.weight.dtype != torch.float32:
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def _widened_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _rows(x) < 2:
        return F.linear(x, self.weight, self.bias)
    bias = None if self.bias is None else self.bias.float()
    return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def _shape_only(weight: torch.Tensor) -> nn.Parameter:
    """A stand-in that keeps the weight's shape, dtype and device (what LoRA slots read) in no memory."""
    return nn.Parameter(torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape),
                        requires_grad=False)


def prepare_linears(model: nn.Module, native: dict[torch.dtype, bool]) -> tuple[str | None, int]:
    """Gives every CPU linear of `model` its fast forward. `native` says per dtype whether oneDNN
    computes it natively (for float32: whether to pack). Returns how they compute (PACKED, WIDENED
    or None) and how many."""
    shared = {id(p) for m in model.modules() if not isinstance(m, nn.Linear) for p in m.parameters(recurse=False)}
    mode, count = None, 0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        # A row-parallel layer across ranks all-reduces in its own forward, which must stay.
        if type(module).forward is not nn.Linear.forward and getattr(getattr(module, "tp", None), "size", 1) > 1:
            continue
        dtype = module.weight.dtype
        if dtype not in native or module.weight.device.type != "cpu":
            continue
        if native[dtype]:
            if dtype == torch.float16 or not packing_available():
                continue  # oneDNN's plain float16 path is already native
            module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), BATCH_HINT)
            if dtype == torch.float32 and id(module.weight) not in shared:
                module.weight = _shape_only(module.weight)
            module.forward = types.MethodType(_packed_forward, module)
            mode = PACKED
        elif dtype == torch.float32:
            continue
        else:
            module.forward = types.MethodType(_widened_forward, module)
            mode = WIDENED
        count += 1
    return mode, count
