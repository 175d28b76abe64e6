"""flash-attn over the paged KV cache: the production GPU path where the package is installed.

Prefill chunks (prefix hits included) go through flash_attn_varlen_func reading keys and values
through block tables; decodes through flash_attn_with_kvcache. flash-attn reads paged KV in pages
of a multiple of 256 tokens, so the engine's block size follows this backend. KV-cache writes use
the fused Triton kernel; flash-attn has no cache-write entry point of its own.
"""
from __future__ import annotations

import torch

from .base import AttentionBackend
from .paged import PagedAttentionMetadata, build_paged_metadata
from .triton_kernels import store_kv_cache


class FlashAttentionBackend(AttentionBackend):
    name = "flash-attn"
    block_size_multiple = 256
    supports_cuda_graphs = True

    def __init__(self):
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    def build_metadata(self, decodes, prefills, block_size, device, sliding_window) -> PagedAttentionMetadata:
        return build_paged_metadata(decodes, prefills, block_size, device, sliding_window)

    def forward(self, q, k, v, k_cache, v_cache, meta: PagedAttentionMetadata, scale):
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        heads, dim = k_cache.shape[1], k_cache.shape[2]
        # The same memory seen as [num_blocks, block_size, Hk, D] pages.
        k_pages = k_cache.view(-1, meta.block_size, heads, dim)
        v_pages = v_cache.view(-1, meta.block_size, heads, dim)
        # flash-attn counts the window from the query itself: keys in [i - left, i].
        window = (meta.sliding_window - 1, 0) if meta.sliding_window else (-1, -1)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._with_kvcache(
                q[:nd].unsqueeze(1), k_pages, v_pages, cache_seqlens=meta.decode_context_lens,
                block_table=meta.decode_block_tables, softmax_scale=scale, causal=True, window_size=window,
            ).squeeze(1)
        if meta.prefills:
            # Causal masks align to the end of each context, so cached tokens are all visible.
            out[nd:] = self._varlen(
                q[nd:], k_pages, v_pages, cu_seqlens_q=meta.prefill_cu_query_lens,
                cu_seqlens_k=meta.prefill_cu_context_lens, max_seqlen_q=meta.prefill_max_query_len,
                max_seqlen_k=meta.prefill_max_context_len, softmax_scale=scale, causal=True, window_size=window,
                block_table=meta.prefill_block_tables,
            )
        return out
