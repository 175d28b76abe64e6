"""bfloat16 linear layers on the CPU with weights pre-packed once for oneDNN.

torch's plain CPU linear re-lays out a bfloat16 weight into oneDNN's blocked format on every call;
for the small batches of a decode step that reorder is a large share of the matmul. Packing once
at load time removes it (about 1.2-1.4x per linear at 8-64 rows on this machine). A single row
(batch-1 decode) stays on the plain path, where the packed kernel measured slower.
"""
from __future__ import annotations

import logging
import types

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

# The batch size oneDNN tunes the packed layout for: a typical decode batch.
BATCH_HINT = 32


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] < 2:
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def prepack_linears(model: nn.Module) -> int:
    """Give every bfloat16 CPU linear layer of `model` a packed weight; returns how many."""
    if not packing_available():
        return 0
    count = 0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        # A row-parallel layer across ranks all-reduces in its own forward, which must stay.
        if type(module).forward is not nn.Linear.forward and getattr(getattr(module, "tp", None), "size", 1) > 1:
            continue
        if module.weight.dtype != torch.bfloat16 or module.weight.device.type != "cpu":
            continue
        module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), BATCH_HINT)
        module.forward = types.MethodType(_packed_forward, module)
        count += 1
    return count
