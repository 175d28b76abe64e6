"""Clients cannot hold the gateway's connections open for free: trickled requests and idle sockets are cut."""
import http.client
import json
import socket
import time
from urllib.parse import urlsplit

import pytest

from fixtures.gateway import gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-deadlines"
CONFIG = gateway_config([{"name": "t", "keys": [key_entry("k", KEY)]}],
                        timeouts={"request_read_s": 1.0, "keep_alive_s": 1.0})
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def connect(gateway) -> socket.socket:
    parts = urlsplit(gateway.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


def trickle(sock: socket.socket, data: bytes, seconds: float) -> bool:
    """Send `data` a byte at a time for up to `seconds`; False once the gateway has closed the connection."""
    deadline = time.monotonic() + seconds
    for byte in data:
        if time.monotonic() > deadline:
            return True
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return False
        time.sleep(0.1)
    return True


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def answer(raw: bytes) -> tuple[int, dict, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_a_body_sent_byte_by_byte_gets_408_and_the_connection_closes(start_gateway):
    gateway = start_gateway(CONFIG, table())
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                     + f"authorization: Bearer {KEY}\r\ncontent-length: {len(BODY)}\r\n\r\n".encode())
        trickle(sock, BODY, seconds=3)
        status, headers, body = answer(read_all(sock))  # read_all returns only once the gateway hung up
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "request_timeout" and set(body["error"]) == {"message", "type", "param", "code"}


def test_headers_sent_byte_by_byte_get_408_and_the_connection_closes(start_gateway):
    gateway = start_gateway(CONFIG, table())
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
            + b"x-padding: " + b"a" * 200 + b"\r\n\r\n")
    with connect(gateway) as sock:
        trickle(sock, head, seconds=4)
        status, headers, body = answer(read_all(sock))
    assert status == 408 and headers["connection"] == "close" and body["error"]["code"] == "request_timeout"


def health(connection: http.client.HTTPConnection) -> int:
    connection.request("GET", "/health")
    response = connection.getresponse()
    response.read()
    return response.status


@pytest.mark.parametrize("used", [False, True], ids=["never-used", "kept-alive"])
def test_idle_connections_are_closed_after_keep_alive_s(start_gateway, used):
    gateway = start_gateway(CONFIG, table())
    parts = urlsplit(gateway.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.connect()
    if used:
        assert health(connection) == 200
    assert connection.sock.recv(65536) == b"", "the gateway should have closed the idle connection"
    connection.close()


def test_a_steady_client_is_not_cut(start_gateway):
    gateway = start_gateway(CONFIG, table())
    parts = urlsplit(gateway.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.connect()
    sock = connection.sock
    for _ in range(5):  # longer than both deadlines in all, but never idle or slow for long
        assert health(connection) == 200
        time.sleep(0.5)
    assert connection.sock is sock, "one connection throughout"
    connection.close()
