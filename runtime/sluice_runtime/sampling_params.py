"""Per-request sampling settings, validated once at the boundary of the engine."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy


@runtime_checkable
class TokenConstraint(Protocol):
    """Constrained decoding state for one output sequence (a grammar matcher, say).

    The executor asks for the allowed tokens before sampling and reports the
    sampled token afterwards. `fork()` gives an independent copy for n > 1.
    """

    def allowed_tokens(self) -> "numpy.ndarray | None":
        """A boolean array over the vocabulary (True = allowed next), or None when all are allowed."""

    def accept_token(self, token_id: int) -> None: ...

    def is_finished(self) -> bool:
        """True once the grammar accepts no further token; generation stops with 'stop'."""

    def fork(self) -> "TokenConstraint": ...


MAX_LOGIT_BIAS = 100.0
LOGIT_BIAS_BAN = -MAX_LOGIT_BIAS


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Added to a token's logit before sampling; LOGIT_BIAS_BAN bans it, whatever else the logits say.
    logit_bias: dict[int, float] = field(default_factory=dict)
    constraint: TokenConstraint | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> None:
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"),
            (0.0 <= self.temperature <= 2.0, f"temperature must be in [0, 2], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k == -1 or self.top_k >= 0, f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (0.0 < self.repetition_penalty <= 2.0, f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, f"logprobs must be in [0, 20], got {self.logprobs}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop sequences must be non-empty strings"),
            (all(isinstance(t, int) and t >= 0 and math.isfinite(b) and abs(b) <= MAX_LOGIT_BIAS
                 for t, b in self.logit_bias.items()),
             f"logit_bias maps token ids to biases in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
