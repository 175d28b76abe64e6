"""logit_bias on the real model: +100 forces a token, -100 bans it, under sampling, penalties and grammars alike."""
import json

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from sluice_runtime.server.normalize import MAX_LOGIT_BIAS_ENTRIES

pytestmark = pytest.mark.integration

MODEL = "smollm2"
ASK = [{"role": "user", "content": "Name a fruit."}]
ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]}}, "required": ["answer"],
          "additionalProperties": False}
YES_NO = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def token_ids(tokenizer):
    """Token text to the ids with that text (a logprobs entry names a token by its text; a few texts, such as
    the replacement character of a split UTF-8 sequence, belong to several tokens)."""
    ids: dict[str, set[int]] = {}
    for i in range(len(tokenizer)):
        ids.setdefault(tokenizer.decode([i]), set()).add(i)
    return ids


@pytest.fixture(scope="module")
def http(runtime_server):
    with httpx.Client(base_url=runtime_server, timeout=120) as client:
        yield client


def generated_ids(choice, token_ids) -> list[set[int]]:
    """The ids each generated token may be."""
    return [token_ids[entry.token] for entry in choice.logprobs.content]


def unambiguous(candidates: list[set[int]]) -> list[int]:
    return [next(iter(c)) for c in candidates if len(c) == 1]


def any_of(candidates: list[set[int]]) -> set[int]:
    return set().union(*candidates)


def one_token(tokenizer, text: str) -> int:
    (token,) = tokenizer.encode(text)
    return token


def test_plus_100_forces_a_token_on_both_endpoints(runtime_openai, tokenizer):
    banana = one_token(tokenizer, " banana")
    chat = runtime_openai.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=4,
                                                  logit_bias={str(banana): 100})
    assert chat.choices[0].message.content == " banana" * 4
    completion = runtime_openai.completions.create(model=MODEL, prompt="My favourite colour is", temperature=1.0,
                                                   seed=3, max_tokens=4, logit_bias={str(banana): 100})
    assert completion.choices[0].text == " banana" * 4


@pytest.mark.parametrize("sampling", [
    {"temperature": 0},
    {"temperature": 1.0, "seed": 7},
    {"temperature": 0, "presence_penalty": -2.0, "frequency_penalty": -2.0},
])
def test_minus_100_bans_the_tokens_it_names(runtime_openai, token_ids, sampling):
    request = dict(model=MODEL, messages=ASK, max_tokens=12, logprobs=True, **sampling)
    before = generated_ids(runtime_openai.chat.completions.create(**request).choices[0], token_ids)
    banned = set(unambiguous(before)[:6])
    after = runtime_openai.chat.completions.create(**request, logit_bias={str(t): -100 for t in banned}).choices[0]
    assert banned and not banned & any_of(generated_ids(after, token_ids)), (before, after.message.content)


def test_a_bias_moves_the_greedy_choice(runtime_openai, token_ids):
    request = dict(model=MODEL, messages=ASK, max_tokens=1, temperature=0, logprobs=True, top_logprobs=2)
    first = runtime_openai.chat.completions.create(**request).choices[0].logprobs.content[0]
    top, runner_up = first.top_logprobs[0], first.top_logprobs[1]
    gap = top.logprob - runner_up.logprob
    lifted = runtime_openai.chat.completions.create(
        **request, logit_bias={str(min(token_ids[runner_up.token])): gap + 1}).choices[0].logprobs.content[0]
    assert lifted.token == runner_up.token != top.token


def test_the_grammar_mask_wins_over_a_forced_token(runtime_openai, tokenizer):
    banana = one_token(tokenizer, " banana")
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is the sky blue?"}], temperature=0, max_tokens=30,
        response_format=YES_NO, logit_bias={str(banana): 100})
    jsonschema.validate(json.loads(response.choices[0].message.content), ANSWER)


def test_a_banned_token_stays_banned_under_a_grammar(runtime_openai, token_ids):
    request = dict(model=MODEL, messages=[{"role": "user", "content": "Is the sky blue?"}], temperature=0,
                   max_tokens=30, response_format=YES_NO, logprobs=True)
    before = runtime_openai.chat.completions.create(**request).choices[0]
    ids = [min(c) for c in generated_ids(before, token_ids)]
    answer = json.loads(before.message.content)["answer"]
    # The first token that holds a letter of the answer: banning it leaves the grammar other ways to go on.
    banned = next(t for t, entry in zip(ids, before.logprobs.content) if entry.token.strip('" ') and
                  entry.token.strip('" ') in answer)
    after = runtime_openai.chat.completions.create(**request, logit_bias={str(banned): -100}).choices[0]
    jsonschema.validate(json.loads(after.message.content), ANSWER)
    assert banned not in any_of(generated_ids(after, token_ids))


def test_a_tool_call_grammar_composes_with_a_bias(runtime_openai, tokenizer):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}}
    paris = one_token(tokenizer, "Paris")
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[weather],
        tool_choice="required", temperature=0, max_tokens=40, logit_bias={str(paris): -100})
    (call,) = response.choices[0].message.tool_calls
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_as_many_entries_as_the_bound_are_taken(runtime_openai):
    bias = {str(1000 + i): 1.5 for i in range(MAX_LOGIT_BIAS_ENTRIES)}
    response = runtime_openai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, logit_bias=bias)
    assert response.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("bias", [
    {"49152": 5},  # one past SmolLM2's vocabulary
    {str(10**30): 5},
    {"abc": 5},
    {"1.5": 5},
    {"-1": 5},
    {" 5": 5},
    {"\u0663": 5},  # an Arabic-Indic digit is a digit, not a token id
    {"": 5},
    {"5": 101},
    {"5": -100.5},
    {"5": 1e300},
    {"5": "5"},
    {"5": True},
    {"5": None},
    {"5": [1]},
    {"5": 1, "05": 2},
    {str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)},
])
@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 2}),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
])
def test_bad_biases_are_a_400_naming_logit_bias(http, path, body, bias):
    response = http.post(path, json={**body, "logit_bias": bias})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "logit_bias" and "logit_bias" in error["message"], error


@pytest.mark.parametrize("bias", [[1, 2], "x", 5])
def test_a_logit_bias_that_is_no_object_is_a_400(http, bias):
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "logit_bias": bias})
    assert response.status_code == 400 and response.json()["error"]["param"] == "logit_bias", response.text


def test_the_sdk_raises_bad_request_for_an_unknown_token(runtime_openai):
    with pytest.raises(openai.BadRequestError) as info:
        runtime_openai.chat.completions.create(model=MODEL, messages=ASK, logit_bias={"9999999": 3})
    assert info.value.body["param"] == "logit_bias" and info.value.body["code"] == "invalid_token_id"
