"""Stopping without losing requests: what the gateway does between SIGTERM and exit.

1. /ready fails at once, so the pod leaves the Service's endpoints;
2. requests are still accepted and served for `shutdown.ready_grace_s`, while that removal reaches every
   load balancer (a request routed here meanwhile is served, not refused);
3. the listener closes, idle connections close, and requests in flight (long streams too) get `drain_s`
   to finish; then the app shuts down.

A second SIGTERM or SIGINT skips what is left of the grace period; a second SIGINT also skips the drain.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType

import uvicorn


class DrainingServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, *, on_terminating: Callable[[], None],
        grace_s: Callable[[], float], drain_s: Callable[[], float],
    ) -> None:
        super().__init__(config)
        self._on_terminating = on_terminating
        self._grace_s = grace_s  # read at SIGTERM: the config may have been reloaded since the start
        self._drain_s = drain_s
        self._terminating_since: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._terminating_since is not None or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # uvicorn re-raises it after the shutdown, as it would have
        self._terminating_since = time.monotonic()
        # uvicorn annotates whole seconds but hands the value to asyncio.wait_for, which takes any float.
        self.config.timeout_graceful_shutdown = self._drain_s()  # type: ignore[assignment]
        self._on_terminating()

    async def on_tick(self, counter: int) -> bool:
        since = self._terminating_since
        if since is not None and not self.should_exit and time.monotonic() - since >= self._grace_s():
            self.should_exit = True
        return await super().on_tick(counter)
