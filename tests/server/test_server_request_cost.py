"""The fields that decide what a request costs are read as the gateway reads them (sluice_contracts.request_cost).

A request the gateway reserved 5 tokens for must not generate more, whatever else the body says.
"""
import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "smollm2"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "ignore_eos": True}
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "ignore_eos": True}


@pytest.fixture(scope="module")
def http(runtime_server):
    with httpx.Client(base_url=runtime_server, timeout=120) as client:
        yield client


def refused(response: httpx.Response, param: str) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


@pytest.mark.parametrize("limits", [
    {"max_completion_tokens": None, "max_tokens": 5},
    {"max_tokens": None, "max_completion_tokens": 5},
    {"max_tokens": 5, "max_completion_tokens": 5},
])
def test_a_null_limit_is_absent_and_the_other_one_holds(http, limits):
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        reply = http.post(path, json={**body, **limits}).json()
        assert reply["usage"]["completion_tokens"] == 5, (path, reply)
        assert reply["choices"][0]["finish_reason"] == "length"


def test_the_completions_default_is_sixteen_tokens(http):
    reply = http.post("/v1/completions", json=COMPLETION).json()
    assert reply["usage"]["completion_tokens"] == 16


def test_two_names_with_different_values_are_refused(http):
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        error = refused(http.post(path, json={**body, "max_tokens": 5, "max_completion_tokens": 3000}), "max_tokens")
        assert "max_completion_tokens" in error["message"]


@pytest.mark.parametrize("value", ["2", 2.0, True, "two", [2], {"n": 2}, 0, 17, -1])
def test_n_is_a_strict_integer_in_range(http, value):
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        refused(http.post(path, json={**body, "n": value, "max_tokens": 2}), "n")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", ["5", 5.0, True, 0, -3, [5]])
def test_max_tokens_is_a_strict_positive_integer(http, field, value):
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        refused(http.post(path, json={**body, field: value}), field)


@pytest.mark.parametrize("value", ["true", 1, 0, "false"])
def test_ignore_eos_is_a_strict_boolean(http, value):
    refused(http.post("/v1/chat/completions", json={**CHAT, "ignore_eos": value, "max_tokens": 2}), "ignore_eos")


def test_every_prompt_and_choice_is_served_as_counted(http):
    body = {**COMPLETION, "prompt": ["One", "Two", "Three"], "n": 2, "max_tokens": 3}
    reply = http.post("/v1/completions", json=body).json()
    assert len(reply["choices"]) == 6
    assert reply["usage"]["completion_tokens"] == 18


def test_n_through_the_openai_client(runtime_openai):
    reply = runtime_openai.chat.completions.create(model=MODEL, messages=CHAT["messages"], n=3, max_tokens=4,
                                                   extra_body={"ignore_eos": True})
    assert len(reply.choices) == 3 and reply.usage.completion_tokens == 12
