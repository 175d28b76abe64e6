"""Prometheus metrics of the runtime: vLLM-compatible names (sluice_contracts.metric_names) plus sluice_ ones.

Engine state (queue lengths, KV usage, prefix cache, preemptions) is read from the engine at scrape
time, so a scrape is never stale; per-request figures are recorded by the server as requests end.
"""
from __future__ import annotations

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
    def __init__(self, model_name: str, stats: Callable[[], object]):
        self._model = model_name
        self._stats = stats

    def collect(self):
        s = self._stats()
        labels = [names.MODEL_LABEL]
        for name, doc, value in (
            (names.NUM_REQUESTS_RUNNING, "Requests in the running batch.", s.num_running),
            (names.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", s.num_waiting),
            (names.KV_CACHE_USAGE, "Fraction of KV-cache blocks in use (0-1).", s.kv_cache_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric([self._model], value)
            yield gauge
        info = GaugeMetricFamily(names.CACHE_CONFIG_INFO, "KV-cache configuration.",
                                 labels=[names.MODEL_LABEL, "block_size", "num_gpu_blocks"])
        info.add_metric([self._model, str(s.block_size), str(s.num_kv_blocks)], 1)
        yield info
        for name, doc, value in (
            (names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            (names.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.", s.prefix_cache_hits),
            (names.NUM_PREEMPTIONS, "Requests preempted to free KV blocks.", s.num_preemptions),
        ):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric([self._model], value)
            yield counter


class RuntimeMetrics:
    def __init__(self, model_name: str, stats: Callable[[], object], template_version: str | None):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, m = self.registry, [names.MODEL_LABEL]
        r.register(_EngineStateCollector(model_name, stats))
        self._prompt_tokens = Counter(names.PROMPT_TOKENS, "Prompt tokens processed.", m, registry=r)
        self._generation_tokens = Counter(names.GENERATION_TOKENS, "Tokens generated.", m, registry=r)
        self._success = Counter(names.REQUEST_SUCCESS, "Finished requests by finish reason.",
                                m + ["finished_reason"], registry=r)
        self._ttft = Histogram(names.TIME_TO_FIRST_TOKEN, "Time to first token.", m,
                               buckets=_LATENCY_BUCKETS, registry=r)
        self._itl = Histogram(names.INTER_TOKEN_LATENCY, "Time between output tokens.", m,
                              buckets=_ITL_BUCKETS, registry=r)
        self._e2e = Histogram(names.E2E_REQUEST_LATENCY, "Arrival to finish.", m,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self._queue = Histogram(names.REQUEST_QUEUE_TIME, "Arrival to first scheduling.", m,
                                buckets=_LATENCY_BUCKETS, registry=r)
        self._prefill = Histogram(names.REQUEST_PREFILL_TIME, "First scheduling to first token.", m,
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self._decode = Histogram(names.REQUEST_DECODE_TIME, "First token to finish.", m,
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self._prompt_hist = Histogram(names.REQUEST_PROMPT_TOKENS, "Prompt length per request.", m,
                                      buckets=_TOKEN_BUCKETS, registry=r)
        self._gen_hist = Histogram(names.REQUEST_GENERATION_TOKENS, "Generated tokens per request.", m,
                                   buckets=_TOKEN_BUCKETS, registry=r)
        self._http = Counter("sluice_runtime_http_requests", "HTTP requests by endpoint and status.",
                             ["endpoint", "status"], registry=r)
        self._cancelled = Counter("sluice_runtime_requests_cancelled", "Requests aborted because the client left.",
                                  m, registry=r)
        self._stalled = Counter("sluice_runtime_requests_stalled",
                                "Streams aborted because their client read nothing for the stream idle timeout.",
                                m, registry=r)
        self._timeouts = Counter("sluice_runtime_requests_timeout", "Requests stopped at their deadline.",
                                 m, registry=r)
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
        self._cancelled.labels(self.model_name).inc()
        self._success.labels(self.model_name, "abort").inc()

    def observe_stalled(self) -> None:
        """The client stopped reading; its engine request was aborted."""
        self._stalled.labels(self.model_name).inc()
        self.observe_cancelled()

    def observe_rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()

    def observe_token_gap(self, seconds: float, tokens: int) -> None:
        """`tokens` new tokens arrived `seconds` after the previous ones."""
        per_token = seconds / tokens
        for _ in range(tokens):
            self._itl.labels(self.model_name).observe(per_token)

    def observe_finished(self, metrics: RequestMetrics, prompt_tokens: int, generated: int,
                         finish_reasons: list[str]) -> None:
        """One engine request ended; `finish_reasons` has one entry per sequence (n > 1)."""
        model = self.model_name
        self._prompt_tokens.labels(model).inc(prompt_tokens)
        self._generation_tokens.labels(model).inc(generated)
        self._prompt_hist.labels(model).observe(prompt_tokens)
        self._gen_hist.labels(model).observe(generated)
        for reason in finish_reasons:
            self._success.labels(model, reason).inc()
            if reason == "timeout":
                self._timeouts.labels(model).inc()
        arrival = metrics.arrival_time
        if metrics.first_token_time is not None:
            self._ttft.labels(model).observe(metrics.first_token_time - arrival)
        if metrics.finished_time is not None:
            self._e2e.labels(model).observe(metrics.finished_time - arrival)
            if metrics.first_token_time is not None:
                self._decode.labels(model).observe(metrics.finished_time - metrics.first_token_time)
        if metrics.first_scheduled_time is not None:
            self._queue.labels(model).observe(metrics.first_scheduled_time - arrival)
            if metrics.first_token_time is not None:
                self._prefill.labels(model).observe(metrics.first_token_time - metrics.first_scheduled_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
