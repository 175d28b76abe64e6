"""A model at zero: the gateway holds its requests, signals the demand, and forwards them once an endpoint appears.

Real processes: a gateway whose routing table lists the model with no endpoint (as the operator publishes a model
scaled to zero), then, as the operator does once a replica is ready, the same table with a runtime's endpoint.
"""
import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
from pydantic import ValidationError

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_gateway.config import GatewayConfig

pytestmark = pytest.mark.integration

KEY = "sk-test-cold-start"
HEADERS = {"authorization": f"Bearer {KEY}"}
TENANTS = [{"name": "t", "keys": [key_entry("k", KEY)]}]
KEEPALIVE = ": waiting for model to start"
AT_ZERO = table(1, tiny={"backends": [backend("tiny-im")]})


def started(url: str, generation: int = 2) -> dict:
    return table(generation, tiny={"backends": [backend("tiny-im", url)]})


def config(**cold_start) -> dict:
    return gateway_config(TENANTS, routing={"reload_interval_s": 0.1}, cold_start=cold_start,
                          shutdown={"ready_grace_s": 0, "drain_s": 5})


def chat(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 4, **extra}


def wait_until(condition, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


class Held:
    """One request in a thread of its own, as a client sees it: when its headers came, its lines, its status."""

    def __init__(self, url: str, *, stream: bool, **extra) -> None:
        self.stream, self.lines, self.status, self.headers_at, self.error = stream, [], None, None, None
        self.extra = extra
        self.headers: dict = {}
        self.body = b""
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", headers=HEADERS, timeout=120,
                              json=chat(stream=self.stream, **self.extra)) as response:
                self.headers_at, self.status, self.headers = time.monotonic(), response.status_code, response.headers
                if self.stream:
                    for line in response.iter_lines():
                        if line:
                            self.lines.append((time.monotonic(), line))
                else:
                    self.body = response.read()
        except httpx.HTTPError as exc:
            self.error = exc

    def join(self) -> "Held":
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the request never ended"
        return self


def test_held_requests_are_answered_once_an_endpoint_appears(tiny_runtimes, start_gateway):
    gateway = start_gateway(config(keepalive_s=0.3, max_wait_s=60), AT_ZERO)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=120)
    assert "tiny" in {m.id for m in client.models.list().data}, "a model at zero stays listed"

    plain = [Held(gateway.url, stream=False) for _ in range(2)]
    streams = [Held(gateway.url, stream=True) for _ in range(2)]
    refused = Held(gateway.url, stream=True, temperature=-1)  # the runtime will refuse it, after the hold
    answers: list = []
    official = threading.Thread(target=lambda: answers.append(list(client.chat.completions.create(**chat(stream=True)))))
    official.start()
    # The demand signal the operator reads: held requests per model, by the routing table's backend name.
    wait_until(lambda: gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 6, "6 held requests")
    wait_until(lambda: all(sum(KEEPALIVE == line for _, line in s.lines) >= 2 for s in streams),
               "streams to get keepalive comments")
    time.sleep(0.5)
    assert all(p.headers_at is None for p in plain), "a held non-streaming request gets nothing until its answer"
    assert all(s.status == 200 and s.headers["content-type"].startswith("text/event-stream") for s in streams)

    appeared = time.monotonic()
    gateway.write_routes(started(tiny_runtimes[0].url))
    for request in plain + streams + [refused]:
        request.join()
    official.join(timeout=120)
    # Its headers (200) went out while it was held: the runtime's 400 is the stream's last event, in API shape.
    assert refused.status == 200 and refused.lines[-1][1].startswith('data: {"error"')
    assert '"type": "invalid_request_error"' in refused.lines[-1][1] and "temperature" in refused.lines[-1][1]

    for request in plain:
        assert request.status == 200 and request.headers_at > appeared, request.body
        assert httpx.Response(200, content=request.body).json()["choices"][0]["message"]["content"] is not None
    for request in streams:
        assert request.lines[-1][1] == "data: [DONE]"
        data = [line for _, line in request.lines if line.startswith("data: {")]
        assert data and all(at > appeared for at, line in request.lines if line.startswith("data: "))
        assert '"error"' not in "".join(data)
    (chunks,) = answers
    assert chunks and chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason, "the official client reads it"
    assert gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 0
    assert gateway.metric("sluice_gateway_hold_seconds_count", backend="tiny-im", outcome="forwarded") == 6
    held_ms = [line["held_ms"] for line in gateway.log_lines() if line.get("route") == "tiny"]
    assert len(held_ms) == 6 and all(ms > 0 for ms in held_ms), held_ms
    # Held no longer: the next request is forwarded at once, with no hold recorded.
    reply = client.chat.completions.create(**chat())
    assert reply.choices[0].message.content is not None
    assert gateway.metric("sluice_gateway_hold_seconds_count", backend="tiny-im") == 6


def test_past_max_held_or_max_wait_the_client_gets_503_saying_the_model_is_starting(start_gateway):
    # Alone, the tenant may fill half of the hold (fair_holds.py; test_gateway_fair_holds.py for several tenants).
    gateway = start_gateway(config(max_held_per_model=4, max_wait_s=2, retry_after_s=7, keepalive_s=0.5), AT_ZERO)
    held = [Held(gateway.url, stream=False), Held(gateway.url, stream=True)]
    wait_until(lambda: gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 2, "2 held requests")

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**chat())
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "7"
    error = refused.value.response.json()["error"]
    assert error["code"] == "model_starting" and error["type"] == "service_unavailable"
    assert "'tiny-im' is starting" in error["message"] and "already take your share" in error["message"]

    plain, stream = (request.join() for request in held)
    assert plain.status == 503 and plain.headers["retry-after"] == "7"
    assert "did not start within 2 s" in httpx.Response(503, content=plain.body).json()["error"]["message"]
    # The stream's headers went out when it was held: its 503 is its last event, as the OpenAI client reads errors.
    assert stream.status == 200 and stream.lines[0][1] == KEEPALIVE
    assert '"code": "model_starting"' in stream.lines[-1][1] and "did not start within 2 s" in stream.lines[-1][1]
    with pytest.raises(openai.APIError, match="did not start within 2 s"):
        list(client.chat.completions.create(**chat(stream=True)))
    assert gateway.metric("sluice_gateway_hold_refusals_total", backend="tiny-im", reason="tenant_share") == 1
    assert gateway.metric("sluice_gateway_hold_refusals_total", backend="tiny-im", reason="timeout") == 3
    assert gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 0


def test_max_held_0_refuses_at_once(start_gateway):
    gateway = start_gateway(config(max_held_per_model=0), AT_ZERO)
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", headers=HEADERS, json=chat(stream=True), timeout=10)
    assert reply.status_code == 503 and reply.headers["retry-after"] == "10"
    assert "holds no request while a model starts" in reply.json()["error"]["message"]


def test_a_client_that_leaves_leaves_the_hold(tiny_runtimes, start_gateway):
    gateway = start_gateway(config(keepalive_s=0.2, max_wait_s=60), AT_ZERO)
    host, port = gateway.url.removeprefix("http://").split(":")
    for stream in (True, False):
        body = json.dumps(chat(stream=stream)).encode()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                         b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
            wait_until(lambda: gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 1, "a held request")
        # The client closed its connection: the gateway sees the disconnect and drops the request from the hold.
        wait_until(lambda: gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 0, "the hold to empty")
    assert gateway.metric("sluice_gateway_hold_seconds_count", backend="tiny-im", outcome="client_left") == 2
    gateway.write_routes(started(tiny_runtimes[0].url))
    wait_until(lambda: httpx.post(f"{gateway.url}/v1/chat/completions", headers=HEADERS, json=chat(),
                                  timeout=60).status_code == 200, "the model to serve")
    lines = [line for line in gateway.log_lines() if line.get("route") == "tiny"]
    assert [line["status"] for line in lines[:2]] == [499, 499], "the requests that left are logged as such"
    # A probe sent before the gateway read the new table is held and forwarded too; the two that left never are.
    probes_held = sum(1 for line in lines[2:] if line["status"] == 200 and line["held_ms"] is not None)
    assert gateway.metric("sluice_gateway_hold_seconds_count", backend="tiny-im", outcome="forwarded") == probes_held
    assert gateway.metric("sluice_gateway_hold_seconds_count", backend="tiny-im", outcome="client_left") == 2


def test_a_stopping_gateway_answers_its_held_requests_503(start_gateway):
    gateway = start_gateway(config(keepalive_s=0.5, max_wait_s=60, retry_after_s=3), AT_ZERO)
    plain, stream = Held(gateway.url, stream=False), Held(gateway.url, stream=True)
    wait_until(lambda: gateway.metric("sluice_gateway_held_requests", backend="tiny-im") == 2, "2 held requests")
    gateway.process.send_signal(signal.SIGTERM)
    plain.join(), stream.join()
    assert plain.status == 503 and plain.headers["retry-after"] == "3"
    assert "shutting down" in httpx.Response(503, content=plain.body).json()["error"]["message"]
    assert "shutting down" in stream.lines[-1][1] and '"model_starting"' in stream.lines[-1][1]
    assert gateway.process.wait(timeout=30) is not None


@pytest.mark.parametrize("field, value, message", [
    ("max_wait_s", 0, "greater than 0"),
    ("max_wait_s", -5, "greater than 0"),
    ("max_wait_s", 1e9, "less than or equal to 3600"),
    ("max_wait_s", "inf", "finite number"),
    ("max_wait_s", None, "valid number"),
    ("max_held_per_model", -1, "greater than or equal to 0"),
    ("max_held_per_model", 2.5, "valid integer"),
    ("max_held_per_model", True, "valid integer"),
    ("keepalive_s", 0, "greater than 0"),
    ("keepalive_s", 3600, "less than or equal to 60"),
    ("retry_after_s", 0, "greater than or equal to 1"),
    ("max_wait", 10, "Extra inputs are not permitted"),
])
def test_cold_start_settings_are_validated(field, value, message):
    with pytest.raises(ValidationError, match=message):
        GatewayConfig.model_validate({"cold_start": {field: value}})
