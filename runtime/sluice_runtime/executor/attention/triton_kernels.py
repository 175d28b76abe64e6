"""Triton kernels over the paged KV cache: the fused cache write, split-KV decode, prefill with cached context.

Caches are [num_slots, Hk, D] with slot = block * block_size + offset; every kernel reaches a
token through its sequence's block table, so a prefix-cache hit is only a block table that starts
with blocks another request computed. Tiles of BLOCK_N tokens are independent of the block size
(each token looks its block up), so any block size works, down to 1.

Under TRITON_INTERPRET=1 the kernels run on CPU tensors; that is how the tests compare them with
the torch reference. The interpreter miscomputes tl.dot on bfloat16 inputs, so those tests use
float32 and float16; on a GPU all three dtypes run.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot needs every dimension to be at least 16.
_MIN_DOT = 16


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
                     NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    # A negative slot is a padding row of a CUDA-graph batch: it writes nowhere. (Broadcast
    # explicitly: the interpreter rejects a scalar operand in a mask.)
    mask = (h < NUM_HEADS) & (d < HEAD_DIM) & (tl.broadcast_to(slot, [BLOCK_H, BLOCK_D]) >= 0)
    k = tl.load(k_ptr + token * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache_ptr + slot * stride_cs + h * stride_ch + d, k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_cs + h * stride_ch + d, v, mask=mask)


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k, v: [T, Hk, D] (any row stride, as split from the fused qkv); caches [num_slots, Hk, D]."""
    tokens, heads, dim = k.shape
    if tokens == 0:
        return
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    _store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1),
        NUM_HEADS=heads, HEAD_DIM=dim, BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(dim))


@triton.jit
def _kv_offsets(block_tables_ptr, seq, stride_bt, n, n_mask, kv_head, stride_cs, stride_ch, d,
                BLOCK_SIZE: tl.constexpr):
    """Cache offsets [BLOCK_N, BLOCK_D] of tokens n of one sequence and KV head, through its block table."""
    block = tl.load(block_tables_ptr + seq * stride_bt + n // BLOCK_SIZE, mask=n_mask, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + n % BLOCK_SIZE
    return slot[:, None] * stride_cs + kv_head * stride_ch + d[None, :]


@triton.jit
def _online_softmax_step(s, m, l, acc, v, PRECISION: tl.constexpr):
    """Folds one tile of scores s (log2 units, -inf where hidden) and its values into the running
    max m, sum l and output acc; returns the new (m, l, acc)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    # A row may see nothing in this tile (window, or a padding row): keep its exponents finite.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m - m_safe)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
                   out_ptr, part_out_ptr, part_lse_ptr, qk_scale, window,
                   stride_qt, stride_qh, stride_ot, stride_oh, stride_cs, stride_ch, stride_bt,
                   stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, num_splits,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   USE_WINDOW: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """One program: one sequence, one KV head (all its query heads at once), one part of the context."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    # Whole tiles per split, so every split but the last reads full tiles.
    per_split = tl.cdiv(tl.cdiv(ctx - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        kv_mask = n_mask[:, None] & d_mask[None, :]
        offsets = _kv_offsets(block_tables_ptr, seq, stride_bt, n, n_mask, kv_head, stride_cs, stride_ch, d,
                              BLOCK_SIZE)
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0)
        # Scores in log2 units (qk_scale carries log2(e)), so exp2 replaces exp.
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0)
        m, l, acc = _online_softmax_step(s, m, l, acc, v, PRECISION)

    # An empty split (or a padding row, context 0) has l == 0: it contributes zeros, not NaNs.
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        tl.store(part_out_ptr + seq * stride_pt + heads[:, None] * stride_ph + split * stride_ps + d[None, :],
                 out, mask=out_mask)
        lse = tl.where(l > 0.0, m + tl.log2(tl.where(l > 0.0, l, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + seq * stride_lt + heads * stride_lh + split, lse, mask=g_mask)
    else:
        tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_splits,
                          stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
                          HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Combine the splits of one (sequence, query head) by their log-sum-exp weights."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_splits
    lse = tl.load(part_lse_ptr + seq * stride_lt + head * stride_lh + s, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.exp2(lse - top)
    parts = tl.load(part_out_ptr + seq * stride_pt + head * stride_ph + s[:, None] * stride_ps + d[None, :],
                    mask=s_mask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    total = tl.sum(weight, 0)
    out = tl.sum(parts * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, block_size: int, scale: float, sliding_window: int | None,
                 num_splits: int, out: torch.Tensor) -> None:
    """One query token per sequence. q, out: [B, Hq, D]; block_tables [B, max_blocks] and context_lens [B], int32.

    With num_splits > 1 each (sequence, KV head) is cut into that many parts of its context, run
    in parallel and merged (flash-decoding): at small batches there are otherwise too few programs
    to keep the GPU busy. The grid depends only on B and num_splits, never on the context lengths,
    so the launch can be captured in a CUDA graph.
    """
    batch, num_heads, dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_d = max(triton.next_power_of_2(dim), _MIN_DOT)
    common = dict(GROUP=group, HEAD_DIM=dim, BLOCK_SIZE=block_size, BLOCK_G=max(triton.next_power_of_2(group), _MIN_DOT),
                  BLOCK_D=block_d, BLOCK_N=64, USE_WINDOW=bool(sliding_window),
                  PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    qk_scale = scale * 1.4426950408889634  # log2(e)
    grid = (batch, num_kv_heads, num_splits)
    if num_splits == 1:
        _decode_kernel[grid](q, k_cache, v_cache, block_tables, context_lens, out, out, out, qk_scale, sliding_window or 0,
                             q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
                             block_tables.stride(0), 0, 0, 0, 0, 0, 1, SPLIT=False, **common)
        return
    part_out = torch.empty(batch, num_heads, num_splits, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    _decode_kernel[grid](q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse, qk_scale,
                         sliding_window or 0, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                         k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
                         part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
                         num_splits, SPLIT=True, **common)
    _reduce_splits_kernel[(batch, num_heads)](part_out, part_lse, out, num_splits, part_out.stride(0), part_out.stride(1),
                                              part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
                                              out.stride(0), out.stride(1), HEAD_DIM=dim,
                                              BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=triton.next_power_of_2(dim))


@triton.jit
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_starts_ptr, query_lens_ptr,
                    context_lens_ptr, qk_scale, window,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_cs, stride_ch, stride_bt,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    """One program: BLOCK_M query tokens of one sequence for one query head, causal over the whole context.

    The step's own keys were already written to the cache, so cached context and new tokens are
    read the same way, through the block table.
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    kv_head = head // GROUP
    query_len = tl.load(query_lens_ptr + seq)
    ctx = tl.load(context_lens_ptr + seq)
    cached = ctx - query_len
    first_row = tile * BLOCK_M
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < query_len
    q_pos = cached + rows
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_rows = tl.load(query_starts_ptr + seq) + rows
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)

    # Keys up to the tile's last query position; none at all for tiles past this sequence's end.
    hi = tl.where(first_row < query_len, cached + tl.minimum(query_len, first_row + BLOCK_M), 0)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(cached + first_row - window + 1, 0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        kv_mask = n_mask[:, None] & d_mask[None, :]
        offsets = _kv_offsets(block_tables_ptr, seq, stride_bt, n, n_mask, kv_head, stride_cs, stride_ch, d,
                              BLOCK_SIZE)
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible &= n[None, :] > q_pos[:, None] - window
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0)
        m, l, acc = _online_softmax_step(s, m, l, acc, v, PRECISION)

    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask[None, :])


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  query_starts: torch.Tensor, query_lens: torch.Tensor, context_lens: torch.Tensor,
                  max_query_len: int, block_size: int, scale: float, sliding_window: int | None,
                  out: torch.Tensor) -> None:
    """Prefill chunks of P sequences packed in q/out [T, Hq, D] (rows query_starts[i] onward).

    Sequence i has query_lens[i] new tokens at the end of its context_lens[i] tokens; the first
    context_lens[i] - query_lens[i] are cached (prefix hits, earlier chunks) and read through
    block_tables[i] like the rest.
    """
    num_seqs = query_lens.shape[0]
    num_heads, dim = q.shape[1], q.shape[2]
    # float32 tiles take twice the shared memory; halve them to fit GPUs with less than an H100's.
    block_m = 64 if q.element_size() < 4 else 32
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](q, k_cache, v_cache, out, block_tables, query_starts, query_lens, context_lens,
                          scale * 1.4426950408889634, sliding_window or 0,
                          q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
                          block_tables.stride(0), GROUP=num_heads // k_cache.shape[1], HEAD_DIM=dim,
                          BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=64,
                          BLOCK_D=max(triton.next_power_of_2(dim), _MIN_DOT), USE_WINDOW=bool(sliding_window),
                          PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
