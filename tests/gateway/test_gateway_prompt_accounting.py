"""What a prompt reserves, tried as a tenant that hides its text where the gateway might not look: earlier
tool calls' arguments and names, thousands of empty content parts, tools' descriptions, a completions list of
empty prompts. Against a real runtime (its prompt_tokens), and with both limiters for the refusals."""
import http.server
import json
import threading

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_contracts import prompt_reservation

pytestmark = pytest.mark.integration

# English-like text: several bytes per token, so a bound of one token per byte is far above what it costs.
TEXT = "The gateway reserves tokens before it forwards any request to a model. " * 45  # 3,240 bytes
WIDE_TPM = 10_000_000


def tool_calls(arguments: list[str], name: str = "lookup") -> list[dict]:
    return [{"role": "user", "content": "Go."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
                for i, args in enumerate(arguments)]},
            *({"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"} for i in range(len(arguments))),
            {"role": "user", "content": "And now?"}]


def chunks(text: str, count: int) -> list[str]:
    size = len(text) // count
    return [text[i * size:(i + 1) * size] for i in range(count)]


# Each hides (most of) TEXT from a count of the messages' content; path, body.
HIDING = {
    "user_message": ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}]}),
    "one_call_arguments": ("/v1/chat/completions", {"messages": tool_calls([json.dumps({"q": TEXT})])}),
    "split_over_40_calls": ("/v1/chat/completions",
                            {"messages": tool_calls([json.dumps({"q": c}) for c in chunks(TEXT, 40)])}),
    "call_name": ("/v1/chat/completions", {"messages": tool_calls(["{}"], name="n" + TEXT.replace(" ", "_")[:3000])}),
    "empty_text_parts": ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": ""}] * 3000}]}),
    "tool_descriptions": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": f"t{i}", "description": c,
                                                      "parameters": {"type": "object", "properties": {}}}}
                  for i, c in enumerate(chunks(TEXT, 8))]}),
    "empty_completion_prompts": ("/v1/completions", {"prompt": [""] * 3000}),
}
# What the tiny model can serve within its context (a name of 3,000 bytes is not a name it accepts).
SERVABLE = ["user_message", "one_call_arguments", "split_over_40_calls", "empty_text_parts", "tool_descriptions"]


def key(name: str) -> str:
    return f"sk-test-{name.replace('_', '-')}"


def tenants(tpm: int) -> list[dict]:
    return [{"name": name, "keys": [key_entry(f"{name}-key", key(name))], "models": ["*"],
             "limits": {"tokens_per_minute": tpm}} for name in HIDING]


def post(gateway, name: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json={"model": "tiny", "max_tokens": 1, **body}, timeout=120,
                      headers={"authorization": f"Bearer {key(name)}"})


def test_the_reservation_covers_the_prompt_the_runtime_serves_whatever_field_carries_the_text(
        tiny_runtimes, start_gateway):
    # No maxModelLen in the table: the prompt's bound is reserved whole, not capped at what the context leaves.
    routes = table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]})
    gateway = start_gateway(gateway_config(tenants(WIDE_TPM)), routes)
    for name in SERVABLE:
        path, body = HIDING[name]
        response = post(gateway, name, path, body)
        assert response.status_code == 200, (name, response.text)
        reserved = WIDE_TPM - int(response.headers["x-ratelimit-remaining-tokens"]) - 1  # less max_tokens
        served = response.json()["usage"]["prompt_tokens"]
        assert served <= reserved, (name, served, reserved)
        # Hidden text is counted as if it were the message itself, give or take the structure around it.
        assert reserved >= len(TEXT) or name == "empty_text_parts", (name, reserved)


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_small_budget_refuses_the_text_in_whatever_field_it_travels(store, tiny_runtimes, start_gateway, request):
    """3,000 tokens a minute: refused for the text as a user message, so refused for it anywhere else."""
    overrides = {}
    if store == "redis":
        overrides["redis"] = {"url": request.getfixturevalue("redis_server").url, "on_failure": "closed",
                              "timeout_s": 10}
    routes = table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]})
    gateway = start_gateway(gateway_config(tenants(3000), **overrides), routes)
    for name, (path, body) in HIDING.items():
        response = post(gateway, name, path, body)
        assert response.status_code == 429, (name, response.status_code, response.text[:300])
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
    # A prompt that fits is still served on that budget.
    assert post(gateway, "user_message", "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "Hi"}]}).status_code == 200


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An upstream that keeps the headers it was sent and answers like a runtime that served one token."""
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["content-length"]))
        self.seen.append(dict(self.headers))
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "tiny", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (the gateway polls /load before it sends this endpoint anything)
        body = b'{"waiting": 0, "running": 0, "kv_cache_usage": 0.0}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_reservation_goes_upstream_in_the_contract_header_replacing_the_clients(start_gateway):
    """A client that sends the header itself cannot raise the runtime's bound above what it was charged."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        routes = table(tiny={"backends": [backend("b", f"http://127.0.0.1:{server.server_port}")]})
        gateway = start_gateway(gateway_config(tenants(WIDE_TPM)), routes)
        for name in ("user_message", "split_over_40_calls"):
            path, body = HIDING[name]
            response = httpx.post(
                f"{gateway.url}/v1/chat/completions", timeout=60, json={"model": "tiny", "max_tokens": 1, **body},
                headers={"authorization": f"Bearer {key(name)}", prompt_reservation.HEADER: "999999999"})
            assert response.status_code == 200, response.text
            reserved = WIDE_TPM - int(response.headers["x-ratelimit-remaining-tokens"]) - 1
            sent = prompt_reservation.parse_header(_Recorder.seen[-1][prompt_reservation.HEADER])
            assert sent == reserved >= len(TEXT), (name, sent, reserved)
    finally:
        server.shutdown()


class _Refuser(_Recorder):
    """An upstream that refuses every prompt as longer than reserved, as a Sluice runtime answers one."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["content-length"]))
        body = json.dumps({"error": {"message": "The prompt has 9 tokens, more than the 8 reserved for it.",
                                     "type": "invalid_request_error", "param": prompt_reservation.PARAM,
                                     "code": prompt_reservation.CODE}}).encode()
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("stream", [False, True])
def test_the_runtimes_refusal_of_a_prompt_over_its_reservation_is_passed_on_and_charges_nothing(
        stream, start_gateway):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        routes = table(tiny={"backends": [backend("b", f"http://127.0.0.1:{server.server_port}")]})
        gateway = start_gateway(gateway_config(tenants(WIDE_TPM)), routes)
        headers = {"authorization": f"Bearer {key('user_message')}"}
        body = {"model": "tiny", "max_tokens": 1, "stream": stream, "messages": [{"role": "user", "content": "Hi"}]}
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["code"], error["param"]) == (prompt_reservation.CODE, prompt_reservation.PARAM)
        assert "more than the 8 reserved" in error["message"]
        reserved = WIDE_TPM - int(response.headers["x-ratelimit-remaining-tokens"])
        # Nothing was served, so nothing is charged: the next one's reservation is all that counts against it.
        again = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert again.status_code == 400 and WIDE_TPM - int(again.headers["x-ratelimit-remaining-tokens"]) == reserved
    finally:
        server.shutdown()
