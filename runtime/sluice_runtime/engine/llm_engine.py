"""The synchronous engine: admission, one step at a time, and the outputs of each step."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from sluice_contracts import metric_names as names
from sluice_contracts.request_priority import DEFAULT_CLASS, DEFAULT_CLASSES, in_batch_class

from ..engine_config import EngineConfig
from ..executor.model_runner import BatchItem, ModelRunner
from ..executor.sampler import SampleRequest, SampleResult, position_generator
from ..model_load_error import ModelLoadError
from ..models.interruption import ForwardInterrupted
from ..models.loading import ModelInfo, resolve_model, validate_model_dir
from ..models.lora_adapter import AdapterError, LoraAdapter, read_adapter
from ..sampling_params import SamplingParams
from . import admission
from .admission import EngineLoad, Queued
from .block_manager import BlockManager
from .detokenizer import Detokenizer
from .errors import DeadlineUnattainable, EngineOverloaded, RequestRejected
from .lora_registry import LoraRegistry
from .outputs import EXPIRED, SHED, CompletionOutput, RequestOutput, TokenLogprob
from .scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from .sequence import Sequence, SequenceGroup
from .speculation import Speculator

log = logging.getLogger(__name__)

# Weight of the previous mean when a step's time outside the model is folded in (about the last 10 steps count).
OVERHEAD_DECAY = 0.9


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_kv_blocks: int
    block_size: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_aborted: int
    num_timed_out: int
    steps: int
    steps_interrupted: int
    # Requests not started yet, and requests shed (refused for a full queue, or dropped from it for a more urgent
    # one), by priority.
    waiting_by_priority: dict[int, int] = field(default_factory=dict)
    shed_by_priority: dict[int, int] = field(default_factory=dict)
    # Names of the LoRA adapters of running requests, and of waiting requests whose adapter is not running.
    running_loras: list[str] = field(default_factory=list)
    waiting_loras: list[str] = field(default_factory=list)
    resident_loras: list[str] = field(default_factory=list)  # adapters in the executor's slots
    # Requests refused or ended before they started, by metric_names.REFUSAL_* reason.
    refused_by_reason: dict[str, int] = field(default_factory=dict)
    # Seconds before a request of the default priority arriving now would start (engine.admission).
    estimated_queue_s: float = 0.0
    # Speculative decoding (--speculative-config): verifications, draft tokens proposed, and those accepted.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # Accepted draft tokens by their position in the draft (0: the first), one entry per position a draft can have.
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        model_dir = resolve_model(config.model)
        raw_config = validate_model_dir(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.runner = ModelRunner(model_dir, config)
        self.max_model_len = self.runner.max_model_len
        self.block_manager = BlockManager(self.runner.num_blocks, self.runner.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_preemptions_per_request, config.target_itl,
                                   max_loras=config.max_loras if config.enable_lora else 0,
                                   speculator=(Speculator(config.speculative_config, self.max_model_len)
                                               if config.speculative_config is not None else None))
        self.detokenizer = Detokenizer(self.tokenizer)
        eos = set(self.runner.cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        name = config.model if "/" not in config.model else model_dir.name
        self.model_info = ModelInfo(
            name=name.removeprefix("hf:"), path=model_dir, architecture=(raw_config.get("architectures") or ["?"])[0],
            max_model_len=self.max_model_len, vocab_size=self.runner.cfg.vocab_size,
            eos_token_ids=self.eos_token_ids, hidden_size=self.runner.cfg.hidden_size)
        self.groups: dict[str, SequenceGroup] = {}
        self._incoming: deque[SequenceGroup] = deque()
        self._aborts: deque[str] = deque()
        # Accepted and never scheduled: what the queue bound counts and what may be shed (guarded by _lock).
        self._unstarted: dict[str, SequenceGroup] = {}
        self._sheds: deque[SequenceGroup] = deque()
        self.num_shed: Counter[int] = Counter()
        self.num_refused: Counter[str] = Counter()
        # Requests whose budget passed (the server's timers): ended at the next step unless they started.
        self._expiries: deque[str] = deque()
        # What the admission estimate reads: published by the engine thread after each step.
        self._load = EngineLoad(0.0, 0.0, config.max_num_seqs)
        # Recent mean of the tokens finished requests generated (None before any finished).
        self.mean_output: float | None = None
        # Recent seconds from one step to the next spent outside the model (scheduling, outputs, the caller's
        # loop between steps, the server's threads holding the interpreter), which the step budget's timing
        # leaves out and a queued request waits for all the same; measured while steps follow each other.
        self.step_overhead_s = 0.0
        self._previous_step: tuple[float, float] | None = None  # (started, seconds in the model), if it left work
        self._lock = threading.Lock()
        self.num_aborted = 0
        self.num_timed_out = 0
        self.steps = 0
        # Set when a request more urgent than the batch class arrives: a step of batch-class rows only is
        # abandoned between layers, so the newcomer waits for one layer, not for the step (cleared each step).
        self._online_arrived = threading.Event()
        self.steps_interrupted = 0
        # Speculative decoding: verifications run, draft tokens they carried, and those the target agreed with, by
        # their place in the draft (their sum is the accepted tokens).
        self.num_drafts = 0
        self.num_draft_tokens = 0
        speculative = self.scheduler.speculator
        self.accepted_per_pos = [0] * (speculative.config.num_speculative_tokens if speculative else 0)
        self.loras = LoraRegistry()
        for name, path in config.lora_modules.items():
            try:
                self.add_lora(name, path, self.read_lora(path))
            except AdapterError as exc:
                raise ModelLoadError(f"--lora {name}={path}: {exc}") from None

    # -- LoRA adapters --------------------------------------------------------------------------

    def read_lora(self, path: str) -> LoraAdapter:
        """An adapter's weights, checked against this model; thread-safe (it only reads files)."""
        if self.runner.lora is None:
            raise AdapterError("LoRA adapters are not enabled; start the runtime with --enable-lora")
        return read_adapter(path, self.runner.cfg, self.config.max_lora_rank, self.runner.dtype)

    def add_lora(self, name: str, path: str, adapter: LoraAdapter) -> None:
        """Serve `adapter` as `name`; on the engine thread, between steps."""
        with self._lock:
            if name in self.loras.by_name:
                raise AdapterError(f"The lora adapter '{name}' has already been loaded.")
            ref = self.loras.add(name, path)
        self.runner.lora.add(ref.id, adapter)
        log.info("LoRA adapter %s loaded from %s (rank %d, %.1f MiB)", name, path, adapter.rank, adapter.nbytes / 2**20)

    def remove_lora(self, name: str) -> None:
        """Stop serving `name`; requests already using it finish with it. On the engine thread."""
        with self._lock:
            unused = self.loras.remove(name)
        if unused is not None:
            self.runner.lora.remove(unused)
        log.info("LoRA adapter %s unloaded", name)

    # -- admission ------------------------------------------------------------------------------

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_manager.num_blocks * self.block_manager.block_size

    def check_admission(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Refuses a request that can never be served as asked."""
        n_prompt = len(prompt_token_ids)
        if n_prompt == 0:
            raise RequestRejected("the prompt is empty; send at least one token")
        if n_prompt >= self.max_model_len:
            raise RequestRejected(
                f"the prompt has {n_prompt} tokens but the model's context length is {self.max_model_len} "
                "tokens, which must also leave room for at least one generated token")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise RequestRejected(
                f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceeds the model's context "
                f"length of {self.max_model_len} tokens; lower max_tokens to at most {self.max_model_len - n_prompt}")
        if n_prompt + max_tokens > self.kv_capacity_tokens:
            raise RequestRejected(
                f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) can never fit in this replica's "
                f"KV cache of {self.kv_capacity_tokens} tokens")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0, deadline: float | None = None, tenant: str = "", share: float = 1.0,
                    lora: str | None = None, streamed: bool = True) -> None:
        """Thread-safe: the request joins the scheduler at the start of the next step. `lora` names the
        adapter it runs with (None: the base model). `streamed`: its client reads tokens as they come, so
        the step budget keeps its decodes steady."""
        self.check_admission(prompt_token_ids, params)
        with self._lock:
            if request_id in self.groups:
                raise ValueError(f"request id {request_id!r} is already in use")
            ref = self.loras.get(lora) if lora is not None else None
            self._make_queue_room(priority)
            group = SequenceGroup(request_id, list(prompt_token_ids), params, priority, deadline, tenant, share,
                                  lora=ref, streamed=streamed)
            if ref is not None:
                self.loras.acquire(ref)
            self.groups[request_id] = group
            self._unstarted[request_id] = group
            self._incoming.append(group)
        if not in_batch_class(priority):
            self._online_arrived.set()

    def queue_room(self) -> int:
        """Requests the queue takes now before it refuses a newcomer no more urgent than those waiting."""
        with self._lock:
            return self.config.max_waiting - len(self._unstarted)

    def _make_queue_room(self, priority: int) -> None:
        """With the queue full, the least urgent request not started yet (the latest of them) is shed for a more
        urgent newcomer; a newcomer no more urgent than every queued request is refused. Called under _lock."""
        if len(self._unstarted) < self.config.max_waiting:
            return
        victim = max(self._unstarted.values(), key=SequenceGroup.sort_key)
        if victim.priority <= priority:
            self.num_shed[priority] += 1
            self.num_refused[names.REFUSAL_QUEUE_FULL] += 1
            raise EngineOverloaded(
                f"the engine has {len(self._unstarted)} requests waiting (limit {self.config.max_waiting}), none "
                f"less urgent than this one (priority {priority}); retry shortly", retry_after_s=1.0)
        del self._unstarted[victim.request_id]
        self._sheds.append(victim)

    # -- deadlines ------------------------------------------------------------------------------

    def first_byte_estimate(self, num_prompt_tokens: int, params: SamplingParams, priority: int,
                            streamed: bool) -> float:
        """Seconds from now to the first byte of a request's answer, were it queued now (engine.admission);
        thread-safe."""
        with self._lock:
            ahead = self._queued_ahead(priority)
        own = Queued(num_prompt_tokens, self._expected_output(params, num_prompt_tokens), params.n)
        return admission.first_byte_s(self._load, ahead, own, streamed)

    def service_s(self, num_prompt_tokens: int, params: SamplingParams, streamed: bool) -> float:
        """Seconds a request takes to its answer's first byte once it starts (its prefill, then one step or, read
        whole, all its decodes): the least of its budget it must have left when it starts. Thread-safe."""
        own = Queued(num_prompt_tokens, self._expected_output(params, num_prompt_tokens), params.n)
        return admission.first_byte_s(EngineLoad(self._load.decode_step_s, self._load.prefill_token_s, 1), [], own,
                                      streamed)

    def check_budget(self, prompt_token_ids: list[int], params: SamplingParams, priority: int, streamed: bool,
                     budget_s: float) -> bool:
        """Refuses a request whose answer's first byte is not expected within `budget_s` seconds, with the
        time after which it is (if no more urgent request comes) as its Retry-After; thread-safe. True when
        an admitted request starts at the next step, so its budget cannot pass while it queues."""
        with self._lock:
            ahead = self._queued_ahead(priority)
        own = Queued(len(prompt_token_ids), self._expected_output(params, len(prompt_token_ids)), params.n)
        load = self._load
        starts_now = not ahead and admission.start_step(load, ahead) == 0
        if starts_now:
            # Only its own decode steps are held against it: the prefill cost is fitted from few chunked steps and
            # can start far too high, and refusing on an idle engine would keep it so, since only requests that
            # run correct it.
            load = replace(load, prefill_token_s=0.0, prefilling_tokens=0)
        estimate = admission.first_byte_s(load, ahead, own, streamed)
        if estimate <= budget_s:
            return starts_now
        with self._lock:
            self.num_refused[names.REFUSAL_DEADLINE] += 1
        raise DeadlineUnattainable(
            f"the answer's first byte is expected in {estimate:.1f} s, beyond this request's budget of {budget_s:g} s "
            "(its client's timeout, else the default of its priority class); retry later or elsewhere",
            retry_after_s=estimate - budget_s)

    def expire(self, request_id: str) -> None:
        """The request's budget has passed: end it with EXPIRED at the next step if it has not started by then.
        Thread-safe and idempotent."""
        self._expiries.append(request_id)

    def _queued_ahead(self, priority: int) -> list[Queued]:
        """The requests not started that a newcomer of `priority` queues behind, in the order they start. Under
        _lock."""
        ahead = sorted((g for g in self._unstarted.values() if g.priority <= priority), key=SequenceGroup.sort_key)
        return [Queued(g.num_prompt_tokens, self._expected_output(g.params, g.num_prompt_tokens), g.params.n)
                for g in ahead]

    def _expected_output(self, params: SamplingParams, num_prompt_tokens: int) -> int:
        return admission.expected_output(params.max_tokens, self.max_model_len - num_prompt_tokens, self.mean_output)

    def _publish_load(self) -> None:
        """What the admission estimate needs of the batch now; on the engine thread, after each step."""
        running = list(self.scheduler.running)
        steps, prefilling, seq_tokens = [], 0, 0
        for seq in running:
            expected = self._expected_output(seq.group.params, seq.num_prompt_tokens)
            steps.append(max(1, expected - seq.num_output_tokens))
            prefilling += max(0, seq.num_prompt_tokens - seq.num_computed_tokens)
            seq_tokens += seq.num_prompt_tokens + expected
        slots = self.config.max_num_seqs
        if running:
            # The KV cache holds fewer sequences as large as the running ones than the batch may: it is the limit.
            slots = max(1, min(slots, self.kv_capacity_tokens * len(running) // max(1, seq_tokens)))
        batch = min(slots, max(1, len(running) + len(self.scheduler.waiting)))
        budget = self.scheduler.step_budget
        step_s = budget.decode_step_s(batch)
        self._load = EngineLoad(step_s + self.step_overhead_s if step_s else 0.0, budget.prefill_token_s(), slots,
                                tuple(steps), prefilling)

    def _observe_output(self, tokens: int) -> None:
        previous = self.mean_output
        self.mean_output = tokens if previous is None else (
            admission.OUTPUT_DECAY * previous + (1 - admission.OUTPUT_DECAY) * tokens)

    def embedding_batches(self, prompts: list[list[int]]) -> list[list[list[int]]]:
        """`prompts` in consecutive groups of at most one step's token budget each (a longer prompt alone): the
        packed forwards of `embed`. Embeddings generate nothing, so a prompt may fill the whole context."""
        batches: list[list[list[int]]] = []
        budget = self.config.max_num_batched_tokens
        tokens = budget
        for ids in prompts:
            if not ids or len(ids) > self.max_model_len:
                raise RequestRejected(f"an input has {len(ids)} tokens; it must have 1 to {self.max_model_len} "
                                      "(the model's context length)")
            if tokens + len(ids) > budget:
                batches.append([])
                tokens = 0
            batches[-1].append(ids)
            tokens += len(ids)
        return batches

    def embed(self, batch: list[list[int]], dimensions: int | None = None) -> list[list[float]]:
        """One packed forward over `batch`, outside the scheduler and the KV cache (ModelRunner.embed)."""
        return self.runner.embed(batch, dimensions)

    def abort(self, request_id: str) -> None:
        """Thread-safe and idempotent; takes effect at the start of the next step."""
        self._aborts.append(request_id)

    # -- stepping -------------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self._incoming or self._aborts or self._expiries or self.scheduler.has_work())

    def step(self) -> list[RequestOutput]:
        started_at = time.monotonic()
        if self._previous_step is not None:
            previous_start, previous_executed = self._previous_step
            overhead = started_at - previous_start - previous_executed
            self.step_overhead_s = OVERHEAD_DECAY * self.step_overhead_s + (1 - OVERHEAD_DECAY) * overhead
        executed_s = 0.0
        finished_now: dict[str, SequenceGroup] = {}
        # Cleared before the newcomers are admitted: one arriving from now on interrupts this step, one already
        # here is scheduled in it (or, if it cannot start, interrupts no step until another arrives).
        self._online_arrived.clear()
        self._admit_incoming()
        self._apply_aborts_and_deadlines(finished_now)
        self._apply_sheds(finished_now)
        self._apply_expiries(finished_now)
        plan = self.scheduler.schedule()
        touched: dict[str, SequenceGroup] = dict(finished_now)
        if not plan.is_empty:
            self.steps += 1
            now = time.time()
            started = {id(g): g for s in plan.scheduled if (g := s.seq.group).metrics.first_scheduled_time is None}
            if started:
                with self._lock:
                    for group in started.values():
                        group.metrics.first_scheduled_time = now
                        self._unstarted.pop(group.request_id, None)
            decodes, chunks = plan.decodes, plan.prefills
            executing = time.monotonic()
            interruptible = all(in_batch_class(s.seq.group.priority) for s in plan.scheduled)
            try:
                results = self.runner.execute([self._batch_item(s) for s in decodes],
                                              [self._batch_item(s) for s in chunks],
                                              self._online_arrived if interruptible else None)
            except ForwardInterrupted:
                results = None
            executed_s = time.monotonic() - executing
            if results is None:
                self.scheduler.on_step_abandoned(plan)
                self.steps_interrupted += 1
            else:
                self._take_results(plan, results, touched)
        outputs = [self._make_output(g) for g in touched.values()]
        for group in touched.values():
            if group.finished:
                self._forget(group)
        busy = not plan.is_empty and self.scheduler.has_work()
        self._previous_step = (started_at, executed_s) if busy else None
        self._publish_load()
        return [o for o in outputs if o is not None]

    def _take_results(self, plan: SchedulerOutput, results: list[SampleResult], touched: dict[str, SequenceGroup]) -> None:
        sampled = [s for s in plan.decodes + plan.prefills if s.samples]
        rows = iter(results)
        accepted = [self._accept(item, [next(rows) for _ in range(len(item.draft_ids) + 1)]) for item in sampled]
        self.scheduler.on_step_done(plan)
        now = time.time()
        for item, tokens in zip(sampled, accepted):
            for result in tokens:
                self._append_token(item.seq, result, now)
                if item.seq.finished:
                    break  # a stop inside an accepted run ends the output there
            touched[item.seq.group.request_id] = item.seq.group

    def _admit_incoming(self) -> None:
        while self._incoming:
            group = self._incoming.popleft()
            for seq in group.seqs:
                self.detokenizer.start(seq)
            self.scheduler.add(group)

    def _apply_aborts_and_deadlines(self, finished_now: dict[str, SequenceGroup]) -> None:
        while self._aborts:
            group = self.groups.get(self._aborts.popleft())
            if group is not None and not group.finished:
                self._finish_group(group, "abort")
                self.num_aborted += 1
                finished_now[group.request_id] = group
        now = time.time()
        for group in list(self.groups.values()):
            if group.deadline is not None and now > group.deadline and not group.finished:
                self._finish_group(group, "timeout")
                self.num_timed_out += 1
                finished_now[group.request_id] = group

    def _apply_sheds(self, finished_now: dict[str, SequenceGroup]) -> None:
        """Ends the requests shed for more urgent ones, unless one started meanwhile (then it runs: no work is
        thrown away)."""
        while self._sheds:
            group = self._sheds.popleft()
            if not group.finished and group.metrics.first_scheduled_time is None:
                self._finish_group(group, SHED)
                with self._lock:
                    self.num_shed[group.priority] += 1
                    self.num_refused[names.REFUSAL_QUEUE_FULL] += 1
                finished_now[group.request_id] = group

    def _apply_expiries(self, finished_now: dict[str, SequenceGroup]) -> None:
        """Ends the requests whose budget passed while they were queued; one that started meanwhile runs on."""
        while self._expiries:
            group = self.groups.get(self._expiries.popleft())
            if group is not None and not group.finished and group.metrics.first_scheduled_time is None:
                self._finish_group(group, EXPIRED)
                with self._lock:
                    self.num_refused[names.REFUSAL_BUDGET_PASSED] += 1
                finished_now[group.request_id] = group

    def _finish_group(self, group: SequenceGroup, reason: str) -> None:
        for seq in group.seqs:
            self.scheduler.finish(seq, reason)
        group.metrics.finished_time = time.time()

    def _batch_item(self, item: ScheduledSeq) -> BatchItem:
        seq = item.seq
        start = seq.num_computed_tokens
        drafts = item.draft_ids
        tokens = seq.token_ids[start:start + item.num_tokens - len(drafts)] + drafts
        # Row i of a verification samples as a plain decode would after the first i drafts were accepted.
        verify = [self._sample_request(seq, drafts[:i]) for i in range(len(drafts))]
        return BatchItem(tokens, start, seq.block_table, self._sample_request(seq, drafts) if item.samples else None,
                         seq.group.lora_id, verify)

    def _sample_request(self, seq: Sequence, drafts: list[int] | tuple[int, ...] = ()) -> SampleRequest:
        """What sampling `seq`'s next token needs, as if `drafts` had been appended to it."""
        params = seq.group.params
        position = seq.num_output_tokens + len(drafts)
        generator = None if params.seed is None else position_generator(params.seed + seq.index, position)
        banned = []
        if position < params.min_tokens:
            banned = self.eos_token_ids + list(params.stop_token_ids)
        return SampleRequest(params, seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids + list(drafts),
                             generator, banned, seq.constraint)

    def _accept(self, item: ScheduledSeq, results: list[SampleResult]) -> list[SampleResult]:
        """The tokens a step adds to `item`'s sequence: the drafts the target picked too, then its own next one."""
        drafts = item.draft_ids
        accepted = 0
        while accepted < len(drafts) and results[accepted].token_id == drafts[accepted]:
            accepted += 1
        item.num_accepted = accepted
        if drafts:
            self.scheduler.speculator.observe(item.seq, accepted, len(drafts))
            self.num_drafts += 1
            self.num_draft_tokens += len(drafts)
            for position in range(accepted):
                self.accepted_per_pos[position] += 1
        return results[:accepted + 1]

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.accepted_per_pos)

    def _append_token(self, seq: Sequence, result: SampleResult, now: float) -> None:
        params = seq.group.params
        token = result.token_id
        seq.token_ids.append(token)
        metrics = seq.group.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now
        if result.logprob is not None:
            seq.logprobs.append(TokenLogprob(token, result.logprob, result.top_logprobs or []))
        if seq.constraint is not None:
            seq.constraint.accept_token(token)
        stop_string = self.detokenizer.append(seq)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len
        reason, stop_reason = None, None
        if stop_string is not None:
            reason, stop_reason = "stop", stop_string
        elif token in params.stop_token_ids:
            reason, stop_reason = "stop", token
        elif token in self.eos_token_ids and not params.ignore_eos:
            reason, stop_reason = "stop", None
        elif seq.constraint is not None and seq.constraint.is_finished():
            reason = "stop"
        elif seq.num_output_tokens >= max_tokens or len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            self._observe_output(seq.num_output_tokens)
            self.scheduler.finish(seq, reason, stop_reason)
            if seq.group.finished:
                seq.group.metrics.finished_time = now

    def _make_output(self, group: SequenceGroup) -> RequestOutput | None:
        """What is new for the request since its previous output; None when nothing is."""
        completions = []
        changed = False
        for seq in group.seqs:
            upto = self.detokenizer.releasable_len(seq)
            start = seq.num_prompt_tokens + seq.emitted_token_count
            completion = CompletionOutput(
                index=seq.index, delta_text=seq.text[seq.emitted_text_len:upto], delta_token_ids=seq.token_ids[start:],
                delta_logprobs=seq.logprobs[seq.emitted_token_count:], num_tokens=seq.num_output_tokens,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason)
            if group.finished:
                completion.text, completion.token_ids = seq.text, seq.output_token_ids
            changed |= bool(completion.delta_token_ids or completion.delta_text) or seq.finished
            seq.emitted_text_len = max(seq.emitted_text_len, upto)
            seq.emitted_token_count = seq.num_output_tokens
            completions.append(completion)
        if not changed:
            return None
        return RequestOutput(group.request_id, group.prompt_token_ids, completions, group.finished, group.metrics)

    def _forget(self, group: SequenceGroup) -> None:
        with self._lock:
            self.groups.pop(group.request_id, None)
            self._unstarted.pop(group.request_id, None)
            if group.lora is not None and self.loras.release(group.lora):
                self.runner.lora.remove(group.lora.id)

    # -- introspection --------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        with self._lock:
            waiting_by_priority = Counter(g.priority for g in self._unstarted.values())
            shed_by_priority = dict(self.num_shed)
            refused_by_reason = dict(self.num_refused)
            ahead = self._queued_ahead(DEFAULT_CLASSES[DEFAULT_CLASS])
        running_loras = _lora_names(self.scheduler.running)
        return EngineStats(
            num_running=len({s.group.request_id for s in self.scheduler.running}),
            num_waiting=self.scheduler.num_waiting_requests + len(self._incoming),
            kv_cache_usage=self.block_manager.usage,
            num_kv_blocks=self.block_manager.num_blocks,
            block_size=self.block_manager.block_size,
            prefix_cache_queries=self.block_manager.prefix_queries,
            prefix_cache_hits=self.block_manager.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_aborted=self.num_aborted,
            num_timed_out=self.num_timed_out,
            steps=self.steps,
            steps_interrupted=self.steps_interrupted,
            waiting_by_priority=dict(waiting_by_priority),
            shed_by_priority=shed_by_priority,
            running_loras=sorted(running_loras),
            waiting_loras=sorted(_lora_names(self.scheduler.waiting) - running_loras),
            resident_loras=self._resident_loras(),
            refused_by_reason=refused_by_reason,
            estimated_queue_s=admission.queue_s(self._load, ahead),
            spec_decode_num_drafts=self.num_drafts,
            spec_decode_num_draft_tokens=self.num_draft_tokens,
            spec_decode_num_accepted_tokens=self.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=list(self.accepted_per_pos))

    def _resident_loras(self) -> list[str]:
        resident = self.runner.lora.resident_ids if self.runner.lora is not None else frozenset()
        return sorted(ref.name for ref in list(self.loras.by_name.values()) if ref.id in resident)


def _lora_names(seqs: list[Sequence]) -> set[str]:
    return {s.group.lora.name for s in list(seqs) if s.group.lora is not None}
