"""How much prefill the next step may carry without slowing running decodes past a target.

Every step's tokens go through the same matmuls, so a step that carries a prefill chunk makes each
running stream wait for that chunk too. The runner's step time is modelled as a fixed cost, a cost
per token (the linear layers) and a cost per attention pair (a query token and a key it reads: a
chunk deep into a long prompt reads all of the prompt before it, which on a CPU costs as much as
its linear layers at 2,000 tokens), fitted to the recent steps the scheduler timed. Chunks then
take what keeps the step within the target inter-token latency:

- auto (the default): AUTO_DECODE_FACTOR times the decode-only step at the largest batch of the
  last BATCH_MEMORY steps (as that batch was, measured where decode-only steps near its size
  ran lately, else read off the line), so while prompts prefill a stream's tokens come at most
  that many times as far apart as that batch's;
- a number of milliseconds: that target, whatever the batch;
- off: only the token budget (--max-num-batched-tokens), which always caps the chunks.

A straight line through all steps misses both ends on a CPU: steps that carry chunks (deep
prompts, wide rows) run dearer than it says and decode-only steps cheaper, so steps ran well past
the target. A step with chunks is therefore predicted as the line's prediction times the measured
over predicted ratio of the last few such steps.

With no decode running there is nothing to protect and the chunks share the whole token budget,
unless the scheduler asks for a short step anyway (batch work while online requests are about: one
arriving waits for the step in progress). A short step aims at SHORT_STEP_FACTOR times auto's
decode-only step instead of AUTO_DECODE_FACTOR (with a number, at the number), decodes running or
not, so its chunks take at most what the decodes leave of the step they would run alone. Which
other steps the budget leaves alone is the scheduler's policy (its module docstring).
A step's first chunk is never smaller than MIN_CHUNK tokens, so prompts progress even under a
target that the decodes alone already exceed, and later ones are not cut smaller either (unless
that finishes their prompt). The price is throughput where a step's fixed cost is
large: chunks that must fit beside the decodes cannot amortize it (engine bench, short-under-long
mix).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ..engine_config import AUTO, OFF

# Below 2: steps aimed at the target land within noise of it, some over, and a stream's
# 99th-percentile token gap should stay within twice the decode-only step (README, the
# short-under-long mix).
AUTO_DECODE_FACTOR = 1.7
# A short step is no longer than its decodes alone would take: an online request that arrives waits for
# that step in progress, so every share of it batch work takes is added to that request's first token.
SHORT_STEP_FACTOR = 1.0
# A short step's batch work decodes as many batch lines as keep it within this many times the step of the
# online decodes alone: a full batch of lines would make every short step several times longer on a CPU.
SHORT_STEP_DECODES_FACTOR = 2.0
MIN_CHUNK = 16
BATCH_MEMORY = 64
# Weight of the step before each new one in the fit: about the last 20 steps count.
DECAY = 0.95
# A fit in which a query reading this many keys costs more than the token's own linear layers is
# taken as noise (decode-heavy steps make pairs and tokens grow together) and the pairs are dropped.
MAX_PAIRS_PER_TOKEN_COST = 256
# A step that took more than this many times what the fit predicted was mostly paused, not slow
# (other processes held the cores): it counts as this many times the prediction. Unclipped, one
# pause raised the fitted fixed cost, and with it auto's target, so much that the next steps'
# chunks grew tenfold and blew the target; a machine that really got slower still moves the fit
# within a few dozen steps.
OUTLIER_FACTOR = 2.0
# Weight of the previous ratio when a step's measured over predicted time is folded in: about the
# last 5 steps with chunks count, so a change of phase (a long prompt's deep chunks) is followed.
BIAS_DECAY = 0.8
# Auto's reference is a decode-only step measured at a batch within this fraction of the one it
# needs, in the last this many steps (the line's prediction otherwise).
DECODE_ONLY_NEAR = 0.15
DECODE_ONLY_MEMORY = 1000


def chunk_pairs(context: int, tokens: int) -> int:
    """Attention pairs of `tokens` new tokens after `context` computed ones (each reads all keys up
    to the chunk's end, as the CPU prefill attention computes them)."""
    return tokens * (context + tokens)


@dataclass
class StepTimeModel:
    """seconds ~= fixed + per_token * tokens + per_pair * pairs, fitted by least squares over recent
    steps, older steps weighing less. Terms the steps seen cannot tell apart are dropped (pairs
    when they grew with the tokens or came out implausibly dear; the fixed cost until steps of
    different sizes were seen, which overstates small steps' cost per token: it errs towards
    smaller chunks)."""

    # Decayed sums over steps: weight, then of tokens, pairs, seconds and their products.
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("w", "n", "p", "t", "nn", "pp", "np", "nt", "pt"), 0.0))

    def observe(self, tokens: int, pairs: int, seconds: float) -> None:
        if tokens < 1 or not seconds > 0 or math.isinf(seconds):
            return
        if self.fitted:
            seconds = min(seconds, OUTLIER_FACTOR * self.predict(tokens, pairs))
        terms = {"w": 1.0, "n": tokens, "p": pairs, "t": seconds, "nn": tokens * tokens, "pp": pairs * pairs,
                 "np": tokens * pairs, "nt": tokens * seconds, "pt": pairs * seconds}
        for name, value in terms.items():
            self.sums[name] = self.sums[name] * DECAY + value

    @property
    def fitted(self) -> bool:
        return self.sums["w"] > 0

    def coefficients(self) -> tuple[float, float, float]:
        """(fixed seconds, seconds per token, seconds per attention pair)."""
        s = self.sums
        mean = {k: s[k] / s["w"] for k in ("n", "p", "t")}
        var_n = s["nn"] / s["w"] - mean["n"] ** 2
        var_p = s["pp"] / s["w"] - mean["p"] ** 2
        cov_np = s["np"] / s["w"] - mean["n"] * mean["p"]
        cov_nt = s["nt"] / s["w"] - mean["n"] * mean["t"]
        cov_pt = s["pt"] / s["w"] - mean["p"] * mean["t"]
        det = var_n * var_p - cov_np ** 2
        if var_n >= 1.0 and var_p > 0 and det > 1e-3 * var_n * var_p:
            per_token = (cov_nt * var_p - cov_pt * cov_np) / det
            per_pair = (cov_pt * var_n - cov_nt * cov_np) / det
            fixed = mean["t"] - per_token * mean["n"] - per_pair * mean["p"]
            if per_token > 0 and 0 <= per_pair * MAX_PAIRS_PER_TOKEN_COST <= per_token and fixed >= 0:
                return fixed, per_token, per_pair
        if var_n >= 1.0:
            per_token = cov_nt / var_n
            fixed = mean["t"] - per_token * mean["n"]
            if per_token > 0 and fixed >= 0:
                return fixed, per_token, 0.0
        return 0.0, mean["t"] / mean["n"], 0.0

    def predict(self, tokens: int, pairs: int) -> float:
        fixed, per_token, per_pair = self.coefficients()
        return fixed + per_token * tokens + per_pair * pairs


@dataclass
class Allowance:
    """What one step may still take on: prefill tokens (the token budget) and, when a target
    applies, seconds."""

    tokens: int
    seconds: float | None = None
    per_token: float = 0.0
    per_pair: float = 0.0
    first: bool = True

    def chunk(self, context: int, wanted: int, timed: bool = True) -> int:
        """Tokens, at most `wanted`, of a prompt with `context` tokens computed that fit (in the
        token budget only, unless `timed`)."""
        limit = min(wanted, self.tokens)
        if self.seconds is None or not timed:
            return max(0, limit)
        # per_pair * n^2 + (per_token + per_pair * context) * n <= seconds, for the largest n.
        linear = self.per_token + self.per_pair * context
        if self.per_pair > 0:
            fits = (-linear + math.sqrt(linear * linear + 4 * self.per_pair * max(0.0, self.seconds))) / (2 * self.per_pair)
        else:
            fits = max(0.0, self.seconds) / linear
        fits = int(fits)
        if self.first:
            fits = max(fits, MIN_CHUNK)
        elif fits < min(MIN_CHUNK, limit):
            return 0  # a crumb of a prompt costs a span's overhead for almost no progress
        return max(0, min(limit, fits))

    def spend(self, context: int, tokens: int) -> None:
        self.tokens -= tokens
        self.first = False
        if self.seconds is not None:
            self.seconds -= self.per_token * tokens + self.per_pair * chunk_pairs(context, tokens)


@dataclass
class StepBudget:
    """target_itl: AUTO, OFF or seconds; max_tokens: the step's token budget."""

    target_itl: str | float
    max_tokens: int
    model: StepTimeModel = field(default_factory=StepTimeModel)
    # Decode batches of the last BATCH_MEMORY steps and the attention pairs they read: auto measures
    # against the largest (as it was: a long prompt's stream joining a few short ones is not that
    # batch grown deeper).
    recent_batches: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=BATCH_MEMORY))
    # Measured over predicted time of recent steps that carried chunks.
    chunk_bias: float = 1.0
    # Decode-only steps by batch: (seconds, attention pairs, the step it was last measured at).
    decode_only: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    # The line through decode-only steps alone: every row of theirs is sampled, so a row costs the LM head's
    # logits too, which a prompt's tokens before its last skip.
    sampled_rows: StepTimeModel = field(default_factory=StepTimeModel)
    steps: int = 0

    def observe(self, num_decodes: int, tokens: int, pairs: int, seconds: float) -> None:
        """A step of `tokens` rows (`num_decodes` of them decodes) took `seconds`."""
        self.steps += 1
        if self.model.fitted and tokens >= 1 and 0 < seconds < math.inf:
            predicted = self.model.predict(tokens, pairs)
            clipped = min(max(seconds, predicted / OUTLIER_FACTOR), OUTLIER_FACTOR * predicted)
            if tokens > num_decodes:
                self.chunk_bias = BIAS_DECAY * self.chunk_bias + (1 - BIAS_DECAY) * clipped / predicted
            else:
                seconds_then, pairs_then, _ = self.decode_only.get(tokens, (clipped, pairs, 0))
                self.decode_only[tokens] = (BIAS_DECAY * seconds_then + (1 - BIAS_DECAY) * clipped,
                                            BIAS_DECAY * pairs_then + (1 - BIAS_DECAY) * pairs, self.steps)
        if tokens == num_decodes:
            self.sampled_rows.observe(tokens, pairs, seconds)
        self.model.observe(tokens, pairs, seconds)

    def decode_only_step(self, num_decodes: int, decode_pairs: float) -> float:
        """Seconds of a step of these decodes alone: as measured at the nearest batch seen lately
        (within DECODE_ONLY_NEAR of it, in the last DECODE_ONLY_MEMORY steps), moved along the line
        through all steps; the line itself when there is none."""
        line = self.model.predict(num_decodes, decode_pairs)
        recent = [batch for batch, (_, _, step) in self.decode_only.items()
                  if self.steps - step <= DECODE_ONLY_MEMORY
                  and abs(batch - num_decodes) <= DECODE_ONLY_NEAR * num_decodes]
        if not recent:
            return line
        batch = min(recent, key=lambda b: abs(b - num_decodes))
        seconds, pairs, _ = self.decode_only[batch]
        return max(line / OUTLIER_FACTOR, seconds + line - self.model.predict(batch, pairs))

    def allowance(self, num_decodes: int, decode_pairs: int, short: bool = False) -> Allowance:
        """What the prefill chunks of a step with `num_decodes` decodes (reading `decode_pairs`
        keys in all) may take; timed with no decode too when `short`."""
        self.recent_batches.append((num_decodes, decode_pairs))
        room = self.max_tokens - num_decodes
        if self.target_itl == OFF or (num_decodes == 0 and not short) or not self.model.fitted:
            return Allowance(room)
        if self.target_itl == AUTO:
            # When the batch shrinks, the time its streams no longer take goes to prefill instead
            # of speeding up the streams left: they keep the pace promised to the recent largest
            # batch, and the prompts behind them are not cut into crumbs.
            batch, pairs = max(self.recent_batches)
            target = (SHORT_STEP_FACTOR if short else AUTO_DECODE_FACTOR) * self.decode_only_step(max(batch, 1), pairs)
        else:
            target = self.target_itl
        _, per_token, per_pair = self.model.coefficients()
        # A step with chunks takes chunk_bias times the line's prediction of it.
        seconds = target / self.chunk_bias - self.model.predict(num_decodes, decode_pairs)
        return Allowance(room, seconds, per_token, per_pair)

    def decode_step_s(self, num_decodes: int) -> float:
        """Seconds of a decode-only step of `num_decodes` sequences as deep as the last batch's (the admission
        estimate's step); 0 before any step was timed."""
        if not self.model.fitted or num_decodes < 1:
            return 0.0
        depth = next((pairs / batch for batch, pairs in reversed(self.recent_batches) if batch), 0.0)
        return self.decode_only_step(num_decodes, depth * num_decodes)

    def decodes_within_short_step(self, num_decodes: int) -> int | None:
        """How many decodes a short step beside `num_decodes` others may add (SHORT_STEP_DECODES_FACTOR);
        None (no bound) before any step was timed or with the budget off."""
        if self.target_itl == OFF or not self.model.fitted:
            return None
        limit = SHORT_STEP_DECODES_FACTOR * self.decode_step_s(max(num_decodes, 1))
        low, high = 0, self.max_tokens - num_decodes
        while low < high:  # the largest count whose step fits; steps grow with their batch
            middle = (low + high + 1) // 2
            if self.decode_step_s(num_decodes + middle) <= limit:
                low = middle
            else:
                high = middle - 1
        return low

    def sampled_row_s(self) -> float:
        """Seconds one more sampled row (a decode, a draft to verify) adds to a decode-only step, as such steps of
        different sizes ran lately; the cost of a prompt token until they differed; 0 before any step was timed."""
        if self.sampled_rows.fitted:
            fixed, per_token, _ = self.sampled_rows.coefficients()
            if fixed > 0:
                return per_token
        return self.prefill_token_s()

    def prefill_token_s(self) -> float:
        """Seconds one prompt token adds to a step, as steps with chunks ran lately; 0 before any step was timed."""
        if not self.model.fitted:
            return 0.0
        return self.model.coefficients()[1] * self.chunk_bias
