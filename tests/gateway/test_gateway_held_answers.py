"""Whole non-streaming answers held at once are bounded across requests (`max_held_response_bytes`): past the
bound an answer is passed through as it arrives, whole and correct, its usage still charged. A real gateway and
runtime, several large answers at once, chat and embeddings."""
import asyncio
import json
from pathlib import Path

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-held"
HELD_LIMIT = 256 * 1024
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 60, "n": 4,
        "ignore_eos": True, "logprobs": True, "top_logprobs": 20}
EMBED = {"model": "tiny", "input": ["a"] * 512}


def rss_kib(pid: int) -> int:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1])


def test_large_answers_at_once_are_passed_through_past_the_bound(tiny_runtimes, start_gateway):
    config = gateway_config([{"name": "t", "keys": [key_entry("k", KEY)], "models": ["*"]}],
                            max_held_response_bytes=HELD_LIMIT)
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", *(r.url for r in tiny_runtimes))]}))

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=180, headers={"authorization": f"Bearer {KEY}"}) as client:
            return await asyncio.gather(*(
                client.post(f"{gateway.url}{path}", json=body)
                for path, body in [("/v1/chat/completions", CHAT)] * 6 + [("/v1/embeddings", EMBED)] * 4))

    before = rss_kib(gateway.process.pid)
    responses = asyncio.run(many())
    for response in responses:
        assert response.status_code == 200, response.text[:300]
        answer = response.json()  # whole and valid, held or not
        assert answer["usage"]["prompt_tokens"] > 0
    sizes = [len(r.content) for r in responses]
    assert min(sizes) > HELD_LIMIT  # each alone is over the bound: none could be held whole
    assert all("content-length" not in r.headers for r in responses)  # passed through, chunked
    assert gateway.metric("sluice_gateway_responses_passed_through_total") == len(responses)
    # The usage was read from the passed-through answers: charged as served, not as reserved.
    lines = [line for line in gateway.log_lines() if line.get("status") == 200]
    assert len(lines) == len(responses) and all(line["prompt_tokens"] for line in lines)
    assert rss_kib(gateway.process.pid) - before < sum(sizes) // 1024 // 2, (before, sizes)

    # A small answer is still held whole, and says its length.
    small = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert small.status_code == 200, small.text[:300]
    assert int(small.headers["content-length"]) == len(small.content)
    json.loads(small.content)
