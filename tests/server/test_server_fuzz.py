"""Property test of the request schema: whatever a client sends, the answer is never a 5xx.

Bodies start valid (so they reach the engine, the grammar and the streaming code) and then have up
to three fields replaced by arbitrary JSON or removed; raw byte bodies cover the parser. Generation
stays cheap: max_tokens is never dropped, and any value that would be accepted is at most 4.
"""
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
REMOVE = object()

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
# Never None or missing: that would mean "up to the context length".
any_max_tokens = (st.integers(1, 4) | st.integers(-3, 0) | st.integers(9000, 2**40) | st.floats(-3, 4)
                  | st.text(max_size=4) | st.lists(st.integers(), max_size=2))

text_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)})
other_part = st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "weird"]),
                                    "image_url": st.just({"url": "data:image/png;base64,AAAA"})})
content = st.text(max_size=40) | st.lists(text_part, min_size=1, max_size=3) | st.lists(text_part | other_part, max_size=2)
plain_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                       "content": content})
call = st.fixed_dictionaries({"id": st.sampled_from(["c1", "c2"]), "type": st.just("function"),
                              "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]),
                                                                 "arguments": st.sampled_from(['{"x": 1}', "{}", "nope"])})})
calling = st.fixed_dictionaries({"role": st.just("assistant"), "tool_calls": st.lists(call, min_size=1, max_size=2)})
result = st.fixed_dictionaries({"role": st.just("tool"), "content": st.text(max_size=10),
                                "tool_call_id": st.sampled_from(["c1", "c2", "c3"])})
messages = st.lists(plain_message | calling | result, min_size=1, max_size=4)
schema = st.sampled_from([{"type": "object"}, {"type": "string", "maxLength": 3}, {"type": "nonsense"},
                          {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                          {"enum": [1, "a"]}, {"$ref": "#/nowhere"}, {"type": "array", "maxItems": 1}])
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "g", "bad name!"])}, optional={"parameters": schema, "description": st.text(max_size=10)})})
response_format = (st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "yaml"}])
                   | st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                       {"name": st.just("x")}, optional={"schema": schema, "strict": st.booleans()})}))
sampling = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 60),
    "min_p": st.floats(0, 1), "n": st.integers(1, 3), "seed": st.integers(0, 2**32),
    "stop": st.text(min_size=1, max_size=4) | st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "response_format": response_format, "ignore_eos": st.booleans(), "min_tokens": st.integers(0, 3),
    "priority": st.integers(-5, 5), "user": st.text(max_size=8),
    "stop_token_ids": st.lists(st.integers(0, 49151), max_size=2),
}
chat_valid = st.fixed_dictionaries(
    {"model": st.just("smollm2"), "messages": messages, "max_tokens": st.integers(1, 4)},
    optional={**sampling, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
              "tools": st.lists(tool, min_size=1, max_size=2),
              "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]),
              "max_completion_tokens": st.integers(1, 4)})
prompt = (st.text(max_size=40) | st.lists(st.text(max_size=10), min_size=1, max_size=3)
          | st.lists(st.integers(0, 49151), min_size=1, max_size=6)
          | st.lists(st.lists(st.integers(0, 49151), min_size=1, max_size=4), min_size=1, max_size=2))
completion_valid = st.fixed_dictionaries(
    {"model": st.just("smollm2"), "prompt": prompt, "max_tokens": st.integers(1, 4)},
    optional={**sampling, "echo": st.booleans(), "logprobs": st.integers(0, 5), "best_of": st.integers(1, 3)})
embedding_valid = st.fixed_dictionaries({"model": st.just("smollm2"), "input": prompt},
                                        optional={"encoding_format": st.sampled_from(["float", "base64"])})
tokenize_valid = st.fixed_dictionaries({}, optional={"model": st.just("smollm2"), "prompt": st.text(max_size=30),
                                                    "messages": messages, "add_special_tokens": st.booleans()})
detokenize_valid = st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 49151), max_size=6)},
                                         optional={"model": st.just("smollm2")})
MUTABLE = sorted(set(sampling) | {"model", "messages", "prompt", "input", "tokens", "tools", "tool_choice", "logprobs",
                                  "top_logprobs", "echo", "suffix", "best_of", "logit_bias", "encoding_format",
                                  "dimensions", "n", "parallel_tool_calls"})


@st.composite
def mutated(draw, valid):
    body = draw(valid)
    for key in draw(st.lists(st.sampled_from(MUTABLE + ["max_tokens", "max_completion_tokens"]), max_size=3)):
        if key in ("max_tokens", "max_completion_tokens"):
            body[key] = draw(any_max_tokens)
        else:
            value = draw(anything | st.just(REMOVE))
            if value is REMOVE:
                body.pop(key, None)
            else:
                body[key] = value
    return body


@pytest.fixture(scope="module")
def http(runtime_server):
    with httpx.Client(base_url=runtime_server, timeout=120) as client:
        yield client


def check(http: httpx.Client, path: str, content: bytes, content_type: str = "application/json") -> None:
    response = http.post(path, content=content, headers={"content-type": content_type})
    assert response.status_code < 500, (path, content[:500], response.text[:500])
    assert response.headers["x-request-id"]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    elif response.headers["content-type"].startswith("text/event-stream"):
        lines = [line for line in response.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert "internal_error" not in response.text and "engine_error" not in response.text
    else:
        response.json()


def dumps(body) -> bytes:
    return json.dumps(body).encode()


@FUZZ
@given(body=mutated(chat_valid))
def test_chat_never_5xx(http, body):
    check(http, "/v1/chat/completions", dumps(body))


@FUZZ
@given(body=mutated(completion_valid))
def test_completions_never_5xx(http, body):
    check(http, "/v1/completions", dumps(body))


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(["/v1/embeddings", "/tokenize", "/detokenize"]), data=st.data())
def test_other_endpoints_never_5xx(http, path, data):
    valid = {"/v1/embeddings": embedding_valid, "/tokenize": tokenize_valid, "/detokenize": detokenize_valid}[path]
    check(http, path, dumps(data.draw(mutated(valid))))


@settings(FUZZ, max_examples=30)
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize"]),
       content=st.binary(max_size=64) | st.text(max_size=64).map(str.encode),
       content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]))
def test_raw_bodies_never_5xx(http, path, content, content_type):
    check(http, path, content, content_type)
