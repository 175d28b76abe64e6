"""When a waiting request will send the first byte of its answer, estimated from the engine's own measurements.

A request starts when a place in the batch frees up for it, after every request queued ahead of it (more urgent,
or as urgent and earlier) has taken one; places free up as running sequences finish their decodes. The estimate
plays that forward in decode steps: each place is free after the steps its sequence still has to run, and each
request ahead takes the first place to free for as many steps as it is expected to generate. The steps are timed
at the decode step measured near the batch the queue keeps full, and every prompt token still to be prefilled up
to this request's own (those ahead, the running prompts' rest, its own) at the measured cost of a prefill token.
A request whose client reads the whole answer at once also waits for its own decodes.

Nothing here reads a clock or the engine: the engine publishes an `EngineLoad` after each step and the queue as
`Queued` entries, so the estimate is a pure function, tested as such.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

# The generated tokens a request is expected to have when it sets no max_tokens and the engine has not seen a
# request finish yet; later, the recent mean of finished requests is used.
DEFAULT_EXPECTED_OUTPUT = 256
# Weight of the previous mean output length when a finished request's is folded in (about the last 20 count).
OUTPUT_DECAY = 0.95


@dataclass(frozen=True)
class EngineLoad:
    """What the engine measured and holds now, as the estimate needs it."""

    decode_step_s: float  # a decode-only step at the batch the queue keeps full
    prefill_token_s: float  # the cost of one prompt token in a step
    slots: int  # sequences that run at once
    # Decode steps each running sequence is still expected to take.
    running_steps: tuple[int, ...] = ()
    # Prompt tokens of running sequences not yet prefilled.
    prefilling_tokens: int = 0

    @property
    def idle(self) -> bool:
        return not self.running_steps and not self.prefilling_tokens


@dataclass(frozen=True)
class Queued:
    """A request as the estimate sees it: its prompt, the tokens it is expected to generate, its sequences (n)."""

    prompt_tokens: int
    expected_output: int
    seqs: int = 1


def expected_output(max_tokens: int | None, room: int, mean_output: float | None) -> int:
    """Tokens a request is expected to generate: the recent mean of finished requests (DEFAULT_EXPECTED_OUTPUT
    before any), never more than its max_tokens or the `room` its context leaves."""
    limit = room if max_tokens is None else min(max_tokens, room)
    typical = DEFAULT_EXPECTED_OUTPUT if mean_output is None else math.ceil(mean_output)
    return max(1, min(limit, typical))


def start_step(load: EngineLoad, ahead: Iterable[Queued]) -> int:
    """The decode step at which a place frees for a request queued behind `ahead` (0: one is free now)."""
    slots = max(1, load.slots)
    free_at = sorted(load.running_steps)[:slots]
    # A place that no running sequence holds is free now; more running than places (a preempted batch
    # shrinking) leaves the ones that finish first.
    free_at = [0] * (slots - len(free_at)) + free_at
    heapq.heapify(free_at)
    for request in ahead:
        for _ in range(request.seqs):
            heapq.heappush(free_at, heapq.heappop(free_at) + request.expected_output)
    return free_at[0]


def first_byte_s(load: EngineLoad, ahead: list[Queued], own: Queued, streamed: bool) -> float:
    """Seconds from now to the first byte of `own`'s answer: its first token when `streamed`, else its last."""
    steps = start_step(load, ahead) + (own.expected_output if not streamed else 1)
    prefill = load.prefilling_tokens + sum(q.prompt_tokens * q.seqs for q in ahead) + own.prompt_tokens
    return steps * load.decode_step_s + prefill * load.prefill_token_s


def queue_s(load: EngineLoad, ahead: list[Queued]) -> float:
    """Seconds before a request queued behind `ahead` starts: the engine's estimated queue time."""
    prefill = load.prefilling_tokens + sum(q.prompt_tokens * q.seqs for q in ahead)
    return start_step(load, ahead) * load.decode_step_s + prefill * load.prefill_token_s
