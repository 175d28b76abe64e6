"""Paged attention in Triton: the GPU path where flash-attn is not installed.

Every step writes its keys and values with one fused kernel, then decodes read their context
through block tables with split-KV parallelism and prefill chunks attend causally over cached
context plus their own tokens (prefix hits included). Decode launches are CUDA-graph safe.
"""
from __future__ import annotations

import torch

from . import triton_kernels as kernels
from .base import AttentionBackend
from .paged import PagedAttentionMetadata, build_paged_metadata

# A split of the decode context shorter than this costs more in merging than it wins in parallelism.
_MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 16


def decode_splits(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """Parts to cut each decode context into so about two waves of programs fill the GPU."""
    programs = num_seqs * num_kv_heads
    wanted = -(-2 * num_sms // programs)
    return max(1, min(wanted, _MAX_SPLITS, -(-max_context // _MIN_TOKENS_PER_SPLIT)))


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graphs = True

    def __init__(self, device: torch.device):
        # On the CPU (the Triton interpreter, for tests) there is no parallelism to win by splitting.
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1

    def build_metadata(self, decodes, prefills, block_size, device, sliding_window) -> PagedAttentionMetadata:
        return build_paged_metadata(decodes, prefills, block_size, device, sliding_window)

    def forward(self, q, k, v, k_cache, v_cache, meta: PagedAttentionMetadata, scale):
        kernels.store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            splits = decode_splits(nd, k_cache.shape[1], meta.decode_max_context, self.num_sms)
            kernels.paged_decode(q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                                 meta.block_size, scale, meta.sliding_window, splits, out[:nd])
        if meta.prefills:
            kernels.paged_prefill(q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_query_starts,
                                  meta.prefill_query_lens, meta.prefill_context_lens, meta.prefill_max_query_len,
                                  meta.block_size, scale, meta.sliding_window, out)
        return out
