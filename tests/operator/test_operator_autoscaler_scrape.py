"""Parsing a runtime pod's /metrics into the autoscaler's input.

data/runtime_metrics.txt is a real capture: `sluice-runtime serve --model smollm2` with three chat streams
in flight, fetched with curl from /metrics. No HTTP server stands in for the runtime here.
"""
import socket
from pathlib import Path

import aiohttp
import pytest

from sluice_operator.autoscaler import MetricsError, parse_runtime_metrics, scrape

CAPTURE = (Path(__file__).parent / "data" / "runtime_metrics.txt").read_text()


def test_reads_the_three_gauges_of_the_served_model():
    load = parse_runtime_metrics(CAPTURE, "smollm2")
    assert load.running == 3 and load.waiting == 0
    assert 0 < load.kv_cache_usage < 1


def test_another_model_name_has_no_metrics():
    with pytest.raises(MetricsError, match="lacks vllm:kv_cache_usage_perc, .*'other'"):
        parse_runtime_metrics(CAPTURE, "other")


def test_a_missing_gauge_is_named():
    without_kv = "\n".join(line for line in CAPTURE.splitlines() if "kv_cache_usage_perc" not in line) + "\n"
    with pytest.raises(MetricsError, match="lacks vllm:kv_cache_usage_perc"):
        parse_runtime_metrics(without_kv, "smollm2")


def test_garbage_is_unparsable():
    with pytest.raises(MetricsError, match="unparsable"):
        parse_runtime_metrics('vllm:num_requests_running{model_name="smollm2" 3\n', "smollm2")


async def test_an_unreachable_pod_is_a_metrics_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        with pytest.raises(MetricsError, match="unreachable"):
            await scrape(session, f"http://127.0.0.1:{port}", "smollm2")


def test_each_engine_is_read_by_its_own_gauge_names():
    sglang = ('sglang:num_running_reqs{model_name="chat"} 5\nsglang:num_queue_reqs{model_name="chat"} 7\n'
              'sglang:token_usage{model_name="chat"} 0.75\n')
    load = parse_runtime_metrics(sglang, "chat", "sglang")
    assert (load.running, load.waiting, load.kv_cache_usage) == (5, 7, 0.75)
    assert parse_runtime_metrics(CAPTURE, "smollm2", "vllm").running == 3
    with pytest.raises(MetricsError, match="lacks sglang:token_usage"):
        parse_runtime_metrics(CAPTURE, "smollm2", "sglang")
