"""Concurrency slots are never lost: not to a Redis reply that came too late, not to a Redis restart, not to a
backend that reports usage in a form nobody can add up. Real gateways, real redis-server processes."""
import contextlib
import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
import redis

from fixtures.gateway import backend, free_port, gateway_config, key_entry, table
from fixtures.loopback_http import LoopbackServer, reply

pytestmark = pytest.mark.integration

KEY = "sk-test-leases"
HEADERS = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def config(redis_url: str | None = None, on_failure: str = "closed", **limits) -> dict:
    tenants = [{"name": "leases", "keys": [key_entry("leases-key", KEY)], "limits": limits}]
    if redis_url is None:
        return gateway_config(tenants)
    return gateway_config(tenants, redis={"url": redis_url, "on_failure": on_failure, "timeout_s": 0.3})


@contextlib.contextmanager
def redis_server(port: int, workdir, *persistence: str):
    """A redis-server on `port` keeping its data in `workdir`, stopped (and its data saved) on exit."""
    process = subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--save", "", *persistence, "--loglevel", "warning"], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                if client.ping():
                    break
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


def hold_redis_busy(client: redis.Redis, seconds: float) -> threading.Thread:
    """Keep the server inside one script for `seconds`: commands sent meanwhile run only after it."""
    script = "local t = redis.call('TIME'); local stop = t[1] * 1000000 + t[2] + ARGV[1] * 1000000; " \
             "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop; return 0"
    thread = threading.Thread(target=client.eval, args=(script, 0, seconds))
    thread.start()
    return thread


def test_an_admission_whose_answer_came_too_late_gives_its_slot_back(tiny_runtimes, start_gateway, tmp_path):
    port = free_port()
    with redis_server(port, tmp_path) as client:
        gateway = start_gateway(config(f"redis://127.0.0.1:{port}/0", max_concurrent=1),
                                table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS).status_code == 200
        busy = hold_redis_busy(client, 1.5)
        time.sleep(0.2)
        # The gateway gives up waiting (fail closed: 503); Redis runs its script afterwards and takes the slot.
        late = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
        assert late.status_code == 503 and late.json()["error"]["code"] == "limiter_unavailable"
        busy.join()
        time.sleep(2.5)  # the gateway hands back what it may have taken, once Redis answers again
        after = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
        assert after.status_code == 200, after.text


def test_a_redis_restart_does_not_bring_back_slots_of_requests_that_ended(tiny_runtimes, start_gateway, tmp_path):
    port = free_port()
    persistence = ("--appendonly", "yes", "--appendfsync", "always")
    gateway = None
    with redis_server(port, tmp_path, *persistence):
        gateway = start_gateway(config(f"redis://127.0.0.1:{port}/0", on_failure="open", max_concurrent=1),
                                table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))
        stream = httpx.stream("POST", f"{gateway.url}/v1/chat/completions", headers=HEADERS, timeout=60,
                              json={**CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True})
        response = stream.__enter__()
        assert response.status_code == 200
        lines = response.iter_lines()
        next(lines)  # admitted: its lease is in Redis, and on disk
    # Redis is down (its data saved) while the request ends: the gateway cannot hand the lease back now.
    assert sum(1 for line in lines if line.startswith("data: {")) > 100
    stream.__exit__(None, None, None)
    with redis_server(port, tmp_path, *persistence) as client:
        assert client.exists("sluice:limits:{leases}:leases"), "the restarted Redis did not load the lease"
        time.sleep(2.5)  # a second to notice Redis is back, and margin
        after = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
        assert after.status_code == 200, after.text
        deadline = time.monotonic() + 10  # that request hands its own lease back just after its response
        while client.exists("sluice:limits:{leases}:leases"):
            assert time.monotonic() < deadline, client.zrange("sluice:limits:{leases}:leases", 0, -1)
            time.sleep(0.05)


class _OddUsageBackend(BaseHTTPRequestHandler):
    """A model server that reports usage nobody can add up (a bug in some other OpenAI-compatible server)."""

    def do_GET(self) -> None:  # noqa: N802 - the gateway polls /load
        self._reply({"waiting": 0, "running": 0, "kv_cache_usage": 0.0, "block_size": 16})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["content-length"]))
        self._reply({"id": "x", "object": "chat.completion", "created": 0, "model": "tiny",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": "12", "completion_tokens": [3], "total_tokens": None}})

    def _reply(self, document: dict) -> None:
        reply(self, 200, json.dumps(document).encode())

    def log_message(self, *args) -> None:
        pass


def test_usage_that_is_not_a_number_does_not_keep_the_slot(start_gateway):
    server = LoopbackServer(_OddUsageBackend)
    try:
        url = server.url
        gateway = start_gateway(config(max_concurrent=1, tokens_per_minute=1000),
                                table(tiny={"backends": [backend("odd", url)]}))
        responses = [httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
                     for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 200], responses[-1].text
        # Nothing it reported can be trusted, so each request was charged its whole reservation.
        remaining = [int(r.headers["x-ratelimit-remaining-tokens"]) for r in responses]
        reservation = 1000 - remaining[0]
        assert remaining == [1000 - reservation, 1000 - 2 * reservation, 1000 - 3 * reservation]
    finally:
        server.close()
