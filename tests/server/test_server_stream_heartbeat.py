"""A stream whose generated text is held back still sends bytes, so idle timeouts of proxies and the gateway hold."""
import httpx
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from fixtures.runtime_server import start_runtime_server
from sluice_runtime.server.sse import HEARTBEAT

pytestmark = pytest.mark.integration

MODEL = "smollm2"


@pytest.fixture(scope="module")
def server():
    with start_runtime_server("--stream-heartbeat-s", "0.2") as server:
        yield server


@pytest.fixture(scope="module")
def held_request(smollm2_dir) -> dict:
    """A stream that generates for a while and shows nothing: every token it is forced to write is the start of
    its stop sequence, until the stop sequence is complete."""
    (banana,) = AutoTokenizer.from_pretrained(smollm2_dir).encode(" banana")
    return {"model": MODEL, "messages": [{"role": "user", "content": "Name a fruit."}], "temperature": 0,
            "max_tokens": 40, "stop": [" banana" * 36], "logit_bias": {str(banana): 100}, "stream": True}


def test_held_text_sends_heartbeats_and_clients_skip_them(server, held_request):
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=held_request, timeout=120) as response:
        assert response.status_code == 200
        body = "".join(response.iter_text())
    events = [e + "\n\n" for e in body.split("\n\n") if e]
    assert HEARTBEAT in events, body
    data = [e for e in events if e != HEARTBEAT]
    assert data[-1] == "data: [DONE]\n\n" and len(data) == 3, data  # the role, the finish reason, [DONE]
    with OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        chunks = [c for c in client.chat.completions.create(**held_request) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]


def test_a_stream_that_sends_its_tokens_sends_no_heartbeat(server, held_request):
    request = {**held_request, "stop": None}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=request, timeout=120) as response:
        body = "".join(response.iter_text())
    assert HEARTBEAT not in body and body.count("banana") == 40
