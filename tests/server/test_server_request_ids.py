"""A client's x-request-id is echoed and logged but never names the request inside the engine."""
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "smollm2"
TOKENS = 24
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": TOKENS,
        "extra_body": {"ignore_eos": True}}


def log_lines(server, client_id: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 10
    while True:
        lines = [r for r in server.request_log() if r.get("client_request_id") == client_id]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def wait_idle(url: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        load = httpx.get(f"{url}/load").json()
        if (load["running"] == 0 and load["kv_cache_usage"] == 0) or time.monotonic() > deadline:
            return load
        time.sleep(0.05)


def test_two_streams_with_one_id_both_finish_and_leaving_one_spares_the_other(runtime_server_process,
                                                                             runtime_openai):
    headers = {"x-request-id": "shared-stream-id"}
    first = runtime_openai.chat.completions.create(**BODY, stream=True, extra_headers=headers)
    second = runtime_openai.chat.completions.create(**BODY, stream=True, extra_headers=headers,
                                                    stream_options={"include_usage": True})
    assert first.response.headers["x-request-id"] == second.response.headers["x-request-id"] == "shared-stream-id"
    first_chunks, second_chunks = iter(first), iter(second)
    ids = set()
    for _ in range(3):
        ids |= {next(first_chunks).id, next(second_chunks).id}
    assert len(ids) == 2
    first.close()  # the client hangs up on one of the two
    rest = list(second_chunks)
    assert rest[-2].choices[0].finish_reason == "length"
    assert rest[-1].usage.completion_tokens == TOKENS
    load = wait_idle(runtime_server_process.url)
    assert load["running"] == 0 and load["kv_cache_usage"] == 0, load
    lines = log_lines(runtime_server_process, "shared-stream-id", 2)
    assert len(lines) == 2 and lines[0]["request_id"] != lines[1]["request_id"]
    assert sorted(line["status"] for line in lines) == [200, 499]
    finished = next(line for line in lines if line["status"] == 200)
    assert finished["completion_tokens"] == TOKENS and finished["finish_reasons"] == ["length"]


def test_concurrent_requests_with_one_id_are_each_served_in_full(runtime_server_process, runtime_openai):
    headers = {"x-request-id": "shared-id"}

    def ask(_):
        return runtime_openai.chat.completions.with_raw_response.create(**BODY, extra_headers=headers)

    with ThreadPoolExecutor(4) as pool:
        raw = list(pool.map(ask, range(4)))
    assert {r.headers["x-request-id"] for r in raw} == {"shared-id"}
    replies = [r.parse() for r in raw]
    assert [r.usage.completion_tokens for r in replies] == [TOKENS] * 4
    assert len({r.id for r in replies}) == 4
    lines = log_lines(runtime_server_process, "shared-id", 4)
    assert [line["status"] for line in lines] == [200] * 4 and len({line["request_id"] for line in lines}) == 4


def test_requests_without_an_id_get_a_fresh_one_echoed(runtime_server):
    ids = {httpx.get(f"{runtime_server}/v1/models").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("req-") for i in ids)
    odd = httpx.get(f"{runtime_server}/v1/models", headers={"x-request-id": "a" * 200})
    assert odd.headers["x-request-id"].startswith("req-")
