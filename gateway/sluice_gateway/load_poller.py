"""Active health checks: poll every endpoint's load on a short interval with a bounded timeout; an endpoint whose
answer is not a load report, or that is too slow to answer several polls in a row, is taken out of rotation until
it answers one again.

Sluice's runtime answers `/load` (sluice_contracts.load_report). vLLM and SGLang have no `/load`: their
endpoints (the routing table's backend says which engine serves them) are polled on `/metrics`, whose load
gauges sluice_contracts.engines names per engine. An endpoint whose `/load` answers 404 is taken for a server
without one (a hand-written routes file naming no engine) and polled on `/metrics` from then on.
"""
from __future__ import annotations

import asyncio
import logging
import time

from sluice_contracts.engines import SERVES_LOAD_DOCUMENT, parse_load
from sluice_contracts.load_report import LoadReport

from .connection_pool import ConnectionPool, UpstreamError
from .metrics import GatewayMetrics
from .picker import EndpointState, Picker

log = logging.getLogger("sluice_gateway.load")
_MAX_LOAD_BODY = 64 * 1024  # /load is a few hundred bytes; more is not a runtime's answer
# vLLM's /metrics carries histograms per model, tens to hundreds of KiB; more is not a model server's.
_MAX_METRICS_BODY = 4 * 1024 * 1024


class _NoLoadDocument(Exception):
    """The endpoint answered /load with 404: it is a server without one."""


class LoadPoller:
    def __init__(self, picker: Picker, metrics: GatewayMetrics, interval_s: float, timeout_s: float,
                 unhealthy_after_slow_polls: int) -> None:
        self._picker = picker
        self._metrics = metrics
        self._interval = interval_s
        self._timeout = timeout_s
        self._slow_polls_allowed = unhealthy_after_slow_polls - 1
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
        self._picker.loads_polled()

    async def _poll(self, pool: ConnectionPool, endpoint: EndpointState) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                if endpoint.engine in SERVES_LOAD_DOCUMENT and not endpoint.no_load_document:
                    try:
                        await self._read_load(pool, endpoint)
                        return self._healthy(endpoint)
                    except _NoLoadDocument:
                        log.info("endpoint %s serves no /load; reading its load from /metrics", endpoint.url)
                        endpoint.no_load_document = True
                await self._read_metrics(pool, endpoint)
        except (UpstreamError, TimeoutError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            if isinstance(exc, TimeoutError) and endpoint.healthy and endpoint.slow_polls < self._slow_polls_allowed:
                # Slow, not gone: a replica writing large answers can be late with one poll, and taking every
                # replica of a model out for that would refuse the requests they are free to serve.
                endpoint.slow_polls += 1
                return
            if endpoint.healthy:
                log.warning("endpoint %s failed its health check: %s", endpoint.url, exc or type(exc).__name__)
            endpoint.healthy = False
            self._metrics.endpoint_up.labels(endpoint.url).set(0)
            return
        self._healthy(endpoint)

    async def _read_load(self, pool: ConnectionPool, endpoint: EndpointState) -> None:
        status, body = await _get(pool, endpoint.url, "/load", _MAX_LOAD_BODY)
        if status == 404:
            raise _NoLoadDocument()
        if status != 200:
            raise ValueError(f"/load answered {status}")
        report = LoadReport.model_validate_json(body)
        endpoint.waiting, endpoint.running, endpoint.kv_cache_usage = report.waiting, report.running, report.kv_cache_usage
        endpoint.loaded_adapters = frozenset(report.loaded_adapters or ())
        endpoint.estimated_queue_s = report.estimated_queue_s

    async def _read_metrics(self, pool: ConnectionPool, endpoint: EndpointState) -> None:
        status, body = await _get(pool, endpoint.url, "/metrics", _MAX_METRICS_BODY)
        if status != 200:
            raise ValueError(f"/metrics answered {status}")
        # The metrics of a server the table names no engine for (found by its 404 on /load) are vLLM's names.
        engine = "vllm" if endpoint.engine in SERVES_LOAD_DOCUMENT else endpoint.engine
        load = parse_load(body.decode("utf-8", "replace"), engine, endpoint.served_model_name)
        if min(load.waiting, load.running, load.kv_cache_usage) < 0:
            raise ValueError("/metrics reports a negative load")
        # Gauges are floats on the wire; counts are whole requests, and usage is a share of the cache.
        endpoint.waiting, endpoint.running = round(load.waiting), round(load.running)
        endpoint.kv_cache_usage = min(load.kv_cache_usage, 1.0)

    def _healthy(self, endpoint: EndpointState) -> None:
        if not endpoint.healthy:
            log.info("endpoint %s is healthy again", endpoint.url)
        endpoint.healthy = True
        endpoint.slow_polls = 0
        endpoint.polled_at = time.monotonic()
        self._metrics.endpoint_up.labels(endpoint.url).set(1)
        self._metrics.endpoint_load.labels(endpoint.url, "waiting").set(endpoint.waiting)
        self._metrics.endpoint_load.labels(endpoint.url, "running").set(endpoint.running)
        self._metrics.endpoint_load.labels(endpoint.url, "kv_cache_usage").set(endpoint.kv_cache_usage)


async def _get(pool: ConnectionPool, url: str, path: str, limit: int) -> tuple[int, bytes]:
    """Status and body; the connection goes back to the pool only when the body was read whole."""
    response = await pool.request("GET", url, path)
    try:
        body = await response.read(limit)
    except BaseException:
        response.close()
        raise
    response.release()
    return response.status, body
