"""A client that gives up must not take the engine down for everyone, and a replica whose engine loop ended must
fail its liveness probe (/health), so the kubelet restarts it.

The abandoned requests keep the engine busy with work that runs on the engine thread between steps (embedding
forwards, adapter loads): the client leaves while that work is queued or running, which cancels the awaiting
future on the server."""
import asyncio
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from fixtures.lora import build_lora
from fixtures.runtime_server import start_runtime_server

pytestmark = pytest.mark.integration

MODEL = "smollm2"
# About 1,000 tokens each: every input fills most of one packed forward, so the request takes several seconds of
# engine time and the client can leave in the middle of it.
LONG_TEXT = "Quarterly tax filing deadlines fall in April, and late filers pay interest on what they owe. " * 50
LONG_INPUTS = [LONG_TEXT] * 8


@pytest.fixture(scope="module")
def adapter(smollm2_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("survival-lora") / "tone"
    build_lora(smollm2_dir, path, seed=7, rank=4)
    return path


@pytest.fixture(scope="module")
def server(adapter):
    with start_runtime_server("--enable-lora", "--max-lora-rank", "4") as running:
        yield running


def _assert_serving(server) -> None:
    """What another tenant sees afterwards: a chat answered, and both probes still 200."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as other:
        reply = other.chat.completions.create(model=MODEL, max_tokens=4,
                                              messages=[{"role": "user", "content": "Say hi"}])
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{server.url}/ready", timeout=10).json() == {"ready": True}
    assert "engine loop crashed" not in server.stderr()


def _busy_engine(server, seconds_of_work: int = 6) -> threading.Thread:
    """An embeddings request from another client that keeps the engine thread in packed forwards meanwhile."""
    def run():
        httpx.post(f"{server.url}/v1/embeddings", timeout=300,
                   json={"model": MODEL, "input": [LONG_TEXT] * seconds_of_work})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.5)
    return thread


def test_an_embeddings_request_the_client_abandons_leaves_the_engine_serving_everyone(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=1.5) as impatient:
        for _ in range(2):
            with pytest.raises(openai.APITimeoutError):
                impatient.embeddings.create(model=MODEL, input=LONG_INPUTS)
    _assert_serving(server)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as patient:
        vectors = patient.embeddings.create(model=MODEL, input=["a red apple", "a green pear"]).data
    assert len(vectors) == 2


def test_a_rerank_request_the_client_abandons_leaves_the_engine_serving_everyone(server):
    for _ in range(2):
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.url}/v1/rerank", timeout=1.5,
                       json={"model": MODEL, "query": "when are taxes due?", "documents": LONG_INPUTS})
    _assert_serving(server)


def test_an_embeddings_request_abandoned_while_queued_behind_another(server):
    """Left while its first forward still waits for the engine thread: the queued call is dropped unrun."""
    busy = _busy_engine(server)
    # Each short call waits for what is left of the packed forward running when it arrives, which on a fast CPU
    # may end within the timeout: calls are sent while the engine is busy until three were left waiting.
    abandoned = 0
    while busy.is_alive() and abandoned < 3:
        try:
            httpx.post(f"{server.url}/v1/embeddings", timeout=0.15, json={"model": MODEL, "input": "short"})
        except httpx.TimeoutException:
            abandoned += 1
    busy.join(timeout=300)
    assert abandoned == 3, f"only {abandoned} short calls were left waiting behind the busy engine's forwards"
    _assert_serving(server)


def test_adapter_loads_and_unloads_abandoned_mid_way(server, adapter):
    """The load's call waits behind a packed forward and the operator's client times out; whichever way each one
    went, the adapter's state stays one the next reconcile can read and fix."""
    busy = _busy_engine(server)
    for body, path in (({"lora_name": "tone", "lora_path": str(adapter)}, "load_lora_adapter"),
                       ({"lora_name": "tone"}, "unload_lora_adapter"),
                       ({"lora_name": "tone", "lora_path": str(adapter)}, "load_lora_adapter")):
        try:
            httpx.post(f"{server.url}/v1/{path}", json=body, timeout=0.15)
        except httpx.TimeoutException:
            pass
    busy.join(timeout=300)
    _assert_serving(server)
    loaded = {m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    if "tone" not in loaded:
        response = httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=60,
                              json={"lora_name": "tone", "lora_path": str(adapter)})
        assert response.status_code == 200, response.text
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        reply = client.chat.completions.create(model="tone", max_tokens=4,
                                               messages=[{"role": "user", "content": "Say hi"}])
    assert reply.model == "tone" and reply.usage.completion_tokens >= 1


class _InProcessServer:
    """The runtime's app on a real engine and a real uvicorn listener, in this process: the test can stop the
    engine loop itself (AsyncEngine.shutdown), which nothing reachable over HTTP does."""

    def __init__(self):
        from sluice_runtime.engine.async_engine import AsyncEngine
        from sluice_runtime.engine_config import EngineConfig
        from sluice_runtime.server.app import build_app
        from sluice_runtime.server.settings import ServerSettings

        self.engine = AsyncEngine.from_config(EngineConfig(num_kv_blocks=256))
        app = build_app(self.engine, ServerSettings(port=0))
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 120
        while not self._server.started:
            assert time.monotonic() < deadline, "the in-process server never started"
            time.sleep(0.1)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.engine.shutdown()


def test_a_stopped_engine_fails_liveness_and_every_waiter_hears_it():
    with _InProcessServer() as server:
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        events: list[str] = []

        def stream():
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60, json={
                    "model": MODEL, "messages": [{"role": "user", "content": "Count to a thousand."}],
                    "max_tokens": 2000, "ignore_eos": True, "stream": True}) as response:
                for line in response.iter_lines():
                    if line:
                        events.append(line)

        streaming = threading.Thread(target=stream, daemon=True)
        streaming.start()
        deadline = time.monotonic() + 60
        while not events:
            assert time.monotonic() < deadline and streaming.is_alive(), "the stream never started"
            time.sleep(0.05)
        server.engine.shutdown()
        streaming.join(timeout=30)
        assert not streaming.is_alive(), "a stream of the stopped engine never ended"
        assert '"engine_dead"' in events[-2] and events[-1] == "data: [DONE]"

        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503
        error = health.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "engine_dead"
        assert "restart" in error["message"]
        assert httpx.get(f"{server.url}/ready").json() == {"ready": False, "reason": "engine stopped"}
        # Neither a generation nor the work handed to the engine thread waits on a loop that is gone.
        chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        embeddings = httpx.post(f"{server.url}/v1/embeddings", timeout=30, json={"model": MODEL, "input": "hi"})
        for response in (chat, embeddings):
            assert response.status_code == 503 and response.json()["error"]["code"] == "engine_dead"
