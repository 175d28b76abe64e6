"""Linear layers sharded across tensor-parallel ranks (Megatron style).

A column-parallel layer splits its output features: each rank computes its own attention heads
or MLP channels with no communication. The row-parallel layer that follows splits its input
features the same way and sums the ranks' partial outputs with one all-reduce. So a decoder layer
costs two all-reduces (after o_proj and after down_proj). With one rank these are plain
nn.Linear layers, parameter names included, so checkpoints load unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1

    def units(self, total: int) -> tuple[int, int]:
        """(first, count) of `total` heads or channels this rank holds.

        Fewer units than ranks (GQA with few KV heads) replicate: rank r holds unit r * total // size.
        """
        count = max(1, total // self.size)
        return self.rank * total // self.size, count


class ColumnParallelLinear(nn.Linear):
    """Output features in parts of (units, unit_size), e.g. q, k, v heads or gate and up channels;
    each part is sharded by units on its own, so a fused projection splits the same as unfused ones."""

    def __init__(self, in_features: int, parts: list[tuple[int, int]], bias: bool, tp: TensorParallel):
        self.parts, self.tp = parts, tp
        super().__init__(in_features, sum(tp.units(units)[1] * size for units, size in parts), bias=bias)

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full checkpoint weight or bias."""
        if self.tp.size == 1:
            return full
        pieces, offset = [], 0
        for units, size in self.parts:
            first, count = self.tp.units(units)
            pieces.append(full[offset + first * size: offset + (first + count) * size])
            offset += units * size
        return torch.cat(pieces)


class RowParallelLinear(nn.Linear):
    """Input features in `units` groups of unit_size (heads or channels), sharded like the column-parallel
    layer feeding it; partial outputs are summed across ranks, then the bias is added once."""

    def __init__(self, units: int, unit_size: int, out_features: int, bias: bool, tp: TensorParallel):
        self.units, self.unit_size, self.tp = units, unit_size, tp
        super().__init__(tp.units(units)[1] * unit_size, out_features, bias=bias)

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1 or full.dim() == 1:
            return full
        first, count = self.tp.units(self.units)
        return full[:, first * self.unit_size:(first + count) * self.unit_size]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        out = F.linear(x, self.weight)
        torch.distributed.all_reduce(out)
        return out if self.bias is None else out + self.bias
