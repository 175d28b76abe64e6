"""One serving path for /v1/chat/completions and /v1/completions: engine outputs to a response or an SSE stream.

What differs between the endpoints (the shape of a choice, of a chunk, what opens a stream) is a
`BodyShape` passed in: `chat_format.ChatFormat` or `completion_format.CompletionFormat`. Choice `index`
is `prompt * n + choice`, so a /v1/completions request with several prompts numbers its choices as OpenAI does.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import AsyncIterator, Protocol

from fastapi.responses import JSONResponse, Response

from sluice_runtime.engine.errors import EngineError
from sluice_runtime.engine.outputs import CompletionOutput, TokenLogprob

from .disconnect import ClientDisconnected, until_disconnected
from .generation import GenerationRunner, Item, engine_error
from .normalize import GenerationRequest
from .protocol import Usage
from .request_log import RequestRecord
from .sse import DONE, HEARTBEAT, event, usage_event


class ChunkWriter(Protocol):
    """One stream's choice entries; it may keep state per choice (a tool-call parser, a text offset)."""

    def opening(self) -> list[list[dict]]:
        """The choice lists of the chunks sent before any token."""

    def delta(self, index: int, choice: CompletionOutput) -> dict | None:
        """The entry for what `choice` added, or None when it added nothing to send."""

    def finished(self, index: int, choice: CompletionOutput) -> dict:
        """The entry that carries the choice's finish_reason."""


class BodyShape(Protocol):
    """How one endpoint (chat or completions) lays out its answer: whole, or as stream chunks."""

    id_prefix: str
    chunk_object: str

    def response(self, greq: GenerationRequest, response_id: str, finals: list[CompletionOutput],
                 logprobs: list[list[TokenLogprob]], usage: Usage) -> dict:
        """The whole response body, from each choice's final output and all its logprobs."""

    def chunks(self, greq: GenerationRequest) -> ChunkWriter:
        ...


class GenerationServing:
    def __init__(self, runner: GenerationRunner, shape: BodyShape, fingerprint: str):
        self._runner = runner
        self._format = shape
        self._fingerprint = fingerprint  # the served version's (served_version.py)

    async def respond(self, greq: GenerationRequest, receive, record: RequestRecord) -> Response:
        outputs = await self._runner.start(greq, receive, record)
        if greq.stream:
            return self._runner.stream(self._events(greq, outputs, record), greq.request_id, record, outputs)
        try:
            body = await until_disconnected(receive, self._collect(greq, outputs, record))
        except ClientDisconnected:
            self._runner.cancelled(record)
            raise
        body["system_fingerprint"] = self._fingerprint
        return JSONResponse(body)

    def _response_id(self, greq: GenerationRequest) -> str:
        return f"{self._format.id_prefix}-{greq.request_id}"

    async def _collect(self, greq: GenerationRequest, outputs: AsyncIterator[Item], record: RequestRecord) -> dict:
        n = greq.params.n
        finals: dict[int, CompletionOutput] = {}
        logprobs: dict[int, list[TokenLogprob]] = defaultdict(list)
        last_seen: dict[str, float] = {}
        try:
            async for prompt, out in outputs:
                self._runner.account(out, record, last_seen)
                for c in out.outputs:
                    logprobs[prompt * n + c.index].extend(c.delta_logprobs)
                    if c.finished:
                        # A finished choice stays in its siblings' later outputs; the request's last one
                        # carries the whole text, so the latest sighting is kept.
                        finals[prompt * n + c.index] = c
        except (EngineError, ValueError) as exc:
            raise engine_error(exc) from None
        finally:
            await outputs.aclose()
        indexes = range(len(greq.prompts) * n)
        for index in indexes:
            failure = self._runner.failure(finals[index].finish_reason)
            if failure is not None:
                raise failure
        usage = _usage(record)
        return self._format.response(greq, self._response_id(greq), [finals[i] for i in indexes],
                                     [logprobs[i] for i in indexes], usage)

    async def _events(self, greq: GenerationRequest, outputs: AsyncIterator[Item], record: RequestRecord):
        n = greq.params.n
        base = {"id": self._response_id(greq), "object": self._format.chunk_object, "created": int(time.time()),
                "model": greq.model, "system_fingerprint": self._fingerprint}
        if greq.include_usage:
            base["usage"] = None
        writer = self._format.chunks(greq)
        for choices in writer.opening():
            yield event({**base, "choices": choices})
        last_seen: dict[str, float] = {}
        done: set[int] = set()
        sent = time.monotonic()
        async for prompt, out in outputs:
            self._runner.account(out, record, last_seen)
            for c in out.outputs:
                index = prompt * n + c.index
                if index in done:
                    continue  # with n > 1, a finished choice stays in later outputs of its siblings
                delta = writer.delta(index, c)
                if delta is not None:
                    yield event({**base, "choices": [delta]})
                    sent = time.monotonic()
                elif time.monotonic() - sent >= self._runner.heartbeat_s:
                    yield HEARTBEAT
                    sent = time.monotonic()
                if c.finished:
                    done.add(index)
                    closing = self._runner.stream_failure(c.finish_reason, record)
                    if closing is not None:
                        yield closing
                        return
                    yield event({**base, "choices": [writer.finished(index, c)]})
        if greq.include_usage:
            usage = _usage(record)
            yield usage_event(base, usage.prompt_tokens, usage.completion_tokens)
        yield DONE


def _usage(record: RequestRecord) -> Usage:
    """The request's token counts, as the runner accounted its finished engine requests."""
    prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
