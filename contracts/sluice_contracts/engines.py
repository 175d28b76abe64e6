"""The inference engines an InferenceModel may run, and how each one's load is read from its Prometheus /metrics.

Sluice's runtime serves `/load` (sluice_contracts.load_report) and vLLM's metric names; vLLM and SGLang serve
no `/load`, so the gateway and the autoscaler read their three load gauges from `/metrics`. vLLM's names are
the runtime's own (metric_names); SGLang, read at sgl-project/sglang commit 001067ff
(python/sglang/srt/metrics/collector.py, served with `--enable-metrics`), names them `sglang:num_running_reqs`,
`sglang:num_queue_reqs` and `sglang:token_usage` (the share of KV-cache tokens in use, 0-1), with the same
`model_name` label. vLLM before its V1 engine called the KV gauge `vllm:gpu_cache_usage_perc`.

The parser reads the Prometheus text format's sample lines only; it takes no dependency, so both the gateway
and the operator use it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from .metric_names import GPU_CACHE_USAGE, KV_CACHE_USAGE, MODEL_LABEL, NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING

Engine = Literal["sluice", "vllm", "sglang"]
ENGINES: tuple[str, ...] = ("sluice", "vllm", "sglang")
DEFAULT_ENGINE: Engine = "sluice"


@dataclass(frozen=True)
class LoadGauges:
    """Each gauge's names, the first one a server exposes wins."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_cache_usage: tuple[str, ...]

    def names(self) -> set[str]:
        return {*self.running, *self.waiting, *self.kv_cache_usage}


LOAD_GAUGES: dict[str, LoadGauges] = {
    "sluice": LoadGauges((NUM_REQUESTS_RUNNING,), (NUM_REQUESTS_WAITING,), (KV_CACHE_USAGE,)),
    "vllm": LoadGauges((NUM_REQUESTS_RUNNING,), (NUM_REQUESTS_WAITING,), (KV_CACHE_USAGE, GPU_CACHE_USAGE)),
    "sglang": LoadGauges(("sglang:num_running_reqs",), ("sglang:num_queue_reqs",), ("sglang:token_usage",)),
}

# Engines whose servers answer GET /load; the others are polled on /metrics.
SERVES_LOAD_DOCUMENT = frozenset({"sluice"})


@dataclass(frozen=True)
class MetricsLoad:
    running: float
    waiting: float
    kv_cache_usage: float


class MetricsParseError(ValueError):
    """The text is not Prometheus metrics, or lacks a gauge; the message says which."""


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?[ \t]*$")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(?:,|$)')


def _labels(text: str, line: str) -> dict[str, str]:
    labels, at = {}, 0
    while at < len(text):
        match = _LABEL.match(text, at)
        if match is None:
            raise MetricsParseError(f"unparsable /metrics line: {line[:200]!r}")
        labels[match.group(1)] = match.group(2)
        at = match.end()
    return labels


def parse_load(text: str, engine: str, served_model_name: str) -> MetricsLoad:
    """The three gauges of `served_model_name` (samples without the label count too), summed over a server's
    samples (SGLang reports one per data-parallel rank)."""
    gauges = LOAD_GAUGES[engine]
    wanted = gauges.names()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsParseError(f"unparsable /metrics line: {line[:200]!r}")
        name, label_text, value_text = match.groups()
        labels = _labels(label_text, line) if label_text else {}
        if name not in wanted:
            continue
        model = labels.get(MODEL_LABEL)
        if model is not None and model != served_model_name:
            continue
        try:
            value = float(value_text)
        except ValueError:
            raise MetricsParseError(f"unparsable /metrics line: {line[:200]!r}") from None
        if not math.isfinite(value):
            raise MetricsParseError(f"/metrics reports {value_text} for {name}")
        values[name] = values.get(name, 0.0) + value

    found: dict[str, float] = {}
    missing = []
    for gauge in ("kv_cache_usage", "waiting", "running"):
        names = getattr(gauges, gauge)
        present = [name for name in names if name in values]
        if present:
            found[gauge] = values[present[0]]
        else:
            missing.append(" or ".join(names))
    if missing:
        raise MetricsParseError(f"/metrics lacks {', '.join(missing)} for model {served_model_name!r}")
    return MetricsLoad(**found)
