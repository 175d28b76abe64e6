"""The contract between the model and an attention implementation over a paged KV cache.

A packed batch holds decode tokens first (one per sequence), then prefill chunks. Keys and
values of every token are written to their slot (block * block_size + offset) before attention
reads the sequence's whole context through its block table.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class SequenceSpan:
    """One sequence's part of the packed batch."""

    start: int
    query_len: int
    context_len: int  # tokens in the KV cache after this step's writes
    block_table: list[int]

    @property
    def num_cached(self) -> int:
        return self.context_len - self.query_len


@dataclass
class AttentionMetadata:
    num_decodes: int
    prefills: list[SequenceSpan]
    slot_mapping: torch.Tensor  # [T] slot per packed token
    block_size: int = 16
    sliding_window: int | None = None
    # Decode-only, int32: [num_decodes, max_blocks] block tables (zero-padded) and [num_decodes]
    # context lengths (tokens in the cache, including this step's).
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    # Prefill spans that read cached context: context slots and mask, aligned with `prefills`.
    prefill_context: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None


class AttentionBackend(ABC):
    name: str = "abstract"
    # KV-cache block sizes must be a multiple of this (flash-attn's paged KV reads 256-token pages).
    block_size_multiple: int = 1
    # Decode steps can be captured in a CUDA graph: fixed shapes, no host synchronization, and
    # padding rows (slot -1, context length 0) that write and read nothing.
    supports_cuda_graphs: bool = False

    @abstractmethod
    def build_metadata(self, decodes: list[SequenceSpan], prefills: list[SequenceSpan], block_size: int,
                       device: torch.device, sliding_window: int | None) -> AttentionMetadata: ...

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor | None,
                v_cache: torch.Tensor | None, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hk, D]; caches: [num_slots, Hk, D] or None (no cache: plain causal
        prefill, used for embeddings). Returns [T, Hq, D]."""
