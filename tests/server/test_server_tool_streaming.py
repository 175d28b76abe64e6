"""Streamed tool calls as OpenAI sends them: the call's id and name first, then its arguments as they are generated."""
import json

import pytest

from fixtures.tools import WEATHER

pytestmark = pytest.mark.integration

MODEL = "smollm2"
CITY = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def _call(i: int, city: str) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": json.dumps({"city": city})}}


# Two earlier turns that each asked two cities and got two calls: the small model then calls in parallel on its own.
PARALLEL = [
    {"role": "user", "content": "Weather in Rome and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(1, "Rome"), _call(2, "Oslo")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "20C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "5C"},
    {"role": "assistant", "content": "Rome 20C, Oslo 5C."},
    {"role": "user", "content": "Weather in Berlin and Madrid?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(3, "Berlin"), _call(4, "Madrid")]},
    {"role": "tool", "tool_call_id": "call_3", "content": "10C"},
    {"role": "tool", "tool_call_id": "call_4", "content": "25C"},
    {"role": "assistant", "content": "Berlin 10C, Madrid 25C."},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
]


def streamed(client, **request):
    """The stream's tool-call deltas, its content, finish reasons and usage."""
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True},
                                                 temperature=0, **request))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return deltas, content, reasons, chunks[-1].usage


def assembled(deltas) -> list[dict]:
    """The calls a client builds from the deltas, checking that only each call's first delta names it."""
    calls: dict[int, dict] = {}
    for d in deltas:
        if d.index not in calls:
            assert d.id and d.type == "function" and d.function.name, "a call's first delta names it"
            calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": "", "deltas": 0}
        else:
            assert d.id is None and d.function.name is None, "only the first delta carries the id and name"
        calls[d.index]["arguments"] += d.function.arguments or ""
        calls[d.index]["deltas"] += bool(d.function.arguments)
    assert sorted(calls) == list(range(len(calls)))
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_arguments_come_as_they_are_generated_and_add_up_to_the_answer(runtime_openai, choice):
    request = dict(messages=ASK, tools=[WEATHER], tool_choice=choice, max_tokens=80)
    deltas, content, reasons, usage = streamed(runtime_openai, **request)
    (call,) = assembled(deltas)
    whole = runtime_openai.chat.completions.create(model=MODEL, temperature=0, **request).choices[0]
    assert call["name"] == whole.message.tool_calls[0].function.name == "get_weather"
    assert call["arguments"] == whole.message.tool_calls[0].function.arguments
    json.loads(call["arguments"])
    # The arguments are sent as their tokens are generated (a token holds a few characters), not held back.
    assert call["deltas"] >= max(8, len(call["arguments"]) // 4), call
    assert call["deltas"] < usage.completion_tokens
    assert not content.strip() and reasons == ["tool_calls"]


def test_parallel_calls_stream_as_index_0_and_1(runtime_openai):
    request = dict(messages=PARALLEL, tools=[CITY], max_tokens=100)
    deltas, content, reasons, _ = streamed(runtime_openai, **request)
    calls = assembled(deltas)
    whole = runtime_openai.chat.completions.create(model=MODEL, temperature=0, **request).choices[0]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Tokyo"}]
    assert all(c["deltas"] > 1 for c in calls) and len({c["id"] for c in calls}) == 2
    assert reasons == ["tool_calls"] == [whole.finish_reason]


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_makes_one_call(runtime_openai, stream):
    request = dict(messages=PARALLEL, tools=[CITY], max_tokens=100, parallel_tool_calls=False)
    if stream:
        deltas, _, reasons, _ = streamed(runtime_openai, **request)
        calls = [(c["name"], c["arguments"]) for c in assembled(deltas)]
    else:
        choice = runtime_openai.chat.completions.create(model=MODEL, temperature=0, **request).choices[0]
        calls = [(t.function.name, t.function.arguments) for t in choice.message.tool_calls]
        reasons = [choice.finish_reason]
    assert calls == [("get_weather", '{"city": "Paris"}')] and reasons == ["tool_calls"]


def test_tool_choice_none_streams_no_calls(runtime_openai):
    deltas, content, reasons, _ = streamed(runtime_openai, messages=PARALLEL, tools=[CITY], tool_choice="none",
                                           max_tokens=24)
    assert deltas == [] and content and reasons[0] in ("stop", "length")
