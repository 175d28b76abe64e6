"""Which LoRA adapters sit in the model's resident slots, and the CPU copies of every loaded adapter.

--max-loras slots live beside the base weights (on the model's device); every loaded adapter keeps its
weights in CPU memory. A step brings the adapters it uses into slots, evicting the least recently used
adapter that the step does not need; the scheduler never puts more adapters in a step than there are slots.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ..layers.lora import MASKED_MAX_ROW_SLOTS, LoraBatch, LoraGroup, LoraLinear
from ..models.config import ModelConfig
from ..models.lora_adapter import LoraAdapter, part_shapes
from .transfer import to_device

_PROJECTIONS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


class LoraSlots:
    def __init__(self, model: nn.Module, cfg: ModelConfig, num_slots: int, max_rank: int):
        self.batch = LoraBatch()
        self.num_slots = num_slots
        shapes = part_shapes(cfg)
        self.layers: dict[tuple[int, str], LoraLinear] = {}
        for index, layer in enumerate(model.layers):
            for owner_name, name in _PROJECTIONS:
                owner = getattr(layer, owner_name)
                wrapped = LoraLinear(getattr(owner, name), [out for _, out in shapes[name]], num_slots, max_rank,
                                     self.batch)
                setattr(owner, name, wrapped)
                self.layers[(index, name)] = wrapped
        self.adapters: dict[int, LoraAdapter] = {}
        self.resident: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, least recently used first
        # The resident ids as one value, replaced whole: other threads read it (the server's /load).
        self.resident_ids: frozenset[int] = frozenset()
        self.loads = 0  # adapters copied into a slot, for tests and logs

    def add(self, adapter_id: int, adapter: LoraAdapter) -> None:
        self.adapters[adapter_id] = adapter

    def remove(self, adapter_id: int) -> None:
        self.adapters.pop(adapter_id, None)
        self.resident.pop(adapter_id, None)  # its slot is free; the next adapter placed there overwrites it
        self.resident_ids = frozenset(self.resident)

    def set_step(self, row_adapters: list[tuple[int, int]], num_rows: int, device: torch.device) -> bool:
        """Point the LoRA layers at this step's rows: `row_adapters` is (adapter id, rows) per item in step
        order, id 0 for the base model. Returns whether any row uses an adapter."""
        rows: dict[int, list[int]] = {}
        start = 0
        for adapter_id, count in row_adapters:
            if adapter_id:
                rows.setdefault(adapter_id, []).extend(range(start, start + count))
            start += count
        slots = {adapter_id: self._place(adapter_id, set(rows)) for adapter_id in rows}
        if not slots:
            self.clear_step()
        elif num_rows * self.num_slots <= MASKED_MAX_ROW_SLOTS:
            row_slots = [slots.get(adapter_id, -1) for adapter_id, count in row_adapters for _ in range(count)]
            self.batch.set([], to_device(row_slots, torch.long, device))
        else:
            self.batch.set([LoraGroup(slots[a], None if len(ids) == num_rows else to_device(ids, torch.long, device))
                            for a, ids in rows.items()], None)
        return bool(slots)

    def clear_step(self) -> None:
        self.batch.set([], None)

    def _place(self, adapter_id: int, needed: set[int]) -> int:
        if adapter_id in self.resident:
            self.resident.move_to_end(adapter_id)
            return self.resident[adapter_id]
        used = set(self.resident.values())
        free = [s for s in range(self.num_slots) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(a for a in self.resident if a not in needed)
            slot = self.resident.pop(victim)
        weights = self.adapters[adapter_id].weights
        for key, layer in self.layers.items():
            layer.set_slot(slot, weights.get(key))
        self.resident[adapter_id] = slot
        self.resident_ids = frozenset(self.resident)
        self.loads += 1
        return slot
