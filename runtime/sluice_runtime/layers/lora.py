"""LoRA deltas on a fused projection, batched per adapter.

A step's tokens may belong to several adapters and to the base model. `LoraBatch` says which rows of the
step each resident adapter slot owns; `LoraLinear` adds, for each slot present, `x[rows] @ A.T @ B.T` to the
base projection's output: one pair of matmuls per adapter in the step, however many requests use it.

A slot's weights are stacked over the projection's parts (q, k, v or gate, up): A is (parts x rank, in) and B
is block-diagonal (out, parts x rank), so one pair of matmuls covers every part. Slots are sized for
--max-lora-rank; an adapter of lower rank, or one that leaves a part alone, fills the rest with zeros.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class LoraGroup:
    slot: int
    rows: torch.Tensor | None  # None: every row of the step


@dataclass
class LoraBatch:
    """The step's rows per resident slot; empty when no token of the step uses an adapter."""

    groups: list[LoraGroup] = field(default_factory=list)


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, part_sizes: list[int], num_slots: int, max_rank: int, batch: LoraBatch):
        super().__init__()
        self.base = base
        self.part_sizes = part_sizes
        self.max_rank = max_rank
        self.batch = batch  # shared by every LoraLinear of the model, replaced in place each step
        weight = base.weight
        in_features, out_features = weight.shape[1], weight.shape[0]
        ranks = max_rank * len(part_sizes)
        self.register_buffer("lora_a", torch.zeros(num_slots, ranks, in_features, dtype=weight.dtype,
                                                   device=weight.device), persistent=False)
        self.register_buffer("lora_b", torch.zeros(num_slots, out_features, ranks, dtype=weight.dtype,
                                                   device=weight.device), persistent=False)

    def set_slot(self, slot: int, parts: list[tuple[torch.Tensor, torch.Tensor] | None] | None) -> None:
        """Write one adapter's (A, B) per part into `slot`; None (or a None part) leaves it zero."""
        a, b = self.lora_a[slot], self.lora_b[slot]
        a.zero_()
        b.zero_()
        offset = 0
        for index, size in enumerate(self.part_sizes):
            pair = parts[index] if parts else None
            if pair is not None:
                pa, pb = pair
                rank, first = pa.shape[0], index * self.max_rank
                a[first:first + rank].copy_(pa)
                b[offset:offset + size, first:first + rank].copy_(pb)
            offset += size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for group in self.batch.groups:
            a, b = self.lora_a[group.slot], self.lora_b[group.slot]
            if group.rows is None:
                out.add_((x @ a.t()) @ b.t())
            else:
                out.index_add_(0, group.rows, (x.index_select(0, group.rows) @ a.t()) @ b.t())
        return out
