"""A gateway restart loses nothing: SIGTERM fails /ready, serving goes on for a grace period, then streams drain."""
import signal
import threading
import time

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-drain"
HEADERS = {"authorization": f"Bearer {KEY}"}
TENANTS = [{"name": "t", "keys": [key_entry("k", KEY)]}]


def chat(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 2, **extra}


class Streams:
    """Long streams through the gateway, each on its own connection and thread."""

    def __init__(self, gateway, count: int, max_tokens: int) -> None:
        self.lines: list[list[str] | None] = [None] * count
        self.errors: list[BaseException] = []
        self._started = threading.Semaphore(0)
        self._threads = [threading.Thread(target=self._run, args=(gateway.url, i, max_tokens)) for i in range(count)]
        for thread in self._threads:
            thread.start()
        for _ in range(count):
            assert self._started.acquire(timeout=120), "a stream never started"

    def _run(self, url: str, index: int, max_tokens: int) -> None:
        lines = []
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", headers=HEADERS, timeout=300,
                              json=chat(max_tokens=max_tokens, ignore_eos=True, stream=True)) as response:
                for line in response.iter_lines():
                    if line and not lines:
                        self._started.release()
                    if line:
                        lines.append(line)
        except httpx.HTTPError as exc:
            self.errors.append(exc)
        finally:
            self.lines[index] = lines

    @property
    def finished(self) -> int:
        return sum(lines is not None for lines in self.lines)

    def join(self) -> list[list[str]]:
        for thread in self._threads:
            thread.join(timeout=300)
        return self.lines


def accepts_connections(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.ConnectError:
        return False
    return True


def test_sigterm_fails_ready_keeps_serving_through_the_grace_then_lets_streams_finish(tiny_runtimes, start_gateway):
    urls = [server.url for server in tiny_runtimes]
    config = gateway_config(TENANTS, shutdown={"ready_grace_s": 3})
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", *urls)]}))
    streams = Streams(gateway, 10, max_tokens=1900)

    gateway.process.send_signal(signal.SIGTERM)
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 503 and ready.json()["error"]["message"] == "gateway is shutting down"
    # Load balancers still send some traffic until they notice: it is served, not refused.
    late = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), headers=HEADERS, timeout=60)
    assert late.status_code == 200, late.text

    deadline = time.monotonic() + 30
    while accepts_connections(gateway.url):  # after the grace period the listener closes
        assert time.monotonic() < deadline, "the gateway never stopped accepting connections"
        time.sleep(0.1)
    in_flight_at_close = 10 - streams.finished
    results = streams.join()

    assert not streams.errors, streams.errors
    assert all(lines and lines[-1] == "data: [DONE]" for lines in results), [lines[-1:] for lines in results]
    assert in_flight_at_close > 0, "every stream ended before the listener closed: the drain was not exercised"
    assert gateway.process.wait(timeout=30) is not None


def test_the_drain_is_bounded_by_drain_s(tiny_runtimes, start_gateway):
    config = gateway_config(TENANTS, shutdown={"ready_grace_s": 0, "drain_s": 1})
    gateway = start_gateway(config, table(tiny={"backends": [backend("b", tiny_runtimes[0].url)]}))
    streams = Streams(gateway, 2, max_tokens=1900)
    started = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    gateway.process.wait(timeout=60)
    results = streams.join()
    assert all(not lines or lines[-1] != "data: [DONE]" for lines in results), "cut at drain_s, not finished"
    assert time.monotonic() - started < 30, "the default 30 s graceful shutdown was used instead of drain_s"
