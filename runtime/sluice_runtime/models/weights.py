"""Load HF safetensors checkpoints into our module layout (fused qkv and gate/up projections).

Under tensor parallelism a sharded layer cuts each full weight down to its rank's part (`shard`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..model_load_error import ModelLoadError

# HF name fragment -> (our parameter, shard index) for weights we fuse.
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _our_name(hf_name: str) -> tuple[str, int | None]:
    name = hf_name.removeprefix("model.")
    for fragment, (fused, shard) in _FUSED.items():
        if fragment + "." in name:
            return name.replace(fragment, fused), shard
    return name, None


def load_weights(model: torch.nn.Module, directory: Path, dtype: torch.dtype) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    params = dict(model.named_parameters())
    fused_parts: dict[str, dict[int, torch.Tensor]] = {}
    loaded: set[str] = set()
    files = sorted(directory.glob("*.safetensors"))
    for file in files:
        try:
            tensors = load_file(str(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"corrupt weight file {file}: {exc}") from None
        for hf_name, tensor in tensors.items():
            if "rotary_emb.inv_freq" in hf_name:
                continue
            name, shard = _our_name(hf_name)
            if name == "lm_head.weight" and model.cfg.tie_word_embeddings:
                continue
            if name not in params:
                raise ModelLoadError(f"{file.name} holds {hf_name}, which this architecture does not have")
            if shard is None:
                _copy(params[name], _local(model, name, tensor), hf_name, dtype)
                loaded.add(name)
            else:
                fused_parts.setdefault(name, {})[shard] = tensor
    for name, parts in fused_parts.items():
        _copy(params[name], _local(model, name, torch.cat([parts[i] for i in sorted(parts)], dim=0)), name, dtype)
        loaded.add(name)
    missing = [n for n in params if n not in loaded and not (n == "lm_head.weight" and model.cfg.tie_word_embeddings)]
    if missing:
        raise ModelLoadError(f"weights missing from {directory}: {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def _local(model: torch.nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of a full checkpoint tensor (all of it unless its layer is sharded)."""
    layer = model.get_submodule(name.rpartition(".")[0])
    return layer.shard(full) if hasattr(layer, "shard") else full


def _copy(param: torch.nn.Parameter, tensor: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if param.shape != tensor.shape:
        raise ModelLoadError(f"weight {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(dtype))
