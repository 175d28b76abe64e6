"""Continuous batching: which sequences run in the next step and how many tokens each computes.

Every step has a token budget. Running decodes are scheduled first so a stream never stalls
behind a long prompt; partially prefilled prompts continue next; waiting requests are admitted
with what is left, their prompts split into chunks when they do not fit. When the KV cache runs
out, the least important running sequence is preempted and later recomputed from its tokens.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceGroup, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the sequence's known tokens, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_tokens == len(self.seq.token_ids)


@dataclass
class SchedulerOutput:
    decodes: list[ScheduledSeq] = field(default_factory=list)
    prefills: list[ScheduledSeq] = field(default_factory=list)

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        return self.decodes + self.prefills

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.decodes) + sum(s.num_tokens for s in self.prefills)


def _order(seq: Sequence) -> tuple[int, int, int]:
    return (*seq.group.sort_key(), seq.index)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_preemptions_per_request: int):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_preemptions = max_preemptions_per_request
        self.waiting: list[Sequence] = []  # sorted by _order
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # A few blocks stay free when admitting new prompts, so running decodes can grow without preempting.
        self.watermark = max(1, block_manager.num_blocks // 100)

    # -- queue management -----------------------------------------------------------------------

    def add(self, group: SequenceGroup) -> None:
        self._enqueue(group.seqs[0])

    def _enqueue(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        keys = [_order(s) for s in self.waiting]
        self.waiting.insert(bisect.bisect(keys, _order(seq)), seq)

    @property
    def num_waiting_requests(self) -> int:
        return len({s.group.request_id for s in self.waiting})

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        if seq.finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free_sequence(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free_sequence(seq)
        seq.num_preemptions += 1
        seq.group.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(seq)

    # -- one step -------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.running.sort(key=_order)
        scheduled: set[int] = set()

        for seq in list(self.running):
            if seq.is_prefilling or seq not in self.running or len(scheduled) >= self.max_num_seqs or budget < 1:
                continue
            if not self._make_room(seq, 1, scheduled):
                continue
            self.blocks.allocate(seq, 1)
            out.decodes.append(ScheduledSeq(seq, 1))
            scheduled.add(id(seq))
            budget -= 1

        for seq in list(self.running):
            if not seq.is_prefilling or len(scheduled) >= self.max_num_seqs or budget < 1:
                continue
            chunk = min(budget, seq.num_uncomputed, self._allocatable_tokens(seq, reserve=0))
            if chunk <= 0:
                continue
            self.blocks.allocate(seq, chunk)
            out.prefills.append(ScheduledSeq(seq, chunk))
            scheduled.add(id(seq))
            budget -= chunk

        while self.waiting and budget > 0 and len(scheduled) < self.max_num_seqs:
            seq = self.waiting[0]
            self.blocks.allocate_prompt_start(seq)
            chunk = min(budget, seq.num_uncomputed, self._allocatable_tokens(seq, reserve=self.watermark))
            if chunk <= 0:
                self.blocks.free_sequence(seq)
                break
            self.waiting.pop(0)
            self.blocks.record_prefix_query(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.blocks.allocate(seq, chunk)
            out.prefills.append(ScheduledSeq(seq, chunk))
            scheduled.add(id(seq))
            budget -= chunk

        if out.is_empty and self.running and not self.blocks.num_free_blocks:
            # Everyone is blocked on memory and every victim hit its preemption cap: break the tie anyway.
            self.preempt(max(self.running, key=_order))
        return out

    def _allocatable_tokens(self, seq: Sequence, reserve: int) -> int:
        """How many more tokens `seq` can compute with the free blocks (keeping `reserve` free)."""
        capacity = (len(seq.block_table) + self.blocks.num_free_blocks - reserve) * self.blocks.block_size
        return capacity - seq.num_computed_tokens

    def _make_room(self, seq: Sequence, num_tokens: int, scheduled: set[int]) -> bool:
        """Preempt lower-ranked running sequences until `seq` can grow; False if it cannot run now."""
        while not self.blocks.can_allocate(seq, num_tokens):
            victim = self._pick_victim(scheduled)
            if victim is None:
                return False
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def _pick_victim(self, scheduled: set[int]) -> Sequence | None:
        """The lowest-priority, latest-arrived running sequence not yet capped or scheduled this step."""
        for candidate in sorted(self.running, key=_order, reverse=True):
            if id(candidate) in scheduled or candidate.num_preemptions >= self.max_preemptions:
                continue
            if candidate.block_table:
                return candidate
        return None

    # -- after the step ---------------------------------------------------------------------------

    def on_step_done(self, out: SchedulerOutput) -> None:
        """Advance progress and start the forks of prompts that just finished prefilling."""
        for item in out.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_tokens
            self.blocks.register_full_blocks(seq)
            if seq.index == 0 and seq.num_computed_tokens >= seq.num_prompt_tokens:
                self._start_forks(seq)

    def _start_forks(self, parent: Sequence) -> None:
        for child in parent.group.seqs[1:]:
            if child.status is SequenceStatus.FORK_PENDING:
                self.blocks.fork(parent, child)
                child.status = SequenceStatus.RUNNING
                self.running.append(child)
