"""OpenTelemetry traces from the real gateway and runtime, exported over OTLP (the standard OTEL_* environment;
the gateway over HTTP, the runtime over gRPC) to a real Jaeger and read back from its query API: one trace per
request, from the gateway's steps to the engine's, for a streamed chat, a retried request, one held while its
model starts and each batch line; and nothing exported, no SDK loaded, when tracing is not configured."""
import io
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler

import httpx
import openai
import pytest

from fixtures.cluster import _reporter
from fixtures.gateway import RUNTIME_ARGS, TINY_MODEL_NAME, backend, gateway_config, key_entry, run_gateway, table
from fixtures.jaeger import CLIENT, INTERNAL, SERVER, Span, start_jaeger
from fixtures.loopback_http import LoopbackServer, reply
from sluice_contracts.tracing_environment import TracingSettingsError, otlp_protocol

pytestmark = pytest.mark.integration

KEY = "sk-traces-tara"
TRACE = "5bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "10f067aa0ba902b7"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 3}
GATEWAY_STEPS = ["auth", "route", "limits", "upstream attempt"]


class Refusing(LoopbackServer):
    """An endpoint that reports the runtime's load as its own (so it stays in rotation) and refuses every request
    with 503, as a runtime shedding load does: the gateway tries the next one."""

    def __init__(self, runtime_url: str) -> None:
        load = httpx.get(f"{runtime_url}/load", timeout=5).content

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive, as the gateway's pool expects of an upstream

            def do_GET(self) -> None:
                reply(self, 200, load)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                reply(self, 503, b'{"error": {"message": "shedding", "type": "server_error", "code": "shed"}}')

            def log_message(self, *args) -> None:
                pass

        super().__init__(Handler)


@pytest.fixture(scope="module")
def jaeger(request):
    with start_jaeger(log=_reporter(request.config)) as jaeger:
        yield jaeger


@pytest.fixture(scope="module")
def traced_runtime(jaeger, tiny_model_dir):
    from fixtures.runtime_server import start_runtime_server

    env = {**os.environ, **jaeger.environment("test-runtime", "grpc")}
    with start_runtime_server(*RUNTIME_ARGS, model=str(tiny_model_dir), timeout=240, env=env) as runtime:
        yield runtime


def routes(runtime_url: str, refusing_url: str, generation: int = 1, cold: tuple[str, ...] = ()) -> dict:
    # "flaky" is first tried on an endpoint that refuses, then on its fallback; "cold" has no endpoint until it starts.
    return table(generation, tiny={"backends": [backend("tiny-im", runtime_url)]},
                 flaky={"backends": [backend("refusing", refusing_url)], "fallbacks": ["tiny"]},
                 cold={"backends": [backend("cold-im", *cold)]})


def config() -> dict:
    return gateway_config([{"name": "tara", "keys": [key_entry("tara-ci", KEY)]}], routing={"reload_interval_s": 0.1},
                          shutdown={"ready_grace_s": 0})


@pytest.fixture(scope="module")
def refusing(traced_runtime):
    refusing = Refusing(traced_runtime.url)
    yield refusing
    refusing.close()


@pytest.fixture(scope="module")
def traced_gateway(jaeger, traced_runtime, refusing, tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        for name, value in jaeger.environment("test-gateway").items():
            env.setenv(name, value)
        gateway = run_gateway(config(), routes(traced_runtime.url, refusing.url),
                              tmp_path_factory.mktemp("traced-gateway"))
        with gateway as running:
            env.undo()
            yield running


def api(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def named(spans: list[Span], name: str, service: str) -> list[Span]:
    return [s for s in spans if s.name == name and s.service == service]


def complete(spans: list[Span]) -> bool:
    return bool(named(spans, "stream", "test-runtime")) and bool(named(spans, "POST /v1/chat/completions",
                                                                       "test-gateway"))


def test_a_streamed_chat_is_one_trace_from_the_gateways_steps_to_the_engines(traced_gateway, jaeger):
    stream = api(traced_gateway).chat.completions.with_raw_response.create(
        **CHAT, stream=True, extra_headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"})
    assert [c.choices[0].finish_reason for c in stream.parse() if c.choices][-1] == "length"
    assert stream.headers["x-sluice-trace-id"] == TRACE
    spans = jaeger.trace(TRACE, complete)

    assert {s.trace_id for s in spans} == {TRACE} and {s.service for s in spans} == {"test-gateway", "test-runtime"}
    server, = named(spans, "POST /v1/chat/completions", "test-gateway")
    assert (server.parent, server.remote_parent) == (CLIENT_SPAN, True), "the gateway's span is a child of the client's"
    assert server.kind == SERVER
    steps = [s for s in spans if s.parent == server.span_id]
    assert [s.name for s in steps] == GATEWAY_STEPS
    assert [s.kind for s in steps] == [INTERNAL, INTERNAL, INTERNAL, CLIENT]
    assert all(server.start <= s.start <= s.end <= server.end for s in steps)
    auth, route, limits, attempt = steps
    assert auth.attributes == {"sluice.tenant": "tara", "sluice.key_id": "tara-ci"}
    assert route.attributes["sluice.backends"] == ["tiny-im"]
    assert limits.attributes["sluice.reservation.granted_tokens"] == limits.attributes["sluice.reservation.tokens"]
    assert attempt.attributes | {"server.address": "?"} == {
        "sluice.attempt": 1, "sluice.route": "tiny", "sluice.backend": "tiny-im", "server.address": "?",
        "sluice.pick.reason": "first choice", "http.response.status_code": 200}
    assert server.attributes["gen_ai.request.model"] == "tiny"
    assert server.attributes["gen_ai.operation.name"] == "chat"
    assert server.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert server.attributes["gen_ai.usage.output_tokens"] == 3

    # The runtime's spans sit under the attempt: its span id is the parent the runtime was sent.
    runtime, = named(spans, "POST /v1/chat/completions", "test-runtime")
    assert runtime.parent == attempt.span_id and attempt.start <= runtime.start <= runtime.end
    assert (runtime.kind, runtime.remote_parent) == (SERVER, True)
    engine = [s for s in spans if s.parent == runtime.span_id]
    assert [s.name for s in engine] == ["queue", "prefill", "decode", "stream"]
    assert len(spans) == 1 + len(steps) + 1 + len(engine), [s.name for s in spans]
    queue, prefill, decode, streamed = engine
    assert queue.end <= prefill.start <= prefill.end <= decode.start <= decode.end <= streamed.end
    prompt_tokens = runtime.attributes["gen_ai.usage.input_tokens"]
    assert prefill.attributes["sluice.prefill.tokens"] == prompt_tokens > 0
    assert prefill.attributes["sluice.prefill.chunks"] == 1
    assert prefill.attributes["gen_ai.usage.cache_read.input_tokens"] >= 0
    assert decode.attributes == {"sluice.decode.tokens": 3, "sluice.decode.preemptions": 0}
    assert streamed.attributes["sluice.stream.chunks"] >= 3
    assert runtime.attributes["gen_ai.usage.output_tokens"] == 3
    # No prompt or completion text in any span.
    assert not any("Hi there" in str(s.attributes) for s in spans)


def test_a_retried_request_has_an_attempt_span_per_endpoint_and_the_engines_under_the_one_that_answered(
        traced_gateway, jaeger):
    answer = api(traced_gateway).chat.completions.with_raw_response.create(**{**CHAT, "model": "flaky"})
    trace_id = answer.headers["x-sluice-trace-id"]
    spans = jaeger.trace(trace_id, lambda spans: bool(named(spans, "decode", "test-runtime"))
                           and bool(named(spans, "POST /v1/chat/completions", "test-gateway")))

    server, = named(spans, "POST /v1/chat/completions", "test-gateway")
    assert server.parent == "", "a trace the gateway started"
    assert [s.name for s in spans if s.parent == server.span_id] == ["auth", "route", "limits", "upstream attempt",
                                                                     "upstream attempt"]
    first, second = named(spans, "upstream attempt", "test-gateway")
    assert first.parent == second.parent == server.span_id, "retries are siblings"
    assert first.kind == second.kind == CLIENT
    assert first.end <= second.start
    assert first.attributes["sluice.backend"] == "refusing"
    assert (first.attributes["http.response.status_code"], first.attributes["error.type"]) == (503, "upstream_error")
    assert second.attributes["sluice.backend"] == "tiny-im"
    assert second.attributes["sluice.pick.reason"] == "fallback"
    runtime, = named(spans, "POST /v1/chat/completions", "test-runtime")
    assert runtime.parent == second.span_id
    assert [s.name for s in spans if s.parent == runtime.span_id] == ["queue", "prefill", "decode"]
    assert server.attributes["sluice.attempts"] == 2


def test_each_batch_line_is_a_trace_of_its_own_naming_its_batch(traced_gateway, jaeger):
    since = datetime.now(timezone.utc)
    client = api(traced_gateway)
    lines = [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": CHAT} for n in range(2)]
    upload = client.files.create(file=("in.jsonl", io.BytesIO("".join(json.dumps(line) + "\n" for line in lines)
                                                                 .encode())), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and batch.status in ("validating", "in_progress", "finalizing"), batch
        time.sleep(0.2)

    def roots() -> list[Span]:
        found = jaeger.find("test-gateway", "batch line /v1/chat/completions", since)
        return [s for s in found if s.parent == "" and s.attributes.get("sluice.batch_id") == batch.id]

    deadline = time.monotonic() + 20
    while len(roots()) < 2:
        assert time.monotonic() < deadline, "a batch line exported no span"
        time.sleep(0.05)
    assert len({root.trace_id for root in roots()}) == 2
    for root in roots():
        spans = jaeger.trace(root.trace_id, lambda spans: bool(named(spans, "decode", "test-runtime")))
        attempt, = named(spans, "upstream attempt", "test-gateway")
        runtime, = named(spans, "POST /v1/chat/completions", "test-runtime")
        assert root.parent == "" and attempt.parent == root.span_id and runtime.parent == attempt.span_id
        assert root.attributes["sluice.tenant"] == "tara" and root.attributes["http.response.status_code"] == 200


def test_a_request_held_while_its_model_starts_has_a_hold_span(traced_gateway, traced_runtime, refusing, jaeger):
    answers: list = []
    held = threading.Thread(target=lambda: answers.append(
        api(traced_gateway).chat.completions.with_raw_response.create(**{**CHAT, "model": "cold"})))
    held.start()
    deadline = time.monotonic() + 30
    while traced_gateway.metric("sluice_gateway_held_requests", backend="cold-im") != 1:
        assert time.monotonic() < deadline, "the request was never held"
        time.sleep(0.05)
    time.sleep(0.3)
    traced_gateway.write_routes(routes(traced_runtime.url, refusing.url, 2, cold=(traced_runtime.url,)))
    held.join(timeout=60)
    trace_id = answers[0].headers["x-sluice-trace-id"]
    spans = jaeger.trace(trace_id, lambda spans: bool(named(spans, "POST /v1/chat/completions", "test-gateway")))

    server, = named(spans, "POST /v1/chat/completions", "test-gateway")
    steps = [s.name for s in spans if s.parent == server.span_id]
    assert steps == ["auth", "route", "limits", "cold start hold", "upstream attempt"]
    hold, = named(spans, "cold start hold", "test-gateway")
    assert hold.attributes["sluice.hold.models"] == ["cold-im"]
    assert hold.attributes["sluice.hold.wait_ms"] >= 300
    assert hold.end - hold.start >= 300e6
    assert server.attributes["sluice.held_ms"] >= 300


def test_without_otel_settings_nothing_is_exported_and_no_sdk_is_set_up(traced_runtime, refusing, jaeger,
                                                                       tmp_path):
    # A gateway without OTEL_* (the traced runtime still has its own): the client's sampled trace reaches the
    # runtime, whose spans are exported, and none of the gateway's.
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    trace_id = "6bf92f3577b34da6a3ce929d0e0e4736"
    with pytest.MonkeyPatch.context() as env:
        for name in set(os.environ) - set(plain):
            env.delenv(name)
        with run_gateway(config(), routes(traced_runtime.url, refusing.url), tmp_path / "plain") as gateway:
            api(gateway).chat.completions.create(
                **CHAT, extra_headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
            spans = jaeger.trace(trace_id, lambda spans: bool(named(spans, "decode", "test-runtime")))
            time.sleep(0.3)  # past the batch delay a traced gateway would export after
    assert {s.service for s in jaeger.spans(trace_id)} == {"test-runtime"}
    assert spans[0].parent not in ("", CLIENT_SPAN) and spans[0].remote_parent, "under the gateway's hop"

    # Nor is the tracing SDK loaded: both components' set-up, from an environment with no OTEL_*.
    probe = ("import sys; from sluice_gateway.tracing_setup import tracing_from_environment as g; "
             "from sluice_runtime.server.tracing_setup import tracing_from_environment as r; "
             "assert g() is None and r() is None; "
             "from opentelemetry import trace; assert type(trace.get_tracer_provider()).__name__ == "
             "'ProxyTracerProvider'; print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk.trace')))")
    out = subprocess.run([sys.executable, "-c", probe], env=plain, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("environ", "protocol"), [
    ({}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, None),
])
def test_tracing_is_on_only_when_an_otlp_endpoint_is_configured(environ, protocol):
    assert otlp_protocol(environ) == protocol


@pytest.mark.parametrize(("environ", "message"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_PROTOCOL must be one of http/protobuf, grpc, got 'http/json'"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER must be otlp or none, got 'zipkin'"),
])
def test_otel_settings_neither_component_can_use_are_refused_with_their_name(environ, message):
    with pytest.raises(TracingSettingsError) as refused:
        otlp_protocol(environ)
    assert str(refused.value) == message


def test_a_gateway_with_an_unusable_otel_setting_exits_saying_which(tmp_path):
    (tmp_path / "gateway.yaml").write_text("tenants: []\n")
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}
    done = subprocess.run([sys.executable, "-m", "sluice_gateway.cli", "--config", str(tmp_path / "gateway.yaml")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "OTEL_EXPORTER_OTLP_PROTOCOL must be one of http/protobuf, grpc, got 'thrift'" in done.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_either_otlp_protocol_sets_up_an_exporter(protocol, monkeypatch):
    from sluice_gateway.tracing_setup import tracing_from_environment

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    tracing = tracing_from_environment()
    assert tracing is not None and tracing.sampled(None, "7bf92f3577b34da6a3ce929d0e0e4736", "POST /v1/chat")
    tracing.shutdown()


def test_a_runtime_called_directly_starts_the_trace_its_answer_names(traced_runtime, jaeger):
    runtime = openai.OpenAI(base_url=f"{traced_runtime.url}/v1", api_key="unused", max_retries=0, timeout=60)
    answer = runtime.chat.completions.with_raw_response.create(**{**CHAT, "model": TINY_MODEL_NAME})
    trace_id = answer.headers["x-sluice-trace-id"]
    spans = jaeger.trace(trace_id, lambda spans: bool(named(spans, "decode", "test-runtime")))
    server, = named(spans, "POST /v1/chat/completions", "test-runtime")
    assert server.parent == "" and server.attributes["http.response.status_code"] == 200
    assert [s.name for s in spans if s.parent == server.span_id] == ["queue", "prefill", "decode"]
