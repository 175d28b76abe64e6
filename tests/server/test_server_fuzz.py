"""Property test of the request schema: whatever a client sends, the answer is never a 5xx.

Bodies start valid (so they reach the engine, the grammar and the streaming code) and then have up
to three fields replaced by arbitrary JSON or removed; raw byte bodies cover the parser. Generation
stays cheap: max_tokens is never dropped, and any value that would be accepted is at most 4.
"""
import copy
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
                                        optional={"encoding_format": st.sampled_from(["float", "base64"]),
                                                  "dimensions": st.integers(1, 576)})
rerank_valid = st.fixed_dictionaries(
    {"model": st.just("smollm2"), "query": st.text(min_size=1, max_size=30),
     "documents": st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=3)},
    optional={"top_n": st.integers(0, 4), "return_documents": st.booleans()})
tokenize_valid = st.fixed_dictionaries({}, optional={"model": st.just("smollm2"), "prompt": st.text(max_size=30),
                                                    "messages": messages, "add_special_tokens": st.booleans()})
detokenize_valid = st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 49151), max_size=6)},
                                         optional={"model": st.just("smollm2")})
MUTABLE = sorted(set(sampling) | {"model", "messages", "prompt", "input", "tokens", "tools", "tool_choice", "logprobs",
                                  "top_logprobs", "echo", "suffix", "best_of", "logit_bias", "encoding_format",
                                  "dimensions", "n", "parallel_tool_calls", "query", "documents", "top_n",
                                  "return_documents"})


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
@given(path=st.sampled_from(["/v1/embeddings", "/v1/rerank", "/tokenize", "/detokenize"]), data=st.data())
def test_other_endpoints_never_5xx(http, path, data):
    valid = {"/v1/embeddings": embedding_valid, "/v1/rerank": rerank_valid, "/tokenize": tokenize_valid,
             "/detokenize": detokenize_valid}[path]
    check(http, path, dumps(data.draw(mutated(valid))))


@settings(FUZZ, max_examples=30)
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/tokenize"]),
       content=st.binary(max_size=64) | st.text(max_size=64).map(str.encode),
       content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]))
def test_raw_bodies_never_5xx(http, path, content, content_type):
    check(http, path, content, content_type)


# --- input that must be refused whatever else the body holds -------------------------------------------------

lone_surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
VALID = {"/v1/chat/completions": chat_valid, "/v1/completions": completion_valid, "/v1/embeddings": embedding_valid,
         "/tokenize": tokenize_valid, "/detokenize": detokenize_valid}
BOOLEANS = {"/v1/chat/completions": ["stream", "logprobs", "ignore_eos", "skip_special_tokens",
                                     "include_stop_str_in_output", "parallel_tool_calls"],
            "/v1/completions": ["stream", "echo", "ignore_eos", "skip_special_tokens"],
            "/tokenize": ["add_special_tokens", "add_generation_prompt"]}
INTEGERS = {"/v1/chat/completions": ["n", "max_tokens", "max_completion_tokens", "top_logprobs", "seed", "top_k",
                                     "priority", "min_tokens"],
            "/v1/completions": ["n", "max_tokens", "logprobs", "best_of", "seed", "priority", "min_tokens"]}
# Bodies with nothing else wrong, so the error is about the field under test.
BASE = {"/v1/chat/completions": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/completions": {"model": "smollm2", "prompt": "hi", "max_tokens": 2},
        "/tokenize": {"prompt": "hi"}}
not_a_boolean = st.integers(-2, 2) | st.floats(allow_nan=False) | st.sampled_from(["true", "false", "yes", "1", ""])
not_an_integer = (st.floats(-5, 5).filter(lambda v: v == int(v)) | st.booleans()
                  | st.integers(1, 4).map(str) | st.sampled_from(["1", "2.0", "16"]))


def text_leaves(value, path=()):
    """Paths to every string in a JSON value (keys excluded)."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from text_leaves(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from text_leaves(child, (*path, index))


def error_code(http: httpx.Client, path: str, body) -> dict:
    content = body if isinstance(body, bytes) else dumps(body)
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400, (path, response.text[:300])
    return response.json()["error"]


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(sorted(VALID)), data=st.data())
def test_a_lone_surrogate_anywhere_is_400(http, path, data):
    body = copy.deepcopy(data.draw(VALID[path]))  # strategies share their st.just() values
    body.setdefault("model", "smollm2")
    leaves = list(text_leaves(body))
    where = data.draw(st.sampled_from(leaves))
    parent = body
    for key in where[:-1]:
        parent = parent[key]
    text = parent[where[-1]]
    cut = data.draw(st.integers(0, len(text)))
    parent[where[-1]] = text[:cut] + data.draw(lone_surrogate) + text[cut:]
    assert error_code(http, path, body)["code"] == "invalid_unicode"


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(sorted(VALID)), data=st.data(), depth=st.integers(1, 3000),
       key=st.sampled_from(["extra", "messages", "prompt", "input", "tokens", "tools", "response_format", "stop"]))
def test_nesting_past_the_bound_is_400_and_within_it_never_5xx(http, path, data, depth, key):
    body = data.draw(VALID[path])
    body.pop(key, None)
    # Written as text: Python's own json would hit its recursion limit on the deeper ones.
    content = dumps(body)[:-1] + b", " * bool(body) + b'"%s": %s%s}' % (key.encode(), b"[" * depth, b"]" * depth)
    if 1 + depth > 64:
        assert error_code(http, path, content)["code"] == "json_too_deep"
    else:
        check(http, path, content)


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(sorted(BOOLEANS)), data=st.data())
def test_a_boolean_is_only_true_or_false(http, path, data):
    body = dict(BASE[path])
    field = data.draw(st.sampled_from(BOOLEANS[path]))
    body[field] = data.draw(not_a_boolean)
    assert error_code(http, path, body)["param"] == field


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(sorted(INTEGERS)), data=st.data())
def test_an_integer_is_never_a_string_a_float_or_a_boolean(http, path, data):
    body = dict(BASE[path])
    field = data.draw(st.sampled_from(INTEGERS[path]))
    body[field] = data.draw(not_an_integer)
    assert error_code(http, path, body)["param"] == field
