"""Reference attention in plain torch; the CPU path and the yardstick for GPU kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata, SequenceSpan


def context_slots(span: SequenceSpan, block_size: int) -> torch.Tensor:
    positions = torch.arange(span.context_len)
    table = torch.tensor(span.block_table, dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def build_metadata(self, decodes, prefills, block_size, device, sliding_window):
        decode_slot_rows = [context_slots(s, block_size) for s in decodes]
        prefill_slot_rows = [context_slots(s, block_size) for s in prefills]
        writes = [row[-1:] for row in decode_slot_rows] + [
            row[s.num_cached:] for row, s in zip(prefill_slot_rows, prefills)]
        meta = AttentionMetadata(
            num_decodes=len(decodes), prefills=prefills, block_size=block_size,
            slot_mapping=(torch.cat(writes) if writes else torch.empty(0, dtype=torch.long)).to(device))
        if decodes:
            lengths = torch.tensor([s.context_len for s in decodes])
            max_blocks = -(-int(lengths.max()) // block_size)
            tables = torch.zeros(len(decodes), max_blocks, dtype=torch.long)
            for row, span in enumerate(decodes):
                used = -(-span.context_len // block_size)
                tables[row, :used] = torch.tensor(span.block_table[:used])
            positions = torch.arange(max_blocks * block_size)
            mask = positions[None, :] < lengths[:, None]
            if sliding_window:
                mask &= positions[None, :] >= (lengths[:, None] - sliding_window)
            meta.decode_block_tables = tables.to(device)
            meta.decode_mask = mask[:, None, None, :].to(device)
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
            keys = _gather_blocks(k_cache, meta.decode_block_tables, meta.block_size)
            values = _gather_blocks(v_cache, meta.decode_block_tables, meta.block_size)
            out[:nd] = F.scaled_dot_product_attention(
                q[:nd].unsqueeze(2), keys, values, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True,
            ).squeeze(2)
        for span, context in zip(meta.prefills, meta.prefill_context or [None] * len(meta.prefills)):
            rows = slice(span.start, span.start + span.query_len)
            if context is None:
                keys, values, mask = k[rows], v[rows], None
            else:
                slots, mask = context
                keys, values = k_cache[slots], v_cache[slots]
            out[rows] = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                values.transpose(0, 1).unsqueeze(0), attn_mask=mask, is_causal=mask is None,
                scale=scale, enable_gqa=True,
            ).squeeze(0).transpose(0, 1)
        return out


def _gather_blocks(cache: torch.Tensor, tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """[num_slots, Hk, D] cache and [B, max_blocks] tables -> [B, Hk, max_blocks * block_size, D].

    Copying whole blocks (one contiguous run each) is several times faster on the CPU than
    gathering token slots one by one.
    """
    batch, max_blocks = tables.shape
    heads, dim = cache.shape[1], cache.shape[2]
    blocks = cache.view(-1, block_size * heads * dim).index_select(0, tables.flatten())
    return blocks.view(batch, max_blocks * block_size, heads, dim).transpose(1, 2)


def _prefill_mask(span: SequenceSpan, sliding_window: int | None) -> torch.Tensor:
    query_pos = span.num_cached + torch.arange(span.query_len)[:, None]
    key_pos = torch.arange(span.context_len)[None, :]
    mask = key_pos <= query_pos
    if sliding_window:
        mask &= key_pos > query_pos - sliding_window
    return mask
