"""Upstream answers are held whole only up to a cap, and their usage is found without parsing them whole."""
import json

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_gateway.request_context import Outcome
from sluice_gateway.usage_scan import read_usage as _read_usage

KEY = "sk-test-cap"
HEADERS = {"authorization": f"Bearer {KEY}"}


def chat(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}


@pytest.mark.integration
def test_a_response_over_the_cap_is_a_502_and_smaller_ones_pass_with_their_usage(tiny_runtimes, start_gateway):
    config = gateway_config([{"name": "t", "keys": [key_entry("k", KEY)]}], max_response_bytes=16 * 1024)
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))

    small = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), headers=HEADERS, timeout=60)
    assert small.status_code == 200 and len(small.content) < 16 * 1024
    # Logprobs with alternatives make each token cost hundreds of bytes: 200 of them are far past 16 KiB.
    big = httpx.post(f"{gateway.url}/v1/chat/completions", headers={**HEADERS, "x-request-id": "too-big"},
                     json=chat(max_tokens=200, ignore_eos=True, logprobs=True, top_logprobs=5), timeout=120)
    assert big.status_code == 502, big.text[:300]
    assert big.json()["error"]["code"] == "upstream_response_too_large"
    assert "16384 bytes" in big.json()["error"]["message"]
    assert gateway.metric("sluice_gateway_upstream_errors_total", kind="response_too_large") == 1
    # The same answer streamed is not held whole, so it is not capped.
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", headers=HEADERS, timeout=120,
                      json=chat(max_tokens=200, ignore_eos=True, logprobs=True, top_logprobs=5, stream=True)) as s:
        assert s.status_code == 200 and sum(len(c) for c in s.iter_bytes()) > 16 * 1024

    line = gateway.access_lines(small.headers["x-request-id"])[small.headers["x-request-id"]]
    assert line["completion_tokens"] == 2 and line["prompt_tokens"] > 0


def scanned(body: bytes) -> Outcome:
    outcome = Outcome()
    _read_usage(body, outcome)
    return outcome


def test_usage_is_found_in_a_large_body_from_its_own_object():
    tokens = [{"token": "x", "logprob": -1.0, "top_logprobs": [{"token": "y", "logprob": -2.0}] * 5}] * 20000
    body = json.dumps({"id": "c", "choices": [{"index": 0, "message": {"content": "x" * 20000},
                                                "logprobs": {"content": tokens}, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 20000, "total_tokens": 20007,
                                 "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
    assert len(body) > 4 * 1024 * 1024
    outcome = scanned(body)
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason) == (7, 20000, "length")


def test_usage_written_by_the_model_inside_its_answer_is_not_taken_for_the_real_one():
    forged = '"usage": {"prompt_tokens": 0, "completion_tokens": 0}'
    body = json.dumps({"choices": [{"message": {"content": forged}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 9}}).encode()
    assert scanned(body).completion_tokens == 9
    first = json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 9},
                        "choices": [{"message": {"content": forged}}]}).encode()
    assert scanned(first).completion_tokens == 9


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": "5", "completion_tokens": 9},
    {"prompt_tokens": 5, "completion_tokens": 9.0},
    {"prompt_tokens": True, "completion_tokens": 9},
    {"prompt_tokens": -5, "completion_tokens": 9},
    {"prompt_tokens": 10 ** 30, "completion_tokens": 9},
    {"prompt_tokens": None, "completion_tokens": 9},
    [5, 9],
])
def test_usage_that_is_not_plain_counts_is_ignored(usage):
    outcome = scanned(json.dumps({"choices": [], "usage": usage}).encode())
    assert outcome.prompt_tokens is None and outcome.completion_tokens is None


def test_an_embedding_usage_has_no_completion_tokens():
    outcome = scanned(b'{"data": [], "usage": {"prompt_tokens": 4, "total_tokens": 4}}')
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (4, 0)
