"""Clients that stop reading cost bounded memory, and their requests end after the stream idle timeout.

Twenty streams of 2,048 tokens each whose clients never read (receive buffers as small as the kernel allows):
the server may buffer only what the sockets take plus each request's unread tokens once, and once a write has
waited the idle timeout the request is aborted and its KV blocks freed, with the clients still connected.
The tiny random-weight model makes 40,000 tokens affordable; memory per token does not depend on the weights.
"""
import json
import re
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from fixtures.runtime_server import start_runtime_server

pytestmark = pytest.mark.integration

STREAMS = 20
TOKENS = 2048
IDLE_TIMEOUT_S = 3
MAX_GROWTH_MIB = 100


@pytest.fixture(scope="module")
def server(tiny_long_context_model_dir):
    with start_runtime_server("--stream-idle-timeout", str(IDLE_TIMEOUT_S), "--max-num-seqs", str(STREAMS),
                              "--kv-cache-memory", "64MiB", "--served-model-name", "tiny",
                              model=str(tiny_long_context_model_dir)) as server:
        yield server


def rss_mib(pid: int) -> float:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def counter(url: str, name: str, labels: str = "") -> float:
    """The sum of the samples of `name` whose label set contains `labels`."""
    samples = re.findall(rf"^{re.escape(name)}(\{{[^}}]*\}}) (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    return sum(float(value) for found, value in samples if labels in found)


def stalled_stream(url: str, body: dict) -> socket.socket:
    """Send a streaming request and never read a byte of the answer."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect, so the window stays small
    sock.connect((parts.hostname, parts.port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: runtime\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def test_streams_that_are_never_read_are_aborted_and_cost_bounded_memory(server):
    url, pid = server.url, server.process.pid
    body = {"model": "tiny", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": TOKENS, "ignore_eos": True,
            "stream": True}
    # One stream read to the end first, so lazily built state is in the baseline, not in the growth.
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "max_tokens": 64}, timeout=60) as warm:
        assert warm.read().endswith(b"data: [DONE]\n\n")
    baseline, peak = rss_mib(pid), 0.0
    stalled_before = counter(url, "sluice_runtime_requests_stalled_total")
    aborted_before = counter(url, "vllm:request_success_total", 'finished_reason="abort"')
    served_before = counter(url, "vllm:request_success_total")
    sockets = [stalled_stream(url, body) for _ in range(STREAMS)]
    try:
        deadline = time.monotonic() + 240
        saw_running = False
        while True:
            peak = max(peak, rss_mib(pid))
            load = httpx.get(f"{url}/load").json()
            saw_running |= load["running"] > 0
            stalled = counter(url, "sluice_runtime_requests_stalled_total") - stalled_before
            if saw_running and stalled == STREAMS and load["running"] == load["waiting"] == 0:
                break
            assert time.monotonic() < deadline, f"stalled streams still served: {load}, {stalled} aborted"
            time.sleep(0.2)
        # Aborted while the clients are still connected, not one of them generated to the end.
        assert load["kv_cache_usage"] == 0, load
        assert counter(url, "vllm:request_success_total", 'finished_reason="abort"') - aborted_before == STREAMS
        assert counter(url, "vllm:request_success_total") - served_before == STREAMS
    finally:
        for sock in sockets:
            sock.close()
    growth = peak - baseline
    print(f"runtime RSS: baseline {baseline:.0f} MiB, peak {peak:.0f} MiB, growth {growth:.1f} MiB")
    assert growth < MAX_GROWTH_MIB
    lines = [r for r in server.request_log() if r.get("error_code") == "client_stalled"]
    assert len(lines) == STREAMS and all(r["status"] == 499 for r in lines)
