"""A request's head (request line, header count, header bytes) is bounded on both of the gateway's ports before
any key is looked at: tried by a client with no key, raw sockets, against a real gateway process."""
import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_contracts.http_bounds import MAX_HEADER_BYTES, MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES

pytestmark = pytest.mark.integration

KEY = "sk-test-head"


@pytest.fixture(scope="module")
def gateway(tiny_runtimes, tmp_path_factory):
    from fixtures.gateway import run_gateway

    config = gateway_config([{"name": "t", "keys": [key_entry("t-key", KEY)], "models": ["*"]}])
    routes = table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]})
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def exchange(port: int, head: bytes, *, chunk: int = 64 * 1024) -> tuple[int | None, bytes, bool]:
    """Send `head` (in chunks, as a flood would), then read until the server closes: (status, body, closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for at in range(0, len(head), chunk):
                sock.sendall(head[at:at + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading and closed: what is wanted
        data = b""
        try:
            while part := sock.recv(65536):
                data += part
            closed = True
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False
    if not data:
        return None, b"", closed
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2], closed


def head(target: str = "/v1/chat/completions", headers: list[tuple[str, str]] = (), method: str = "POST") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "host: gateway", *(f"{n}: {v}" for n, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def cases() -> dict[str, tuple[bytes, int]]:
    filler = "x" * 1000
    return {
        "request_line": (head("/v1/chat/completions?" + "a" * MAX_REQUEST_LINE_BYTES), 414),
        "header_count": (head(headers=[(f"x-h{i}", "1") for i in range(MAX_HEADER_COUNT + 1)]), 431),
        "header_bytes": (head(headers=[(f"x-h{i}", filler) for i in range(MAX_HEADER_BYTES // 1000 + 1)]), 431),
        "one_huge_header": (head(headers=[("x-huge", "y" * (16 * 1024 * 1024))]), 431),
        "unknown_path": (head("/nowhere", headers=[(f"x-h{i}", "1") for i in range(MAX_HEADER_COUNT + 1)],
                              method="GET"), 431),
    }


@pytest.mark.parametrize("case", list(cases()))
@pytest.mark.parametrize("listener", ["api", "metrics"])
def test_a_head_past_a_bound_is_refused_and_the_connection_closed(gateway, listener, case):
    request, expected = cases()[case]
    port = port_of(gateway.url if listener == "api" else gateway.metrics_url)
    status, body, closed = exchange(port, request)
    assert (status, closed) == (expected, True), (listener, case, status, body[:200])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("listener", ["api", "metrics"])
def test_a_head_within_the_bounds_is_served(gateway, listener):
    # Near every bound at once: the count, the bytes, the request line (httpx adds up to 10 headers of its own).
    count = MAX_HEADER_COUNT - 10
    per = (MAX_HEADER_BYTES - 1000) // count
    headers = {f"x-h{i}": "v" * (per - len(f"x-h{i}")) for i in range(count)}
    if listener == "api":
        response = httpx.post(f"{gateway.url}/v1/chat/completions?" + "a" * (MAX_REQUEST_LINE_BYTES - 100),
                              json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
                              headers={"authorization": f"Bearer {KEY}", **headers}, timeout=60)
    else:
        response = httpx.get(f"{gateway.metrics_url}/metrics", headers=headers, timeout=60)
    assert response.status_code == 200, response.text[:300]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_flood_of_header_bytes_does_not_grow_the_gateway(gateway):
    """Four connections sending 64 MiB of header lines each, before any key: each is cut off early."""
    before = rss_kib(gateway.process.pid)
    started = time.monotonic()
    flood = head(headers=[(f"x-{i}", "z" * 8000) for i in range(8 * 1024)])  # 64 MiB
    for port in (port_of(gateway.url), port_of(gateway.metrics_url)) * 2:
        status, _, closed = exchange(port, flood)
        assert (status, closed) == (431, True)
    assert time.monotonic() - started < 30
    assert rss_kib(gateway.process.pid) - before < 16 * 1024


def test_a_body_arriving_with_the_end_of_its_head_is_read_as_body(gateway):
    """A large body in the same write as the head's end, after a request line sent alone, is not head."""
    body = json.dumps({"model": "tiny", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "Hi"}], "metadata": {"pad": "p" * 200_000}}).encode()
    request = head(headers=[("authorization", f"Bearer {KEY}"), ("content-type", "application/json"),
                            ("content-length", str(len(body)))]) + body
    line_end = request.index(b"\r\n") + 2
    with socket.create_connection(("127.0.0.1", port_of(gateway.url)), timeout=60) as sock:
        sock.sendall(request[:line_end])
        time.sleep(0.2)
        sock.sendall(request[line_end:])
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200"), data[:300]
