"""Failures a user would otherwise see: a killed runtime, nothing to serve, clients that leave early."""
import json
import signal
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from fixtures.gateway import ADMIN_KEY, backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-resilience"
HEADERS = {"authorization": f"Bearer {KEY}"}
LONG = {"max_tokens": 1500, "ignore_eos": True}


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 1, **extra}


def tenant(**limits) -> list[dict]:
    return [{"name": "resilience", "keys": [key_entry("res-key", KEY)], "limits": limits}]


def runtime_metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


def wait_for(condition, timeout: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_killed_runtime_is_retried_elsewhere_and_its_route_falls_back(tiny_runtimes, spare_runtime, start_gateway):
    stable, victim = tiny_runtimes[0].url, spare_runtime.url
    routes = table(**{
        "pool": {"backends": [backend("pool", victim, stable)]},
        "canary": {"backends": [backend("victim", victim)], "fallbacks": ["stable"]},
        "stable": {"backends": [backend("stable", stable)]},
    })
    # Polls far apart, so only the passive path (failed attempts) can notice the kill in this test.
    gateway = start_gateway(gateway_config(tenant(), routing={"poll_interval_s": 60, "eject_after_failures": 2}),
                            routes)
    watcher = start_gateway(gateway_config(tenant(), routing={"poll_interval_s": 0.2}), routes)

    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("canary"),
                      headers=HEADERS).headers["x-sluice-backend"] == "victim"
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", headers={**HEADERS, "x-request-id": "cut-off"},
                      json=chat("canary", stream=True, **LONG), timeout=60) as streaming:
        lines = streaming.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        spare_runtime.stop(signal.SIGKILL)
        rest = list(lines)
    assert any('"upstream_error"' in line for line in rest), "a cut stream must end with an error event"

    for _ in range(10):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("pool"), headers=HEADERS)
        assert response.status_code == 200
    for _ in range(5):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("canary"), headers=HEADERS)
        assert response.status_code == 200 and response.headers["x-sluice-backend"] == "stable"

    assert gateway.metric("sluice_gateway_retries_total") >= 1
    assert gateway.metric("sluice_gateway_upstream_errors_total", kind="connect") >= 1
    cut = gateway.access_lines("cut-off")["cut-off"]
    assert cut["attempts"] == 1 and cut["finish_reason"] == "upstream_error", "retried after the first byte"
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    states = {e["url"]: e for e in httpx.get(f"{gateway.url}/admin/endpoints", headers=admin).json()["endpoints"]}
    assert states[victim]["ejected_for_s"] > 0 and states[stable]["available"]

    # The active health check (the /load poll) takes the dead endpoint out without any failed request.
    wait_for(lambda: watcher.metric("sluice_gateway_endpoint_up", endpoint=victim) == 0 and
             watcher.metric("sluice_gateway_endpoint_up", endpoint=stable) == 1, what="health check")
    assert httpx.post(f"{watcher.url}/v1/chat/completions", json=chat("canary"), headers=HEADERS).status_code == 200
    assert watcher.metric("sluice_gateway_retries_total") == 0


def test_nothing_to_serve_is_503_with_retry_after(start_gateway):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: connection refused
        routes = table(empty={"backends": [backend("none-ready")]}, dead={"backends": [backend("dead", dead)]})
        # A model with no endpoint at all is held while it starts (test_gateway_cold_start.py), at most max_wait_s.
        gateway = start_gateway(gateway_config(tenant(), cold_start={"max_wait_s": 1}), routes)
        for model in ("empty", "dead"):
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(model), headers=HEADERS)
            assert response.status_code == 503, response.text
            assert int(response.headers["retry-after"]) >= 1
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_client_disconnect_aborts_the_upstream_and_frees_the_slot(tiny_runtimes, start_gateway):
    runtime = tiny_runtimes[1].url
    gateway = start_gateway(gateway_config(tenant(max_concurrent=1)), table(tiny={"backends": [backend("b", runtime)]}))
    cancelled = runtime_metric(runtime, "sluice_runtime_requests_cancelled_total")

    def idle_runtime() -> bool:
        load = httpx.get(f"{runtime}/load").json()
        return load["running"] == 0 and load["waiting"] == 0

    # Streaming: the client reads one event and leaves.
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", headers=HEADERS,
                      json=chat("tiny", stream=True, **LONG), timeout=60) as streaming:
        assert next(line for line in streaming.iter_lines() if line.startswith("data:"))
    wait_for(lambda: runtime_metric(runtime, "sluice_runtime_requests_cancelled_total") == cancelled + 1,
             what="the runtime to abort the streamed request")
    wait_for(idle_runtime, what="the runtime to free the aborted request")

    # Not streaming: the client leaves while still waiting for the first byte.
    host, port = urlsplit(gateway.url).hostname, urlsplit(gateway.url).port
    body = json.dumps(chat("tiny", **LONG)).encode()
    with socket.create_connection((host, port)) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                    + f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(lambda: httpx.get(f"{runtime}/load").json()["running"] == 1, what="the request to start")
    wait_for(lambda: runtime_metric(runtime, "sluice_runtime_requests_cancelled_total") == cancelled + 2,
             what="the runtime to abort the waiting request")
    wait_for(idle_runtime, what="the runtime to free the aborted request")
    assert httpx.get(f"{runtime}/load").json()["kv_cache_usage"] < 0.05

    # Both concurrency slots came back: with a limit of one, the next request is admitted.
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("tiny"), headers=HEADERS).status_code == 200
    assert gateway.metric("sluice_gateway_client_disconnects_total") == 2
    assert gateway.metric("sluice_gateway_requests_in_flight") == 0


def test_first_byte_timeout_is_504_and_abandons_the_upstream_without_retrying(tiny_runtimes, start_gateway):
    urls = [server.url for server in tiny_runtimes]
    config = gateway_config(tenant(), timeouts={"first_byte_s": 0.3})
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", *urls)]}))

    def cancelled() -> float:
        return sum(runtime_metric(url, "sluice_runtime_requests_cancelled_total") for url in urls)

    before = cancelled()
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("tiny", **LONG),
                          headers={**HEADERS, "x-request-id": "too-slow"}, timeout=60)
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"
    wait_for(lambda: cancelled() == before + 1, what="the runtime to abort the abandoned request")
    line = gateway.access_lines("too-slow")["too-slow"]
    assert line["attempts"] == 1 and line["status"] == 504


def test_a_replica_late_with_one_poll_stays_in_rotation_and_one_that_stops_answering_is_taken_out(
        spare_runtime, start_gateway):
    url = spare_runtime.url
    gateway = start_gateway(gateway_config(tenant(), routing={"poll_interval_s": 0.2, "poll_timeout_s": 0.2}),
                            table(only={"backends": [backend("only", url)]}))
    up = lambda: gateway.metric("sluice_gateway_endpoint_up", endpoint=url)  # noqa: E731
    wait_for(lambda: up() == 1, what="the first poll")
    process = spare_runtime.process
    try:
        # Frozen for 0.5 s: one poll starts in that time and times out, as one can behind a large answer.
        process.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        process.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        assert up() == 1 and "failed its health check" not in gateway.log_text()
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("only"), headers=HEADERS,
                          timeout=30).status_code == 200

        # Frozen for good: three slow polls in a row take it out, and it is back with the first it answers.
        process.send_signal(signal.SIGSTOP)
        wait_for(lambda: up() == 0, what="the endpoint taken out")
        assert "failed its health check" in gateway.log_text()
    finally:
        process.send_signal(signal.SIGCONT)
    wait_for(lambda: up() == 1, what="the endpoint back in rotation")
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("only"), headers=HEADERS,
                      timeout=30).status_code == 200
