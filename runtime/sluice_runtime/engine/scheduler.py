"""Continuous batching: which sequences run in the next step and how many tokens each computes.

Running decodes are scheduled first, so a stream never stalls behind a prompt. Prompts are then
prefilled in chunks within the step's prefill budget (step_budget: what keeps the step within the
target inter-token latency, at most the token budget), prompts already started and waiting ones
alike, shortest first within a priority, so a short chat is answered between a long prompt's
chunks. Age is counted in prefill work: a prompt that has seen PREFILL_AGE_LIMIT tokens of other
prompts prefilled since it arrived goes ahead of shorter ones, so long prompts never starve. Within a
priority, tenants take turns in proportion to their shares (fair_share), each tenant's prompts in the
order above. The time budget holds only where someone waits on the decodes it protects: a streamed
request, or a request that was there before the prompt. A burst of requests read whole fills
every step's token budget, which finishes them all soonest. A long prompt (longer
than one step's token budget) is what the budget holds back for short requests' streams; beside
the streams of long prompts only, it fills the token budget too, as they did in their turn, so a
few long documents are not prefilled crumb by crumb behind each other's first tokens. When the KV
cache runs out, the least important running sequence (least urgent, then most recent) is preempted
and later recomputed from its tokens; so is one when a more urgent prompt waits for a place in a
full batch.

Batch-class requests (sluice_contracts.request_priority.in_batch_class: the gateway's offline
batches) run on what online requests leave. A step that prefills an online prompt carries no
batch-class rows, decodes or chunks, so an online request's first token waits for its own prompt
only; if no online prompt can start in the step (memory, an adapter slot), batch-class work runs
in it as usual. While an online request is in the engine, or was within ONLINE_LINGER_S, batch-class
prompts are prefilled in chunks timed by the step budget, decodes running or not, and only as many
lines decode as keep the step short (step_budget.py), so one arriving waits for a short step in
progress; on a replica with no online traffic they fill the token budget. A step of batch-class rows only
is abandoned between layers when an online request arrives (the engine's part: llm_engine.py), so the
newcomer waits for one layer rather than the step; the step's rows are scheduled afresh
(on_step_abandoned), the abandoned work recomputed later.
"""
from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice_contracts.request_priority import in_batch_class

from .block_manager import BlockManager
from .fair_share import FairShare
from .sequence import Sequence, SequenceGroup, SequenceStatus
from .speculation import Speculator
from .step_budget import AUTO, Allowance, StepBudget, chunk_pairs

# Tokens of other prompts' prefill a waiting prompt lets go ahead of it (about 8 full steps).
PREFILL_AGE_LIMIT = 8192
# How long after the last online request batch-class prompts still take short steps: online requests that come
# one after another, a think time apart, each find a short step in progress.
ONLINE_LINGER_S = 5.0


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int
    # Speculative tokens computed after the sequence's last one (the last `len(draft_ids)` of `num_tokens`).
    draft_ids: list[int] = field(default_factory=list)
    # How many of them the target model agreed with, known once the step ran.
    num_accepted: int = 0

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the sequence's known tokens, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_tokens - len(self.draft_ids) == len(self.seq.token_ids)

    @property
    def num_kept(self) -> int:
        """Tokens whose keys and values the step leaves valid: the rejected drafts' slots are written over later."""
        return self.num_tokens - len(self.draft_ids) + self.num_accepted

    @property
    def attention_pairs(self) -> int:
        """Query-key pairs its attention computes (until the step is done)."""
        return chunk_pairs(self.seq.num_computed_tokens, self.num_tokens)


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


def _batch_class(seq: Sequence) -> bool:
    return in_batch_class(seq.group.priority)


def _order(seq: Sequence) -> tuple[int, int, int]:
    return (*seq.group.sort_key(), seq.index)


def _fairness(seq: Sequence) -> tuple[int, str, float, bool]:
    """Its priority, tenant and share, and whether admitting it is charged to the tenant: only a request's
    first admission is (a preempted one coming back already paid)."""
    group = seq.group
    charged = seq.status is SequenceStatus.WAITING and seq.num_preemptions == 0 and seq.index == 0
    return group.priority, group.tenant, group.share, charged


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_preemptions_per_request: int, target_itl: str | float = AUTO,
                 prefill_age_limit: int = PREFILL_AGE_LIMIT, clock: Callable[[], float] = time.monotonic,
                 max_loras: int = 0, speculator: Speculator | None = None):
        self.blocks = block_manager
        self.speculator = speculator
        # Distinct LoRA adapters among running sequences (the executor's resident slots); 0: no adapters served.
        self.max_loras = max_loras
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_preemptions = max_preemptions_per_request
        self.waiting: list[Sequence] = []  # sorted by _order
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # A few blocks stay free when admitting new prompts, so running decodes can grow without preempting.
        self.watermark = max(1, block_manager.num_blocks // 100)
        self.step_budget = StepBudget(target_itl, max_num_batched_tokens)
        self.clock = clock
        self._step_started = 0.0
        # The clock prompts age by: prefill tokens computed so far, and where it stood at each arrival.
        self.prefill_age_limit = prefill_age_limit
        self.prefill_work = 0
        self._arrived_at: dict[Sequence, int] = {}
        self.fair = FairShare()
        self._online_seen = -math.inf

    # -- queue management -----------------------------------------------------------------------

    def add(self, group: SequenceGroup) -> None:
        self.fair.join(group.priority, group.tenant)
        self._enqueue(group.seqs[0])

    def _enqueue(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self._arrived_at.setdefault(seq, self.prefill_work)  # a preempted sequence keeps its age
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
        self._arrived_at.pop(seq, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        if seq.group.finished:
            self.fair.leave(seq.group.priority, seq.group.tenant)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free_sequence(seq)
        seq.num_preemptions += 1
        seq.group.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(seq)

    # -- one step -------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Every running decode that the KV cache can grow (preempting the lowest-ranked sequences when
        it is full), then prefill chunks in prefill order until the step's prefill budget is spent.
        Online work goes first: when an online prompt gets a chunk, the step carries no batch-class rows."""
        out = SchedulerOutput()
        self._make_room_for_urgent()
        self.running.sort(key=_order)
        scheduled: set[int] = set()
        online_about = self._online_about()
        loras = self.running_loras()
        order = self._prefill_order()
        self._schedule_decodes(out, scheduled, batch_class=False)
        online_prompts = [seq for seq in order if not _batch_class(seq)]
        if online_prompts:
            self._schedule_prefills(out, scheduled, online_prompts, loras, short=False)
        if not out.prefills:
            # No online prompt could start now (memory, an adapter slot): the batch class runs as usual, in a
            # short step while online requests are about.
            limit = self.step_budget.decodes_within_short_step(len(out.decodes)) if online_about else None
            self._schedule_decodes(out, scheduled, batch_class=True, limit=limit)
            self._schedule_prefills(out, scheduled, order, loras, short=online_about)

        if out.is_empty and self.running and not self.blocks.num_free_blocks:
            # Everyone is blocked on memory and every victim hit its preemption cap: break the tie anyway.
            self.preempt(max(self.running, key=_order))
        self._step_started = self.clock()
        return out

    def _online_about(self) -> bool:
        """Whether an online request is in the engine or was within ONLINE_LINGER_S: batch-class prompts then
        take short steps, so the next online request waits for little."""
        now = self.clock()
        if any(not _batch_class(seq) for seq in self.running) or any(not _batch_class(seq) for seq in self.waiting):
            self._online_seen = now
        return now - self._online_seen <= ONLINE_LINGER_S

    def _schedule_decodes(self, out: SchedulerOutput, scheduled: set[int], batch_class: bool,
                          limit: int | None = None) -> None:
        """A decode row for each running sequence of the batch class (or of the others) that the KV cache can grow,
        at most `limit` of them (the most important first: the earliest lines finish and make room)."""
        first = len(out.decodes)
        for seq in list(self.running):
            if limit is not None and len(out.decodes) - first >= limit:
                break
            if (_batch_class(seq) != batch_class or seq.is_prefilling or seq not in self.running
                    or len(scheduled) >= self.max_num_seqs):
                continue
            if not self._make_room(seq, 1, scheduled):
                continue
            self.blocks.allocate(seq, 1)
            out.decodes.append(ScheduledSeq(seq, 1))
            scheduled.add(id(seq))
        if self.speculator is not None:
            self._add_drafts(out.decodes, first)

    def _schedule_prefills(self, out: SchedulerOutput, scheduled: set[int], order: list[Sequence], loras: set[int],
                           short: bool) -> None:
        """Chunks of the prompts in `order` beside the step's decodes, within its prefill budget; a batch-class
        prompt's are timed to a short step when `short` (online requests are about)."""
        allowance = self.step_budget.allowance(sum(s.num_tokens for s in out.decodes),
                                               sum(s.attention_pairs for s in out.decodes), short=short)
        shield = self._shield(out.decodes)
        for seq in order:
            if allowance.tokens < 1 or len(scheduled) >= self.max_num_seqs:
                break
            if id(seq) in scheduled:
                continue
            waiting = seq.status is SequenceStatus.WAITING
            lora_id = seq.group.lora_id
            if lora_id and lora_id not in loras and len(loras) >= self.max_loras:
                continue  # its adapter waits for a slot; other prompts may still run
            timed = shield(seq) or (short and _batch_class(seq))
            chunk = self._allocate_chunk(seq, allowance, timed)
            if chunk == 0 and waiting:
                break  # the first waiting prompt that does not fit holds back those after it
            if chunk:
                out.prefills.append(ScheduledSeq(seq, chunk))
                scheduled.add(id(seq))
                if lora_id:
                    loras.add(lora_id)

    def _add_drafts(self, decodes: list[ScheduledSeq], first: int) -> None:
        """Extend decodes from `first` on with draft tokens once every decode has its slot, within the step's
        token budget and the KV cache's free blocks above the watermark: a guess never preempts or holds back
        anyone. A draft token is made when its chance to be kept is at least what the step's rows yield in the
        time it adds to the step (what a sampled row costs lately), so each draft raises the step's
        expected tokens per second: a lone stream drafts freely, a large batch only what it likely keeps."""
        room = self.max_num_batched_tokens - sum(item.num_tokens for item in decodes)
        row_s = self.step_budget.sampled_row_s()
        step_s = self.step_budget.decode_step_s(len(decodes))
        expected = float(len(decodes))
        for item in decodes[first:]:
            if room < 1:
                return
            slots = self.blocks.allocatable_tokens(item.seq, reserve=self.watermark) - 1
            threshold = expected * row_s / step_s if step_s > 0 else 0.0
            drafts = self.speculator.drafts(item.seq, min(room, slots), threshold)
            if drafts:
                self.blocks.allocate(item.seq, 1 + len(drafts))
                item.num_tokens += len(drafts)
                item.draft_ids = drafts
                room -= len(drafts)
                expected += self.speculator.expected_kept(item.seq, len(drafts))
                step_s += row_s * len(drafts)

    def running_loras(self) -> set[int]:
        return {s.group.lora_id for s in self.running if s.group.lora_id}

    def _shield(self, decodes: list[ScheduledSeq]) -> Callable[[Sequence], bool]:
        """Whether a chunk of a prompt must fit the step budget beside these decodes: a streamed
        decode shields its reader from every prompt, except that a stream of a long prompt (longer
        than one step's token budget) takes long prompts' chunks as they come, as they took its; an
        unstreamed one only from prompts that came after the earliest of them (requests that arrived
        together, with no prefill between them, only wait for the batch to finish). A batch-class
        decode shields nobody: its lines are read whole, and throughput is what they wait for."""
        long_prompt = self.max_num_batched_tokens
        decodes = [item for item in decodes if not _batch_class(item.seq)]
        streams = [item.seq.num_prompt_tokens for item in decodes if item.seq.group.streamed]
        shields_all = any(tokens <= long_prompt for tokens in streams)
        since = min((self._arrived_at.get(item.seq, self.prefill_work) for item in decodes
                     if not item.seq.group.streamed), default=math.inf)

        def shielded(seq: Sequence) -> bool:
            return (shields_all or (bool(streams) and seq.num_prompt_tokens <= long_prompt)
                    or self._arrived_at.get(seq, self.prefill_work) > since)
        return shielded

    def _prefill_order(self) -> list[Sequence]:
        """Started and waiting prompts: by priority, then those past the age limit in arrival order,
        then the fewest tokens left first."""

        def key(seq: Sequence) -> tuple:
            priority, arrival = seq.group.sort_key()
            others_since = self.prefill_work - self._arrived_at.get(seq, self.prefill_work) - seq.num_computed_tokens
            if others_since >= self.prefill_age_limit:
                return priority, 0, arrival, seq.index
            return priority, 1, seq.num_uncomputed, arrival, seq.index

        ordered = sorted([s for s in self.running if s.is_prefilling] + self.waiting, key=key)
        return self.fair.interleave(ordered, _fairness)

    def _allocate_chunk(self, seq: Sequence, allowance: Allowance, timed: bool) -> int:
        """Blocks for the next chunk of `seq`'s prompt, what the allowance leaves (its time too when
        `timed`), admitting it if it waits; returns the chunk's tokens, 0 when the step or the KV
        cache cannot hold any now."""
        waiting = seq.status is SequenceStatus.WAITING
        if waiting:
            self.blocks.allocate_prompt_start(seq)
        chunk = min(allowance.chunk(seq.num_computed_tokens, seq.num_uncomputed, timed),
                    self.blocks.allocatable_tokens(seq, reserve=self.watermark if waiting else 0))
        if chunk <= 0:
            if waiting:
                self.blocks.free_sequence(seq)
            return 0
        if waiting:
            if _fairness(seq)[3]:
                self.fair.charge(seq.group.priority, seq.group.tenant, seq.group.share)
            self.waiting.remove(seq)
            self.blocks.record_prefix_query(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        allowance.spend(seq.num_computed_tokens, chunk)
        self.blocks.allocate(seq, chunk)
        if seq.index == 0:
            seq.group.metrics.num_prefill_chunks += 1
        return chunk

    def _make_room(self, seq: Sequence, num_tokens: int, scheduled: set[int]) -> bool:
        """Preempt lower-ranked running sequences until `seq` can grow; False if it cannot run now."""
        while self.blocks.allocatable_tokens(seq) < num_tokens:
            victim = self._pick_victim(scheduled)
            if victim is None:
                return False
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def _make_room_for_urgent(self) -> None:
        """Preempt the least urgent running sequence (then the most recent) while the most urgent waiting
        prompt is more urgent than it and cannot start: the batch is full or the KV cache has no block to spare."""
        while self.waiting and self.running:
            urgent = self.waiting[0]
            full = len(self.running) >= self.max_num_seqs or self.blocks.num_free_blocks <= self.watermark
            if not full:
                return
            victim = self._pick_victim(set())
            if victim is None or victim.group.priority <= urgent.group.priority:
                return
            self.preempt(victim)

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
        """Time the step for the step budget, advance progress and start the forks of prompts that
        just finished prefilling."""
        tokens = sum(item.num_tokens for item in out.scheduled)
        pairs = sum(item.attention_pairs for item in out.scheduled)
        # A verification's drafts are rows of the decode part of the step, as the allowance counted them.
        decode_rows = sum(item.num_tokens for item in out.decodes)
        self.step_budget.observe(decode_rows, tokens, pairs, self.clock() - self._step_started)
        self.prefill_work += sum(item.num_tokens for item in out.prefills)
        for item in out.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_kept
            if item.draft_ids:
                self.blocks.trim(seq)
            self.blocks.register_full_blocks(seq)
            if seq.index == 0 and seq.num_computed_tokens >= seq.num_prompt_tokens:
                self._start_forks(seq)

    def on_step_abandoned(self, out: SchedulerOutput) -> None:
        """Undo what scheduling `out` allotted beyond each sequence's computed tokens, so the next step schedules
        its rows afresh: its blocks past them (the prefix blocks of a prompt that just started stay) and the
        prompt chunks it counted."""
        for item in out.scheduled:
            self.blocks.trim(item.seq)
        for item in out.prefills:
            if item.seq.index == 0:
                item.seq.group.metrics.num_prefill_chunks -= 1

    def _start_forks(self, parent: Sequence) -> None:
        for child in parent.group.seqs[1:]:
            if child.status is SequenceStatus.FORK_PENDING:
                self.blocks.fork(parent, child)
                self._arrived_at[child] = self._arrived_at.get(parent, self.prefill_work)
                child.status = SequenceStatus.RUNNING
                self.running.append(child)
