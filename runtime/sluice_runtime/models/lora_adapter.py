"""Reading a LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors) for a Llama model.

Every check happens here, before an adapter reaches the engine, so a bad one is refused with a message naming
what is wrong (a file, a key, a shape) and never half-loaded. The files are read through adapter_files (regular
files inside the adapter's directory, within bounds), and every declared shape is checked before any tensor
data is read. The weights come out per layer and per projection of our fused layout (qkv_proj, o_proj,
gate_up_proj, down_proj) with PEFT's scaling folded into B, so serving computes `x @ A.T @ B.T` and nothing else.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .adapter_files import (
    AdapterError,
    TensorEntry,
    clipped,
    open_inside,
    read_bounded,
    read_safetensors_header,
    read_tensors,
    resolve_directory,
    short,
)
from .config import ModelConfig

# PEFT's module name -> (our fused projection, its part).
TARGETS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "o_proj": ("o_proj", 0), "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
           "down_proj": ("down_proj", 0)}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d{1,9})\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT writes about a kilobyte of configuration.
MAX_CONFIG_BYTES = 1024 * 1024
_PEFT_DIRECTORY = ": a LoRA adapter is a PEFT directory with adapter_config.json and adapter_model.safetensors"

__all__ = ["AdapterError", "LoraAdapter", "TARGETS", "part_shapes", "read_adapter"]


@dataclass
class LoraAdapter:
    """One adapter's weights: (layer, projection) -> one (A, B) pair per part of the projection, None for a
    part the adapter leaves alone. A is (rank, in), B is (out, rank) times the scaling."""

    rank: int
    weights: dict[tuple[int, str], list[tuple[torch.Tensor, torch.Tensor] | None]]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for parts in self.weights.values() for p in parts if p for t in p)


def part_shapes(cfg: ModelConfig) -> dict[str, list[tuple[int, int]]]:
    """(in, out) of each part of each projection LoRA can target, as the base model has them."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"qkv_proj": [(h, q), (h, kv), (h, kv)], "o_proj": [(q, h)],
            "gate_up_proj": [(h, i), (h, i)], "down_proj": [(i, h)]}


def read_adapter(path: str | Path, cfg: ModelConfig, max_rank: int, dtype: torch.dtype) -> LoraAdapter:
    """The adapter at `path`, every check done on what its files declare before a tensor byte is read."""
    if not str(path).strip():  # Path("") is the working directory
        raise AdapterError("LoRA adapter path is empty")
    directory, shown = resolve_directory(path), Path(path)
    config = _read_config(directory, shown)
    rank, scaling = _rank_and_scaling(config, max_rank)
    _check_targets(config)
    shapes = part_shapes(cfg)
    with open_inside(directory, WEIGHTS_FILE, shown / WEIGHTS_FILE,
                     " (adapters saved as .bin are not read; save with safetensors)") as file:
        entries, data_start = read_safetensors_header(file, shown / WEIGHTS_FILE)
        pairs = _pairs(entries, cfg, rank, shapes, config)
        tensors = read_tensors(file, shown / WEIGHTS_FILE, entries, data_start)
    weights: dict[tuple[int, str], list] = {}
    for (layer, module), names in sorted(pairs.items()):
        a, b = tensors[names["A"]], tensors[names["B"]]
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"layer {layer} {module}: the LoRA weights hold infinities or NaNs")
        projection, part = TARGETS[module]
        parts = weights.setdefault((layer, projection), [None] * len(shapes[projection]))
        # Copies: the tensors read are views of one buffer of the whole file, which is let go.
        parts[part] = (a.to(dtype, copy=True).contiguous(), (b.float() * scaling).to(dtype).contiguous())
    return LoraAdapter(rank, weights)


def _pairs(entries: dict[str, TensorEntry], cfg: ModelConfig, rank: int, shapes: dict[str, list[tuple[int, int]]],
           config: dict) -> dict[tuple[int, str], dict[str, str]]:
    """(layer, module) -> the names of its A and B tensors, refused unless every declared tensor is the LoRA
    weight of a projection of this base model, of the adapter's rank."""
    pairs: dict[tuple[int, str], dict[str, str]] = {}
    for key in entries:
        match = _KEY.match(key)
        if match is None or match.group(2) not in TARGETS:
            raise AdapterError(f"adapter_model.safetensors holds {short(key)}, which is not a LoRA weight of a "
                               f"q/k/v/o/gate/up/down projection")
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        if layer >= cfg.num_layers:
            raise AdapterError(f"{short(key)} is for layer {layer}, but the base model has {cfg.num_layers} layers: "
                               f"the adapter was trained for another base model{_base_of(config)}")
        pair = pairs.setdefault((layer, module), {})
        if which in pair:  # "layers.1" and "layers.01": one would escape the checks below
            raise AdapterError(f"adapter_model.safetensors holds layer {layer} {module} lora_{which} twice: "
                               f"{short(pair[which])} and {short(key)}")
        pair[which] = key
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise AdapterError(f"layer {layer} {module} has no lora_{missing} weight")
        in_features, out_features = shapes[TARGETS[module][0]][TARGETS[module][1]]
        a, b = entries[pair["A"]].shape, entries[pair["B"]].shape
        if len(a) != 2 or len(b) != 2 or a[0] != rank or b[1] != rank:
            raise AdapterError(f"layer {layer} {module}: lora_A is {a} and lora_B {b}, "
                               f"which is not rank {rank} as adapter_config.json's r says")
        if a != (rank, in_features) or b != (out_features, rank):
            raise AdapterError(
                f"layer {layer} {module}: lora_A is {a} and lora_B {b}, but a rank-{rank} "
                f"adapter of this base model has ({rank}, {in_features}) and ({out_features}, {rank}): the adapter "
                f"was trained for another base model{_base_of(config)}")
    if not pairs:
        raise AdapterError("adapter_model.safetensors holds no LoRA weights")
    return pairs


def _read_config(directory: Path, shown: Path) -> dict:
    file = shown / CONFIG_FILE
    with open_inside(directory, CONFIG_FILE, file, _PEFT_DIRECTORY) as opened:
        raw = read_bounded(opened, file, MAX_CONFIG_BYTES)
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "it nests too deeply" if isinstance(exc, RecursionError) else exc
        raise AdapterError(f"{file} is not valid JSON: {reason}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{file} must hold a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(f"adapter_config.json has peft_type {short(peft_type)}; only LORA adapters are served")
    unsupported = [(config.get("use_dora"), "use_dora (DoRA)"), (config.get("bias", "none") != "none", "bias"),
                   (config.get("modules_to_save"), "modules_to_save"), (config.get("fan_in_fan_out"), "fan_in_fan_out"),
                   (config.get("rank_pattern"), "rank_pattern"), (config.get("alpha_pattern"), "alpha_pattern"),
                   (config.get("layers_to_transform") is not None, "layers_to_transform")]
    named = [name for present, name in unsupported if present]
    if named:
        raise AdapterError(f"adapter_config.json sets {', '.join(named)}, which this runtime does not serve")
    return config


def _rank_and_scaling(config: dict, max_rank: int) -> tuple[int, float]:
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"adapter_config.json: r must be a positive integer, got {short(rank)}")
    if rank > max_rank:
        raise AdapterError(f"the adapter's rank {rank} is above this runtime's --max-lora-rank {max_rank}")
    try:
        value = float(alpha) if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else None
    except OverflowError:  # an integer of hundreds of digits
        value = None
    if value is None or not 0 < value < float("inf"):
        raise AdapterError(f"adapter_config.json: lora_alpha must be a positive number, got {short(alpha)}")
    return rank, value / (rank ** 0.5 if config.get("use_rslora") else rank)


def _check_targets(config: dict) -> None:
    targets = config.get("target_modules")
    if isinstance(targets, str):  # PEFT's regex form: the weights file says what it really targets
        return
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterError(f"adapter_config.json: target_modules must be a list of module names, got {short(targets)}")
    unknown = sorted({t.rpartition(".")[2] for t in targets} - set(TARGETS))
    if unknown:
        raise AdapterError(f"adapter_config.json targets {clipped(', '.join(unknown))}; LoRA is served on "
                           f"{', '.join(TARGETS)} only")


def _base_of(config: dict) -> str:
    base = config.get("base_model_name_or_path")
    return f" ({base})" if isinstance(base, str) and base else ""

