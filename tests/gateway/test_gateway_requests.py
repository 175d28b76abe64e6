"""A client's view of the gateway in front of real runtimes: auth, model access, streaming, headers, logs."""
import json
import time

import httpx
import openai
import pytest

from fixtures.gateway import ADMIN_KEY, TINY_MODEL_NAME, backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

ALICE, BOB = "sk-test-alice", "sk-test-bob-0123456789"
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def gateway(tiny_runtimes, tmp_path_factory):
    from fixtures.gateway import run_gateway

    a, _ = tiny_runtimes
    config = gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)], "models": ["*"],
         "limits": {"tokens_per_minute": 100000}},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)], "models": ["chat-*"]},
    ])
    routes = table(**{
        "chat-small": {"backends": [backend("tiny-v1", a.url)]},
        "secret": {"backends": [backend("tiny-secret", a.url)]},
    })
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def client(gateway, key):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_auth_matrix_answers_in_openai_error_format(gateway):
    no_key = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": "chat-small", "messages": CHAT})
    assert no_key.status_code == 401
    assert no_key.json()["error"]["code"] == "invalid_api_key"
    assert set(no_key.json()["error"]) == {"message", "type", "param", "code"}

    with pytest.raises(openai.AuthenticationError):
        client(gateway, "sk-wrong").chat.completions.create(model="chat-small", messages=CHAT, max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client(gateway, BOB).chat.completions.create(model="secret", messages=CHAT, max_tokens=2)
    assert "secret" in denied.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        client(gateway, ALICE).chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=2)
    assert missing.value.body["code"] == "model_not_found"

    allowed = client(gateway, BOB).chat.completions.create(model="chat-small", messages=CHAT, max_tokens=3)
    assert allowed.choices[0].message.content and allowed.usage.completion_tokens == 3


def test_models_lists_only_what_the_tenant_may_use(gateway):
    assert {m.id for m in client(gateway, BOB).models.list()} == {"chat-small"}
    assert {m.id for m in client(gateway, ALICE).models.list()} == {"chat-small", "secret", "tiny-v1", "tiny-secret"}


def test_admin_endpoints_need_an_admin_key(gateway):
    assert httpx.get(f"{gateway.url}/admin/endpoints").status_code == 401
    assert httpx.get(f"{gateway.url}/admin/endpoints", headers={"authorization": f"Bearer {ALICE}"}).status_code == 403
    answer = httpx.get(f"{gateway.url}/admin/routes", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert answer.status_code == 200 and "chat-small" in answer.json()["routes"]


def test_bad_requests_get_clear_errors(gateway):
    headers = {"authorization": f"Bearer {ALICE}"}
    broken = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{not json", headers=headers)
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    no_model = httpx.post(f"{gateway.url}/v1/chat/completions", json={"messages": CHAT}, headers=headers)
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    huge = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"x" * (5 * 1024 * 1024), headers=headers)
    assert huge.status_code == 413
    nowhere = httpx.get(f"{gateway.url}/v2/nothing")
    assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "unknown_url"
    # The runtime's own validation errors pass through unchanged.
    upstream = httpx.post(f"{gateway.url}/v1/chat/completions", headers=headers,
                          json={"model": "chat-small", "messages": CHAT, "temperature": -3})
    assert upstream.status_code == 400 and upstream.json()["error"]["param"] == "temperature"


def test_streaming_passes_through_and_usage_is_only_sent_when_asked(gateway):
    alice = client(gateway, ALICE)
    chunks = list(alice.chat.completions.create(model="chat-small", messages=CHAT, max_tokens=6, stream=True))
    assert all(c.choices for c in chunks), "the gateway's own usage request leaked to a client that did not ask"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(1 for c in chunks if c.choices[0].delta.content) >= 1

    with_usage = list(alice.chat.completions.create(
        model="chat-small", messages=CHAT, max_tokens=6, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].usage.completion_tokens == 6 and with_usage[-1].choices == []


def test_tokens_are_settled_with_the_real_usage(gateway):
    headers = {"authorization": f"Bearer {ALICE}"}
    body = {"model": "chat-small", "messages": CHAT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as first:
        first.read()
    second = httpx.post(f"{gateway.url}/v1/chat/completions", json={**body, "stream": False}, headers=headers)
    real = second.json()["usage"]["total_tokens"]
    # Each response reports what remains after its own reservation (the same estimate for both). Between them,
    # the streamed request was settled: its estimate replaced by its real usage (identical request, so `real`).
    drop = int(first.headers["x-ratelimit-remaining-tokens"]) - int(second.headers["x-ratelimit-remaining-tokens"])
    assert drop == real
    assert int(first.headers["x-ratelimit-limit-tokens"]) == 100000


def test_request_id_is_propagated_and_overhead_reported(gateway, tiny_runtimes):
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json={"model": "chat-small", "messages": CHAT, "max_tokens": 2},
        headers={"authorization": f"Bearer {ALICE}", "x-request-id": "trace-me-42"},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-me-42"
    assert 0 < float(response.headers["x-sluice-overhead-ms"]) < 1000
    assert response.headers["x-sluice-backend"] == "tiny-v1"
    own_id = response.headers["x-sluice-request-id"]  # the request's own id, sent upstream in place of the client's
    deadline = time.monotonic() + 10  # the runtime writes its log line just after the response
    while own_id not in {line.get("client_request_id") for line in tiny_runtimes[0].request_log()}:
        assert time.monotonic() < deadline, "the runtime never saw the request's id"
        time.sleep(0.05)
    generated = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {ALICE}"})
    assert len(generated.headers["x-request-id"]) >= 16 and "x-sluice-overhead-ms" in generated.headers
    odd = httpx.get(f"{gateway.url}/health", headers={"x-request-id": "has spaces; and more"})
    assert odd.headers["x-request-id"] != "has spaces; and more" and len(odd.headers["x-request-id"]) >= 16


def test_access_log_names_the_key_but_never_contains_it(gateway):
    httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": "chat-small", "messages": CHAT, "max_tokens": 2},
               headers={"authorization": f"Bearer {BOB}", "x-request-id": "log-check"})
    line = gateway.access_lines("log-check")["log-check"]
    assert line["tenant"] == "bob" and line["key_id"] == "bob-key" and line["status"] == 200
    assert line["route"] == "chat-small" and line["backend"] == "tiny-v1" and line["completion_tokens"] == 2
    assert line["finish_reason"] == "length" and line["overhead_ms"] > 0
    log = gateway.log_text()
    assert BOB not in log and ALICE not in log and "sk-wrong" not in log


def test_metrics_count_requests_tokens_and_load(gateway):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"authorization": f"Bearer {BOB}"},
                          json={"model": "chat-small", "messages": CHAT, "max_tokens": 2})
    gateway.access_lines(response.headers["x-request-id"])  # written with the metrics, after the response
    assert gateway.metric("sluice_gateway_requests_total", route="chat-small", tenant="bob", status="200") >= 1
    assert gateway.metric("sluice_gateway_tokens_total", tenant="bob", direction="completion") >= 2
    assert gateway.metric("sluice_gateway_overhead_seconds_count") >= 1
    assert gateway.metric("sluice_gateway_endpoint_up") == 1
    assert gateway.metric("sluice_gateway_routing_table_generation") == 1
    text = httpx.get(f"{gateway.metrics_url}/metrics").text
    assert 'sluice_gateway_endpoint_load{endpoint=' in text
    assert json.loads(httpx.get(f"{gateway.url}/ready").text)["status"] == "ready"


def test_health_and_models_need_no_upstream(gateway):
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    assert TINY_MODEL_NAME not in {m.id for m in client(gateway, BOB).models.list()}
