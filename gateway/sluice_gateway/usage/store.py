"""What both usage stores do: count a request's cells now, read the cells of a span of hours."""
from __future__ import annotations

from abc import ABC, abstractmethod

from .counts import Cell


class UsageUnavailable(Exception):
    """The shared store cannot be read now."""


class UsageStore(ABC):
    shared: bool  # every replica counts into it and it outlives them

    @abstractmethod
    def add(self, cells: dict[Cell, int]) -> None:
        """Count these; never waits on I/O (a request's end is not held up by its accounting)."""

    @abstractmethod
    async def read(self, first_hour: int, last_hour: int) -> dict[Cell, int]:
        """Every cell of the hours from `first_hour` to `last_hour`, both included; UsageUnavailable when the
        store cannot be read."""

    async def run(self) -> None:
        """The store's background work, if it has any, until cancelled."""
        return None

    async def close(self) -> None:
        return None
