"""The LoRA adapters an engine serves, by name, and the requests still using each.

Every load gets a new id, never reused: a name unloaded and loaded again with other weights is another
adapter, so it never meets the first one's prefix-cache blocks. An adapter unloaded while requests use it
keeps its weights until the last of them finishes.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from .errors import EngineError


@dataclass(frozen=True)
class LoraRef:
    id: int
    name: str
    path: str


class LoraNotFound(EngineError):
    """A request or an unload names an adapter that is not loaded."""

    code = "model_not_found"

    def __init__(self, name: str):
        super().__init__(f"The lora adapter '{name}' cannot be found.")
        self.name = name


class LoraRegistry:
    def __init__(self):
        self.by_name: dict[str, LoraRef] = {}
        self._ids = itertools.count(1)
        self._users: Counter[int] = Counter()
        self._retired: set[int] = set()

    def add(self, name: str, path: str) -> LoraRef:
        ref = LoraRef(next(self._ids), name, path)
        self.by_name[name] = ref
        return ref

    def get(self, name: str) -> LoraRef:
        ref = self.by_name.get(name)
        if ref is None:
            raise LoraNotFound(name)
        return ref

    def remove(self, name: str) -> int | None:
        """Unload `name`; returns its id when no request uses it any more (its weights can go now)."""
        ref = self.by_name.pop(name, None)
        if ref is None:
            raise LoraNotFound(name)
        if self._users[ref.id]:
            self._retired.add(ref.id)
            return None
        return ref.id

    def acquire(self, ref: LoraRef) -> None:
        self._users[ref.id] += 1

    def release(self, ref: LoraRef) -> bool:
        """A request using `ref` ended; True when it was the last user of an unloaded adapter."""
        self._users[ref.id] -= 1
        if self._users[ref.id]:
            return False
        del self._users[ref.id]
        if ref.id in self._retired:
            self._retired.discard(ref.id)
            return True
        return False
