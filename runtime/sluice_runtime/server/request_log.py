"""One JSON line per API request: who, what, how long, how it ended."""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("sluice.requests")


@dataclass
class RequestRecord:
    request_id: str  # the server's own, unique
    method: str
    path: str
    trace_id: str  # the caller's W3C trace, else one started here (sluice_contracts.trace_context)
    client_request_id: str | None = None  # the client's x-request-id, which need not be unique
    parent_span_id: str | None = None  # the caller's span (a gateway's attempt); None: the trace started here
    status: int | None = None
    model: str | None = None
    template_version: str | None = None
    stream: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    sampling: dict | None = None
    priority: int | None = None
    tenant: str | None = None  # as the gateway named it (percent-encoded); absent for direct callers
    finish_reasons: list[str] = field(default_factory=list)
    error_code: str | None = None
    cancelled: bool = False
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    total_s: float | None = None
    # Only with --log-prompts: prompts can hold personal data.
    prompt: str | None = None
    # The engine's timestamps of its first sequence (engine.outputs.RequestMetrics), for the request's spans
    # (request_spans.py); not logged: queue_s, prefill_s and decode_s are their log fields.
    engine_metrics: Any = None

    def emit(self) -> None:
        fields = {k: v for k, v in asdict(self).items() if v is not None and v != [] and k != "engine_metrics"}
        line = json.dumps(fields, ensure_ascii=False, default=str)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            # Text no encoder takes (a lone surrogate) would make the log handler drop the line with a
            # traceback; escaped, every character stays in a line that is still JSON.
            line = json.dumps(fields, default=str)
        log.info(line)
