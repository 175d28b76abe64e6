"""Attention in plain torch: the CPU path and the yardstick for GPU kernels.

Decode on the CPU reads the paged cache in place with the native kernel (native_cpu.py) when it
could be built; the gather-then-SDPA path below is its fallback and its reference in the tests.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native_cpu
from .base import AttentionBackend, AttentionMetadata, SequenceSpan


def context_slots(span: SequenceSpan, block_size: int) -> torch.Tensor:
    positions = torch.arange(span.context_len)
    table = torch.tensor(span.block_table, dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self, native_decode: bool = True):
        self.native_decode = native_decode

    def build_metadata(self, decodes, prefills, block_size, device, sliding_window):
        prefill_slot_rows = [context_slots(s, block_size) for s in prefills]
        decode_writes = [s.block_table[(s.context_len - 1) // block_size] * block_size
                         + (s.context_len - 1) % block_size for s in decodes]
        writes = [torch.tensor(decode_writes, dtype=torch.long)] + [
            row[s.num_cached:] for row, s in zip(prefill_slot_rows, prefills)]
        meta = AttentionMetadata(
            num_decodes=len(decodes), prefills=prefills, block_size=block_size,
            slot_mapping=torch.cat(writes).to(device), sliding_window=sliding_window)
        if decodes:
            max_blocks = max(-(-s.context_len // block_size) for s in decodes)
            meta.decode_block_tables = torch.tensor(
                [s.block_table[:max_blocks] + [0] * (max_blocks - len(s.block_table)) for s in decodes],
                dtype=torch.int32, device=device)
            meta.decode_context_lens = torch.tensor([s.context_len for s in decodes], dtype=torch.int32,
                                                    device=device)
        meta.prefill_context = [
            None if span.num_cached == 0 and not sliding_window
            else (row.to(device), _prefill_mask(span, sliding_window).to(device))
            for row, span in zip(prefill_slot_rows, prefills)
        ]
        return meta

    def forward(self, q, k, v, k_cache, v_cache, meta, scale):
        if k_cache is not None:
            k_cache.index_copy_(0, meta.slot_mapping, k)
            v_cache.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            native = self.native_decode and native_cpu.supports(q.dtype, q.device, q.shape[-1])
            decode = native_cpu.paged_decode if native else gathered_decode
            out[:nd] = decode(q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                              meta.block_size, meta.sliding_window, scale)
        for span, context in zip(meta.prefills, meta.prefill_context or [None] * len(meta.prefills)):
            rows = slice(span.start, span.start + span.query_len)
            if context is None:
                keys, values, mask = k[rows], v[rows], None
            else:
                slots, mask = context
                keys, values = k_cache[slots], v_cache[slots]
                mask = mask if mask.dtype == q.dtype else mask.to(q.dtype)
            out[rows] = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                values.transpose(0, 1).unsqueeze(0), attn_mask=mask, is_causal=mask is None,
                scale=scale, enable_gqa=True,
            ).squeeze(0).transpose(0, 1)
        return out


def gathered_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, block_size: int, sliding_window: int | None,
                    scale: float) -> torch.Tensor:
    """Decode attention by copying each sequence's blocks out, padded to the longest, then SDPA."""
    keys = _gather_blocks(k_cache, block_tables, block_size)
    values = _gather_blocks(v_cache, block_tables, block_size)
    positions = torch.arange(keys.shape[2], device=q.device)
    lengths = context_lens.to(torch.long)[:, None]
    mask = positions[None, :] < lengths
    if sliding_window:
        mask &= positions[None, :] >= lengths - sliding_window
    return F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True,
    ).squeeze(2)


def _gather_blocks(cache: torch.Tensor, tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """[num_slots, Hk, D] cache and [B, max_blocks] tables -> [B, Hk, max_blocks * block_size, D].

    Copying whole blocks (one contiguous run each) is several times faster on the CPU than
    gathering token slots one by one.
    """
    batch, max_blocks = tables.shape
    heads, dim = cache.shape[1], cache.shape[2]
    blocks = cache.view(-1, block_size * heads * dim).index_select(0, tables.flatten().to(torch.long))
    return blocks.view(batch, max_blocks * block_size, heads, dim).transpose(1, 2)


def _prefill_mask(span: SequenceSpan, sliding_window: int | None) -> torch.Tensor:
    """0 where a query may see a key, -inf elsewhere. Additive, not boolean: SDPA on the CPU
    converts a boolean mask into this form on every call and layer (README, the engine's CPU paths)."""
    query_pos = span.num_cached + torch.arange(span.query_len)[:, None]
    key_pos = torch.arange(span.context_len)[None, :]
    visible = key_pos <= query_pos
    if sliding_window:
        visible &= key_pos > query_pos - sliding_window
    return torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))
