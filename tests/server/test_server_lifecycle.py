"""Admission limits, queued disconnects, server flags and graceful SIGTERM drain, on a server of their own.

The tests in this module run in order on one small server (2 running, 1 waiting); the last one
shuts it down.
"""
import json
import signal
import threading
import time

import httpx
import openai
import pytest

from fixtures.runtime_server import start_runtime_server

pytestmark = pytest.mark.integration

LONG = {"model": "chat", "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 4000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def small_server():
    with start_runtime_server("--max-num-seqs", "2", "--max-waiting", "1", "--shutdown-timeout", "8",
                              "--served-model-name", "chat", "smollm2", "--log-prompts") as server:
        yield server


class Streamer:
    """A streaming request in a background thread that we can watch and hang up on."""

    def __init__(self, url: str, body: dict, read_timeout: float = 120):
        self.events: list[str] = []
        self.gave_up = False
        self._stop = threading.Event()
        timeout = httpx.Timeout(120, read=read_timeout)
        self._thread = threading.Thread(target=self._run, args=(url, body, timeout), daemon=True)
        self._thread.start()

    def _run(self, url, body, timeout):
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as response:
                for line in response.iter_lines():
                    if line:
                        self.events.append(line)
                    if self._stop.is_set():
                        return
        except httpx.ReadTimeout:
            self.gave_up = True

    def hang_up(self):
        self._stop.set()
        self._thread.join(timeout=30)

    def join(self, timeout):
        self._thread.join(timeout)
        return not self._thread.is_alive()


def wait_for(url, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        load = httpx.get(f"{url}/load").json()
        if predicate(load):
            return load
        assert time.monotonic() < deadline, f"/load never matched: {load}"
        time.sleep(0.05)


def test_alias_and_prompt_logging(small_server):
    client = openai.OpenAI(base_url=f"{small_server.url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["chat", "smollm2"]
    for name in ("chat", "smollm2"):
        response = client.chat.completions.create(model=name, max_tokens=2, extra_headers={"x-request-id": name},
                                                  messages=[{"role": "user", "content": "log me please"}])
        assert response.model == name
    time.sleep(0.3)
    line = next(r for r in small_server.request_log() if r.get("client_request_id") == "chat")
    assert "log me please" in line["prompt"]


def test_full_queue_is_503_with_retry_after_and_queued_disconnect_frees_its_place(small_server):
    url = small_server.url
    running = [Streamer(url, LONG), Streamer(url, LONG)]
    wait_for(url, lambda load: load["running"] == 2)
    # No header comes back while queued; this client gives up after 3 s of silence and hangs up.
    queued = Streamer(url, LONG, read_timeout=3)
    wait_for(url, lambda load: load["waiting"] == 1)
    refused = httpx.post(f"{url}/v1/chat/completions", json={**LONG, "stream": False})
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "overloaded"
    assert queued.join(timeout=10) and queued.gave_up
    wait_for(url, lambda load: load["waiting"] == 0 and load["running"] == 2, timeout=5)
    for streamer in running:
        streamer.hang_up()
    wait_for(url, lambda load: load["running"] == 0 and load["kv_cache_usage"] == 0, timeout=5)


def test_sigterm_drains_then_aborts_with_a_clear_error(small_server):
    url = small_server.url
    short = {**LONG, "max_tokens": 4}
    long_stream = Streamer(url, LONG)
    wait_for(url, lambda load: load["running"] == 1)
    short_stream = Streamer(url, short)
    wait_for(url, lambda load: load["running"] == 2)
    small_server.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    while httpx.get(f"{url}/ready").status_code == 200:
        assert time.monotonic() < started + 2, "/ready stayed true after SIGTERM"
        time.sleep(0.05)
    assert httpx.get(f"{url}/ready").json() == {"ready": False, "reason": "draining"}
    late = httpx.post(f"{url}/v1/chat/completions", json={**short, "stream": False})
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
    # The short request finishes normally within the drain window.
    assert short_stream.join(timeout=15)
    assert short_stream.events[-1] == "data: [DONE]"
    assert json.loads(short_stream.events[-2][6:])["choices"][0]["finish_reason"] == "length"
    # The long one is aborted at the deadline with an error event, then the stream ends cleanly.
    assert long_stream.join(timeout=20)
    error = json.loads(long_stream.events[-2][6:])
    assert error["error"]["code"] == "shutting_down" and long_stream.events[-1] == "data: [DONE]"
    assert time.monotonic() - started >= 7.5
    assert small_server.process.wait(timeout=20) == 0
