"""Bad input found by fuzzing: text that is not Unicode, JSON nested without end, values of the wrong type.

Each gets 400 in OpenAI's error JSON on every endpoint, and the server (and its request log) carries on.
"""
import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
LONE = "\ud800"
# A body per endpoint, and where in it a text field is.
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "TEXT"}], "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "TEXT", "max_tokens": 2},
    "/v1/embeddings": {"model": MODEL, "input": "TEXT"},
    "/tokenize": {"prompt": "TEXT"},
    "/detokenize": {"model": "TEXT", "tokens": [1, 2]},
}


@pytest.fixture(scope="module")
def http(runtime_server):
    with httpx.Client(base_url=runtime_server, timeout=120) as client:
        yield client


def post(http: httpx.Client, path: str, content: bytes) -> httpx.Response:
    return http.post(path, content=content, headers={"content-type": "application/json"})


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert error["type"] == "invalid_request_error"
    return error


def with_text(path: str, text: str) -> bytes:
    """The endpoint's body with `text` in its text field, as JSON (json.dumps escapes a lone surrogate)."""
    return json.dumps(BODIES[path]).replace('"TEXT"', json.dumps(text)).encode()


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_lone_surrogate_is_400_on_every_endpoint(http, path):
    for text in (LONE, "abc\udfff", "\udc00\ud800"):
        error = error_of(post(http, path, with_text(path, text)))
        assert error["code"] == "invalid_unicode" and "surrogate" in error["message"], error
    # The same character as raw bytes is not UTF-8 at all.
    raw = with_text(path, "x").replace(b'"x"', b'"\xed\xa0\x80"')
    assert error_of(post(http, path, raw))["code"] == "invalid_json"


def test_a_lone_surrogate_in_a_key_or_a_message_is_named(http):
    body = b'{"model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800"}]}'
    assert error_of(post(http, "/v1/chat/completions", body))["param"] == "messages[0].content"
    body = b'{"model": "smollm2", "max_tokens": 2, "messages": [], "x": {"\\udfff": 1}}'
    assert error_of(post(http, "/v1/chat/completions", body))["param"] == "x"


def test_surrogate_pairs_are_ordinary_text(http):
    reply = post(http, "/tokenize", b'{"prompt": "smile \\ud83d\\ude00"}')
    assert reply.status_code == 200 and reply.json()["count"] > 1
    assert http.post("/detokenize", json={"tokens": reply.json()["tokens"]}).json()["prompt"] == "smile \U0001F600"


def test_the_request_log_survives_text_it_cannot_encode(runtime_server_process, http):
    body = b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'
    response = http.post("/v1/chat/completions", content=body, headers={"x-request-id": "surrogate-log-1",
                                                                          "content-type": "application/json"})
    error_of(response)
    http.get("/v1/models")  # a request after it: the log line of the first is written by then
    lines = [r for r in runtime_server_process.request_log() if r.get("client_request_id") == "surrogate-log-1"]
    assert len(lines) == 1 and lines[0]["status"] == 400 and lines[0]["error_code"] == "invalid_unicode"
    assert "Logging error" not in runtime_server_process.stderr()


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, 1.0, [], {}])
def test_stream_must_be_a_boolean(http, value):
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = {**BODIES[path], "stream": value}
        body = json.loads(json.dumps(body).replace('"TEXT"', '"hi"'))
        response = http.post(path, json=body)
        assert not response.headers["content-type"].startswith("text/event-stream")
        assert error_of(response)["param"] == "stream"


@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "logprobs", "true"),
    ("/v1/chat/completions", "logprobs", 1),
    ("/v1/chat/completions", "top_logprobs", 2.0),
    ("/v1/chat/completions", "temperature", "0.5"),
    ("/v1/chat/completions", "temperature", True),
    ("/v1/chat/completions", "top_p", "1"),
    ("/v1/chat/completions", "seed", "7"),
    ("/v1/chat/completions", "seed", 7.0),
    ("/v1/chat/completions", "priority", 1.5),
    ("/v1/chat/completions", "min_tokens", 1.0),
    ("/v1/chat/completions", "top_k", 5.0),
    ("/v1/chat/completions", "stop_token_ids", [2.0]),
    ("/v1/chat/completions", "skip_special_tokens", "false"),
    ("/v1/chat/completions", "parallel_tool_calls", 0),
    ("/v1/chat/completions", "model", 5),
    ("/v1/chat/completions", "presence_penalty", "1"),
    ("/v1/completions", "echo", 1),
    ("/v1/completions", "logprobs", True),
    ("/v1/completions", "logprobs", 2.0),
    ("/v1/completions", "best_of", "1"),
    ("/v1/completions", "prompt", 5),
    ("/v1/completions", "prompt", [1.0, 2.0]),
    ("/v1/embeddings", "input", [1.5]),
    ("/tokenize", "add_special_tokens", 1),
    ("/tokenize", "add_generation_prompt", "yes"),
    ("/detokenize", "tokens", ["1"]),
    ("/detokenize", "tokens", [1.0]),
    ("/detokenize", "tokens", [True]),
])
def test_values_are_never_coerced(http, path, field, value):
    body = json.loads(json.dumps(BODIES[path]).replace('"TEXT"', '"hi"' if path != "/detokenize" else '"smollm2"'))
    error = error_of(http.post(path, json={**body, field: value}))
    assert error["param"] is not None and error["param"].split("[")[0] == field, error


def test_integers_are_numbers(http):
    body = {**BODIES["/v1/chat/completions"], "messages": USER, "temperature": 0, "top_p": 1,
            "presence_penalty": 0, "frequency_penalty": 1, "stream_options": None}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    stream = {**body, "stream": True, "stream_options": {"include_usage": "yes"}}
    assert error_of(http.post("/v1/chat/completions", json=stream))["param"] == "stream_options.include_usage"


@pytest.mark.parametrize("depth", [65, 200, 5_000, 200_000])
@pytest.mark.parametrize("path", sorted(BODIES))
def test_deeply_nested_json_is_400(http, path, depth):
    body = json.dumps(BODIES[path]).replace('"TEXT"', '"hi"')[:-1] + f', "extra": {nested(depth - 1)}}}'
    error = error_of(post(http, path, body.encode()))
    assert error["code"] == "json_too_deep" and "64 levels" in error["message"], error


def test_the_bound_counts_every_level_of_the_body(http):
    body = {**BODIES["/v1/chat/completions"], "messages": USER, "extra": json.loads(nested(62))}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": json.loads(nested(70, "{}"))}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = {**BODIES["/v1/chat/completions"], "messages": USER, "response_format": response_format}
    assert error_of(http.post("/v1/chat/completions", json=body))["code"] == "json_too_deep"


@pytest.mark.parametrize("arguments, code", [
    (nested(100), "json_too_deep"),
    (nested(100_000), "json_too_deep"),
    ('{"a": ' * 3000 + "1" + "}" * 3000, "json_too_deep"),
    ('{"city": "\\ud800"}', "invalid_unicode"),
])
def test_tool_call_arguments_are_checked_like_the_body(runtime_openai, http, arguments, code):
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]
    messages = USER + [{"role": "assistant", "tool_calls": calls},
                       {"role": "tool", "tool_call_id": "call_1", "content": "22C"}]
    with pytest.raises(openai.BadRequestError) as info:
        runtime_openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert info.value.body["code"] == code
    assert info.value.body["param"] == "messages[1].tool_calls[0].function.arguments"
    error = error_of(http.post("/tokenize", json={"messages": messages}))
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"


def test_arguments_that_are_not_json_still_round_trip(runtime_openai):
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "[[[not json"}}]
    messages = USER + [{"role": "assistant", "tool_calls": calls},
                       {"role": "tool", "tool_call_id": "call_1", "content": "22C"}]
    reply = runtime_openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
