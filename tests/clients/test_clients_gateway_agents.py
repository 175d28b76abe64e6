"""The OpenAI Agents SDK's default model (the Responses API) running an agent with a function tool end to end
through the gateway, in front of a real runtime."""
import pytest

from fixtures.clients import run_client
from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, runtimes, table

pytestmark = pytest.mark.integration

KEY = "sk-agents-alice"

AGENT = """
import json, os
from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)
set_default_openai_client(AsyncOpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"],
                                      max_retries=0))
calls = []

@function_tool
def get_weather(city: str) -> str:
    \"\"\"The weather in a city.\"\"\"
    calls.append(city)
    return f"Sunny in {city}"

STREAM = os.environ.get("STREAM") == "1"
# The tiny model's weights are random: the first turn is made to call the tool; after it the SDK lets the model
# answer freely (reset_tool_choice), which ends the run. A streamed run takes only a completed response as its
# end, which a random model's answer cut at max_tokens is not: that run ends with the tool's output.
agent = Agent(name="weather", instructions="Answer with the weather.", model="tiny", tools=[get_weather],
              model_settings=ModelSettings(tool_choice="get_weather", max_tokens=40, temperature=0.0,
                                           parallel_tool_calls=False),
              tool_use_behavior="stop_on_first_tool" if STREAM else "run_llm_again")
if STREAM:
    import asyncio

    async def main():
        result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
        async for _ in result.stream_events():
            pass
        return result
    result = asyncio.run(main())
else:
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
print(json.dumps({"calls": calls, "final": result.final_output,
                  "items": [item.type for item in result.new_items],
                  "responses": [r.response_id for r in result.raw_responses],
                  "usage": [r.usage.output_tokens for r in result.raw_responses]}))
"""


@pytest.fixture(scope="module")
def gateway(tiny_model_dir, tmp_path_factory):
    config = gateway_config([{"name": "alice", "keys": [key_entry("alice-key", KEY)]}])
    with runtimes(tiny_model_dir, 1) as (upstream,):
        routes = table(tiny={"backends": [backend("tiny-v1", upstream.url)]})
        with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
            yield gw


@pytest.mark.parametrize("stream", ["0", "1"])
def test_an_agent_calls_its_function_tool_and_answers(gateway, stream):
    out = run_client(AGENT, base_url=gateway.url, api_key=KEY, STREAM=stream)
    assert len(out["calls"]) == 1 and isinstance(out["calls"][0], str)
    assert out["items"][:2] == ["tool_call_item", "tool_call_output_item"]
    if stream == "1":
        assert out["final"] == f"Sunny in {out['calls'][0]}" and len(out["responses"]) == 1
    else:
        assert out["items"][-1] == "message_output_item" and isinstance(out["final"], str)
        assert len(out["responses"]) == 2
    assert all(r.startswith("resp_") for r in out["responses"])
    assert all(tokens > 0 for tokens in out["usage"])
