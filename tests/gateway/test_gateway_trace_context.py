"""W3C trace context through the real gateway and runtimes, driven by the official OpenAI client: a client's trace
is kept to the engine and named in every answer, log line and audit record; a missing or malformed one is
replaced by a new trace, never refused; a retry's attempts are spans of one trace."""
import json
import re
import time

import httpx
import openai
import pytest

from fixtures.gateway import RUNTIME_ARGS, backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-trace-tess"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HEX32, HEX16 = re.compile(r"[0-9a-f]{32}"), re.compile(r"[0-9a-f]{16}")
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def config(**overrides) -> dict:
    return gateway_config([{"name": "tess", "keys": [key_entry("tess-ci", KEY)]}],
                          audit={"sink": "audit.jsonl"}, shutdown={"ready_grace_s": 0}, **overrides)


def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def audit_record(gateway, request_id: str, timeout: float = 15) -> dict:
    path, deadline = gateway.config_path.parent / "audit.jsonl", time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        found = [r for r in map(json.loads, lines) if r.get("request_id") == request_id]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no audit record of {request_id}"
        time.sleep(0.05)


def runtime_lines(runtime, gateway_request_id: str, count: int = 1, timeout: float = 15) -> list[dict]:
    """The runtime's log lines of a request the gateway sent (its id is the runtime's client request id)."""
    deadline = time.monotonic() + timeout
    while len(found := [r for r in runtime.request_log() if r.get("client_request_id") == gateway_request_id]) < count:
        assert time.monotonic() < deadline, f"no runtime log line of {gateway_request_id}"
        time.sleep(0.05)
    return found


def test_a_clients_trace_is_kept_from_the_client_to_the_engine(tiny_runtimes, start_gateway):
    runtime = tiny_runtimes[0]
    gateway = start_gateway(config(), table(tiny={"backends": [backend("tiny", runtime.url)]}))
    api = client(gateway)
    traced = {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "congo=t61rcWkgMzE"}

    answer = api.chat.completions.with_raw_response.create(**CHAT, extra_headers=traced)
    stream = api.chat.completions.with_raw_response.create(**CHAT, stream=True, extra_headers=traced)
    assert [c.choices[0].finish_reason for c in stream.parse() if c.choices][-1] == "length"
    with pytest.raises(openai.NotFoundError) as refused:
        api.chat.completions.create(**{**CHAT, "model": "no-such-model"}, extra_headers=traced)
    models = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {KEY}", **traced})

    for response in (answer, stream, refused.value.response, models):
        assert response.headers["x-sluice-trace-id"] == TRACE
    served = [r.headers["x-sluice-request-id"] for r in (answer, stream)]
    lines = gateway.access_lines(*served, refused.value.response.headers["x-sluice-request-id"])
    assert {line["trace_id"] for line in lines.values()} == {TRACE}
    for request_id in (*served, refused.value.response.headers["x-sluice-request-id"]):
        assert audit_record(gateway, request_id)["trace_id"] == TRACE
    for request_id in served:
        line, = runtime_lines(runtime, request_id)
        assert line["trace_id"] == TRACE and line["status"] == 200
        # The engine's parent is the gateway's hop, not the client's span.
        assert HEX16.fullmatch(line["parent_span_id"]) and line["parent_span_id"] != SPAN


def test_a_missing_or_malformed_traceparent_gets_a_new_trace_never_an_error(tiny_runtimes, start_gateway):
    runtime = tiny_runtimes[0]
    gateway = start_gateway(config(), table(tiny={"backends": [backend("tiny", runtime.url)]}))
    malformed = [
        [], [("traceparent", f"00-{TRACE.upper()}-{SPAN}-01")], [("traceparent", "00-<script>alert(1)</script>-01")],
        [("traceparent", f"00-{'0' * 32}-{SPAN}-01")], [("traceparent", f"ff-{TRACE}-{SPAN}-01")],
        # Twice, even the same valid value: which one would be meant?
        [("traceparent", f"00-{TRACE}-{SPAN}-01"), ("traceparent", f"00-{TRACE}-{SPAN}-01")],
    ]
    seen = set()
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        for headers in malformed:
            response = http.post("/v1/chat/completions", json=CHAT,
                                 headers=[("authorization", f"Bearer {KEY}"), *headers, ("tracestate", "rojo=1")])
            assert response.status_code == 200, response.text
            trace_id = response.headers["x-sluice-trace-id"]
            assert HEX32.fullmatch(trace_id) and trace_id not in seen and trace_id != TRACE
            seen.add(trace_id)
            request_id = response.headers["x-sluice-request-id"]
            assert gateway.access_lines(request_id)[request_id]["trace_id"] == trace_id
            line, = runtime_lines(runtime, request_id)
            assert line["trace_id"] == trace_id
        refused = http.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-nobody"})
    assert refused.status_code == 401 and HEX32.fullmatch(refused.headers["x-sluice-trace-id"])
    assert "<script>" not in gateway.log_text() and "<script>" not in runtime.stdout_path.read_text()


def test_a_retried_requests_attempts_are_spans_of_one_trace(tiny_runtimes, tiny_model_dir, tmp_path, start_gateway):
    from fixtures.runtime_server import start_runtime_server

    steady = tiny_runtimes[0]
    (tmp_path / "credential").write_text("a-credential-the-gateway-does-not-hold\n")
    # A runtime that refuses the gateway (its credential is not the gateway's): the attempt is tried elsewhere.
    with start_runtime_server(*RUNTIME_ARGS, "--api-key-file", str(tmp_path / "credential"),
                              model=str(tiny_model_dir), timeout=240) as refusing:
        routes = table(flaky={"backends": [backend("refusing", refusing.url)], "fallbacks": ["steady"]},
                       steady={"backends": [backend("steady", steady.url)]})
        gateway = start_gateway(config(), routes)
        answer = client(gateway).chat.completions.with_raw_response.create(
            **{**CHAT, "model": "flaky"}, extra_headers={"traceparent": f"00-{TRACE}-{SPAN}-00"})
        request_id = answer.headers["x-sluice-request-id"]
        first, = runtime_lines(refusing, request_id)
    second, = runtime_lines(steady, request_id)

    assert answer.headers["x-sluice-trace-id"] == TRACE and answer.headers["x-sluice-backend"] == "steady"
    line = gateway.access_lines(request_id)[request_id]
    assert line["attempts"] == 2 and line["trace_id"] == TRACE
    assert (first["status"], second["status"]) == (401, 200)
    assert first["trace_id"] == second["trace_id"] == TRACE
    assert len({first["parent_span_id"], second["parent_span_id"], SPAN}) == 3, "each attempt is a span of its own"
