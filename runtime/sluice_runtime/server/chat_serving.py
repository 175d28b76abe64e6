"""/v1/chat/completions: engine outputs to chat responses and chat.completion.chunk streams."""
from __future__ import annotations

import time

from fastapi.responses import JSONResponse, Response

from sluice_runtime.engine.errors import EngineError

from .disconnect import ClientDisconnected, until_disconnected
from .generation import GenerationRunner, engine_error
from .logprobs import LogprobFormatter
from .normalize import GenerationRequest
from .protocol import ChatChoice, ChatCompletionResponse, ChoiceLogprobs, ResponseMessage, Usage
from .request_log import RequestRecord
from .sse import DONE, event, usage_event
from .tool_calls import ParsedCall, ToolCallParser



def _finish_reason(engine_reason: str | None, made_calls: bool) -> str | None:
    """"tool_calls" when the model ended on its calls; a call cut short by max_tokens stays "length"."""
    return "tool_calls" if made_calls and engine_reason != "length" else engine_reason


def _tool_calls(calls: list[ParsedCall], first_index: int = 0) -> list[dict]:
    return [{"index": first_index + k, "id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for k, c in enumerate(calls)]


class ChatServing:
    def __init__(self, runner: GenerationRunner, logprobs: LogprobFormatter):
        self._runner = runner
        self._logprobs = logprobs

    async def respond(self, greq: GenerationRequest, receive, record: RequestRecord) -> Response:
        first, stream = await self._runner.start(greq, receive, record)
        if greq.stream:
            return self._runner.stream(self._events(greq, first, stream, record), greq.request_id, record, stream)
        try:
            body = await until_disconnected(receive, self._collect(greq, first, stream, record))
        except ClientDisconnected:
            self._runner.cancelled(record)
            raise
        return JSONResponse(body)

    async def _collect(self, greq: GenerationRequest, first, stream, record: RequestRecord) -> dict:
        final, logprobs, last_seen = {}, {i: [] for i in range(greq.params.n)}, {}
        prompt_tokens = 0
        try:
            item = first
            while item is not None:
                _, out = item
                self._runner.account(out, record, last_seen)
                prompt_tokens = len(out.prompt_token_ids)
                for c in out.outputs:
                    logprobs[c.index].extend(c.delta_logprobs)
                    if c.finished:
                        final[c.index] = c
                item = None if out.finished else await stream.__anext__()
        except (EngineError, ValueError) as exc:
            raise engine_error(exc) from None
        finally:
            await stream.aclose()
        choices = []
        for index in range(greq.params.n):
            c = final[index]
            failure = self._runner.failure(c.finish_reason)
            if failure is not None:
                raise failure
            content, calls = c.text, []
            if greq.tool_use is not None:
                parser = ToolCallParser(greq.tool_use.tools, greq.tool_use.forced)
                head, _ = parser.feed(c.text)
                tail, _ = parser.finish()
                content, calls = head + tail, parser.calls
            message = ResponseMessage(content=content if (content.strip() or not calls) else None,
                                      tool_calls=_tool_calls(calls) or None)
            lp = None
            if greq.logprobs is not None:
                lp = ChoiceLogprobs(content=self._logprobs.chat(logprobs[index], greq.logprobs))
            choices.append(ChatChoice(index=index, message=message, logprobs=lp,
                                      finish_reason=_finish_reason(c.finish_reason, bool(calls))))
        completion_tokens = sum(len(c.token_ids) for c in final.values())
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      total_tokens=prompt_tokens + completion_tokens)
        return ChatCompletionResponse(id=f"chatcmpl-{greq.request_id}", model=greq.model, choices=choices,
                                      usage=usage).model_dump(mode="json")

    async def _events(self, greq: GenerationRequest, first, stream, record: RequestRecord):
        n = greq.params.n
        created = int(time.time())
        base = {"id": f"chatcmpl-{greq.request_id}", "object": "chat.completion.chunk", "created": created,
                "model": greq.model}
        if greq.include_usage:
            base["usage"] = None

        def chunk(choices: list[dict]) -> str:
            return event({**base, "choices": choices})

        parsers = [ToolCallParser(greq.tool_use.tools, greq.tool_use.forced) if greq.tool_use else None
                   for _ in range(n)]
        last_seen: dict[str, float] = {}
        prompt_tokens = completion_tokens = 0
        done: set[int] = set()
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(n)])
        item = first
        while item is not None:
            _, out = item
            self._runner.account(out, record, last_seen)
            for c in out.outputs:
                if c.index in done:
                    continue  # with n > 1, a finished choice stays in later outputs of its siblings
                delta: dict = {}
                text, calls = c.delta_text, []
                parser = parsers[c.index]
                if parser is not None:
                    known = len(parser.calls)
                    text, calls = parser.feed(text)
                    if c.finished:
                        tail, more = parser.finish()
                        text, calls = text + tail, calls + more
                    if calls:
                        delta["tool_calls"] = _tool_calls(calls, known)
                if text:
                    delta["content"] = text
                lp = None
                if greq.logprobs is not None and c.delta_logprobs:
                    lp = {"content": self._logprobs.chat(c.delta_logprobs, greq.logprobs)}
                if delta or lp:
                    yield chunk([{"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": None}])
                if c.finished:
                    done.add(c.index)
                    closing = self._runner.stream_failure(c.finish_reason, record)
                    if closing is not None:
                        yield closing
                        return
                    reason = _finish_reason(c.finish_reason, parser is not None and bool(parser.calls))
                    yield chunk([{"index": c.index, "delta": {}, "logprobs": None, "finish_reason": reason}])
            if out.finished:
                prompt_tokens = len(out.prompt_token_ids)
                completion_tokens = sum(len(c.token_ids) for c in out.outputs)
                item = None
            else:
                item = await stream.__anext__()
        if greq.include_usage:
            yield usage_event(base, prompt_tokens, completion_tokens)
        yield DONE
