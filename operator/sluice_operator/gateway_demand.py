"""The gateways' demand per model (autoscaler/demand.py), read from their pods' /metrics: at most once per
interval, however many models ask, and from every replica, so the signal covers them all."""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

import aiohttp

from .autoscaler import GatewayDemand, MetricsError, scrape_gateway
from .kube import Kube
from .pods import addresses, base_url

log = logging.getLogger(__name__)

# model → gateway replica (pod name) → its figures
Demand = dict[str, dict[str, GatewayDemand]]


@dataclass(frozen=True)
class GatewaySource:
    """Where the gateway replicas run: their namespace (whose routing table they serve), pods and metrics port."""

    namespace: str
    selector: str
    port: int


class GatewayDemandReader:
    def __init__(self, kube: Kube, source: GatewaySource, max_age: float) -> None:
        self.source = source
        self._kube = kube
        self._max_age = max_age
        self._lock = asyncio.Lock()
        self._read_at = -math.inf
        self._demand: Demand = {}

    async def read(self) -> Demand:
        async with self._lock:
            if time.monotonic() - self._read_at >= self._max_age:
                self._demand = await self._scrape()
                self._read_at = time.monotonic()
            return self._demand

    async def _scrape(self) -> Demand:
        source = self.source
        pods = [p for p in await self._kube.list_pods(source.namespace, source.selector) if addresses(p)]
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(
                *(scrape_gateway(session, base_url(addresses(p)[0], source.port)) for p in pods),
                return_exceptions=True,
            )
        demand: Demand = {}
        for pod, result in zip(pods, results):
            name = pod["metadata"]["name"]
            if isinstance(result, MetricsError):
                log.debug("gateway %s: %s", name, result)
                continue
            if isinstance(result, BaseException):
                log.warning("gateway %s: scrape failed: %r", name, result)
                continue
            for model, figures in result.items():
                demand.setdefault(model, {})[name] = figures
        return demand
