"""Read the demand of every model from the gateway replicas' /metrics (names in sluice_contracts.demand)."""
from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sluice_contracts.demand import BACKEND_IN_FLIGHT, BACKEND_LABEL, HELD_REQUESTS, REQUESTS

from .demand import GatewayDemand
from .scrape import MetricsError, fetch_metrics

_FIELDS = {HELD_REQUESTS: "held", BACKEND_IN_FLIGHT: "in_flight", f"{REQUESTS}_total": "answered"}


def parse_gateway_demand(text: str) -> dict[str, GatewayDemand]:
    """Model (the routing table's backend name) → its figures on this gateway replica."""
    figures: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                field = _FIELDS.get(sample.name)
                model = sample.labels.get(BACKEND_LABEL)
                if field is None or not model or sample.value != sample.value:
                    continue
                per_model = figures.setdefault(model, {})
                per_model[field] = per_model.get(field, 0.0) + float(sample.value)
    except ValueError as exc:
        raise MetricsError(f"unparsable /metrics: {exc}") from None
    return {model: GatewayDemand(**values) for model, values in figures.items()}


async def scrape_gateway(session: aiohttp.ClientSession, base_url: str) -> dict[str, GatewayDemand]:
    return parse_gateway_demand(await fetch_metrics(session, base_url))
