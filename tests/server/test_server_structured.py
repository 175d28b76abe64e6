"""Tools and structured output: the grammar makes even a 135M model produce valid JSON and calls."""
import json

import httpx
import jsonschema
import pytest

from fixtures.tools import WEATHER

pytestmark = pytest.mark.integration

MODEL = "smollm2"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "pets", "employed"],
    "additionalProperties": False,
}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def person_format(strict=True):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": strict}}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_json_schema_output_always_validates(runtime_openai, seed):
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=person_format(), temperature=1.0, seed=seed, max_tokens=120)
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content), PERSON)


def test_json_schema_streamed_and_n2(runtime_openai):
    chunks = list(runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A person, please."}], n=2,
        response_format=person_format(), temperature=1.0, seed=11, max_tokens=120, stream=True))
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices and c.choices[0].index == index)
        jsonschema.validate(json.loads(text), PERSON)


def test_json_schema_on_completions(runtime_openai):
    response = runtime_openai.completions.create(
        model=MODEL, prompt="Here is a person record:", max_tokens=120, temperature=1.0, seed=5,
        extra_body={"response_format": person_format()})
    jsonschema.validate(json.loads(response.choices[0].text), PERSON)


def test_json_object_output_parses(runtime_openai):
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
        response_format={"type": "json_object"}, temperature=0.7, seed=3, max_tokens=200)
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].message.content), dict)
    else:
        # An open-ended object can outrun max_tokens; the text is then a valid JSON prefix.
        assert response.choices[0].message.content.startswith("{")


def test_named_tool_choice_always_yields_a_valid_call(runtime_openai):
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, ADD], max_tokens=80, temperature=0.8, seed=2,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("seed", [1, 2])
def test_required_tool_choice_calls_one_of_the_tools(runtime_openai, seed):
    response = runtime_openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2 plus 3?"}], tools=[WEATHER, ADD],
        tool_choice="required", max_tokens=80, temperature=1.0, seed=seed)
    (call,) = response.choices[0].message.tool_calls
    schema = {"get_weather": WEATHER, "add": ADD}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_max_tokens_reports_length_and_the_partial_call(runtime_openai, stream):
    request = dict(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=20, temperature=0,
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    if stream:
        chunks = [c for c in runtime_openai.chat.completions.create(**request, stream=True) if c.choices]
        deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        name, arguments = deltas[0].function.name, "".join(d.function.arguments or "" for d in deltas)
    else:
        choice = runtime_openai.chat.completions.create(**request).choices[0]
        content, reasons = choice.message.content or "", [choice.finish_reason]
        (call,) = choice.message.tool_calls
        name, arguments = call.function.name, call.function.arguments
    assert reasons == ["length"]
    assert "<tool_call>" not in content and not content.strip()
    assert name == "get_weather" and arguments.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)  # cut short: what OpenAI returns too, a prefix of the arguments


def test_tool_call_streams_as_tool_call_deltas(runtime_openai):
    chunks = list(runtime_openai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=80,
        temperature=0, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].id and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_round_trip(runtime_openai, runtime_server):
    first = runtime_openai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    answer = runtime_openai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],
                                                    max_tokens=24, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
    # The earlier call and its result are in the prompt the model saw.
    tokens = httpx.post(f"{runtime_server}/tokenize", json={"messages": history}).json()["tokens"]
    prompt = httpx.post(f"{runtime_server}/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather"' in prompt and "18 degrees and sunny" in prompt


def test_tool_choice_none_and_auto_answer_normally(runtime_openai):
    for choice in ("none", "auto"):
        response = runtime_openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], tools=[WEATHER],
            tool_choice=choice, max_tokens=16, temperature=0)
        message = response.choices[0].message
        assert message.content or message.tool_calls
        if choice == "none":
            assert message.tool_calls is None
