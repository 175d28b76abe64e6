"""Readiness and graceful drain: which engine requests are running, and stopping them on shutdown."""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager

log = logging.getLogger("sluice.server")


class Lifecycle:
    def __init__(self) -> None:
        self.warmed_up = False
        self.draining = False
        self._running: set[str] = set()

    @property
    def running(self) -> int:
        return len(self._running)

    @contextmanager
    def track(self, engine_request_id: str):
        self._running.add(engine_request_id)
        try:
            yield
        finally:
            self._running.discard(engine_request_id)

    async def drain(self, abort, timeout: float) -> None:
        """Refuse new work, wait up to `timeout` s for running requests, then abort the rest."""
        self.draining = True
        deadline = time.monotonic() + timeout
        log.info("draining: %d request(s) running, waiting up to %.0f s", self.running, timeout)
        while self._running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._running:
            log.warning("drain deadline reached: aborting %d request(s)", self.running)
            for request_id in list(self._running):
                abort(request_id)
            # Give the handlers a moment to send their clients the shutdown error.
            grace = time.monotonic() + 2.0
            while self._running and time.monotonic() < grace:
                await asyncio.sleep(0.02)
        log.info("drained")
