"""The runtime verifies the gateway's prompt reservation (sluice_contracts.prompt_reservation) against the prompt
as it serves it: whatever field carries the text, the tokens the model reads may not exceed what was reserved."""
import json

import httpx
import openai
import pytest

from sluice_contracts import prompt_reservation

pytestmark = pytest.mark.integration

MODEL = "smollm2"
TEXT = "The quarterly report shows revenue grew in every region, led by strong demand in the north. " * 12


def _with_tool_call_text(arguments: str, name: str = "lookup") -> list[dict]:
    """A conversation whose only long text is an earlier assistant turn's tool call."""
    return [{"role": "user", "content": "Find it."},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
            {"role": "user", "content": "Thanks."}]


def _reserved(tokens) -> dict:
    return {prompt_reservation.HEADER: str(tokens)}


def _post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=headers or {}, timeout=120)


def _refused(response: httpx.Response, tokens: int, reserved: int, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == prompt_reservation.CODE and error["param"] == param
    assert f"{tokens} tokens" in error["message"] and f"{reserved} prompt tokens reserved" in error["message"]


def _chat_prompt_tokens(url: str, messages: list[dict], **extra) -> int:
    """The prompt's real size: what the runtime reports serving it without a reservation."""
    response = _post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1, **extra})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("messages", [
    _with_tool_call_text(json.dumps({"query": TEXT})),
    _with_tool_call_text(TEXT),  # arguments that are not JSON are sent to the model as they are
    _with_tool_call_text("{}", name="lookup_" + "x" * 400),
    # Empty content parts: each still costs the separator it is joined with.
    [{"role": "user", "content": [{"type": "text", "text": ""}] * 1000}],
], ids=["tool-call-arguments", "non-json-arguments", "tool-call-name", "empty-content-parts"])
def test_a_chat_prompt_beyond_its_reservation_is_refused_whichever_field_carries_it(runtime_server, messages):
    tokens = _chat_prompt_tokens(runtime_server, messages)
    assert tokens > 100
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    # What the gateway reserves when it counts only `content`: far less than the model reads.
    _refused(_post(runtime_server, "/v1/chat/completions", body, _reserved(20)), tokens, 20, "messages")
    _refused(_post(runtime_server, "/v1/chat/completions", body, _reserved(tokens - 1)), tokens, tokens - 1,
             "messages")
    served = _post(runtime_server, "/v1/chat/completions", body, _reserved(tokens))
    assert served.status_code == 200 and served.json()["usage"]["prompt_tokens"] == tokens


def test_the_tools_a_chat_offers_count_as_prompt_and_streams_are_refused_before_they_start(runtime_server):
    tools = [{"type": "function", "function": {"name": "lookup", "description": TEXT,
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "hi"}]
    tokens = _chat_prompt_tokens(runtime_server, messages, tools=tools)
    with openai.OpenAI(base_url=f"{runtime_server}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=1, stream=True,
                                           extra_headers=_reserved(10))
        served = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=1,
                                                extra_headers=_reserved(tokens))
    assert refused.value.code == prompt_reservation.CODE and f"{tokens} tokens" in refused.value.message
    assert served.usage.prompt_tokens == tokens


def test_completion_prompts_are_summed_against_the_reservation(runtime_server):
    prompts = ["Once upon a time", TEXT, "The end."]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 1}
    served = _post(runtime_server, "/v1/completions", body)
    assert served.status_code == 200
    tokens = served.json()["usage"]["prompt_tokens"]
    # Each prompt alone is within the reservation; together they are not.
    biggest = max(len(httpx.post(f"{runtime_server}/tokenize", json={"prompt": p}).json()["tokens"])
                  for p in prompts)
    assert biggest < tokens - 1
    _refused(_post(runtime_server, "/v1/completions", body, _reserved(tokens - 1)), tokens, tokens - 1, "prompt")
    assert "3 prompts have" in _post(runtime_server, "/v1/completions", body,
                                     _reserved(biggest)).json()["error"]["message"]
    assert _post(runtime_server, "/v1/completions", body, _reserved(tokens)).status_code == 200
    # n choices read the prompt once.
    assert _post(runtime_server, "/v1/completions", {**body, "n": 3}, _reserved(tokens)).status_code == 200


def test_embedding_and_rerank_inputs_are_summed_against_the_reservation(runtime_server):
    inputs = ["a red apple", TEXT, "a green pear"]
    served = _post(runtime_server, "/v1/embeddings", {"model": MODEL, "input": inputs})
    tokens = served.json()["usage"]["prompt_tokens"]
    _refused(_post(runtime_server, "/v1/embeddings", {"model": MODEL, "input": inputs}, _reserved(tokens - 1)),
             tokens, tokens - 1, "input")
    with openai.OpenAI(base_url=f"{runtime_server}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        assert len(client.embeddings.create(model=MODEL, input=inputs, extra_headers=_reserved(tokens)).data) == 3
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL, input=[[7] * 50, [8] * 50], extra_headers=_reserved(99))
    assert refused.value.code == prompt_reservation.CODE
    rerank = {"model": MODEL, "query": "which fruit is red?", "documents": inputs}
    tokens = _post(runtime_server, "/v1/rerank", rerank).json()["usage"]["prompt_tokens"]
    _refused(_post(runtime_server, "/v1/rerank", rerank, _reserved(tokens - 1)), tokens, tokens - 1, "documents")
    assert _post(runtime_server, "/v1/rerank", rerank, _reserved(tokens)).status_code == 200


@pytest.mark.parametrize("value", ["abc", "-5", "12.0", "", "1e3", "0x10", "99999999999999",
                                   str(prompt_reservation.MAX_RESERVATION + 1)])
def test_a_malformed_reservation_is_refused(runtime_server, value):
    for path, body in (("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 1}),
                       ("/v1/embeddings", {"model": MODEL, "input": "hi"})):
        response = _post(runtime_server, path, body, {prompt_reservation.HEADER: value})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_prompt_reservation" and prompt_reservation.HEADER in error["message"]


def test_a_reservation_sent_twice_is_refused_and_none_is_not_checked(runtime_server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": TEXT}], "max_tokens": 1}
    twice = httpx.post(f"{runtime_server}/v1/chat/completions", json=body, timeout=120,
                       headers=[(prompt_reservation.HEADER, "100000"), (prompt_reservation.HEADER, "1")])
    assert twice.status_code == 400 and twice.json()["error"]["code"] == "invalid_prompt_reservation"
    assert _post(runtime_server, "/v1/chat/completions", body).status_code == 200
