"""Prometheus metrics of the runtime: vLLM-compatible names (sluice_contracts.metric_names) plus sluice_ ones.

Engine state (queue lengths, KV usage, prefix cache, preemptions) is read from the engine at scrape
time, so a scrape is never stale; per-request figures are recorded by the server as requests end.
"""
from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sluice_contracts import metric_names as names
from sluice_runtime.engine.outputs import RequestMetrics

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class _EngineStateCollector:
    def __init__(self, model_name: str, stats: Callable[[], object], max_loras: int | None):
        self._model = model_name
        self._stats = stats
        self._max_loras = max_loras

    def collect(self):
        s = self._stats()
        for family, name, doc, value in (
            (GaugeMetricFamily, names.NUM_REQUESTS_RUNNING, "Requests in the running batch.", s.num_running),
            (GaugeMetricFamily, names.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", s.num_waiting),
            (GaugeMetricFamily, names.KV_CACHE_USAGE, "Fraction of KV-cache blocks in use (0-1).", s.kv_cache_usage),
            (GaugeMetricFamily, names.GPU_CACHE_USAGE, "Fraction of KV-cache blocks in use (0-1); vLLM's name before "
             "its V1 engine, which GIE's endpoint picker reads by default.", s.kv_cache_usage),
            (CounterMetricFamily, names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
             s.prefix_cache_queries),
            (CounterMetricFamily, names.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.",
             s.prefix_cache_hits),
            (CounterMetricFamily, names.NUM_PREEMPTIONS, "Requests preempted to free KV blocks.", s.num_preemptions),
            (CounterMetricFamily, names.SPEC_DECODE_NUM_DRAFTS, "Speculative verifications run (a draft checked "
             "in one step).", s.spec_decode_num_drafts),
            (CounterMetricFamily, names.SPEC_DECODE_NUM_DRAFT_TOKENS, "Draft tokens proposed for verification.",
             s.spec_decode_num_draft_tokens),
            (CounterMetricFamily, names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Draft tokens the model accepted.",
             s.spec_decode_num_accepted_tokens),
            (CounterMetricFamily, names.STEPS_INTERRUPTED, "Steps of batch-class work only abandoned between layers "
             "for a more urgent request that arrived (recomputed in a later step).", s.steps_interrupted),
            (GaugeMetricFamily, names.ESTIMATED_QUEUE_SECONDS, "Seconds before a request of the default priority "
             "arriving now would start, as the engine estimates it from its measured step times and its queue.",
             s.estimated_queue_s),
        ):
            metric = family(name, doc, labels=[names.MODEL_LABEL])
            metric.add_metric([self._model], value)
            yield metric
        per_pos = CounterMetricFamily(names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, "Draft tokens the model "
                                      "accepted, by their position in the draft (0: the first).",
                                      labels=[names.MODEL_LABEL, names.POSITION_LABEL])
        for position, value in enumerate(s.spec_decode_num_accepted_tokens_per_pos):
            per_pos.add_metric([self._model, str(position)], value)
        yield per_pos
        refused = CounterMetricFamily(names.REQUESTS_REFUSED, "Requests refused at once or ended before they "
                                      "started (503 with Retry-After), by reason: not answerable within their "
                                      "budget, queue full, budget passed while queued.",
                                      labels=[names.MODEL_LABEL, names.REFUSAL_REASON_LABEL])
        for reason in (names.REFUSAL_DEADLINE, names.REFUSAL_QUEUE_FULL, names.REFUSAL_BUDGET_PASSED):
            refused.add_metric([self._model, reason], s.refused_by_reason.get(reason, 0))
        yield refused
        info = GaugeMetricFamily(names.CACHE_CONFIG_INFO, "KV-cache configuration.",
                                 labels=[names.MODEL_LABEL, "block_size", "num_gpu_blocks"])
        info.add_metric([self._model, str(s.block_size), str(s.num_kv_blocks)], 1)
        yield info
        for family, name, doc, values in (
            (GaugeMetricFamily, names.REQUESTS_WAITING_BY_PRIORITY, "Requests accepted and not started, by priority.",
             s.waiting_by_priority),
            (CounterMetricFamily, names.REQUESTS_SHED, "Requests refused for a full queue or dropped from it for a "
             "more urgent one, by priority.", s.shed_by_priority),
        ):
            metric = family(name, doc, labels=[names.MODEL_LABEL, names.PRIORITY_LABEL])
            for priority, value in sorted(values.items()):
                metric.add_metric([self._model, str(priority)], value)
            yield metric
        if self._max_loras is not None:
            # vLLM's shape, which adapter-aware routers read: no model label, the time as its value.
            loras = GaugeMetricFamily(names.LORA_REQUESTS_INFO, "Running and waiting LoRA adapters.",
                                      labels=[names.LORA_RUNNING_LABEL, names.LORA_WAITING_LABEL, names.LORA_MAX_LABEL])
            loras.add_metric([",".join(s.running_loras), ",".join(s.waiting_loras), str(self._max_loras)], time.time())
            yield loras


class RuntimeMetrics:
    def __init__(self, model_name: str, stats: Callable[[], object], template_version: str | None,
                 max_loras: int | None = None):
        """`max_loras`: the resident adapter limit when LoRA is enabled, else None."""
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, m = self.registry, [names.MODEL_LABEL]
        r.register(_EngineStateCollector(model_name, stats, max_loras))

        # Most series have the model as their only label: they are bound to it here.
        def counter(name: str, doc: str):
            return Counter(name, doc, m, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple = _LATENCY_BUCKETS):
            return Histogram(name, doc, m, buckets=buckets, registry=r).labels(model_name)

        self._prompt_tokens = counter(names.PROMPT_TOKENS, "Prompt tokens processed.")
        self._generation_tokens = counter(names.GENERATION_TOKENS, "Tokens generated.")
        self._success = Counter(names.REQUEST_SUCCESS, "Finished requests by finish reason.",
                                m + ["finished_reason"], registry=r)
        self._ttft = histogram(names.TIME_TO_FIRST_TOKEN, "Time to first token.")
        self._itl = histogram(names.INTER_TOKEN_LATENCY, "Time between output tokens.", _ITL_BUCKETS)
        self._e2e = histogram(names.E2E_REQUEST_LATENCY, "Arrival to finish.")
        self._queue = histogram(names.REQUEST_QUEUE_TIME, "Arrival to first scheduling.")
        self._prefill = histogram(names.REQUEST_PREFILL_TIME, "First scheduling to first token.")
        self._decode = histogram(names.REQUEST_DECODE_TIME, "First token to finish.")
        self._prompt_hist = histogram(names.REQUEST_PROMPT_TOKENS, "Prompt length per request.", _TOKEN_BUCKETS)
        self._gen_hist = histogram(names.REQUEST_GENERATION_TOKENS, "Generated tokens per request.", _TOKEN_BUCKETS)
        self._http = Counter("sluice_runtime_http_requests", "HTTP requests by endpoint and status.",
                             ["endpoint", "status"], registry=r)
        self._cancelled = counter("sluice_runtime_requests_cancelled", "Requests aborted because the client left.")
        self._stalled = counter("sluice_runtime_requests_stalled",
                                "Streams aborted because their client read nothing for the stream idle timeout.")
        self._timeouts = counter("sluice_runtime_requests_timeout", "Requests stopped at their deadline.")
        self._rejected = Counter("sluice_runtime_requests_rejected", "Requests refused by the engine at admission.",
                                 m + ["reason"], registry=r)
        self.in_flight = Gauge("sluice_runtime_requests_in_flight", "HTTP generation requests being served.",
                               m, registry=r).labels(model_name)
        info = Gauge("sluice_runtime_chat_template_info", "The chat template version (hash) in use.",
                     m + ["version"], registry=r)
        info.labels(model_name, template_version or "none").set(1)

    def observe_http(self, endpoint: str, status: int) -> None:
        self._http.labels(endpoint, str(status)).inc()

    def observe_cancelled(self) -> None:
        """The client left; the engine request ended as an abort the server never saw finish."""
        self._cancelled.inc()
        self._success.labels(self.model_name, "abort").inc()

    def observe_stalled(self) -> None:
        """The client stopped reading; its engine request was aborted."""
        self._stalled.inc()
        self.observe_cancelled()

    def observe_rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()

    def observe_token_gap(self, seconds: float, tokens: int) -> None:
        """`tokens` new tokens arrived `seconds` after the previous ones."""
        per_token = seconds / tokens
        for _ in range(tokens):
            self._itl.observe(per_token)

    def observe_pooled(self, prompt_tokens: int) -> None:
        """An embeddings or rerank request was served: prompt tokens only, nothing generated."""
        self._prompt_tokens.inc(prompt_tokens)
        self._prompt_hist.observe(prompt_tokens)

    def observe_finished(self, metrics: RequestMetrics, prompt_tokens: int, generated: int,
                         finish_reasons: list[str]) -> None:
        """One engine request ended; `finish_reasons` has one entry per sequence (n > 1)."""
        model = self.model_name
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(generated)
        self._prompt_hist.observe(prompt_tokens)
        self._gen_hist.observe(generated)
        for reason in finish_reasons:
            self._success.labels(model, reason).inc()
            if reason == "timeout":
                self._timeouts.inc()
        arrival = metrics.arrival_time
        if metrics.first_token_time is not None:
            self._ttft.observe(metrics.first_token_time - arrival)
        if metrics.finished_time is not None:
            self._e2e.observe(metrics.finished_time - arrival)
            if metrics.first_token_time is not None:
                self._decode.observe(metrics.finished_time - metrics.first_token_time)
        if metrics.first_scheduled_time is not None:
            self._queue.observe(metrics.first_scheduled_time - arrival)
            if metrics.first_token_time is not None:
                self._prefill.observe(metrics.first_token_time - metrics.first_scheduled_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
