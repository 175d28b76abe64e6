"""A streaming client that stops reading is cut off within `timeouts.client_send_s`, and its request handed back
(concurrency slot, token reservation, on Redis its lease) first: raw sockets against a real gateway and runtime."""
import json
import socket
import time

import httpx
import pytest
import redis as redis_client

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-stall"
SEND_S = 2
# Large events (20 alternatives per token), so the stream soon fills every buffer between it and the client.
STREAM = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1500, "n": 8,
          "ignore_eos": True, "logprobs": True, "top_logprobs": 20, "stream": True}


def stalled_stream(port: int, path: str = "/v1/chat/completions", body: dict = STREAM) -> socket.socket:
    """A client with a tiny receive buffer that sends its request, reads the first bytes, then reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nhost: g\r\nauthorization: Bearer {KEY}\r\n"
                 f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
    assert sock.recv(12).startswith(b"HTTP/1.1 200")
    return sock


def cut_off(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closed the connection (read what is buffered until EOF or a reset)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def served(url: str) -> int:
    return httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=60,
                      json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
                      ).status_code


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_client_that_stops_reading_is_cut_off_and_its_request_handed_back(store, tiny_runtimes, start_gateway,
                                                                           request):
    overrides = {"timeouts": {"client_send_s": SEND_S}}
    if store == "redis":
        redis = request.getfixturevalue("redis_server")
        overrides["redis"] = {"url": redis.url, "on_failure": "closed", "timeout_s": 10}
    tenant = f"stall-{store}"
    config = gateway_config([{"name": tenant, "keys": [key_entry("k", KEY)], "models": ["*"],
                              "limits": {"max_concurrent": 1, "tokens_per_minute": 1_000_000}}], **overrides)
    runtime = tiny_runtimes[0]
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", runtime.url)]}))
    port = int(gateway.url.rsplit(":", 1)[1])
    sock = stalled_stream(port)
    try:
        assert served(gateway.url) == 429  # the stalled stream holds the tenant's one slot
        started = time.monotonic()
        # Reading nothing: once the buffers are full the stream waits client_send_s, then the slot is free again,
        # well before the request's total_s or a Redis lease's TTL.
        while served(gateway.url) != 200:
            assert time.monotonic() - started < 60, "the gateway kept a client that reads nothing"
            time.sleep(1)
        assert cut_off(sock, timeout=10), "the connection of the client that read nothing is still open"
        if store == "redis":
            leases = redis_client.Redis.from_url(redis.url).zcard(f"sluice:limits:{{{tenant}}}:leases")
            assert leases == 0
        # The upstream request was closed too: the runtime is not left generating for nobody.
        deadline = time.monotonic() + 30
        while httpx.get(f"{runtime.url}/load", timeout=10).json()["running"]:
            assert time.monotonic() < deadline, "the runtime still runs the abandoned stream"
            time.sleep(0.2)
        line = next(line for line in gateway.log_lines() if line.get("status") == 499)
        assert line["tenant"] == tenant
    finally:
        sock.close()
