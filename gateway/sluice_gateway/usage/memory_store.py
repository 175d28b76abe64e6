"""Usage counted in this replica's memory: for a gateway without Redis. Another replica's requests are not in
it, and a restart starts it from zero."""
from __future__ import annotations

import time
from collections import Counter

from .counts import BUCKET_S, KEPT_S, Cell, hour_of
from .store import UsageStore


class MemoryUsage(UsageStore):
    shared = False

    def __init__(self) -> None:
        self._cells: Counter[Cell] = Counter()
        self._pruned_hour = 0

    def add(self, cells: dict[Cell, int]) -> None:
        self._cells.update(cells)
        hour = hour_of(time.time())
        if hour != self._pruned_hour:  # at most once an hour: old hours dropped, as Redis expires them
            self._pruned_hour = hour
            oldest = hour - KEPT_S + BUCKET_S
            for cell in [cell for cell in self._cells if cell.hour < oldest]:
                del self._cells[cell]

    async def read(self, first_hour: int, last_hour: int) -> dict[Cell, int]:
        return {cell: n for cell, n in self._cells.items() if first_hour <= cell.hour <= last_hour}
