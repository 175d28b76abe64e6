"""Read a runtime pod's load from its Prometheus /metrics, by its engine's gauge names (sluice_contracts.engines)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from sluice_contracts.engines import DEFAULT_ENGINE, MetricsParseError, parse_load

SCRAPE_TIMEOUT_SECONDS = 3.0


class MetricsError(ValueError):
    """The pod's metrics cannot be used; the message says why, for the autoscaler's status."""


@dataclass(frozen=True)
class RuntimeLoad:
    kv_cache_usage: float
    waiting: float
    running: float


def parse_runtime_metrics(text: str, served_model_name: str, engine: str = DEFAULT_ENGINE) -> RuntimeLoad:
    """The three gauges for `served_model_name` (or unlabelled ones); MetricsError when any is missing."""
    try:
        load = parse_load(text, engine, served_model_name)
    except MetricsParseError as exc:
        raise MetricsError(str(exc)) from None
    return RuntimeLoad(load.kv_cache_usage, load.waiting, load.running)


async def fetch_metrics(session: aiohttp.ClientSession, base_url: str) -> str:
    """The text of `base_url`/metrics (a runtime's or a gateway's); MetricsError when it cannot be had."""
    try:
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)
        async with session.get(f"{base_url}/metrics", timeout=timeout) as response:
            if response.status != 200:
                raise MetricsError(f"/metrics answered HTTP {response.status}")
            return await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise MetricsError(f"/metrics unreachable: {type(exc).__name__} {exc}".strip()) from None


async def scrape(session: aiohttp.ClientSession, base_url: str, served_model_name: str,
                 engine: str = DEFAULT_ENGINE) -> RuntimeLoad:
    return parse_runtime_metrics(await fetch_metrics(session, base_url), served_model_name, engine)
