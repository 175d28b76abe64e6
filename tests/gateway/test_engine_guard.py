"""`sluice-engine-guard` in front of a real engine: our own runtime, started without a credential of its own on
loopback, stands in for vLLM. Every path but the probes needs the runtime credential, however it is spelled;
with it, requests (a chat streamed through the official client too) reach the engine and come back as sent."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from fixtures.gateway import TINY_MODEL_NAME, free_port, runtimes
from sluice_contracts.http_bounds import MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES
from sluice_contracts.runtime_credential import OPEN_PATHS

pytestmark = pytest.mark.integration

CREDENTIAL = "guard-credential-1"
ROTATED = "guard-credential-2"
AUTH = {"authorization": f"Bearer {CREDENTIAL}"}

# vLLM's inference paths outside /v1, which its own --api-key leaves open, and the /v1 ones it guards.
ENGINE_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/load_lora_adapter",
                "/invocations", "/pooling", "/classify", "/score", "/rerank", "/v1/rerank", "/v2/rerank",
                "/tokenize", "/detokenize"]
# Spellings that a server decoding or normalising the target might take for a probe, or for another path.
TRICKS = ["/v1/../invocations", "//invocations", "//v1/chat/completions", "/%69nvocations", "/health/../tokenize",
          "/health/..%2ftokenize", "/health%2f..%2ftokenize", "/metrics/%2e%2e/tokenize", "/./tokenize",
          "/health/", "/HEALTH", "/health;/../tokenize", "/health%00", "/metrics%2f", "/load/..", "/ready/."]


@dataclass
class Guard:
    url: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


def _command() -> list[str]:
    script = Path(sys.executable).with_name("sluice-engine-guard")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sluice_gateway.engine_guard"]


@contextlib.contextmanager
def run_guard(upstream: str, credential_file: Path, workdir: Path, *args: str, wait: bool = True) -> Iterator[Guard]:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"guard-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            _command() + ["--host", "127.0.0.1", "--port", str(port), "--upstream", upstream,
                          "--credential-file", str(credential_file), *args],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    guard = Guard(f"http://127.0.0.1:{port}", port, process, log_path)
    try:
        deadline = time.monotonic() + 60
        while wait:
            if process.poll() is not None:
                pytest.fail(f"the engine guard exited with {process.returncode}:\n{guard.log()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the engine guard does not listen after 60 s:\n{guard.log()[-3000:]}")
            time.sleep(0.1)
        yield guard
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def write_secret_volume(directory: Path, credential: str) -> Path:
    """A Secret volume as the kubelet lays it out (api-key -> ..data/api-key, ..data -> a timestamped directory),
    or its update: a new timestamped directory, and ..data swapped to it by rename."""
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.time_ns()}"
    version.mkdir()
    (version / "api-key").write_text(credential + "\n")
    staged = directory / "..data_tmp"
    staged.symlink_to(version.name)
    os.replace(staged, directory / "..data")
    key = directory / "api-key"
    if not key.is_symlink():
        key.symlink_to("..data/api-key")
    return key


def raw_request(port: int, head: str, body: bytes = b"", timeout: float = 30) -> tuple[int, bytes, bytes]:
    """Send `head` (request line and fields, without the blank line) as written, and read the answer to its end:
    status, header block, body (the guard's own answers carry a length; the connection is closed after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\nconnection: close\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_block, _, rest = data.partition(b"\r\n\r\n")
    return int(head_block.split(b" ", 2)[1]), head_block, rest


def assert_refused(status: int, body: bytes) -> None:
    assert status == 401, body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


def reached_engine(engine, request_id: str, timeout: float = 10) -> bool:
    """Whether the runtime logged a request carrying this x-request-id (it logs one line per request)."""
    deadline = time.monotonic() + timeout
    while True:
        if any(line.get("client_request_id") == request_id for line in engine.request_log()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with runtimes(tiny_model_dir, 1) as servers:
        yield servers[0]


@pytest.fixture(scope="module")
def secret_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("guard-secret") / "runtime-credential"
    write_secret_volume(directory, CREDENTIAL)
    return directory


@pytest.fixture(scope="module")
def guard(engine, secret_dir, tmp_path_factory) -> Iterator[Guard]:
    with run_guard(engine.url, secret_dir / "api-key", tmp_path_factory.mktemp("guard")) as running:
        yield running


@pytest.mark.parametrize("path", ENGINE_PATHS + TRICKS)
def test_every_path_but_the_probes_is_refused_without_the_credential(guard, engine, path):
    request_id = f"refused-{uuid.uuid4().hex[:12]}"
    for head in (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-request-id: {request_id}\r\n"
                 "content-type: application/json\r\ncontent-length: 2",
                 f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-request-id: {request_id}"):
        status, _, body = raw_request(guard.port, head, b"{}" if head.startswith("POST") else b"")
        assert_refused(status, body)
    assert not reached_engine(engine, request_id, timeout=0.2)


def test_a_refused_client_is_not_read_further(guard):
    """A refusal closes the connection: a body declared as 1 GiB behind it is not read and dropped."""
    with socket.create_connection(("127.0.0.1", guard.port), timeout=10) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nhost: x\r\ncontent-length: 1073741824\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower()


@pytest.mark.parametrize("head", [
    # An absolute URI, and Host headers naming the engine itself or localhost: none of them opens a path.
    "POST http://127.0.0.1/tokenize HTTP/1.1\r\nhost: 127.0.0.1",
    "POST http://localhost/health/../tokenize HTTP/1.1\r\nhost: localhost",
    "POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1:8001",
    "POST /tokenize HTTP/1.1\r\nhost: localhost",
    "POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nx-forwarded-for: 127.0.0.1\r\nx-real-ip: 127.0.0.1",
    # Probe methods other than reading are not open either, nor is a credential that is not the Bearer form.
    "POST /health HTTP/1.1\r\nhost: 127.0.0.1",
    "PUT /metrics HTTP/1.1\r\nhost: 127.0.0.1",
    f"POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: {CREDENTIAL}",
    f"POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {CREDENTIAL}x",
    f"POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: bearer {CREDENTIAL}",
    f"POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {CREDENTIAL}",
    "POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ",
])
def test_a_host_an_absolute_uri_or_a_method_opens_nothing(guard, engine, head):
    request_id = f"refused-{uuid.uuid4().hex[:12]}"
    status, _, body = raw_request(guard.port, f"{head}\r\nx-request-id: {request_id}\r\ncontent-length: 2", b"{}")
    assert_refused(status, body)
    assert not reached_engine(engine, request_id, timeout=0.2)


def test_two_authorization_headers_are_refused_even_if_one_is_right(guard):
    status, _, body = raw_request(guard.port, "POST /tokenize HTTP/1.1\r\nhost: x\r\n"
                                  f"authorization: Bearer {CREDENTIAL}"
                                  "\r\nauthorization: Bearer nope\r\ncontent-length: 2", b"{}")
    assert_refused(status, body)
    assert "exactly one Authorization header" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("path", ENGINE_PATHS)
def test_with_the_credential_every_path_reaches_the_engine(guard, engine, path):
    request_id = f"served-{uuid.uuid4().hex[:12]}"
    method = "GET" if path == "/v1/models" else "POST"
    response = httpx.request(method, f"{guard.url}{path}", headers={**AUTH, "x-request-id": request_id},
                             json=None if method == "GET" else {"model": TINY_MODEL_NAME}, timeout=60)
    direct = httpx.request(method, f"{engine.url}{path}", headers={"x-request-id": request_id + "-direct"},
                           json=None if method == "GET" else {"model": TINY_MODEL_NAME}, timeout=60)
    # Whatever the engine answers (our runtime has no /invocations: 404), the guard passes on as it is.
    assert response.status_code == direct.status_code != 401
    assert reached_engine(engine, request_id)


def test_the_engines_answers_come_back_as_sent(guard, engine):
    body = {"model": TINY_MODEL_NAME, "prompt": "hello there, engine"}
    through = httpx.post(f"{guard.url}/tokenize", json=body, headers=AUTH, timeout=30)
    direct = httpx.post(f"{engine.url}/tokenize", json=body, timeout=30)
    assert through.status_code == 200 and through.json() == direct.json()
    assert through.json()["count"] > 3
    # The query string goes along, and an error answer comes back with its status and JSON.
    missing = httpx.get(f"{guard.url}/v1/models/nope?x=1", headers=AUTH, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_chunked_body_and_a_large_answer_pass_whole(guard, engine):
    prompt = "many words in a row " * 30000  # an answer of many reads: ~120,000 token ids
    def chunks():
        text = json.dumps({"model": TINY_MODEL_NAME, "prompt": prompt}).encode()
        for start in range(0, len(text), 7000):
            yield text[start:start + 7000]
    through = httpx.post(f"{guard.url}/tokenize", content=chunks(), timeout=60,
                         headers={**AUTH, "content-type": "application/json"})
    direct = httpx.post(f"{engine.url}/tokenize", json={"model": TINY_MODEL_NAME, "prompt": prompt}, timeout=60)
    assert through.status_code == 200, through.text
    assert len(through.content) > 256 * 1024 and through.json() == direct.json()


@pytest.mark.parametrize("path", sorted(OPEN_PATHS))
def test_the_probe_and_scrape_paths_pass_without_the_credential(guard, engine, path):
    through = httpx.get(f"{guard.url}{path}", timeout=30)
    direct = httpx.get(f"{engine.url}{path}", timeout=30)
    assert through.status_code == direct.status_code
    if path == "/metrics":
        assert "vllm:" in through.text or "sluice" in through.text
    else:
        assert through.headers["content-type"] == direct.headers["content-type"]
    head = httpx.head(f"{guard.url}{path}", timeout=30)
    assert head.status_code in (direct.status_code, 405) and head.content == b""


def test_a_chat_streams_through_the_official_client_as_it_is_generated(guard):
    with openai.OpenAI(base_url=f"{guard.url}/v1", api_key=CREDENTIAL, max_retries=0, timeout=120) as client:
        arrivals, text = [], []
        stream = client.chat.completions.create(
            model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "Count to a hundred."}], max_tokens=200,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = None
        for chunk in stream:
            arrivals.append(time.monotonic())
            text += [c.delta.content or "" for c in chunk.choices]
            usage = chunk.usage or usage
        assert usage is not None and usage.completion_tokens == 200
        # Events came as they were generated, not all at once at the end.
        assert len(arrivals) > 100 and arrivals[-1] - arrivals[0] > 0.05
        whole = client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=5)
        assert whole.usage.completion_tokens == 5
    with openai.OpenAI(base_url=f"{guard.url}/v1", api_key="sk-not-it", max_retries=0, timeout=30) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=5, stream=True)


def test_a_client_that_leaves_mid_stream_ends_the_engines_request(guard, engine):
    request_id = f"left-{uuid.uuid4().hex[:12]}"
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 2000,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{guard.url}/v1/chat/completions", json=body, timeout=60,
                      headers={**AUTH, "x-request-id": request_id}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    left = time.monotonic()
    while not reached_engine(engine, request_id, timeout=0):
        assert time.monotonic() - left < 10, "the engine still runs the request of a client that left"
        time.sleep(0.05)
    line = next(line for line in engine.request_log() if line.get("client_request_id") == request_id)
    assert line["cancelled"] and line["status"] == 499
    assert httpx.get(f"{engine.url}/load", timeout=10).json()["running"] == 0


def test_an_engine_that_dies_mid_stream_cuts_the_clients_stream_too(spare_runtime, secret_dir, tmp_path):
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 2000,
            "ignore_eos": True, "stream": True}
    with run_guard(spare_runtime.url, secret_dir / "api-key", tmp_path) as guard:
        with httpx.stream("POST", f"{guard.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            spare_runtime.process.kill()
            # The client sees a cut, not a stream that looks complete ("data: [DONE]" and the chunked end).
            with pytest.raises(httpx.RemoteProtocolError):
                for line in lines:
                    assert line != "data: [DONE]"
        assert "the engine closed the connection mid-response" in guard.log()
        assert "Traceback" not in guard.log()


def test_a_rotated_credential_file_takes_effect_and_the_old_one_lapses(engine, tmp_path):
    directory = tmp_path / "runtime-credential"
    key = write_secret_volume(directory, CREDENTIAL)
    with run_guard(engine.url, key, tmp_path, "--credential-grace-s", "3") as guard:
        def status(credential: str) -> int:
            return httpx.post(f"{guard.url}/tokenize", json={"prompt": "x"}, timeout=30,
                              headers={"authorization": f"Bearer {credential}"}).status_code
        assert (status(CREDENTIAL), status(ROTATED)) == (200, 401)
        write_secret_volume(directory, ROTATED)
        assert (status(ROTATED), status(CREDENTIAL)) == (200, 200)  # the replaced one, within its grace
        time.sleep(3.5)
        assert (status(ROTATED), status(CREDENTIAL)) == (200, 401)
        # A Secret caught mid-write (empty) keeps the credential in force.
        version = (directory / "..data").resolve()
        (version / "api-key").write_text("")
        assert status(ROTATED) == 200
        assert "keeping the runtime credential in force" in guard.log()


def test_bodies_over_the_limit_are_refused_however_they_are_sent(engine, secret_dir, tmp_path):
    with run_guard(engine.url, secret_dir / "api-key", tmp_path, "--max-body-bytes", "4096") as guard:
        small = httpx.post(f"{guard.url}/tokenize", json={"prompt": "x" * 3000}, headers=AUTH, timeout=30)
        assert small.status_code == 200
        declared = httpx.post(f"{guard.url}/tokenize", json={"prompt": "x" * 5000}, headers=AUTH, timeout=30)

        def chunks():
            yield b'{"prompt": "'
            for _ in range(8):
                yield b"x" * 1024
            yield b'"}'
        chunked = httpx.post(f"{guard.url}/tokenize", content=chunks(), timeout=30,
                             headers={**AUTH, "content-type": "application/json"})
        for response in (declared, chunked):
            assert response.status_code == 413, response.text
            error = response.json()["error"]
            assert error["code"] == "request_too_large" and "4096 bytes" in error["message"]
        # Without the credential a large body is not even read: the refusal is the credential's.
        assert httpx.post(f"{guard.url}/tokenize", json={"prompt": "x" * 5000}, timeout=30).status_code == 401


def test_request_heads_are_bounded(guard):
    fields = "".join(f"\r\nx-field-{i}: {i}" for i in range(MAX_HEADER_COUNT + 1))
    status, _, _ = raw_request(guard.port, f"GET /health HTTP/1.1\r\nhost: x{fields}")
    assert status == 431
    status, _, _ = raw_request(guard.port, f"GET /health?{'q' * MAX_REQUEST_LINE_BYTES} HTTP/1.1\r\nhost: x")
    assert status == 414
    # One endless header line: cut off after about the bound, not buffered until it ends. The client's own send
    # buffer is kept small, so that what was sent counts what the guard took in, not what the kernel holds.
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", guard.port))
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-long: ")
        with contextlib.suppress(OSError):
            while sent < 16 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 431") and sent < 4 * 1024 * 1024
    assert httpx.get(f"{guard.url}/health", timeout=10).status_code == 200


def test_an_engine_that_cannot_be_reached_is_a_502_in_openai_shape(secret_dir, tmp_path):
    with run_guard(f"http://127.0.0.1:{free_port()}", secret_dir / "api-key", tmp_path) as guard:
        for response in (httpx.post(f"{guard.url}/v1/chat/completions", json={}, headers=AUTH, timeout=30),
                         httpx.get(f"{guard.url}/health", timeout=30)):
            assert response.status_code == 502
            error = response.json()["error"]
            assert error["code"] == "engine_unreachable" and "cannot be reached" in error["message"]
        assert "Traceback" not in guard.log()


@pytest.mark.parametrize("args, message", [
    (["--credential-file", "/nonexistent/api-key"], "cannot read the credential file /nonexistent/api-key"),
    (["--upstream", "https://127.0.0.1:8001"], "must look like http://HOST:PORT"),
    (["--upstream", "http://127.0.0.1"], "must name the engine's port"),
    (["--upstream", "http://127.0.0.1:8001/v1"], "must look like http://HOST:PORT"),
    (["--max-body-bytes", "0"], "--max-body-bytes: must be a positive int"),
    (["--max-body-bytes", "lots"], "--max-body-bytes: must be a positive int"),
    (["--credential-grace-s", "-1"], "--credential-grace-s: must be a positive float"),
    (["--port", "70000"], "--port must be a port number"),
])
def test_a_bad_command_line_stops_the_start_with_why(secret_dir, args, message):
    flags = {"--port": "0", "--upstream": "http://127.0.0.1:8001", "--credential-file": str(secret_dir / "api-key"),
             **dict(zip(args[::2], args[1::2]))}
    command = _command() + [part for pair in flags.items() for part in pair]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
