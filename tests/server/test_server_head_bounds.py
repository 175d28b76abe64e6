"""The runtime's serving port bounds a request's head (request line, header count, header bytes) as it arrives,
before the credential is looked at: tried with raw sockets against a real runtime process."""
import json
import socket
import time

import httpx
import openai
import pytest

from sluice_contracts.http_bounds import MAX_HEADER_BYTES, MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES

pytestmark = pytest.mark.integration

FLOOD_BYTES = 64 << 20
CHUNK = 64 << 10


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def head(target: str = "/v1/models", headers=(), method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "host: runtime", *(f"{n}: {v}" for n, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket) -> tuple[int | None, dict | None, bool]:
    """(status, JSON body, closed by the server) of what comes back until the server closes or 10 s pass."""
    data, closed = b"", False
    try:
        while part := sock.recv(65536):
            data += part
        closed = True
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    if not data:
        return None, None, closed
    status_line, _, rest = data.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split(b" ")[1]), json.loads(body) if body.startswith(b"{") else None, closed


def exchange(port: int, request: bytes) -> tuple[int | None, dict | None, bool]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return read_response(sock)


def flood(port: int, first: bytes, line: bytes) -> tuple[int, bool]:
    """Sends `first`, then `line` over and over up to FLOOD_BYTES: (bytes the socket took before the server cut
    it off, whether it did). The client's send buffer is kept small so the count stays close to what the server
    read."""
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        chunk = line * (CHUNK // len(line))
        try:
            sock.sendall(first)
            sent = len(first)
            while sent < FLOOD_BYTES:
                sent += sock.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            return sent, True
        except TimeoutError:
            return sent, False
        status, _, closed = read_response(sock)
        return sent, closed and status is not None


def rss_kib(pid: int) -> int:
    for entry in open(f"/proc/{pid}/status"):
        if entry.startswith("VmRSS:"):
            return int(entry.split()[1])
    raise AssertionError("no VmRSS")


def assert_refused(result, status: int, code: str) -> None:
    got, body, closed = result
    assert got == status and closed, result
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == code


def assert_still_serving(url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        reply = client.chat.completions.create(model="smollm2", max_tokens=2,
                                               messages=[{"role": "user", "content": "hi"}])
    assert reply.usage.completion_tokens >= 1


def test_64_mib_of_header_lines_are_cut_off_after_the_bound_and_the_memory_stays(runtime_server_process):
    server = runtime_server_process
    port = port_of(server.url)
    before = rss_kib(server.process.pid)
    accepted = []
    # Many lines of 1 KiB; one endless header value (a line that never ends); both after a valid first request
    # kept alive on the same connection; the same split into one-byte writes is below.
    many_lines = b"x-fill: " + b"a" * 1014 + b"\r\n"
    for first, line in ((head(method="POST", target="/v1/chat/completions")[:-2], many_lines),
                        (head(method="POST", target="/v1/chat/completions")[:-2] + b"x-endless: ", b"a" * 1024),
                        (head("/health") + head("/health")[:-2], many_lines),
                        (head("/health") + head("/health")[:-2] + b"x-endless: ", b"b" * 1024)):
        sent, cut = flood(port, first, line)
        assert cut, "the server kept reading a 64 MiB head"
        accepted.append(sent)
    grown = rss_kib(server.process.pid) - before
    print(f"bytes each flooding connection could send before the cut: {accepted}; VmRSS grew {grown} KiB")
    # What the server read plus the loopback socket buffers on both sides: far below the flood.
    assert max(accepted) < 8 << 20
    assert grown < 32 << 10, f"the runtime's RSS grew by {grown} KiB over four 64 MiB heads"
    assert_still_serving(server.url)


def test_a_head_just_over_the_byte_bound_is_refused_even_a_byte_at_a_time(runtime_server):
    port = port_of(runtime_server)
    # Names and values together (host's included) one byte past the bound.
    headers = [(f"x-big-{i:02d}", "v" * 1000) for i in range(16)]
    used = len("host") + len("runtime") + sum(len(n) + len(v) for n, v in headers) + len("x-last")
    over = head(headers=headers + [("x-last", "w" * (MAX_HEADER_BYTES + 1 - used))])
    assert_refused(exchange(port, over), 431, "request_headers_too_large")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i in range(len(over)):
            sock.send(over[i:i + 1])
        assert_refused(read_response(sock), 431, "request_headers_too_large")
    assert_still_serving(runtime_server)


def test_a_head_just_under_the_bounds_is_served(runtime_server):
    port = port_of(runtime_server)
    # MAX_HEADER_COUNT fields in all (host included), their names and values MAX_HEADER_BYTES bytes together.
    count = MAX_HEADER_COUNT - 1
    names = [f"x-f-{i:03d}" for i in range(count)]
    budget = MAX_HEADER_BYTES - len("host") - len("runtime") - sum(map(len, names))
    values = [("v" * (budget // count + (1 if i < budget % count else 0))) for i in range(count)]
    assert sum(map(len, names)) + sum(map(len, values)) + len("host") + len("runtime") == MAX_HEADER_BYTES
    status, body, _ = exchange(port, head(headers=list(zip(names, values))))
    assert status == 200 and body["data"][0]["id"] == "smollm2"
    # A request line of exactly the bound: "GET " + target + " HTTP/1.1".
    target = "/v1/models?pad=" + "p" * (MAX_REQUEST_LINE_BYTES - len("GET  HTTP/1.1") - len("/v1/models?pad="))
    status, body, _ = exchange(port, head(target=target))
    assert status == 200 and body["data"][0]["id"] == "smollm2"


def test_a_body_arriving_with_its_head_is_not_counted_as_head(runtime_server):
    """A body far larger than the head bounds, in the same write as the head's end (and after a request line sent
    alone), is read as body."""
    port = port_of(runtime_server)
    body = json.dumps({"prompt": "word " * 40_000}).encode()
    # The server closes once it has answered; a client that shut its own side instead would read as gone.
    request = head(method="POST", target="/tokenize", headers=[("content-type", "application/json"),
                                                                ("content-length", str(len(body))),
                                                                ("connection", "close")]) + body
    line_end = request.index(b"\r\n") + 2
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request[:line_end])
        time.sleep(0.2)
        sock.sendall(request[line_end:])
        status, answer, _ = read_response(sock)
    assert status == 200 and answer["count"] >= 40_000


def test_too_many_small_headers_are_refused(runtime_server):
    port = port_of(runtime_server)
    # One field past the count ("host" is one), each a few bytes, far below the byte bound.
    headers = [(f"x-h{i}", "1") for i in range(MAX_HEADER_COUNT)]
    assert_refused(exchange(port, head(headers=headers)), 431, "request_headers_too_large")
    # The same count with a body and an unauthenticated POST: refused before any route.
    post = head(method="POST", target="/v1/chat/completions",
                headers=[("content-type", "application/json"), ("content-length", "2")]
                + [(f"x-h{i}", "1") for i in range(MAX_HEADER_COUNT - 2)]) + b"{}"
    assert_refused(exchange(port, post), 431, "request_headers_too_large")
    assert_still_serving(runtime_server)


def test_a_huge_request_target_is_refused_with_414(runtime_server):
    port = port_of(runtime_server)
    target = "/v1/models?pad=" + "p" * (MAX_REQUEST_LINE_BYTES - len("GET  HTTP/1.1") - len("/v1/models?pad=") + 1)
    assert_refused(exchange(port, head(target=target)), 414, "request_line_too_long")
    sent, cut = flood(port, b"GET /v1/models?pad=", b"p" * 1024)
    assert cut and sent < 8 << 20
    # A longer method name does not buy a longer target.
    long_method = head(method="PROPPATCH", target=target[:-len("PROPPATCH") + len("GET")])
    assert_refused(exchange(port, long_method), 414, "request_line_too_long")
    assert_still_serving(runtime_server)


def test_a_refusal_is_quick_and_a_new_connection_is_served_at_once(runtime_server):
    port = port_of(runtime_server)
    started = time.monotonic()
    for _ in range(5):
        assert_refused(exchange(port, head(headers=[(f"x-h{i}", "1") for i in range(MAX_HEADER_COUNT)])), 431,
                       "request_headers_too_large")
        assert httpx.get(f"{runtime_server}/health", timeout=10).status_code == 200
    assert time.monotonic() - started < 30
