"""Active health checks: poll every endpoint's `/load` (sluice_contracts.load_report) on a short interval with a
bounded timeout; an endpoint whose answer is not a load report is taken out of rotation until it is one again."""
from __future__ import annotations

import asyncio
import logging
import time

from sluice_contracts.load_report import LoadReport

from .metrics import GatewayMetrics
from .picker import EndpointState, Picker
from .connection_pool import ConnectionPool, UpstreamError

log = logging.getLogger("sluice_gateway.load")
_MAX_LOAD_BODY = 64 * 1024  # /load is a few hundred bytes; more is not a runtime's answer


class LoadPoller:
    def __init__(self, picker: Picker, metrics: GatewayMetrics, interval_s: float, timeout_s: float) -> None:
        self._picker = picker
        self._metrics = metrics
        self._interval = interval_s
        self._timeout = timeout_s
        self._labelled: set[str] = set()

    async def run(self, pool: ConnectionPool) -> None:
        while True:
            await self.poll_all(pool)
            await asyncio.sleep(self._interval)

    async def poll_all(self, pool: ConnectionPool) -> None:
        endpoints = self._picker.endpoints()
        await asyncio.gather(*(self._poll(pool, ep) for ep in endpoints))
        current = {ep.url for ep in endpoints}
        for url in self._labelled - current:
            self._metrics.forget_endpoint(url)
        self._labelled = current

    async def _poll(self, pool: ConnectionPool, endpoint: EndpointState) -> None:
        response = None
        try:
            async with asyncio.timeout(self._timeout):
                response = await pool.request("GET", endpoint.url, "/load")
                body = await response.read(_MAX_LOAD_BODY)
            if response.status != 200:
                raise ValueError(f"/load answered {response.status}")
            report = LoadReport.model_validate_json(body)
        except (UpstreamError, TimeoutError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            if response is not None:
                response.close()
            if endpoint.healthy:
                log.warning("endpoint %s failed its health check: %s", endpoint.url, exc or type(exc).__name__)
            endpoint.healthy = False
            self._metrics.endpoint_up.labels(endpoint.url).set(0)
            return
        response.release()
        endpoint.waiting, endpoint.running, endpoint.kv_cache_usage = report.waiting, report.running, report.kv_cache_usage
        endpoint.loaded_adapters = frozenset(report.loaded_adapters or ())
        if not endpoint.healthy:
            log.info("endpoint %s is healthy again", endpoint.url)
        endpoint.healthy = True
        endpoint.polled_at = time.monotonic()
        self._metrics.endpoint_up.labels(endpoint.url).set(1)
        self._metrics.endpoint_load.labels(endpoint.url, "waiting").set(endpoint.waiting)
        self._metrics.endpoint_load.labels(endpoint.url, "running").set(endpoint.running)
        self._metrics.endpoint_load.labels(endpoint.url, "kv_cache_usage").set(endpoint.kv_cache_usage)
