"""Requests and their sequences as the scheduler sees them: token ids, progress and blocks."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from ..sampling_params import SamplingParams
from .lora_registry import LoraRef
from .outputs import RequestMetrics, TokenLogprob


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    # A child of an n > 1 request, waiting for its parent to finish the shared prompt.
    FORK_PENDING = "fork_pending"
    FINISHED = "finished"


_arrival_counter = itertools.count()


@dataclass(eq=False)
class Sequence:
    group: "SequenceGroup"
    index: int
    token_ids: list[int]
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # Incremental detokenizer state.
    text: str = ""
    emitted_text_len: int = 0
    emitted_token_count: int = 0
    detok_prefix_offset: int = 0
    detok_read_offset: int = 0
    constraint: object | None = None
    # How its drafts have fared (engine.speculation), once speculative decoding has drafted for it.
    drafting: object | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return self.group.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed > 1

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass(eq=False)
class SequenceGroup:
    """One request: a prompt and its n output sequences."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    deadline: float | None = None
    # Who sent it (the gateway's tenant; "" for direct callers) and its weight among tenants of its priority.
    tenant: str = ""
    share: float = 1.0
    # Whether its client reads tokens as they come (an SSE stream): the step budget protects those.
    streamed: bool = True
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.time()))
    seqs: list[Sequence] = field(default_factory=list)
    lora: LoraRef | None = None  # the adapter the request runs with; None: the base model

    def __post_init__(self) -> None:
        self.seqs = [Sequence(self, 0, list(self.prompt_token_ids))]
        if self.params.constraint is not None:
            self.seqs[0].constraint = self.params.constraint
        for i in range(1, self.params.n):
            child = Sequence(self, i, list(self.prompt_token_ids), status=SequenceStatus.FORK_PENDING)
            if self.params.constraint is not None:
                child.constraint = self.params.constraint.fork()
            self.seqs.append(child)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def lora_id(self) -> int:
        return self.lora.id if self.lora is not None else 0

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.seqs)

    def sort_key(self) -> tuple[int, int]:
        """Lower sorts first: served earlier, preempted last."""
        return (self.priority, self.arrival_order)
