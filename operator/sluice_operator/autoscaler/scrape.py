"""Read a runtime pod's load from its Prometheus /metrics (the runtime's names, from sluice_contracts)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from sluice_contracts.metric_names import KV_CACHE_USAGE, MODEL_LABEL, NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING

SCRAPE_TIMEOUT_SECONDS = 3.0


class MetricsError(ValueError):
    """The pod's metrics cannot be used; the message says why, for the autoscaler's status."""


@dataclass(frozen=True)
class RuntimeLoad:
    kv_cache_usage: float
    waiting: float
    running: float


def parse_runtime_metrics(text: str, served_model_name: str) -> RuntimeLoad:
    """The three gauges for `served_model_name` (or unlabelled ones); MetricsError when any is missing."""
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in (KV_CACHE_USAGE, NUM_REQUESTS_WAITING, NUM_REQUESTS_RUNNING):
                    continue
                model = sample.labels.get(MODEL_LABEL)
                if model is not None and model != served_model_name:
                    continue
                values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise MetricsError(f"unparsable /metrics: {exc}") from None
    missing = [name for name in (KV_CACHE_USAGE, NUM_REQUESTS_WAITING, NUM_REQUESTS_RUNNING) if name not in values]
    if missing:
        raise MetricsError(f"/metrics lacks {', '.join(missing)} for model {served_model_name!r}")
    if any(v != v for v in values.values()):
        raise MetricsError("/metrics reports NaN")
    return RuntimeLoad(values[KV_CACHE_USAGE], values[NUM_REQUESTS_WAITING], values[NUM_REQUESTS_RUNNING])


async def scrape(session: aiohttp.ClientSession, base_url: str, served_model_name: str) -> RuntimeLoad:
    try:
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)
        async with session.get(f"{base_url}/metrics", timeout=timeout) as response:
            if response.status != 200:
                raise MetricsError(f"/metrics answered HTTP {response.status}")
            text = await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise MetricsError(f"/metrics unreachable: {type(exc).__name__} {exc}".strip()) from None
    return parse_runtime_metrics(text, served_model_name)
