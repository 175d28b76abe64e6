"""An explicit null in any optional field means its default, as in OpenAI's API; clients send it for unset fields."""
import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "smollm2"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3}
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}

# The nullable fields of OpenAI's create-chat-completion and create-completion request schemas, then the
# vLLM-style extensions the runtime takes.
OPENAI_CHAT = ["store", "reasoning_effort", "metadata", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
               "max_tokens", "max_completion_tokens", "n", "modalities", "prediction", "audio", "presence_penalty",
               "response_format", "seed", "service_tier", "stop", "stream", "stream_options", "temperature", "top_p",
               "tools", "tool_choice", "parallel_tool_calls", "user", "function_call", "functions",
               "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier"]
OPENAI_COMPLETION = ["best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
                     "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p",
                     "user"]
EXTENSIONS = ["top_k", "min_p", "repetition_penalty", "stop_token_ids", "priority", "min_tokens",
              "skip_special_tokens", "include_stop_str_in_output", "ignore_eos"]


@pytest.fixture(scope="module")
def http(runtime_server):
    with httpx.Client(base_url=runtime_server, timeout=120) as client:
        yield client


def with_null(body: dict, field: str) -> dict:
    body = {**body, field: None}
    if field == "max_tokens" and "messages" in body:
        body["max_completion_tokens"] = 3  # chat's other name bounds the answer, so the test stays short
    return body


def ok(response: httpx.Response, obj: str, choices: int = 1) -> dict:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json"), "a null stream is no stream"
    body = response.json()
    assert body["object"] == obj and len(body["choices"]) == choices
    return body


@pytest.mark.parametrize("field", OPENAI_CHAT + EXTENSIONS)
def test_chat_takes_null_in_every_optional_field(http, field):
    body = ok(http.post("/v1/chat/completions", json=with_null(CHAT, field)), "chat.completion")
    choice = body["choices"][0]
    assert choice["logprobs"] is None and choice["message"]["tool_calls"] is None
    if field in ("max_tokens", "max_completion_tokens"):
        assert body["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize("field", OPENAI_COMPLETION + EXTENSIONS)
def test_completions_take_null_in_every_optional_field(http, field):
    body = with_null(COMPLETION, field)
    if field == "max_tokens":
        answer = ok(http.post("/v1/completions", json=body), "text_completion")
        # The legacy endpoint's default of 16 tokens, not the whole context.
        assert answer["usage"]["completion_tokens"] <= 16
        return
    answer = ok(http.post("/v1/completions", json=body), "text_completion")
    assert answer["choices"][0]["logprobs"] is None
    assert not answer["choices"][0]["text"].startswith(COMPLETION["prompt"]), "a null echo is no echo"


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "assistant", "content": "Hello.", "tool_calls": None, "name": None, "refusal": None, "audio": None,
     "function_call": None, "tool_call_id": None},
])
def test_chat_messages_take_null_in_their_optional_fields(http, message):
    history = [{"role": "user", "content": "Weather in Oslo?", "name": None}, message]
    if message.get("tool_calls"):
        history.append({"role": "tool", "tool_call_id": "call_1", "content": "5C", "name": None})
    history.append({"role": "user", "content": "Thanks."})
    ok(http.post("/v1/chat/completions", json={**CHAT, "messages": history, "tools": [WEATHER]}), "chat.completion")


def test_nested_optional_fields_take_null(http):
    tool = {"type": "function", "function": {"name": "get_weather", "description": None, "parameters": None,
                                             "strict": None}}
    ok(http.post("/v1/chat/completions", json={**CHAT, "tools": [tool], "tool_choice": None}), "chat.completion")
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "description": None, "strict": None,
                                                  "schema": {"type": "object"}}}
    ok(http.post("/v1/chat/completions", json={**CHAT, "response_format": fmt}), "chat.completion")
    streamed = http.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                       "stream_options": {"include_usage": None}})
    assert streamed.status_code == 200 and '"usage":{' not in streamed.text and streamed.text.endswith("[DONE]\n\n")


def test_defaults_hold_when_nulled(http):
    """n null is one choice, stop null stops nothing, temperature null samples (seeded) as the default 1 does."""
    sampled = {**CHAT, "max_tokens": 12, "seed": 5}
    default = ok(http.post("/v1/chat/completions", json=sampled), "chat.completion")
    nulled = ok(http.post("/v1/chat/completions", json={**sampled, "temperature": None, "top_p": None, "n": None,
                                                        "stop": None, "presence_penalty": None}), "chat.completion")
    assert nulled["choices"][0]["message"]["content"] == default["choices"][0]["message"]["content"]


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", CHAT, "model"),
    ("/v1/chat/completions", CHAT, "messages"),
    ("/v1/completions", COMPLETION, "model"),
    ("/v1/completions", COMPLETION, "prompt"),
])
def test_a_null_required_field_is_a_400_naming_it(http, path, body, field):
    response = http.post(path, json={**body, field: None})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"] and error["type"] == "invalid_request_error"


def test_a_null_role_is_a_400_naming_it(http):
    response = http.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": None, "content": "hi"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].role"


def test_wrong_types_are_still_refused(http):
    for field, value in (("stream", "yes"), ("presence_penalty", "0"), ("logprobs", 0), ("n", 1.0)):
        response = http.post("/v1/chat/completions", json={**CHAT, field: value})
        assert response.status_code == 400 and response.json()["error"]["param"] == field, (field, response.text)
