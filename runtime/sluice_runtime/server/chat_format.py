"""/v1/chat/completions: the chat.completion response and chat.completion.chunk entries, tool calls parsed out."""
from __future__ import annotations

from sluice_runtime.engine.outputs import CompletionOutput, TokenLogprob

from .logprobs import LogprobFormatter
from .normalize import GenerationRequest
from .protocol import ChatChoice, ChatCompletionResponse, ChoiceLogprobs, ResponseMessage, Usage
from .tool_calls import CallDelta, ParsedCall, ToolCallParser


def _finish_reason(engine_reason: str | None, made_calls: bool) -> str | None:
    """"tool_calls" when the model ended on its calls; a call cut short by max_tokens stays "length"."""
    return "tool_calls" if made_calls and engine_reason != "length" else engine_reason


def _tool_calls(calls: list[ParsedCall]) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _call_delta(d: CallDelta) -> dict:
    """A streamed tool-call entry: OpenAI's shape, the id, type and name only on a call's first entry."""
    if d.new:
        return {"index": d.index, "id": d.call.id, "type": "function",
                "function": {"name": d.call.name, "arguments": d.arguments}}
    return {"index": d.index, "function": {"arguments": d.arguments}}


def _parser(greq: GenerationRequest) -> ToolCallParser | None:
    return ToolCallParser(greq.tool_use.tools, greq.tool_use.forced) if greq.tool_use is not None else None


class ChatFormat:
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"

    def __init__(self, logprobs: LogprobFormatter):
        self._logprobs = logprobs

    def response(self, greq: GenerationRequest, response_id: str, finals: list[CompletionOutput],
                 logprobs: list[list[TokenLogprob]], usage: Usage) -> dict:
        choices = [self._choice(greq, index, c, logprobs[index]) for index, c in enumerate(finals)]
        return ChatCompletionResponse(id=response_id, model=greq.model, choices=choices,
                                      usage=usage).model_dump(mode="json")

    def _choice(self, greq: GenerationRequest, index: int, c: CompletionOutput,
                logprobs: list[TokenLogprob]) -> ChatChoice:
        content, calls = c.text, []
        parser = _parser(greq)
        if parser is not None:
            head, _ = parser.feed(c.text)
            tail, _ = parser.finish()
            content, calls = head + tail, parser.calls
        message = ResponseMessage(content=content if (content.strip() or not calls) else None,
                                  tool_calls=_tool_calls(calls) or None)
        lp = None
        if greq.logprobs is not None:
            lp = ChoiceLogprobs(content=self._logprobs.chat(logprobs, greq.logprobs))
        return ChatChoice(index=index, message=message, logprobs=lp,
                          finish_reason=_finish_reason(c.finish_reason, bool(calls)))

    def chunks(self, greq: GenerationRequest) -> "ChatChunks":
        return ChatChunks(greq, self._logprobs)


class ChatChunks:
    """A stream's chunk entries: the assistant role first, then text and tool-call deltas per choice."""

    def __init__(self, greq: GenerationRequest, logprobs: LogprobFormatter):
        self._greq = greq
        self._logprobs = logprobs
        self._parsers = [_parser(greq) for _ in range(greq.params.n)]

    def opening(self) -> list[list[dict]]:
        return [[{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for i in range(self._greq.params.n)]]

    def delta(self, index: int, c: CompletionOutput) -> dict | None:
        delta: dict = {}
        text, calls = c.delta_text, []
        parser = self._parsers[index]
        if parser is not None:
            text, calls = parser.feed(text)
            if c.finished:
                tail, more = parser.finish()
                text, calls = text + tail, calls + more
            if calls:
                delta["tool_calls"] = [_call_delta(d) for d in calls]
        if text:
            delta["content"] = text
        lp = None
        if self._greq.logprobs is not None and c.delta_logprobs:
            lp = {"content": self._logprobs.chat(c.delta_logprobs, self._greq.logprobs)}
        if not (delta or lp):
            return None
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": None}

    def finished(self, index: int, c: CompletionOutput) -> dict:
        parser = self._parsers[index]
        reason = _finish_reason(c.finish_reason, parser is not None and bool(parser.calls))
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
