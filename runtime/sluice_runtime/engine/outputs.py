"""What the engine streams back for each request."""
from __future__ import annotations

from dataclasses import dataclass, field

# The finish reason of a request dropped from a full queue, before it started, for a more urgent one.
SHED = "shed"
# The finish reason of a request whose budget passed while it was queued, ended before it started.
EXPIRED = "expired"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CompletionOutput:
    """One of the n sequences of a request: what is new since the request's previous output.

    Outputs carry deltas, never the text so far: a stream whose reader falls behind then holds its
    unread tokens once, not once per step. Only a request's final output also carries each
    sequence's whole `text` and `token_ids` (None before), for callers that want the result alone.
    """

    index: int
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[TokenLogprob] = field(default_factory=list)
    num_tokens: int = 0  # generated so far
    # "stop" | "length" | "abort" | "timeout" | "error" | SHED | EXPIRED; None while running.
    finish_reason: str | None = None
    # The stop string or stop token id that ended the sequence, if any.
    stop_reason: str | int | None = None
    text: str | None = None
    token_ids: list[int] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def absorb(self, later: "CompletionOutput") -> None:
        """Fold a later output of the same sequence into this one, as if they had been one."""
        self.delta_text += later.delta_text
        self.delta_token_ids.extend(later.delta_token_ids)
        self.delta_logprobs.extend(later.delta_logprobs)
        self.num_tokens = later.num_tokens
        self.finish_reason, self.stop_reason = later.finish_reason, later.stop_reason
        self.text, self.token_ids = later.text, later.token_ids


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
    # Steps that computed part of the first sequence's prompt: more than one when the step budget split it, or a
    # preemption made it compute the prompt again.
    num_prefill_chunks: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # every sequence of the request, by index
    finished: bool
    metrics: RequestMetrics

    def absorb(self, later: "RequestOutput") -> None:
        """Fold the request's next output into this unread one (the reader gets both at once)."""
        for mine, theirs in zip(self.outputs, later.outputs):
            mine.absorb(theirs)
        self.finished = later.finished
