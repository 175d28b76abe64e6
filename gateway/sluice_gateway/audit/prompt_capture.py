"""Prompt capture (gateway.yaml `audit.prompt_capture`, `tenants[].prompt_capture_rate`): of the tenants that opt
in, a random sample of their requests, online and batch lines alike, written with their prompt and their
answer's text to a sink of their own, redacted and bounded before the write (redaction.py).

A request is drawn when its first byte of answer goes out (its tenant known by then), at its tenant's rate as
gateway.yaml says now, with a generator of the capture's own: tracing's sampler has no say in it. Off (no sink,
or no tenant opted in), a request costs one check and no copy of anything. On, it is never failed or delayed:
its answer is read after each part of it has been sent, the record is written once it has been answered, and
a record that cannot be written is logged and counted.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ..config import GatewayConfig
from ..config import PromptCapture as Settings
from ..request import Serialised
from ..request_context import RequestContext
from .answer_text import AnswerText
from .redaction import MARGIN, Budget, Redactor
from .sink import AuditSink

# The fields of a body that carry its prompt, in every API the gateway proxies (the Responses and Messages APIs
# as translated to chat); the rest are settings.
PROMPT_FIELDS = ("messages", "prompt", "input", "query", "documents")
# The APIs whose answers are text; an embedding's or a ranking's numbers are not captured.
_TEXT_ANSWERS = frozenset({"chat", "completion"})


class CaptureWatch:
    """One request's part in the capture: whether it was drawn, and its answer's text if so."""

    def __init__(self, capture: Capture, ctx: RequestContext) -> None:
        self._capture = capture
        self.ctx = ctx
        self.drawn: bool | None = None
        self.answer: AnswerText | None = None

    def saw(self, message: dict[str, Any]) -> None:
        """A message the client was sent, after it was sent."""
        if self.drawn is None:
            self.draw()
        if self.answer is not None:
            self.answer.saw(message)

    def done(self, batch_id: str | None) -> None:
        """The request has been answered: its record, if it was drawn."""
        self._capture.write(self, batch_id)

    def draw(self) -> None:
        self.drawn = self._capture.draws(self.ctx)
        if self.drawn and self.ctx.kind in _TEXT_ANSWERS:
            self.answer = AnswerText(self.ctx.stream, self._capture.max_chars + MARGIN)


class Capture:
    def __init__(self, settings: Settings, failed: Callable[[], None], config: Callable[[], GatewayConfig]) -> None:
        """`failed` is called for each record that could not be written; `config` is gateway.yaml in force."""
        self._wanted = settings.sink != "off"
        self._sink = AuditSink(settings.sink, failed, setting="audit.prompt_capture.sink",
                               record="prompt capture record")
        self._on_stdout = settings.sink == "stdout"
        self._failed = failed
        self._redactor = Redactor(settings.redact)
        self.max_chars = settings.max_chars
        self._config = config
        self._random = random.Random()
        self._rates: dict[str, float] = {}
        self._rates_of: GatewayConfig | None = None

    def watch(self, ctx: RequestContext) -> CaptureWatch | None:
        """The request's watch; None when no request can be drawn."""
        return CaptureWatch(self, ctx) if self._wanted and self._rates_now() else None

    def draws(self, ctx: RequestContext) -> bool:
        principal = ctx.principal
        if principal is None or principal.admin or ctx.parsed is None:
            return False
        rate = self._rates_now().get(principal.tenant)
        return rate is not None and self._random.random() < rate

    def write(self, watch: CaptureWatch, batch_id: str | None) -> None:
        if watch.drawn is None:
            watch.draw()  # nothing was sent to its client: a batch line's or one that left
        if not watch.drawn:
            return
        if not self._sink.on or (self._on_stdout and self._config().access_log):
            # Its file could not be opened (said in the log at start), or a reload turned the access log on
            # where the records go: the record is lost, and counted.
            self._failed()
            return
        self._sink.write(self._record(watch, batch_id))

    def close(self) -> None:
        self._sink.close()

    def _rates_now(self) -> dict[str, float]:
        config = self._config()
        if config is not self._rates_of:
            self._rates = {tenant.name: tenant.prompt_capture_rate for tenant in config.tenants
                           if tenant.prompt_capture_rate is not None}
            self._rates_of = config
        return self._rates

    def _record(self, watch: CaptureWatch, batch_id: str | None) -> dict[str, Any]:
        ctx, redactor = watch.ctx, self._redactor
        principal, parsed = ctx.principal, ctx.parsed
        assert principal is not None and parsed is not None  # a request is drawn only with both
        payload = parsed.payload
        asked = Budget(self.max_chars)
        request = {name: redactor.value(_parsed(payload[name]), asked) for name in PROMPT_FIELDS if name in payload}
        told = Budget(self.max_chars)
        texts = watch.answer.texts() if watch.answer is not None else None
        answer = None if texts is None else [told.take(text, redactor) for text in texts]
        arrived = time.time() - (time.perf_counter() - ctx.started)
        return {
            "audit": "prompt_capture",
            "time": datetime.fromtimestamp(arrived, UTC).isoformat(timespec="milliseconds"),
            "request_id": ctx.request_id.decode(errors="replace"),
            "client_request_id": ctx.client_id.decode() if ctx.client_id else None,
            "trace_id": ctx.trace.trace_id,
            "mode": "online" if batch_id is None else "batch",
            "batch_id": batch_id,
            "tenant": principal.tenant,
            "key_id": principal.key_id,
            "path": ctx.path,
            "route": ctx.outcome.route or None,
            "status": ctx.outcome.status,
            "request": request,
            "answer": answer,
            "truncated": {"request": asked.truncated,
                          "answer": told.truncated or (watch.answer is not None and watch.answer.cut)},
        }


def _parsed(value: Any) -> Any:
    """A body field as the gateway parsed it: a large body's arrays and objects are kept as their JSON text."""
    return value.json if isinstance(value, Serialised) else value
