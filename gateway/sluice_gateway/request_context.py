"""One proxied request as it passes through the gateway: who sent it, what it asks for, its hold on the
tenant's limits, and what happened to it. Built when the request arrives and handed whole to each step
(admission, picking, forwarding, the response, the access log), so no step takes a dozen loose arguments.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sluice_contracts.trace_context import TraceContext, new_trace

from .admission import Admission
from .auth import Principal
from .request import ParsedRequest
from .request_spans import NO_SPANS, RequestSpans


@dataclass(slots=True)
class Outcome:
    """What happened to one request; feeds the metrics and the access log."""

    route: str = ""
    backend: str = ""  # the InferenceModel (what the demand signal of scale to zero counts by)
    adapter: str | None = None  # the LoRA adapter of that model that served it, if one did
    endpoint: str = ""
    status: int = 0
    attempts: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    overhead_s: float = 0.0  # the gateway's own time: until the request went upstream, and on the way back
    upstream_s: float | None = None  # until the upstream's response headers
    ttft_s: float | None = None
    held_s: float | None = None  # in the holds (a model starting, a saturated model), before any of the above
    model_version: str | None = None  # the answering backend's, as the routing table names it
    responded: bool = False  # the final body chunk was handed to the server


@dataclass(slots=True)
class RequestContext:
    kind: str  # the task: "chat", "completion", "embedding" or "rerank" (sluice_contracts.model_tasks)
    path: str
    request_id: bytes  # the gateway's own, unique per request; sent upstream
    client_id: bytes | None  # the client's x-request-id when plain enough to echo and log
    started: float  # time.perf_counter() when the request arrived
    admission: Admission
    budget_s: float | None = None  # the client's timeout (budget.py), from `started`; None: it states none
    trace: TraceContext = field(default_factory=new_trace)  # the client's, when valid (sluice_contracts.trace_context)
    spans: RequestSpans | Any = NO_SPANS  # its steps' marks, its spans once answered (request_spans.py); NO_SPANS: off
    principal: Principal | None = None
    parsed: ParsedRequest | None = None
    # The client did not ask for usage on a stream, but the limiter needs it: asked for, then dropped on the way back.
    strip_usage: bool = False
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    response_started: bool = False
    adapter: Any = None  # an adapted_api.Adapter when the request is in another API's format than chat's
    upstream_path: str = ""  # the path it goes upstream to, when not its own (an adapted request's chat path)
    fingerprint: bytes | None = None  # the system_fingerprint member its answer gets (version_stamp.py)
    outcome: Outcome = field(default_factory=Outcome)

    @property
    def stream(self) -> bool:
        return self.parsed is not None and self.parsed.stream

    def budget_left(self) -> float | None:
        """Seconds left of the request's budget (negative once passed); None without one."""
        if self.budget_s is None:
            return None
        return self.started + self.budget_s - time.perf_counter()

    @property
    def tenant(self) -> str:
        return self.principal.tenant if self.principal else ""
