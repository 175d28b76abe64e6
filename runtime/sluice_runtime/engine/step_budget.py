"""How many prefill tokens the next step may carry without slowing running decodes past a target.

Every step's tokens go through the same matmuls, so a step that carries a prefill chunk makes each
running stream wait for that chunk too. The runner's step time is modelled as a fixed cost plus a
cost per token (on a CPU most of a step is the linear layers, linear in tokens; on a GPU most of
it is fixed), fitted to the recent steps the scheduler timed. The chunk is then the most tokens
that keep the step within the target inter-token latency:

- auto (the default): twice the decode-only step at the current batch, so a stream's tokens come
  at most half as fast while prompts prefill beside it;
- a number of milliseconds: that target, whatever the batch;
- off: only the token budget (--max-num-batched-tokens), which always caps the chunk.

With no decode running there is nothing to protect and the chunk is the whole token budget. A
chunk is never smaller than MIN_CHUNK tokens, so prompts progress even under a target that the
decodes alone already exceed. The price is throughput where a step's fixed cost is large: a
chunk that must fit beside a few decodes cannot amortize it (engine bench, short-under-long mix).
"""
from __future__ import annotations

from dataclasses import dataclass, field

AUTO, OFF = "auto", "off"
AUTO_DECODE_FACTOR = 2.0
MIN_CHUNK = 16
# Weight of the step before each new one in the fit: about the last 20 steps count.
DECAY = 0.95


@dataclass
class StepTimeModel:
    """seconds ~= fixed + per_token * tokens, fitted by least squares over recent steps, older
    steps weighing less. Until steps of different sizes were seen, the cost is taken as
    proportional to the tokens (fixed 0), which overstates small steps' cost per token: it errs
    towards smaller chunks."""

    weight: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    tokens_sq: float = 0.0
    tokens_seconds: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < 1 or not seconds > 0:
            return
        for name in ("weight", "tokens", "seconds", "tokens_sq", "tokens_seconds"):
            setattr(self, name, getattr(self, name) * DECAY)
        self.weight += 1
        self.tokens += tokens
        self.seconds += seconds
        self.tokens_sq += tokens * tokens
        self.tokens_seconds += tokens * seconds

    @property
    def fitted(self) -> bool:
        return self.weight > 0

    def coefficients(self) -> tuple[float, float]:
        """(fixed seconds, seconds per token)."""
        mean_tokens, mean_seconds = self.tokens / self.weight, self.seconds / self.weight
        variance = self.tokens_sq / self.weight - mean_tokens ** 2
        if variance >= 1.0:
            per_token = (self.tokens_seconds / self.weight - mean_tokens * mean_seconds) / variance
            fixed = mean_seconds - per_token * mean_tokens
            if per_token > 0 and fixed >= 0:
                return fixed, per_token
        return 0.0, mean_seconds / mean_tokens

    def predict(self, tokens: int) -> float:
        fixed, per_token = self.coefficients()
        return fixed + per_token * tokens


@dataclass
class StepBudget:
    """target_itl: AUTO, OFF or seconds; max_tokens: the step's token budget."""

    target_itl: str | float
    max_tokens: int
    model: StepTimeModel = field(default_factory=StepTimeModel)

    def prefill_tokens(self, num_decodes: int) -> int:
        """Prefill tokens the next step may carry beside `num_decodes` decodes."""
        room = self.max_tokens - num_decodes
        if self.target_itl == OFF or num_decodes == 0 or not self.model.fitted:
            return room
        fixed, per_token = self.model.coefficients()
        target = AUTO_DECODE_FACTOR * self.model.predict(num_decodes) if self.target_itl == AUTO else self.target_itl
        fits = int((target - fixed) / per_token) - num_decodes
        return max(0, min(room, max(MIN_CHUNK, fits)))
