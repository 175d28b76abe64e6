"""Rotary position embeddings with the scaling variants found in Llama-family configs."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import fused_cpu


def _inverse_frequencies(head_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """Return (inv_freq, attention_factor) for the config's rope type."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "dynamic":
        # Dynamic NTK only changes frequencies beyond the trained length; within it, default rope applies.
        return inv_freq, 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        factor = scaling["factor"]
        old_len = scaling.get("original_max_position_embeddings", 4096)
        beta_fast, beta_slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

        def correction_dim(rotations: float) -> float:
            return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), head_dim - 1)
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
        attention_factor = scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
        return inv, attention_factor
    raise ValueError(f"unsupported rope scaling type {kind!r}")


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict):
        super().__init__()
        inv_freq, attention_factor = _inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * attention_factor, persistent=False)
        self.register_buffer("sin", emb.sin() * attention_factor, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> "Rope":
        """What every layer of one forward needs to rotate its queries and keys."""
        if fused_cpu.applies(dtype, positions.device) and self.cos.dtype == torch.float32:
            return Rope(positions.to(torch.int64).contiguous(), self.cos, self.sin, fused=True)
        return Rope(positions, self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype))


@dataclass
class Rope:
    positions: torch.Tensor
    # fused: the float32 [max_positions, D] tables, indexed natively by position; otherwise cos and
    # sin already gathered for the positions, [T, 1, D] in the model's dtype.
    cos: torch.Tensor
    sin: torch.Tensor
    fused: bool = False


def apply_rotary(q: torch.Tensor, k: torch.Tensor, rope: Rope):
    """q: [T, Hq, D], k: [T, Hk, D] (views with any row stride when fused, which rotates in place)."""
    if rope.fused:
        for x in (q, k):
            fused_cpu.rotary_(x, x.shape[1], x.shape[2], rope.positions, rope.cos, rope.sin)
        return q, k
    cos, sin = rope.cos, rope.sin
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
