"""What a finished proxied request leaves behind: its metrics and one JSON access-log line (the key's id,
never the key)."""
from __future__ import annotations

import json
import logging
import time

from .metrics import GatewayMetrics
from .request_context import RequestContext

access_log = logging.getLogger("sluice_gateway.access")


# The route label of a request refused before its route was resolved: a label never holds a client's words.
UNKNOWN_ROUTE = "unknown"


def record(ctx: RequestContext, metrics: GatewayMetrics, log_it: bool, batch_id: str | None = None) -> None:
    """`batch_id`: the batch of a batch line, logged with it."""
    outcome, tenant = ctx.outcome, ctx.tenant
    metrics.requests.labels(outcome.route or UNKNOWN_ROUTE, outcome.backend, tenant, str(outcome.status)).inc()
    metrics.overhead.observe(outcome.overhead_s)
    if outcome.prompt_tokens is not None:
        metrics.tokens.labels(tenant, "prompt").inc(outcome.prompt_tokens)
        metrics.tokens.labels(tenant, "completion").inc(outcome.completion_tokens or 0)
    if log_it and access_log.isEnabledFor(logging.INFO):
        access_log.info(json.dumps(_line(ctx, batch_id)))


def _line(ctx: RequestContext, batch_id: str | None) -> dict:
    outcome = ctx.outcome
    return {
        "request_id": ctx.request_id.decode(errors="replace"),
        "client_request_id": ctx.client_id.decode() if ctx.client_id else None,
        "trace_id": ctx.trace.trace_id,
        "batch_id": batch_id,
        "tenant": ctx.tenant,
        "key_id": ctx.principal.key_id if ctx.principal else None,
        "route": outcome.route,
        "backend": outcome.backend,
        "adapter": outcome.adapter,
        "endpoint": outcome.endpoint,
        "status": outcome.status,
        "attempts": outcome.attempts,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "finish_reason": outcome.finish_reason,
        "overhead_ms": round(outcome.overhead_s * 1000, 3),
        "upstream_ms": _ms(outcome.upstream_s),
        "ttft_ms": _ms(outcome.ttft_s),
        "held_ms": _ms(outcome.held_s),
        "total_ms": round((time.perf_counter() - ctx.started) * 1000, 3),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
