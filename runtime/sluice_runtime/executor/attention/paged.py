"""Step metadata for kernels that read the KV cache through block tables (Triton, flash-attn).

Per-sequence lengths and block tables as int32 device tensors, built once per step on the host
and shared by every layer. Host-side maxima ride along for launch grids and flash-attn's
arguments; they are never read back from the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..transfer import to_device
from .base import AttentionMetadata, SequenceSpan


@dataclass
class PagedAttentionMetadata(AttentionMetadata):
    # Longest decode context this metadata may describe; sizes the split-KV decode grid. For a
    # CUDA graph it is the model's context length, since the graph is reused for every step.
    decode_max_context: int = 0
    # Prefills, aligned with `prefills`: first packed row, new tokens, context after this step.
    prefill_query_starts: torch.Tensor | None = None
    prefill_query_lens: torch.Tensor | None = None
    prefill_context_lens: torch.Tensor | None = None
    # Cumulative query and context lengths ([P + 1], from 0), as flash-attn's varlen API takes them.
    prefill_cu_query_lens: torch.Tensor | None = None
    prefill_cu_context_lens: torch.Tensor | None = None
    prefill_block_tables: torch.Tensor | None = None
    prefill_max_query_len: int = 0
    prefill_max_context_len: int = 0


def _slots(span: SequenceSpan, block_size: int, first: int) -> list[int]:
    table = span.block_table
    return [table[pos // block_size] * block_size + pos % block_size for pos in range(first, span.context_len)]


def _tables(spans: list[SequenceSpan], block_size: int, device: torch.device) -> torch.Tensor:
    """[len(spans), max used blocks] int32, zero-padded."""
    used = [-(-s.context_len // block_size) for s in spans]
    width = max(used)
    return to_device([s.block_table[:n] + [0] * (width - n) for s, n in zip(spans, used)], torch.int32, device)


def build_paged_metadata(decodes: list[SequenceSpan], prefills: list[SequenceSpan], block_size: int,
                         device: torch.device, sliding_window: int | None) -> PagedAttentionMetadata:
    slots: list[int] = []
    for span in decodes:
        slots.extend(_slots(span, block_size, span.context_len - 1))
    for span in prefills:
        slots.extend(_slots(span, block_size, span.num_cached))
    meta = PagedAttentionMetadata(num_decodes=len(decodes), prefills=prefills, block_size=block_size,
                                  slot_mapping=to_device(slots, torch.long, device), sliding_window=sliding_window)
    if decodes:
        meta.decode_block_tables = _tables(decodes, block_size, device)
        meta.decode_context_lens = to_device([s.context_len for s in decodes], torch.int32, device)
        meta.decode_max_context = max(s.context_len for s in decodes)
    if prefills:
        query_lens = [s.query_len for s in prefills]
        context_lens = [s.context_len for s in prefills]
        meta.prefill_query_starts = to_device([s.start for s in prefills], torch.int32, device)
        meta.prefill_query_lens = to_device(query_lens, torch.int32, device)
        meta.prefill_context_lens = to_device(context_lens, torch.int32, device)
        meta.prefill_cu_query_lens = to_device(_cumulative(query_lens), torch.int32, device)
        meta.prefill_cu_context_lens = to_device(_cumulative(context_lens), torch.int32, device)
        meta.prefill_block_tables = _tables(prefills, block_size, device)
        meta.prefill_max_query_len = max(query_lens)
        meta.prefill_max_context_len = max(context_lens)
    return meta


def _cumulative(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out
