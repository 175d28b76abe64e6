"""LoRA deltas on a fused projection, batched per adapter.

A step's tokens may belong to several adapters and to the base model. `LoraBatch` says which resident adapter
slot each row of the step uses, and `LoraLinear` adds `x @ A.T @ B.T` of that slot to the base projection's
output, in one of two forms, never a loop over requests:
- masked (small steps: decodes): every slot's A at once, the columns of other slots zeroed per row, then every
  slot's B at once: three ops per projection however many adapters the step has. Its work grows with the slots,
  so it serves steps where rows x slots stays small, where the op count, not arithmetic, is the cost.
- grouped (large steps: prefill chunks): for each adapter in the step, its rows gathered, one pair of matmuls,
  the result added back to those rows.

A slot's weights are stacked over the projection's parts (q, k, v or gate, up): A is (parts x rank, in) and B
block-diagonal, kept transposed as (parts x rank, out), so one pair of matmuls covers every part. Slots are
sized for --max-lora-rank; a lower rank, or a part the adapter leaves alone, is zeros.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

# The masked form computes rows x slots deltas of which only `rows` are kept.
MASKED_MAX_ROW_SLOTS = 256


@dataclass
class LoraGroup:
    slot: int
    rows: torch.Tensor | None  # None: every row of the step


@dataclass
class LoraBatch:
    """The step's LoRA rows: `groups` (grouped form) or `row_slots` (masked form; -1 for a base-model row);
    neither when no row of the step uses an adapter."""

    groups: list[LoraGroup] = field(default_factory=list)
    row_slots: torch.Tensor | None = None
    _masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def set(self, groups: list[LoraGroup], row_slots: torch.Tensor | None) -> None:
        self.groups, self.row_slots = groups, row_slots
        self._masks.clear()

    def mask(self, num_slots: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """(rows, slots x width): 1 where a column belongs to the row's slot; one per width and step."""
        mask = self._masks.get(width)
        if mask is None:
            columns = torch.arange(num_slots * width, device=self.row_slots.device) // width
            mask = self._masks[width] = (self.row_slots[:, None] == columns[None, :]).to(dtype)
        return mask


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
        self.register_buffer("lora_bt", torch.zeros(num_slots, ranks, out_features, dtype=weight.dtype,
                                                    device=weight.device), persistent=False)

    def set_slot(self, slot: int, parts: list[tuple[torch.Tensor, torch.Tensor] | None] | None) -> None:
        """Write one adapter's (A, B) per part into `slot`; None (or a None part) leaves it zero."""
        a, bt = self.lora_a[slot], self.lora_bt[slot]
        a.zero_()
        bt.zero_()
        offset = 0
        for index, size in enumerate(self.part_sizes):
            pair = parts[index] if parts else None
            if pair is not None:
                pa, pb = pair
                rank, first = pa.shape[0], index * self.max_rank
                a[first:first + rank].copy_(pa)
                bt[first:first + rank, offset:offset + size].copy_(pb.t())
            offset += size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.batch
        if batch.row_slots is not None:
            slots, ranks = self.lora_a.shape[:2]
            xa = x @ self.lora_a.view(slots * ranks, -1).t()
            xa.mul_(batch.mask(slots, ranks, xa.dtype))
            return out.addmm_(xa, self.lora_bt.view(slots * ranks, -1))
        for group in batch.groups:
            a, bt = self.lora_a[group.slot], self.lora_bt[group.slot]
            if group.rows is None:
                out.addmm_(x @ a.t(), bt)
            else:
                out.index_add_(0, group.rows, (x.index_select(0, group.rows) @ a.t()) @ bt)
        return out
