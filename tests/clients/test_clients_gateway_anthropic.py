"""Anthropic's Messages API at the gateway, through the official `anthropic` SDK (run as its users run it, in
.venv-clients), in front of a real runtime: text, system, tools and tool results, streams, keys, errors, limits."""
import httpx
import pytest

from fixtures.clients import run_client
from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, runtimes, table

pytestmark = pytest.mark.integration

ALICE, BOB, CAROL = "sk-msg-alice", "sk-msg-bob", "sk-msg-carol"

PRELUDE = """
import json, os
import anthropic
client = anthropic.Anthropic(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0,
                             timeout=60)
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                            "required": ["city"], "additionalProperties": False}}
"""


@pytest.fixture(scope="module")
def gateway(tiny_model_dir, tmp_path_factory):
    config = gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)]},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)], "models": ["other-*"]},
        {"name": "carol", "keys": [key_entry("carol-key", CAROL)], "limits": {"requests_per_minute": 1}},
    ])
    with runtimes(tiny_model_dir, 1) as (upstream,):
        routes = table(tiny={"backends": [backend("tiny-v1", upstream.url)]})
        with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
            yield gw


def test_text_with_a_system_prompt_and_stop_sequences(gateway):
    out = run_client(PRELUDE + """
ask = [{"role": "user", "content": "Say hello."}]
message = client.messages.create(model="tiny", max_tokens=8, system="Answer briefly.", stop_sequences=["\\n\\n"],
                                 messages=ask)
longer = client.messages.create(model="tiny", max_tokens=8, system=[{"type": "text", "text": "Answer briefly. " * 20}],
                                messages=ask)
print(json.dumps({"type": message.type, "role": message.role, "blocks": [b.type for b in message.content],
                  "text": message.content[0].text, "stop": message.stop_reason, "usage": message.usage.model_dump(),
                  "longer_input": longer.usage.input_tokens, "id": message.id}))
""", base_url=gateway.url, api_key=ALICE)
    assert out["type"] == "message" and out["role"] == "assistant" and out["blocks"] == ["text"] and out["text"]
    assert out["stop"] in ("end_turn", "max_tokens") and out["id"].startswith("msg_")
    assert 0 < out["usage"]["output_tokens"] <= 8
    # The system prompt went upstream (as a string and as text blocks): a longer one costs more input tokens.
    assert out["longer_input"] >= out["usage"]["input_tokens"] + 19 * 3


def test_a_stream_is_anthropics_event_sequence(gateway):
    out = run_client(PRELUDE + """
kinds, deltas = [], []
with client.messages.stream(model="tiny", max_tokens=10, messages=[{"role": "user", "content": "Count."}]) as s:
    for event in s:
        kinds.append(event.type)
        if event.type == "content_block_delta":
            deltas.append(event.delta.text)
    final = s.get_final_message()
print(json.dumps({"kinds": kinds, "deltas": "".join(deltas), "text": final.content[0].text,
                  "stop": final.stop_reason, "output_tokens": final.usage.output_tokens}))
""", base_url=gateway.url, api_key=ALICE)
    raw = [k for k in out["kinds"] if k not in ("text",)]  # the SDK adds its own "text" events
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert out["deltas"] == out["text"] and out["stop"] == "max_tokens" and out["output_tokens"] == 10


def test_tool_use_and_tool_results_whole_and_streamed(gateway):
    out = run_client(PRELUDE + """
forced = {"type": "tool", "name": "get_weather"}
ask = [{"role": "user", "content": "Weather in Paris?"}]
message = client.messages.create(model="tiny", max_tokens=60, tools=[WEATHER], tool_choice=forced, messages=ask)
use = next(b for b in message.content if b.type == "tool_use")
with client.messages.stream(model="tiny", max_tokens=60, tools=[WEATHER], tool_choice=forced, messages=ask) as s:
    partial = [e.delta.partial_json for e in s if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    streamed = s.get_final_message()
answered = client.messages.create(model="tiny", max_tokens=4, tools=[WEATHER], messages=ask + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]}])
alone = client.messages.create(model="tiny", max_tokens=4, tools=[WEATHER], messages=ask)
print(json.dumps({"stop": message.stop_reason, "name": use.name, "input": use.input,
                  "streamed": [b.model_dump() for b in streamed.content], "partial": "".join(partial),
                  "streamed_stop": streamed.stop_reason, "answered": answered.usage.input_tokens,
                  "alone": alone.usage.input_tokens}))
""", base_url=gateway.url, api_key=ALICE)
    assert out["stop"] == "tool_use" and out["name"] == "get_weather" and isinstance(out["input"]["city"], str)
    tool = next(b for b in out["streamed"] if b["type"] == "tool_use")
    assert tool["name"] == "get_weather" and isinstance(tool["input"]["city"], str)
    assert out["partial"] and out["streamed_stop"] == "tool_use"
    assert out["answered"] > out["alone"]  # the call and its result went upstream


def test_keys_in_either_header_and_errors_in_anthropics_shape(gateway):
    out = run_client(PRELUDE + """
bearer = anthropic.Anthropic(base_url=os.environ["BASE_URL"], auth_token=os.environ["API_KEY"], max_retries=0)
ok = bearer.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
errors = {}
for name, key, body in [
    ("auth", "sk-wrong", {}),
    ("model", os.environ["BOB_KEY"], {}),
    ("unknown", os.environ["API_KEY"], {"model": "nope"}),
    ("tool", os.environ["API_KEY"], {"tools": [{"type": "web_search_20250305", "name": "s"}]}),
]:
    c = anthropic.Anthropic(base_url=os.environ["BASE_URL"], api_key=key, max_retries=0)
    try:
        c.messages.create(**{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
                             **body})
    except anthropic.APIStatusError as exc:
        errors[name] = [type(exc).__name__, exc.status_code, exc.body]
print(json.dumps({"ok": ok.type, "errors": errors}))
""", base_url=gateway.url, api_key=ALICE, BOB_KEY=BOB)
    assert out["ok"] == "message"
    errors = out["errors"]
    assert errors["auth"][:2] == ["AuthenticationError", 401]
    assert errors["model"][:2] == ["PermissionDeniedError", 403]
    assert errors["unknown"][:2] == ["NotFoundError", 404]
    assert errors["tool"][:2] == ["BadRequestError", 400]
    for _, _, body in errors.values():
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}


def test_limits_apply_and_refuse_in_anthropics_shape(gateway):
    out = run_client(PRELUDE + """
client.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
result = {}
try:
    client.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
except anthropic.RateLimitError as exc:
    result = {"status": exc.status_code, "body": exc.body, "retry_after": exc.response.headers.get("retry-after")}
try:
    with client.messages.stream(model="tiny", max_tokens=1, messages=[{"role": "user", "content": "Hi"}]) as s:
        list(s)
except anthropic.RateLimitError as exc:
    result["stream_status"] = exc.status_code
print(json.dumps(result))
""", base_url=gateway.url, api_key=CAROL)
    assert out["status"] == 429 and out["retry_after"] and out["stream_status"] == 429
    assert out["body"]["type"] == "error" and out["body"]["error"]["type"] == "rate_limit_error"
    # The chat endpoint shares the count: the same key is refused there too.
    chat = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"authorization": f"Bearer {CAROL}"},
                      json={"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 429


@pytest.mark.parametrize("body, status", [
    ({"messages": [{"role": "user", "content": "Hi"}]}, 400),  # no max_tokens
    ({"max_tokens": 1, "messages": []}, 400),
    ({"max_tokens": 1, "messages": [{"role": "system", "content": "Hi"}]}, 400),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "enabled"}}, 400),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}, 400),
    ({"max_tokens": "many", "messages": [{"role": "user", "content": "Hi"}]}, 400),
    ({"max_tokens": 10 ** 12, "messages": [{"role": "user", "content": "Hi"}]}, 400),
])
def test_bad_bodies_are_anthropic_errors(gateway, body, status):
    answer = httpx.post(f"{gateway.url}/v1/messages", headers={"x-api-key": ALICE}, json={"model": "tiny", **body})
    assert answer.status_code == status, answer.text
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"


def test_no_key_is_an_anthropic_401(gateway):
    answer = httpx.post(f"{gateway.url}/v1/messages", json={"model": "tiny", "max_tokens": 1,
                                                            "messages": [{"role": "user", "content": "Hi"}]})
    assert answer.status_code == 401
    assert answer.json() == {"type": "error", "error": {"type": "authentication_error",
                                                        "message": answer.json()["error"]["message"]}}
