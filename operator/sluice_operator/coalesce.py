"""Run at most one job per key at a time, and once more after a burst of requests: events come in bursts."""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)


class Coalescer:
    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._running: dict[Hashable, asyncio.Task] = {}
        self._again: set[Hashable] = set()

    def request(self, key: Hashable, job: Callable[[], Awaitable[None]]) -> None:
        if key in self._running:
            self._again.add(key)
            return
        self._running[key] = asyncio.get_running_loop().create_task(self._loop(key, job))

    async def _loop(self, key: Hashable, job: Callable[[], Awaitable[None]]) -> None:
        try:
            while True:
                self._again.discard(key)
                await asyncio.sleep(self._delay)
                try:
                    await job()
                except Exception:
                    # The next event or timer retries; one failed round must not stop the loop for good.
                    log.exception("job %s failed", key)
                    await asyncio.sleep(2.0)
                    self._again.add(key)
                if key not in self._again:
                    return
        finally:
            self._running.pop(key, None)

    async def drain(self) -> None:
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)
