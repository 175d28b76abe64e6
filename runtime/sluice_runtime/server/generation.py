"""Running a normalized request on the engine: submission, merging, error mapping, per-request accounting."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import AsyncIterator

from sluice_runtime.engine.errors import DeadlinePassed, EngineDead, EngineError, EngineOverloaded, RequestRejected
from sluice_runtime.engine.lora_registry import LoraNotFound
from sluice_runtime.engine.outputs import EXPIRED, RequestOutput
from sluice_runtime.sampling_params import SamplingParams

from .disconnect import ClientDisconnected, until_disconnected
from .errors import APIError, internal_error, invalid_request, model_not_found, overloaded, shutting_down
from .normalize import GenerationRequest
from .request_budget import BUDGET
from .request_log import RequestRecord
from .sse import DONE, SSEResponse, error_event

log = logging.getLogger("sluice.server")

Item = tuple[int, RequestOutput]


def engine_error(exc: Exception) -> APIError:
    if isinstance(exc, LoraNotFound):  # unloaded between the request's check and its admission
        return model_not_found(exc.name)
    if isinstance(exc, EngineOverloaded):
        err = overloaded(str(exc), exc.retry_after_s)
        err.code = exc.code
        return err
    if isinstance(exc, RequestRejected):
        return invalid_request(str(exc), code=exc.code)
    if isinstance(exc, EngineDead):
        return APIError(503, "The engine has stopped and cannot serve requests.", type="server_error",
                        code=exc.code, headers={"Retry-After": "1"})
    if isinstance(exc, EngineError):
        return APIError(500, str(exc), type="server_error", code=exc.code)
    return invalid_request(str(exc))


class GenerationRunner:
    def __init__(self, engine, lifecycle, metrics, settings):
        self._engine = engine
        self._lifecycle = lifecycle
        self._metrics = metrics
        self._timeout = settings.request_timeout
        self._stream_idle_timeout = settings.stream_idle_timeout
        self.heartbeat_s = settings.stream_heartbeat_s
        self._admission = engine.config.deadline_admission
        self._default_budget = engine.config.default_budget_s

    async def start(self, greq: GenerationRequest, receive, record: RequestRecord) -> AsyncIterator[Item]:
        """Submit every prompt and wait for the first output, so that admission errors become HTTP statuses.

        The iterator returned yields that first output, then the rest until every prompt has finished;
        closing it aborts the engine requests still running."""
        budget, stated = BUDGET.get()
        outputs = self._outputs(greq, self._default_budget if budget is None else budget, stated)
        try:
            first = await until_disconnected(receive, outputs.__anext__())
        except ClientDisconnected:
            self.cancelled(record)
            raise
        except (EngineError, ValueError) as exc:
            await outputs.aclose()
            err = engine_error(exc)
            self._metrics.observe_rejected(err.code or err.type)
            raise err from None
        return _after(first, outputs)

    def stream(self, events: AsyncIterator[str], request_id: str, record: RequestRecord,
               outputs: AsyncIterator[Item]) -> SSEResponse:
        """The SSE response for a stream's events; `outputs` are the engine outputs they are made from."""
        return SSEResponse(self._guarded(events, request_id, record, outputs), self._stream_idle_timeout)

    async def _guarded(self, events: AsyncIterator[str], request_id: str, record: RequestRecord,
                       outputs: AsyncIterator[Item]) -> AsyncIterator[str]:
        """Ends every stream cleanly: engine errors and our own bugs become an error event, then [DONE]."""
        try:
            async for chunk in events:
                yield chunk
        except asyncio.CancelledError:
            self.cancelled(record)
            raise
        except (EngineError, ValueError) as exc:
            err = engine_error(exc)
            record.error_code = err.code
            yield error_event(err)
            yield DONE
        except Exception:
            log.exception("stream of request %s failed", request_id)
            record.error_code = "internal_error"
            yield error_event(internal_error(request_id))
            yield DONE
        finally:
            await outputs.aclose()

    def cancelled(self, record: RequestRecord) -> None:
        record.cancelled = True
        self._metrics.observe_cancelled()

    def failure(self, finish_reason: str | None) -> APIError | None:
        """The error a client gets for a sequence that ended without a result, or None."""
        if finish_reason == "abort":
            if self._lifecycle.draining:
                return shutting_down()
            return APIError(503, "The request was aborted by the server.", type="server_error", code="aborted")
        if finish_reason == "timeout":
            return APIError(504, f"The request did not finish within the server's request timeout of "
                                 f"{self._timeout:g} s.", type="timeout_error", code="request_timeout")
        if finish_reason == "error":
            return APIError(500, "The engine failed while generating; this is a bug in the server.",
                            type="server_error", code="engine_error")
        return None

    def stream_failure(self, finish_reason: str | None, record: RequestRecord) -> str | None:
        """The closing frames of a stream whose choice ended without a result (error event, [DONE]), or None."""
        failure = self.failure(finish_reason)
        if failure is None:
            return None
        record.error_code = failure.code
        return error_event(failure) + DONE

    def account(self, out: RequestOutput, record: RequestRecord, last_seen: dict[str, float]) -> None:
        """Metrics and log fields for one engine output; `last_seen` keeps token arrival times per request."""
        now = time.monotonic()
        new_tokens = sum(len(c.delta_token_ids) for c in out.outputs)
        if new_tokens:
            previous = last_seen.get(out.request_id)
            if previous is not None:
                self._metrics.observe_token_gap(now - previous, new_tokens)
            last_seen[out.request_id] = now
        if not out.finished:
            return
        generated = sum(len(c.token_ids) for c in out.outputs)
        reasons = [c.finish_reason or "abort" for c in out.outputs]
        self._metrics.observe_finished(out.metrics, len(out.prompt_token_ids), generated, reasons)
        record.prompt_tokens = (record.prompt_tokens or 0) + len(out.prompt_token_ids)
        record.completion_tokens = (record.completion_tokens or 0) + generated
        record.finish_reasons.extend(reasons)
        m = out.metrics
        if record.queue_s is None and m.first_scheduled_time is not None:
            record.engine_metrics = m
            record.queue_s = round(m.first_scheduled_time - m.arrival_time, 4)
            if m.first_token_time is not None:
                record.prefill_s = round(m.first_token_time - m.first_scheduled_time, 4)
                if m.finished_time is not None:
                    record.decode_s = round(m.finished_time - m.first_token_time, 4)

    async def _outputs(self, greq: GenerationRequest, budget: float, stated: bool) -> AsyncIterator[Item]:
        deadline = time.time() + self._timeout if self._timeout else None
        ids = [greq.request_id if len(greq.prompts) == 1 else f"{greq.request_id}-{i}"
               for i in range(len(greq.prompts))]
        streams = [self._tracked(ids[i], prompt, _params_for(greq, i), greq, deadline, budget, stated)
                   for i, prompt in enumerate(greq.prompts)]
        merged = _numbered(streams[0]) if len(streams) == 1 else _merge(streams)
        unfinished = len(streams)
        try:
            async for item in merged:
                yield item
                unfinished -= item[1].finished
                if not unfinished:
                    return
        finally:
            await merged.aclose()

    async def _tracked(self, request_id: str, prompt: list[int], params: SamplingParams, greq: GenerationRequest,
                       deadline, budget: float, stated: bool):
        """One prompt's engine request. With deadline admission, it is refused at once when its answer's first
        byte is not expected within `budget` seconds, and ended with the same 503 when too little of the budget is
        left for it to be answered in time and it has not started (the engine checks that at its next step).
        The first byte of a response read at once is its end, when the client `stated` the budget
        (request_budget); otherwise the first token, as for a stream."""
        engine = self._engine.engine
        expiry = None
        first_token = greq.stream or not stated
        if self._admission and not engine.check_budget(prompt, params, greq.priority, first_token, budget):
            # Once less is left than its own service takes, it cannot be answered in time even if it starts.
            left = max(0.0, budget - engine.service_s(len(prompt), params, first_token))
            expiry = asyncio.get_running_loop().call_later(left, engine.expire, request_id)
        with self._lifecycle.track(request_id):
            outputs = self._engine.generate(prompt, params, request_id, priority=greq.priority, deadline=deadline,
                                            tenant=greq.tenant, share=greq.share, lora=greq.lora,
                                            streamed=greq.stream)
            try:
                async for out in outputs:
                    if expiry is not None:
                        expiry.cancel()
                    if out.finished and out.outputs[0].finish_reason == EXPIRED:
                        estimate = engine.first_byte_estimate(len(prompt), params, greq.priority, first_token)
                        raise DeadlinePassed(
                            f"this request's budget of {budget:g} s ran out while it was queued (too little was left "
                            f"for its answer to come in time); its answer's first byte is now expected in "
                            f"{estimate:.1f} s; retry later or elsewhere",
                            retry_after_s=estimate - budget)
                    yield out
            finally:
                if expiry is not None:
                    expiry.cancel()
                await outputs.aclose()


def _params_for(greq: GenerationRequest, index: int) -> SamplingParams:
    """Each prompt needs its own grammar state; the first one uses the original."""
    params = greq.params
    if index == 0 or params.constraint is None:
        return params
    return dataclasses.replace(params, constraint=params.constraint.fork())


async def _after(first: Item, rest: AsyncIterator[Item]) -> AsyncIterator[Item]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def _numbered(stream) -> AsyncIterator[Item]:
    """One engine request's outputs as items of prompt 0; closing this closes (aborts) it."""
    try:
        async for out in stream:
            yield 0, out
    finally:
        await stream.aclose()


async def _merge(streams: list) -> AsyncIterator[Item]:
    """Outputs of several engine requests in arrival order; closing this closes (aborts) them all.

    The hand-over holds one output: a reader that falls behind leaves the rest folded together in the
    engine's mailboxes rather than queued here."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=1)
    done = object()

    async def pump(index: int, stream) -> None:
        try:
            async for out in stream:
                await queue.put((index, out, None))
            await queue.put((index, None, done))
        except Exception as exc:
            await queue.put((index, None, exc))
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, out, exc = await queue.get()
            if exc is done:
                remaining -= 1
            elif exc is not None:
                raise exc
            else:
                yield index, out
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
