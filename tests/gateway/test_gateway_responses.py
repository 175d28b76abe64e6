"""OpenAI's Responses API at the gateway, through the official client, in front of a real runtime: whole and
streamed answers, function calls, structured output, stored responses (memory and Redis), cancel, limits."""
import json
import time

import httpx
import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, runtimes, table

pytestmark = pytest.mark.integration

ALICE, BOB, CAROL = "sk-resp-alice", "sk-resp-bob", "sk-resp-carol"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}


def config(**overrides):
    return gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)]},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)]},
        {"name": "carol", "keys": [key_entry("carol-key", CAROL)], "limits": {"requests_per_minute": 2}},
    ], **overrides)


@pytest.fixture(scope="module")
def upstream(tiny_model_dir):
    with runtimes(tiny_model_dir, 1) as servers:
        yield servers[0]


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    routes = table(tiny={"backends": [backend("tiny-v1", upstream.url)]})
    with run_gateway(config(), routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def client(gateway, key=ALICE):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_a_whole_response_is_stored_for_its_tenant_only(gateway):
    alice = client(gateway)
    response = alice.responses.create(model="tiny", input="Say hello.", instructions="Be brief.",
                                      max_output_tokens=6, temperature=0.5, top_p=0.9)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message" and response.output_text
    assert 0 < response.usage.output_tokens <= 6 and response.usage.input_tokens > 0
    assert response.instructions == "Be brief." and response.max_output_tokens == 6

    again = alice.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == response.output_text

    bob = client(gateway, BOB)
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as continued:
        bob.responses.create(model="tiny", input="More.", previous_response_id=response.id, max_output_tokens=2)
    assert continued.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve("resp_" + "0" * 32)

    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(response.id)
    alice.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.delete(response.id)

    unstored = alice.responses.create(model="tiny", input="Say hello.", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(unstored.id)


def test_previous_response_id_continues_the_conversation(gateway):
    alice = client(gateway)
    first = alice.responses.create(model="tiny", input="Name a colour.", max_output_tokens=8)
    second = alice.responses.create(model="tiny", input="And another?", previous_response_id=first.id,
                                    max_output_tokens=4)
    alone = alice.responses.create(model="tiny", input="And another?", max_output_tokens=4)
    assert second.previous_response_id == first.id
    # The first turn and its answer went upstream again ahead of the new input.
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    third = alice.responses.create(model="tiny", input="One more.", previous_response_id=second.id,
                                   max_output_tokens=2)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_a_stream_is_the_typed_event_sequence(gateway):
    stream = client(gateway).responses.create(model="tiny", input="Count to five.", max_output_tokens=12, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    # At max_output_tokens the last is response.incomplete, as OpenAI's.
    assert kinds[-1] == {"completed": "response.completed", "incomplete": "response.incomplete"}[events[-1].response.status]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert deltas and done.text == deltas == final.output_text
    assert final.status in ("completed", "incomplete") and 0 < final.usage.output_tokens <= 12
    assert client(gateway).responses.retrieve(final.id).output_text == deltas


def test_function_calls_whole_streamed_and_answered(gateway):
    alice = client(gateway)
    forced = {"type": "function", "name": "get_weather"}
    response = alice.responses.create(model="tiny", input="Weather in Paris?", tools=[WEATHER], tool_choice=forced,
                                      max_output_tokens=60)
    call = next(item for item in response.output if item.type == "function_call")
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)

    events = list(alice.responses.create(model="tiny", input="Weather in Paris?", tools=[WEATHER],
                                         tool_choice=forced, max_output_tokens=60, stream=True))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
    assert added.item.name == "get_weather"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert deltas == done.arguments and json.loads(done.arguments)["city"]
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.completed")
    assert events[-1].response.output[-1].arguments == done.arguments

    # The call and its output go back as input items, as an agent sends them.
    answered = alice.responses.create(model="tiny", max_output_tokens=4, tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"},
    ])
    alone = alice.responses.create(model="tiny", max_output_tokens=4, tools=[WEATHER], input="Weather in Paris?")
    assert answered.status in ("completed", "incomplete")
    assert answered.usage.input_tokens > alone.usage.input_tokens + len(call.arguments) // 8


def test_text_format_json_schema_constrains_the_output(gateway):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"],
              "additionalProperties": False}
    response = client(gateway).responses.create(
        model="tiny", input="Pick a colour.", max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
    assert json.loads(response.output_text)["colour"] in ("red", "blue")
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize("extra, param", [
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"frequency_penalty_x": 1}, "frequency_penalty_x"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": 7}, "input"),
    ({"stream": "yes"}, "stream"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
])
def test_unsupported_parameters_are_400_naming_them(gateway, extra, param):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 2, **extra}
    answer = httpx.post(f"{gateway.url}/v1/responses", json=body, headers={"authorization": f"Bearer {ALICE}"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_nulls_mean_not_given(gateway):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 2, "temperature": None, "top_p": None,
            "tools": None, "reasoning": None, "background": None, "previous_response_id": None, "stream": None}
    answer = httpx.post(f"{gateway.url}/v1/responses", json=body, headers={"authorization": f"Bearer {ALICE}"})
    assert answer.status_code == 200, answer.text


def test_limits_count_responses_and_chat_alike(gateway):
    carol = client(gateway, CAROL)
    carol.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    carol.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    with pytest.raises(openai.RateLimitError) as limited:
        carol.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    assert limited.value.response.headers.get("retry-after")
    with pytest.raises(openai.RateLimitError):
        carol.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)


def test_usage_is_accounted_as_chat_is(gateway):
    raw = client(gateway).responses.with_raw_response.create(model="tiny", input="Hi", max_output_tokens=3)
    response = raw.parse()
    line = gateway.access_lines(raw.headers["x-sluice-request-id"])[raw.headers["x-sluice-request-id"]]
    assert line["prompt_tokens"] == response.usage.input_tokens
    assert line["completion_tokens"] == response.usage.output_tokens
    assert line["status"] == 200 and line["route"] == "tiny"


def test_a_running_stream_is_cancelled(gateway):
    alice = client(gateway)
    stream = alice.responses.create(model="tiny", input="Write a long story.", max_output_tokens=1500, stream=True)
    events = []
    for event in stream:
        events.append(event)
        if event.type == "response.output_text.delta" and len(events) == 8:
            cancelled = client(gateway).responses.cancel(events[0].response.id)
            assert cancelled.status == "cancelled"
    final = events[-1].response
    assert final.status == "cancelled"
    assert sum(e.type == "response.output_text.delta" for e in events) < 1000
    assert alice.responses.retrieve(final.id).status == "cancelled"
    with pytest.raises(openai.NotFoundError):
        client(gateway, BOB).responses.cancel(final.id)

    done = alice.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError):
        alice.responses.cancel(done.id)


def test_a_second_replica_reads_the_redis_store(upstream, redis_server, start_gateway):
    routes = table(tiny={"backends": [backend("tiny-v1", upstream.url)]})
    shared = config(redis={"url": redis_server.url}, responses={"store_ttl_s": 3})
    one, two = start_gateway(shared, routes), start_gateway(shared, routes)
    first = client(one).responses.create(model="tiny", input="Name a colour.", max_output_tokens=4)
    assert client(two).responses.retrieve(first.id).output_text == first.output_text
    follow = client(two).responses.create(model="tiny", input="Another?", previous_response_id=first.id,
                                          max_output_tokens=2)
    assert follow.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client(two, BOB).responses.retrieve(first.id)
    client(one).responses.delete(follow.id)
    with pytest.raises(openai.NotFoundError):
        client(two).responses.retrieve(follow.id)
    # The Redis limiter counts Responses with every replica's chat requests.
    client(one, CAROL).responses.create(model="tiny", input="Hi", max_output_tokens=1)
    client(two, CAROL).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=1)
    with pytest.raises(openai.RateLimitError):
        client(one, CAROL).responses.create(model="tiny", input="Hi", max_output_tokens=1)
    time.sleep(3.5)
    with pytest.raises(openai.NotFoundError):
        client(one).responses.retrieve(first.id)


def test_the_memory_store_expires_responses(upstream, start_gateway):
    routes = table(tiny={"backends": [backend("tiny-v1", upstream.url)]})
    gw = start_gateway(config(responses={"store_ttl_s": 2}), routes)
    first = client(gw).responses.create(model="tiny", input="Hi", max_output_tokens=1)
    assert client(gw).responses.retrieve(first.id).id == first.id
    time.sleep(2.5)
    with pytest.raises(openai.NotFoundError):
        client(gw).responses.retrieve(first.id)


@pytest.mark.parametrize("ttl", [0, -1, 1.5, "1d", None, 10 ** 9])
def test_the_store_ttl_is_validated(ttl):
    from pydantic import ValidationError

    from sluice_gateway.config import GatewayConfig

    with pytest.raises(ValidationError) as refused:
        GatewayConfig.model_validate({"responses": {"store_ttl_s": ttl}})
    assert "store_ttl_s" in str(refused.value)


def test_the_token_reservation_is_chats_on_every_endpoint(gateway):
    """A request that asks for more tokens than any limit or model allows is refused alike, whichever API
    it comes in, and the refusal names the field as that API spells it."""
    auth = {"authorization": f"Bearer {ALICE}"}
    ask = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(f"{gateway.url}/v1/chat/completions", headers=auth,
                      json={"model": "tiny", "messages": ask, "max_tokens": 10 ** 12})
    responses = httpx.post(f"{gateway.url}/v1/responses", headers=auth,
                           json={"model": "tiny", "input": "Hi", "max_output_tokens": 10 ** 12})
    messages = httpx.post(f"{gateway.url}/v1/messages", headers={"x-api-key": ALICE},
                          json={"model": "tiny", "messages": ask, "max_tokens": 10 ** 12})
    assert chat.status_code == responses.status_code == messages.status_code == 400
    assert chat.json()["error"]["param"] == "max_tokens"
    assert responses.json()["error"]["param"] == "max_output_tokens"
    assert responses.json()["error"]["code"] == chat.json()["error"]["code"]
    assert messages.json()["error"]["type"] == "invalid_request_error"
    for wrong in ("many", -1, True, 1.5):
        refused = httpx.post(f"{gateway.url}/v1/responses", headers=auth,
                             json={"model": "tiny", "input": "Hi", "max_output_tokens": wrong})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_output_tokens", wrong


def test_the_memory_store_is_bounded_oldest_first():
    import asyncio

    from sluice_gateway.response_store import ResponseStore

    async def fill():
        store = ResponseStore(3600, memory_bytes=10_000)
        ids = [f"resp_{n:032x}" for n in range(100)]
        for response_id in ids:  # 100 records of about 1 kB: a tenant storing without end
            await store.put("alice", response_id, {"response": {"id": response_id}, "messages": ["x" * 1000]})
        return [await store.get("alice", response_id) is not None for response_id in ids]

    kept = asyncio.run(fill())
    assert kept[-1] and not kept[0] and 5 <= sum(kept) <= 10
    assert kept == sorted(kept)  # what is kept is the newest


def test_a_stream_cut_short_ends_in_each_apis_error_event(upstream, start_gateway):
    """Past the gateway's total deadline a stream is cut: the client reads the failure in its own API's events."""
    routes = table(tiny={"backends": [backend("tiny-v1", upstream.url)]})
    gw = start_gateway(config(timeouts={"total_s": 1.0}), routes)
    events = list(client(gw).responses.create(model="tiny", input="Write a long story.", max_output_tokens=1900,
                                              stream=True))
    assert events[0].type == "response.created" and [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.status == "failed" and "mid-response" in events[-1].response.error.message

    with httpx.stream("POST", f"{gw.url}/v1/messages", headers={"x-api-key": ALICE}, timeout=30, json={
            "model": "tiny", "max_tokens": 1900, "stream": True,
            "messages": [{"role": "user", "content": "Write a long story."}]}) as answer:
        text = answer.read().decode()
    kinds = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-1] == "error" and "message_stop" not in kinds
    last = json.loads(text.strip().splitlines()[-1][len("data: "):])
    assert last["type"] == "error" and last["error"]["type"] == "api_error"
