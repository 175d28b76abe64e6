"""N-gram speculative decoding (prompt lookup): drafts from a sequence's own tokens, checked by the target model.

A running sequence whose last n tokens (n from prompt_lookup_max down to prompt_lookup_min) occurred earlier in
its prompt and output proposes the tokens that followed that occurrence. The next step computes its last token
and the drafts in one query; the target's own choice at each position accepts the longest agreeing prefix of
the drafts, plus one token of its own, so each verification yields at least the token a plain decode would.

Each row of a verification samples the target's token as a plain decode would after the drafts before it, and a
draft is kept only while it equals that token. A draft made without a distribution of its own is accepted with the
target's probability for it, and a rejection emits the target's draw given it was not the draft, so this is
rejection sampling that keeps the target distribution exactly, for greedy and sampled requests alike. A seeded
request draws each position with a generator keyed by that position (`position_generator`), so its output is
token for token what decoding without drafts gives; so is greedy output, in float32 (in bfloat16 as closely as a
change of batch shape leaves greedy output anyway, since its rounding can flip a near tie between two tokens). A
request whose grammar's state cannot be rewound (json_schema, tools) decodes one token a step.

How many drafts a sequence makes is priced (the scheduler's _add_drafts): each sequence's chance to keep its next
draft is estimated from its recent verifications, and a draft at position i, kept with that chance to the power i,
is made when that is at least what the step's rows yield in the time one more sampled row adds to the step. A
lone stream's step is mostly the read of the weights, so it drafts at full length; in a large batch on a CPU a
row costs a step a share that only well-repeating text pays back. A verification's rows run as decodes, each over
the context up to its own token, so they cost what decode rows cost.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sluice_contracts.runtime_flags import NUM_SPECULATIVE_TOKENS, SPECULATIVE_METHODS

if TYPE_CHECKING:
    from .sequence import Sequence

# What a sequence's acceptance is taken to be before its first verification: one draft kept of two checked.
PRIOR_KEPT, PRIOR_TRIED = 1.0, 2.0
# Weight of what came before at each verification: about the last 8 count.
ACCEPTANCE_DECAY = 0.875
# At each step without a verification, the estimate keeps this much of itself and moves the rest of the way back
# to the prior: a sequence whose drafts stopped paying is tried again after a few steps, the fewer the closer it
# was to paying.
RETRY_DRIFT = 0.97
# (prompt_lookup_max, prompt_lookup_min) when the config gives neither.
DEFAULT_LOOKUP = (3, 1)
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int
    prompt_lookup_min: int


def parse_speculative_config(value: str | dict) -> SpeculativeConfig:
    """--speculative-config's JSON object (or the dict itself), every key checked with a message naming it."""
    flag = "--speculative-config"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(f"{flag}: unknown key {unknown[0]!r}; the keys are {', '.join(_KEYS)}")
    missing = [key for key in ("method", "num_speculative_tokens") if key not in value]
    if missing:
        raise ValueError(f"{flag}: missing key {missing[0]!r}")
    method = value["method"]
    if method not in SPECULATIVE_METHODS:
        raise ValueError(f"{flag}: method {method!r} is not supported; the methods built are "
                         f"{', '.join(SPECULATIVE_METHODS)}")
    numbers = {}
    for key in _KEYS[1:]:
        if key not in value:
            continue
        number = value[key]
        if not isinstance(number, int) or isinstance(number, bool):
            raise ValueError(f"{flag}: {key} must be an integer, got {number!r}")
        numbers[key] = number
    k = numbers["num_speculative_tokens"]
    if k not in NUM_SPECULATIVE_TOKENS:
        raise ValueError(f"{flag}: {NUM_SPECULATIVE_TOKENS.message(k)}")
    # Either bound alone stands for both, as in vLLM; with neither, suffixes of DEFAULT_LOOKUP tokens.
    high = numbers.get("prompt_lookup_max", numbers.get("prompt_lookup_min", DEFAULT_LOOKUP[0]))
    low = numbers.get("prompt_lookup_min", high if "prompt_lookup_max" in numbers else DEFAULT_LOOKUP[1])
    if low < 1:
        raise ValueError(f"{flag}: prompt_lookup_min must be at least 1, got {low}")
    if high < low:
        raise ValueError(f"{flag}: prompt_lookup_max ({high}) must be at least prompt_lookup_min ({low})")
    return SpeculativeConfig(method, k, high, low)


def lookup(token_ids: list[int], max_n: int, min_n: int, k: int) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix (max_n down to min_n
    tokens) of `token_ids`; empty when none occurs."""
    length = len(token_ids)
    if length < min_n + 1 or k < 1:
        return []
    tokens = np.asarray(token_ids)
    # Where an occurrence could end: every earlier position holding the last token, latest first.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])[::-1]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for end in ends:
            start = end - n + 1
            if start >= 0 and np.array_equal(tokens[start:end + 1], suffix):
                return tokens[end + 1:end + 1 + k].tolist()
    return []


@dataclass
class Drafting:
    """How one sequence's drafts have fared: drafts kept and drafts checked (up to the first one rejected), both
    decayed so that the latest verifications count most; their ratio is its chance to keep each next draft."""

    kept: float = PRIOR_KEPT
    tried: float = PRIOR_TRIED

    @property
    def acceptance(self) -> float:
        return self.kept / self.tried

    def fold(self, kept: float, tried: float) -> None:
        self.kept = ACCEPTANCE_DECAY * self.kept + kept
        self.tried = ACCEPTANCE_DECAY * self.tried + tried

    def drift(self) -> None:
        self.kept = RETRY_DRIFT * self.kept + (1 - RETRY_DRIFT) * PRIOR_KEPT
        self.tried = RETRY_DRIFT * self.tried + (1 - RETRY_DRIFT) * PRIOR_TRIED


def draft_length(acceptance: float, threshold: float, most: int) -> int:
    """The most drafts, up to `most`, whose chance to be kept (acceptance to the power of its position) is at
    least `threshold`."""
    if threshold <= 0 or acceptance >= 1:
        return most
    if acceptance <= threshold:
        return 0
    return min(most, int(math.log(threshold) / math.log(acceptance) + 1e-9))


class Speculator:
    """Proposes each step's drafts for the scheduler and learns from their verification."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len

    def drafts(self, seq: "Sequence", room: int, threshold: float = 0.0) -> list[int]:
        """Drafts for `seq`'s next step, at most `room` (the KV slots it may take beyond its next token), never
        past its max_tokens or the context, so the token the target adds stays within both; only those whose
        chance to be kept is at least `threshold` (what a draft token costs the step, in tokens it yields)."""
        params = seq.group.params
        if seq.constraint is not None:
            return []
        state = seq.drafting
        if not isinstance(state, Drafting):
            state = seq.drafting = Drafting()
        left = self.max_model_len - len(seq.token_ids)
        if params.max_tokens is not None:
            left = min(left, params.max_tokens - seq.num_output_tokens)
        cfg = self.config
        length = min(draft_length(state.acceptance, threshold, cfg.num_speculative_tokens), room, left - 1)
        drafts = lookup(seq.token_ids, cfg.prompt_lookup_max, cfg.prompt_lookup_min, length) if length > 0 else []
        if not drafts:
            # Not checked this step: a sequence whose text starts repeating later is tried again.
            state.drift()
        return drafts

    def expected_kept(self, seq: "Sequence", drafted: int) -> float:
        """Of `drafted` drafts for `seq`, how many it is expected to keep."""
        acceptance = seq.drafting.acceptance if isinstance(seq.drafting, Drafting) else PRIOR_KEPT / PRIOR_TRIED
        return sum(acceptance ** position for position in range(1, drafted + 1))

    def observe(self, seq: "Sequence", accepted: int, drafted: int) -> None:
        """Its latest verification kept `accepted` of `drafted` drafts: checked were those and the first one
        rejected, if any."""
        state = seq.drafting
        assert isinstance(state, Drafting)
        state.fold(accepted, accepted + (accepted < drafted))
