"""What the engine streams back for each request."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CompletionOutput:
    """One of the n sequences of a request. `text`/`token_ids` are cumulative, `delta_*` new since the last output."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[TokenLogprob] = field(default_factory=list)
    # "stop" | "length" | "abort" | "timeout" | "error"; None while running.
    finish_reason: str | None = None
    # The stop string or stop token id that ended the sequence, if any.
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (time.time()) and counters, for latency metrics and logs."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
