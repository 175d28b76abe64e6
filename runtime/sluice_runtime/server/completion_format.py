"""/v1/completions: the text_completion response and stream entries (several prompts, echo, text offsets)."""
from __future__ import annotations

from typing import Callable

from sluice_runtime.engine.outputs import CompletionOutput, TokenLogprob

from .logprobs import LogprobFormatter
from .normalize import GenerationRequest
from .protocol import CompletionChoice, CompletionLogprobs, CompletionResponse, Usage


class CompletionFormat:
    id_prefix = "cmpl"
    chunk_object = "text_completion"

    def __init__(self, logprobs: LogprobFormatter, tokenizer):
        self._logprobs = logprobs
        self._tokenizer = tokenizer

    def echo(self, greq: GenerationRequest, index: int) -> str:
        """The prompt text choice `index` starts with when `echo` is asked for, else ''."""
        if not greq.echo:
            return ""
        prompt = index // greq.params.n
        text = greq.prompt_texts[prompt]
        return text if text is not None else self._tokenizer.decode(greq.prompts[prompt])

    def response(self, greq: GenerationRequest, response_id: str, finals: list[CompletionOutput],
                 logprobs: list[list[TokenLogprob]], usage: Usage) -> dict:
        choices = []
        for index, c in enumerate(finals):
            echo = self.echo(greq, index)
            lp = None
            if greq.logprobs is not None:
                lp = CompletionLogprobs(**self._logprobs.completion(logprobs[index], greq.logprobs, len(echo)))
            choices.append(CompletionChoice(index=index, text=echo + c.text, logprobs=lp,
                                            finish_reason=c.finish_reason))
        return CompletionResponse(id=response_id, model=greq.model, choices=choices,
                                  usage=usage).model_dump(mode="json")

    def chunks(self, greq: GenerationRequest) -> "CompletionChunks":
        return CompletionChunks(greq, self.echo, self._logprobs)


class CompletionChunks:
    """A stream's entries: each choice's echoed prompt first when asked, then its text; logprobs carry offsets."""

    def __init__(self, greq: GenerationRequest, echo: Callable[[GenerationRequest, int], str],
                 logprobs: LogprobFormatter):
        self._greq = greq
        self._echo = echo
        self._logprobs = logprobs
        self._offsets: dict[int, int] = {}

    def opening(self) -> list[list[dict]]:
        if not self._greq.echo:
            return []
        chunks = []
        for index in range(len(self._greq.prompts) * self._greq.params.n):
            text = self._echo(self._greq, index)
            self._offsets[index] = len(text)
            chunks.append([{"index": index, "text": text, "logprobs": None, "finish_reason": None}])
        return chunks

    def delta(self, index: int, c: CompletionOutput) -> dict | None:
        offset = self._offsets.get(index, 0)
        lp = None
        if self._greq.logprobs is not None and c.delta_logprobs:
            lp = self._logprobs.completion(c.delta_logprobs, self._greq.logprobs, offset)
        self._offsets[index] = offset + len(c.delta_text)
        if not (c.delta_text or lp):
            return None
        return {"index": index, "text": c.delta_text, "logprobs": lp, "finish_reason": None}

    def finished(self, index: int, c: CompletionOutput) -> dict:
        return {"index": index, "text": "", "logprobs": None, "finish_reason": c.finish_reason}
