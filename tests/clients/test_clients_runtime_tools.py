"""Streamed tool calls through client libraries nobody on the project wrote, against the runtime directly."""
import json

import pytest

from fixtures.clients import run_client

pytestmark = pytest.mark.integration


def test_instructor_create_partial_in_tools_mode_gets_the_object_as_it_forms(runtime_server):
    result = run_client("""
        import json, os
        import instructor
        from openai import OpenAI
        from pydantic import BaseModel, ConfigDict

        class Weather(BaseModel):
            model_config = ConfigDict(extra="forbid")
            city: str
            unit: str

        client = instructor.from_openai(OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"]),
                                        mode=instructor.Mode.TOOLS)
        request = dict(model="smollm2", response_model=Weather, temperature=0, max_tokens=80,
                       messages=[{"role": "user", "content": "What's the weather like in Paris today, in celsius?"}])
        partials = [p.model_dump() for p in client.chat.completions.create_partial(**request)]
        whole = client.chat.completions.create(**request).model_dump()
        print(json.dumps({"partials": partials, "whole": whole}))
    """, base_url=f"{runtime_server}/v1")
    partials = result["partials"]
    distinct = [p for i, p in enumerate(partials) if i == 0 or p != partials[i - 1]]
    # The object fills in field by field: empty, the city, then the unit, and ends as the whole answer.
    assert len(distinct) >= 3, partials
    assert any(p["city"] and p["unit"] is None for p in distinct), distinct
    assert partials[-1] == result["whole"] and result["whole"]["city"] == "Paris"


def test_langchain_streams_a_tool_call_in_chunks(runtime_server):
    result = run_client("""
        import json, os
        from langchain_openai import ChatOpenAI

        weather = {"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": False}}}
        llm = ChatOpenAI(model="smollm2", base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"],
                         temperature=0, max_tokens=80).bind_tools([weather], tool_choice="get_weather")
        question = "What's the weather like in Paris today?"
        chunks, merged = [], None
        for chunk in llm.stream(question):
            chunks += [{"id": c.get("id"), "name": c.get("name"), "args": c.get("args"), "index": c.get("index")}
                       for c in chunk.tool_call_chunks]
            merged = chunk if merged is None else merged + chunk
        whole = llm.invoke(question)
        print(json.dumps({"chunks": chunks, "streamed": merged.tool_calls, "whole": whole.tool_calls,
                          "finish": merged.response_metadata.get("finish_reason")}))
    """, base_url=f"{runtime_server}/v1")
    chunks = result["chunks"]
    assert len(chunks) >= 4 and chunks[0]["id"] and chunks[0]["name"] == "get_weather"
    assert all(c["index"] == 0 and c["name"] is None for c in chunks[1:])
    assert json.loads("".join(c["args"] for c in chunks)) == {"city": "Paris"}
    (streamed,), (whole,) = result["streamed"], result["whole"]
    assert (streamed["name"], streamed["args"]) == (whole["name"], whole["args"]) == ("get_weather", {"city": "Paris"})
    assert result["finish"] == "tool_calls"
