"""/v1/completions: engine outputs to text_completion responses and streams (several prompts, echo)."""
from __future__ import annotations

import time

from fastapi.responses import JSONResponse, Response

from sluice_runtime.engine.errors import EngineError

from .disconnect import ClientDisconnected, until_disconnected
from .generation import GenerationRunner, engine_error
from .logprobs import LogprobFormatter
from .normalize import GenerationRequest
from .protocol import CompletionChoice, CompletionLogprobs, CompletionResponse, Usage
from .request_log import RequestRecord
from .sse import DONE, event, usage_event



class CompletionServing:
    def __init__(self, runner: GenerationRunner, logprobs: LogprobFormatter, tokenizer):
        self._runner = runner
        self._logprobs = logprobs
        self._tokenizer = tokenizer

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

    def _echo(self, greq: GenerationRequest, prompt_index: int) -> str:
        if not greq.echo:
            return ""
        text = greq.prompt_texts[prompt_index]
        return text if text is not None else self._tokenizer.decode(greq.prompts[prompt_index])

    async def _collect(self, greq: GenerationRequest, first, stream, record: RequestRecord) -> dict:
        n = greq.params.n
        final, logprobs, last_seen = {}, {}, {}
        finished_prompts = 0
        try:
            item = first
            while item is not None:
                p, out = item
                self._runner.account(out, record, last_seen)
                for c in out.outputs:
                    logprobs.setdefault(p * n + c.index, []).extend(c.delta_logprobs)
                    if c.finished:
                        final[p * n + c.index] = c
                finished_prompts += out.finished
                item = None if finished_prompts == len(greq.prompts) else await stream.__anext__()
        except (EngineError, ValueError) as exc:
            raise engine_error(exc) from None
        finally:
            await stream.aclose()
        choices = []
        for index in range(len(greq.prompts) * n):
            c = final[index]
            failure = self._runner.failure(c.finish_reason)
            if failure is not None:
                raise failure
            echo = self._echo(greq, index // n)
            lp = None
            if greq.logprobs is not None:
                lp = CompletionLogprobs(**self._logprobs.completion(logprobs[index], greq.logprobs, len(echo)))
            choices.append(CompletionChoice(index=index, text=echo + c.text, logprobs=lp,
                                            finish_reason=c.finish_reason))
        prompt_tokens = sum(len(p) for p in greq.prompts)
        completion_tokens = sum(len(c.token_ids) for c in final.values())
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      total_tokens=prompt_tokens + completion_tokens)
        return CompletionResponse(id=f"cmpl-{greq.request_id}", model=greq.model, choices=choices,
                                  usage=usage).model_dump(mode="json")

    async def _events(self, greq: GenerationRequest, first, stream, record: RequestRecord):
        n = greq.params.n
        base = {"id": f"cmpl-{greq.request_id}", "object": "text_completion", "created": int(time.time()),
                "model": greq.model}
        if greq.include_usage:
            base["usage"] = None
        offsets: dict[int, int] = {}
        last_seen: dict[str, float] = {}
        done: set[int] = set()
        finished_prompts = 0
        if greq.echo:
            for index in range(len(greq.prompts) * n):
                text = self._echo(greq, index // n)
                offsets[index] = len(text)
                yield event({**base, "choices": [{"index": index, "text": text, "logprobs": None,
                                                  "finish_reason": None}]})
        item = first
        while item is not None:
            p, out = item
            self._runner.account(out, record, last_seen)
            for c in out.outputs:
                index = p * n + c.index
                if index in done:
                    continue  # with n > 1, a finished choice stays in later outputs of its siblings
                lp = None
                if greq.logprobs is not None and c.delta_logprobs:
                    lp = self._logprobs.completion(c.delta_logprobs, greq.logprobs, offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + len(c.delta_text)
                if c.delta_text or lp:
                    yield event({**base, "choices": [{"index": index, "text": c.delta_text, "logprobs": lp,
                                                      "finish_reason": None}]})
                if c.finished:
                    done.add(index)
                    closing = self._runner.stream_failure(c.finish_reason, record)
                    if closing is not None:
                        yield closing
                        return
                    yield event({**base, "choices": [{"index": index, "text": "", "logprobs": None,
                                                      "finish_reason": c.finish_reason}]})
            finished_prompts += out.finished
            item = None if finished_prompts == len(greq.prompts) else await stream.__anext__()
        if greq.include_usage:
            prompt_tokens = sum(len(p) for p in greq.prompts)
            completion_tokens = record.completion_tokens or 0
            yield usage_event(base, prompt_tokens, completion_tokens)
        yield DONE
