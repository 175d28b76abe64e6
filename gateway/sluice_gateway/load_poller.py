"""Active health checks: poll every endpoint's `/load` on a short interval with a bounded timeout."""
from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from .metrics import GatewayMetrics
from .picker import EndpointState, Picker

log = logging.getLogger("sluice_gateway.load")


class LoadPoller:
    def __init__(self, picker: Picker, metrics: GatewayMetrics, interval_s: float, timeout_s: float) -> None:
        self._picker = picker
        self._metrics = metrics
        self._interval = interval_s
        self._timeout = timeout_s
        self._labelled: set[str] = set()

    async def run(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.poll_all(session)
            await asyncio.sleep(self._interval)

    async def poll_all(self, session: aiohttp.ClientSession) -> None:
        endpoints = self._picker.endpoints()
        await asyncio.gather(*(self._poll(session, ep) for ep in endpoints))
        current = {ep.url for ep in endpoints}
        for url in self._labelled - current:
            self._metrics.forget_endpoint(url)
        self._labelled = current

    async def _poll(self, session: aiohttp.ClientSession, endpoint: EndpointState) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                async with session.get(f"{endpoint.url}/load") as resp:
                    if resp.status != 200:
                        raise ValueError(f"/load answered {resp.status}")
                    data = await resp.json(content_type=None)
            endpoint.waiting = int(data.get("waiting", 0))
            endpoint.running = int(data.get("running", 0))
            endpoint.kv_cache_usage = float(data.get("kv_cache_usage", 0.0))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, TypeError, AttributeError) as exc:
            if endpoint.healthy:
                log.warning("endpoint %s failed its health check: %s", endpoint.url, exc or type(exc).__name__)
            endpoint.healthy = False
            self._metrics.endpoint_up.labels(endpoint.url).set(0)
            return
        if not endpoint.healthy:
            log.info("endpoint %s is healthy again", endpoint.url)
        endpoint.healthy = True
        endpoint.polled_at = time.monotonic()
        self._metrics.endpoint_up.labels(endpoint.url).set(1)
        self._metrics.endpoint_load.labels(endpoint.url, "waiting").set(endpoint.waiting)
        self._metrics.endpoint_load.labels(endpoint.url, "running").set(endpoint.running)
        self._metrics.endpoint_load.labels(endpoint.url, "kv_cache_usage").set(endpoint.kv_cache_usage)
