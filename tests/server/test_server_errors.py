"""Every kind of bad request gets OpenAI error JSON with the right status, never a 500."""
import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def refused(client, status, **overrides):
    """Send a chat request that must fail; return the error object."""
    args = {"model": MODEL, "messages": USER, "max_tokens": 4}
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**{**args, **overrides})
    assert info.value.status_code == status, info.value.body
    error = info.value.body
    assert set(error) >= {"message", "type", "param", "code"}, error
    return error


def test_unknown_model_is_404(runtime_openai):
    error = refused(runtime_openai, 404, model="gpt-9")
    assert error["code"] == "model_not_found" and error["param"] == "model"
    with pytest.raises(openai.NotFoundError) as info:
        runtime_openai.models.retrieve("gpt-9")
    assert info.value.body["code"] == "model_not_found" and "gpt-9" in info.value.body["message"]
    assert set(info.value.body) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("overrides, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant"}]}, "messages[0].content"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"extra_body": {"top_k": -2}}, "top_k"),
    ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
    ({"stop": ["x" * 300]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"logit_bias": {"42": 101}}, "logit_bias"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"extra_body": {"min_tokens": 10}, "max_tokens": 5}, None),
])
def test_invalid_parameters_are_400(runtime_openai, overrides, param):
    error = refused(runtime_openai, 400, **overrides)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error


def test_role_order_is_checked(runtime_openai):
    error = refused(runtime_openai, 400, messages=[{"role": "tool", "content": "22C", "tool_call_id": "call_1"}])
    assert error["code"] == "invalid_role_order"
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    error = refused(runtime_openai, 400, messages=USER + [
        {"role": "assistant", "tool_calls": calls},
        {"role": "tool", "content": "22C", "tool_call_id": "call_2"}])
    assert error["param"] == "messages[2].tool_call_id"


def test_images_to_a_text_model_are_refused(runtime_openai):
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    error = refused(runtime_openai, 400, messages=[{"role": "user", "content": content}])
    assert error["code"] == "unsupported_content" and error["param"] == "messages[0].content[1]"
    assert "image" in error["message"]


def test_prompt_longer_than_context_names_both_numbers(runtime_openai):
    error = refused(runtime_openai, 400, messages=[{"role": "user", "content": "hello " * 9000}])
    assert error["code"] == "context_length_exceeded"
    assert "8192" in error["message"] and "90" in error["message"]


def test_max_tokens_beyond_context_names_both_numbers(runtime_openai):
    error = refused(runtime_openai, 400, max_tokens=9000)
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "8192" in error["message"] and "9000" in error["message"]


def test_tools_too_large(runtime_openai):
    huge = {"type": "function", "function": {"name": "big", "description": "x" * 70_000,
                                             "parameters": {"type": "object"}}}
    error = refused(runtime_openai, 400, tools=[huge])
    assert error["code"] == "tools_too_large"


def test_completions_checks(runtime_openai):
    for overrides, param in [({"prompt": []}, "prompt"), ({"prompt": [10**9]}, "prompt"),
                             ({"suffix": "end"}, "suffix"), ({"max_tokens": 9000}, "max_tokens")]:
        with pytest.raises(openai.BadRequestError) as info:
            runtime_openai.completions.create(**{"model": MODEL, "prompt": "hi", "max_tokens": 2, **overrides})
        assert info.value.body["param"] == param


def test_body_too_large_is_413(runtime_server):
    body = b'{"model": "smollm2", "prompt": "' + b"a" * (9 << 20) + b'"}'
    response = httpx.post(f"{runtime_server}/v1/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert response.headers["x-request-id"]


def test_malformed_bodies_are_400(runtime_server):
    for content in (b"{not json", b"[1, 2]", b"", b'"text"'):
        response = httpx.post(f"{runtime_server}/v1/chat/completions", content=content,
                              headers={"content-type": "application/json"})
        assert response.status_code == 400, content
        assert response.json()["error"]["type"] == "invalid_request_error"
    response = httpx.post(f"{runtime_server}/v1/chat/completions", json={"messages": USER})
    assert response.status_code == 400
    assert response.json()["error"] == {"message": "Missing required parameter: 'model'.",
                                        "type": "invalid_request_error", "param": "model",
                                        "code": "missing_required_parameter"}


def test_unknown_path_and_method(runtime_server):
    response = httpx.get(f"{runtime_server}/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    response = httpx.get(f"{runtime_server}/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()


def test_request_id_is_honoured_on_success_and_error(runtime_server):
    ok = httpx.get(f"{runtime_server}/v1/models", headers={"x-request-id": "trace-123"})
    assert ok.headers["x-request-id"] == "trace-123"
    bad = httpx.post(f"{runtime_server}/v1/chat/completions", json={"model": "nope", "messages": USER},
                     headers={"x-request-id": "trace-456"})
    assert bad.status_code == 404 and bad.headers["x-request-id"] == "trace-456"


def test_tokenize_and_embedding_errors(runtime_server, runtime_openai):
    assert httpx.post(f"{runtime_server}/detokenize", json={"tokens": [-1]}).status_code == 400
    assert httpx.post(f"{runtime_server}/tokenize", json={"prompt": "a", "messages": USER}).status_code == 400
    assert httpx.post(f"{runtime_server}/tokenize", json={"model": "x", "prompt": "a"}).status_code == 404
    with pytest.raises(openai.BadRequestError) as info:
        runtime_openai.embeddings.create(model=MODEL, input="hello " * 9000)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        runtime_openai.embeddings.create(model=MODEL, input="hi", dimensions=577)
    assert info.value.body["param"] == "dimensions" and "576" in info.value.body["message"]


def test_huge_prompt_within_the_body_limit_is_refused_as_too_long(runtime_openai):
    with pytest.raises(openai.BadRequestError) as info:
        runtime_openai.completions.create(model=MODEL, prompt="x" * (7 << 20), max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded" and info.value.body["param"] == "prompt"
    assert "8192" in info.value.body["message"]
