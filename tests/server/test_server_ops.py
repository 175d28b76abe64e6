"""Operations: probes, /load, /metrics, request logs, and aborting requests whose client went away."""
import json
import re
import time

import httpx
import pytest

from sluice_contracts import metric_names
from sluice_contracts.load_report import LoadReport

pytestmark = pytest.mark.integration

MODEL = "smollm2"
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 4000, "ignore_eos": True}
VLLM_NAMES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:gpu_cache_usage_perc",
              "vllm:cache_config_info", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
              "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
              "vllm:request_success_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
              "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:spec_decode_num_drafts_total",
              "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"]


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of `name` whose label set contains `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match and labels in (match.group(1) or ""):
            total += float(match.group(2))
    return total


def idle(url: str, timeout: float = 5.0) -> dict:
    """Wait until the engine runs nothing and holds no KV blocks; return /load."""
    deadline = time.monotonic() + timeout
    while True:
        load = httpx.get(f"{url}/load").json()
        if (load["running"] == 0 and load["waiting"] == 0 and load["kv_cache_usage"] == 0) \
                or time.monotonic() > deadline:
            return load
        time.sleep(0.05)


def test_probes_and_load(runtime_server):
    assert httpx.get(f"{runtime_server}/health").json() == {"status": "ok"}
    assert httpx.get(f"{runtime_server}/ready").json() == {"ready": True}
    load = httpx.get(f"{runtime_server}/load").json()
    assert set(load) >= {"waiting", "running", "kv_cache_usage", "block_size", "prefix_cache"}
    assert load["block_size"] == 16 and 0 <= load["kv_cache_usage"] <= 1
    assert set(load["prefix_cache"]) == {"queries", "hits", "hit_rate"}
    # What the gateway parses /load with: the runtime's own document must pass it.
    report = LoadReport.model_validate_json(httpx.get(f"{runtime_server}/load").content)
    assert report.model == MODEL and report.draining is False and report.prefix_cache is not None


def test_metrics_use_vllm_names_and_count_requests(runtime_server, runtime_openai):
    before = httpx.get(f"{runtime_server}/metrics").text
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}], max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True})
    after = httpx.get(f"{runtime_server}/metrics").text
    for name in VLLM_NAMES:
        assert re.search(rf"^{re.escape(name)}(_bucket|_count|_sum)?\{{.*model_name=\"{MODEL}\"", after, re.M), name
    assert metric(after, "vllm:request_success_total", 'finished_reason="length"') == \
        metric(before, "vllm:request_success_total", 'finished_reason="length"') + 1
    assert metric(after, "vllm:prompt_tokens_total") - metric(before, "vllm:prompt_tokens_total") == \
        response.usage.prompt_tokens
    assert metric(after, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total") == 5
    assert metric(after, "vllm:time_to_first_token_seconds_count") == \
        metric(before, "vllm:time_to_first_token_seconds_count") + 1
    assert metric(after, "sluice_runtime_http_requests_total", 'endpoint="/v1/chat/completions",status="200"') >= 1
    assert 'block_size="16"' in after
    # Every name the contract promises (the autoscaler scrapes the gauges) is the one exported; the LoRA gauge
    # only where --enable-lora is given, as in vLLM (tests/server/test_server_lora.py reads it there), and the
    # accepted drafts by position only where --speculative-config gives positions (tests/runtime reads them).
    only_where_enabled = (metric_names.LORA_REQUESTS_INFO, metric_names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS)
    promised = [v for k, v in vars(metric_names).items()
                if k.isupper() and v.startswith("vllm:") and v not in only_where_enabled]
    assert len(promised) == len(VLLM_NAMES)
    for name in promised:
        assert re.search(rf"^{re.escape(name)}(_total|_bucket|_count|_sum)?\{{", after, re.M), name


def test_each_request_logs_one_json_line(runtime_server_process, runtime_openai):
    runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "secret prompt text"}], max_tokens=3,
        extra_headers={"x-request-id": "log-check-1"})
    httpx.post(f"{runtime_server_process.url}/v1/chat/completions", json={"model": "nope", "messages": []},
               headers={"x-request-id": "log-check-2"})
    deadline = time.monotonic() + 5
    while True:
        lines = {line.get("client_request_id"): line for line in runtime_server_process.request_log()}
        if {"log-check-1", "log-check-2"} <= set(lines) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    ok, bad = lines["log-check-1"], lines["log-check-2"]
    assert ok["status"] == 200 and ok["model"] == MODEL and len(ok["template_version"]) == 12
    assert ok["completion_tokens"] == 3 and ok["prompt_tokens"] > 0
    assert ok["finish_reasons"] == ["length"] and ok["sampling"]["max_tokens"] == 3
    assert {"queue_s", "prefill_s", "decode_s", "total_s"} <= set(ok)
    assert "prompt" not in ok and "secret prompt text" not in json.dumps(ok)
    assert bad["status"] == 404 and bad["error_code"] == "model_not_found"
    assert [line.get("client_request_id") for line in runtime_server_process.request_log()].count("log-check-1") == 1
    assert ok["request_id"].startswith("req-") and ok["request_id"] != bad["request_id"]


def test_stream_disconnect_aborts_and_frees_blocks(runtime_server):
    before = httpx.get(f"{runtime_server}/metrics").text
    with httpx.stream("POST", f"{runtime_server}/v1/chat/completions", json={**LONG, "stream": True},
                      timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        load = httpx.get(f"{runtime_server}/load").json()
        assert load["running"] == 1 and load["kv_cache_usage"] > 0
    load = idle(runtime_server)
    assert load["running"] == 0 and load["kv_cache_usage"] == 0, load
    after = httpx.get(f"{runtime_server}/metrics").text
    assert metric(after, "sluice_runtime_requests_cancelled_total") == \
        metric(before, "sluice_runtime_requests_cancelled_total") + 1
    assert metric(after, "vllm:request_success_total", 'finished_reason="abort"') >= 1


def test_non_stream_disconnect_aborts_and_frees_blocks(runtime_server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{runtime_server}/v1/chat/completions", json=LONG, timeout=httpx.Timeout(60, read=1.5))
    load = idle(runtime_server)
    assert load["running"] == 0 and load["kv_cache_usage"] == 0, load
