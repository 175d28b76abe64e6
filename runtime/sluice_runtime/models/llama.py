"""The Llama family (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) over packed, unpadded batches.

Attention is delegated to a backend object (executor/attention) passed in at call time, so this
module stays below the executor and knows nothing of KV-cache layout. With tensor parallelism each
rank holds its share of the heads and MLP channels (layers/linear.py); embeddings, norms and the
LM head are replicated.
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.linear import ColumnParallelLinear, RowParallelLinear, TensorParallel
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding, apply_rotary
from .config import ModelConfig
from .interruption import check as check_interrupt


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.num_heads = tp.units(cfg.num_heads)[1]
        self.num_kv_heads = tp.units(cfg.num_kv_heads)[1]
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        # q, k and v share one matmul: one large GEMM beats three small ones on every backend.
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [(cfg.num_heads, cfg.head_dim), (cfg.num_kv_heads, cfg.head_dim),
                              (cfg.num_kv_heads, cfg.head_dim)], cfg.attention_bias, tp)
        self.o_proj = RowParallelLinear(cfg.num_heads, cfg.head_dim, cfg.hidden_size, False, tp)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x, rope, backend, meta, kv_cache):
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, rope)
        k_cache, v_cache = kv_cache if kv_cache is not None else (None, None)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.intermediate = tp.units(cfg.intermediate_size)[1]
        channels = (cfg.intermediate_size, 1)
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [channels, channels], False, tp)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, 1, cfg.hidden_size, False, tp)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, x, residual, rope, backend, meta, kv_cache):
        """x: the previous layer's output, residual: the skip stream before it (None at layer 0);
        returns the same pair, so each residual add happens inside the next norm."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, backend, meta, kv_cache)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, backend, meta,
                      kv_caches: list | None, interrupt: threading.Event | None = None) -> torch.Tensor:
        """`interrupt`: set (by another thread) to abandon the forward before its next layer (ForwardInterrupted)."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions, x.dtype)
        residual = None
        for i, layer in enumerate(self.layers):
            check_interrupt(interrupt)
            x, residual = layer(x, residual, rope, backend, meta, kv_caches[i] if kv_caches else None)
        return self.norm(x, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
