"""The audit record of one request the gateway answered: who sent it from where, what served it, what it used
and how long each part took. Built from what the gateway decided and measured, never from the prompt or the
answer's text; every name in it comes from gateway.yaml or the routing table, or is the gateway's own."""
from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from ..auth import Principal
from ..request_context import RequestContext
from .answer_watch import AnswerWatch


def request_record(ctx: RequestContext, watch: AnswerWatch, *, batch_id: str | None,
                   source: str | None) -> dict[str, Any]:
    """`batch_id`: the batch of a batch line (its mode "batch"), None for an online request."""
    outcome, principal = ctx.outcome, ctx.principal
    now = time.perf_counter()
    arrived = time.time() - (now - ctx.started)
    return {
        "audit": "request",
        "time": datetime.fromtimestamp(arrived, UTC).isoformat(timespec="milliseconds"),
        "request_id": ctx.request_id.decode(errors="replace"),
        "client_request_id": ctx.client_id.decode() if ctx.client_id else None,
        "trace_id": ctx.trace.trace_id,
        "mode": "online" if batch_id is None else "batch",
        "batch_id": batch_id,
        "tenant": principal.tenant if principal else None,
        "key_id": principal.key_id if principal else None,
        "source": source,
        "path": ctx.path,
        "route": outcome.route or None,
        "backend": outcome.backend or None,
        "adapter": outcome.adapter,
        "model_version": outcome.model_version,
        "endpoint": outcome.endpoint or None,
        "priority_class": principal.rank.priority_class if principal else None,
        "stream": ctx.stream,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "finish_reason": outcome.finish_reason,
        "status": outcome.status,
        "error_code": watch.error_code,
        "attempts": outcome.attempts,
        "events_sent": watch.events_sent if ctx.stream else None,
        "bytes_sent": watch.bytes_sent,
        "held_ms": _ms(outcome.held_s),
        "first_byte_ms": _ms(None if watch.first_byte_at is None else watch.first_byte_at - ctx.started),
        "total_ms": _ms(now - ctx.started),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def own_record(*, request_id: bytes, client_id: bytes | None, trace_id: str, principal: Principal | None,
               source: str | None, path: str, status: int, error_code: str | None, bytes_sent: int,
               started: float) -> dict[str, Any]:
    """The record of a request the gateway answered itself (models, usage, files, an unknown path, ...), with the
    fields of a proxied request's record, those that only a proxied one has left null."""
    now = time.perf_counter()
    return {
        "audit": "request",
        "time": datetime.fromtimestamp(time.time() - (now - started), UTC).isoformat(timespec="milliseconds"),
        "request_id": request_id.decode(errors="replace"),
        "client_request_id": client_id.decode() if client_id else None,
        "trace_id": trace_id,
        "mode": "online",
        "batch_id": None,
        "tenant": principal.tenant if principal and not principal.admin else None,
        "key_id": principal.key_id if principal else None,
        "source": source,
        "path": path,
        **dict.fromkeys(("route", "backend", "adapter", "model_version", "endpoint", "priority_class")),
        "stream": False,
        **dict.fromkeys(("prompt_tokens", "completion_tokens", "finish_reason")),
        "status": status,
        "error_code": error_code,
        "attempts": 0,
        "events_sent": None,
        "bytes_sent": bytes_sent,
        "held_ms": None,
        "first_byte_ms": None,
        "total_ms": _ms(now - started),
    }
