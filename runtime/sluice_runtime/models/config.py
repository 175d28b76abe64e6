"""The subset of an HF config.json the Llama-family executor needs, normalized across config versions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model_load_error import ModelLoadError

# Qwen3 adds per-head RMSNorm on q and k; Qwen2 adds biases on q/k/v.
_QK_NORM_ARCHITECTURES = {"Qwen3ForCausalLM"}


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    hidden_act: str
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    eos_token_ids: list[int] = field(default_factory=list)
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "ModelConfig":
        architecture = (raw.get("architectures") or ["?"])[0]
        try:
            num_heads = raw["num_attention_heads"]
            hidden = raw["hidden_size"]
            # transformers >= 5 nests rope settings in rope_parameters; older configs keep them flat.
            rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
            theta = rope.pop("rope_theta", None) or raw.get("rope_theta", 10000.0)
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = {}
            eos = raw.get("eos_token_id")
            act = raw.get("hidden_act", "silu")
            if act != "silu":
                raise ModelLoadError(f"unsupported activation {act!r}; the Llama family uses silu")
            return cls(
                architecture=architecture,
                vocab_size=raw["vocab_size"],
                hidden_size=hidden,
                intermediate_size=raw["intermediate_size"],
                num_layers=raw["num_hidden_layers"],
                num_heads=num_heads,
                num_kv_heads=raw.get("num_key_value_heads") or num_heads,
                head_dim=raw.get("head_dim") or hidden // num_heads,
                rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
                max_position_embeddings=raw.get("max_position_embeddings", 2048),
                tie_word_embeddings=raw.get("tie_word_embeddings", False),
                attention_bias=raw.get("attention_bias", architecture == "Qwen2ForCausalLM"),
                qk_norm=architecture in _QK_NORM_ARCHITECTURES,
                hidden_act=act,
                rope_theta=float(theta),
                rope_scaling=rope,
                eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
                sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
            )
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks {missing} needed by {architecture}") from None
