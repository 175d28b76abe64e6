"""Request budgets through the gateway: the client's timeout goes upstream as what is left of it, the runtime's
refusal of a budget it cannot meet reaches the client at once (or is tried on another replica), holds end with
the budget, and replicas whose estimated queue does not fit are passed over.

Real processes: tiny runtimes with a batch of one sequence (`--max-num-seqs 1`), kept busy by endless streams
sent to them directly, and the gateway in front.
"""
from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, runtimes, table
from sluice_contracts import request_deadline

pytestmark = pytest.mark.integration

KEYS = {"default": "sk-test-budget", "batch": "sk-test-budget-batch", "limited": "sk-test-budget-limited"}
CHAT = [{"role": "user", "content": "Count."}]
# The client timeout of the requests meant to be refused by a busy replica, and what that replica's queue must be
# estimated at before a test counts on it.
BUDGET_S = 1.0
BUSY_S = 2 * BUDGET_S
# The length of the streams that keep a runtime busy (and of the one that sets its expected length).
STREAM_TOKENS = 1900


def _tenants() -> list[dict]:
    return [{"name": "default", "keys": [key_entry("default-key", KEYS["default"])]},
            {"name": "nightly", "keys": [key_entry("batch-key", KEYS["batch"])], "priority": "batch"}]


@pytest.fixture(scope="module")
def single_seq_runtimes(tiny_model_dir):
    """Two runtimes of one sequence each. Each has first answered a long request, so that it expects a running
    stream to go on for as long (its estimate of a request's length is the mean of those it finished)."""
    with runtimes(tiny_model_dir, 2, "--max-num-seqs", "1", "--default-budget-s", "600") as servers:
        def finish_a_long_one(server):
            return httpx.post(f"{server.url}/v1/chat/completions", timeout=180, json={
                "model": "tiny", "messages": CHAT, "max_tokens": STREAM_TOKENS, "ignore_eos": True})

        with ThreadPoolExecutor(len(servers)) as pool:
            for response in pool.map(finish_a_long_one, servers):
                assert response.status_code == 200, response.text
        yield servers


class Busy:
    """Long streams sent to a runtime directly, each sent again when it ends, until the block ends. With `queued`,
    a runtime of one sequence: one runs and the rest wait, and its estimate of a newcomer's wait is past BUSY_S;
    else they all run."""

    def __init__(self, url: str, streams: int, *, queued: bool = True) -> None:
        self.url, self._stop, self._queued = url, threading.Event(), queued
        self.refusals: list[bytes] = []
        self._threads = [threading.Thread(target=self._stream, daemon=True) for _ in range(streams)]

    def _stream(self) -> None:
        body = {"model": "tiny", "messages": CHAT, "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True}
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=120) as response:
                    if response.status_code != 200:
                        self.refusals.append(response.read())
                        return
                    for _ in response.iter_bytes():
                        if self._stop.is_set():
                            return

    def __enter__(self) -> Busy:
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + 60
        while True:
            load = httpx.get(f"{self.url}/load", timeout=5).json()
            streams = len(self._threads)
            if (load["running"] >= 1 and load["waiting"] >= streams - 1 and load["estimated_queue_s"] > BUSY_S
                    if self._queued else load["running"] >= streams):
                return self
            assert time.monotonic() < deadline, f"the runtime never got busy: {load} {self.refusals}"
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        deadline = time.monotonic() + 30
        while (load := httpx.get(f"{self.url}/load", timeout=5).json())["running"] or load["waiting"]:
            assert time.monotonic() < deadline, f"the runtime never went idle: {load}"
            time.sleep(0.05)


def _await_polled(gateway, url: str, field: str, at_least: int) -> None:
    """Until the gateway's own load poll has seen `url` with `field` at `at_least` or more, and healthy."""
    deadline = time.monotonic() + 30
    while (gateway.metric("sluice_gateway_endpoint_load", endpoint=url, field=field) < at_least
           or gateway.metric("sluice_gateway_endpoint_up", endpoint=url) < 1):
        assert time.monotonic() < deadline, f"the gateway never saw {url} with {field} at {at_least}"
        time.sleep(0.05)


def _post(gateway, headers: list[tuple[str, str]] | dict, tenant: str = "default", **extra) -> httpx.Response:
    body = {"model": "chat", "messages": CHAT, "max_tokens": 8, **extra}
    all_headers = [("authorization", f"Bearer {KEYS[tenant]}"),
                   *(headers.items() if isinstance(headers, dict) else headers)]
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=all_headers, timeout=60)


def _routes(*urls: str) -> dict:
    return table(chat={"affinity": "none", "backends": [backend("tiny", *urls)]})


def test_a_short_client_timeout_reaches_the_runtime_which_refuses_at_once(single_seq_runtimes, tmp_path):
    busy_runtime = single_seq_runtimes[0]
    config = gateway_config(_tenants())
    with run_gateway(config, _routes(busy_runtime.url), tmp_path) as gateway, Busy(busy_runtime.url, 3):
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["default"], max_retries=0,
                               timeout=BUDGET_S)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="chat", messages=CHAT, max_tokens=8)
        elapsed = time.monotonic() - started
        response = refused.value.response
        assert response.status_code == 503, response.text
        # The runtime's own answer: its code and the Retry-After it computed from its queue.
        assert response.json()["error"]["code"] == request_deadline.DEADLINE_UNATTAINABLE, response.text
        assert int(response.headers["retry-after"]) >= 1
        assert elapsed < 1.0, f"the refusal took {elapsed:.2f} s"


def test_a_held_request_is_answered_503_when_its_budget_runs_out(single_seq_runtimes, tmp_path):
    busy_runtime = single_seq_runtimes[0]
    config = gateway_config(_tenants(), routing={"poll_interval_s": 0.2}, priority={"hold_s": 30, "max_held": 8})
    with run_gateway(config, _routes(busy_runtime.url), tmp_path) as gateway, Busy(busy_runtime.url, 3):
        _await_polled(gateway, busy_runtime.url, "waiting", 2)
        started = time.monotonic()
        response = _post(gateway, {"x-request-timeout": str(BUDGET_S)}, tenant="batch")
        elapsed = time.monotonic() - started
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == request_deadline.DEADLINE_PASSED, response.text
        assert response.headers["retry-after"] == "30"
        assert 0.9 < elapsed < 5, f"answered after {elapsed:.2f} s (the hold itself lasts 30 s)"
        # A short budget does not make a batch request urgent: it was held, not forwarded.
        assert gateway.metric("sluice_gateway_priority_shed_total", priority_class="batch") == 1


def test_a_request_held_for_a_starting_model_is_answered_503_when_its_budget_runs_out(start_gateway):
    gateway = start_gateway(gateway_config(_tenants(), cold_start={"max_wait_s": 60, "retry_after_s": 7}),
                            table(chat={"backends": [backend("tiny")]}))
    started = time.monotonic()
    response = _post(gateway, {"x-stainless-read-timeout": "0.8"})
    elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == request_deadline.DEADLINE_PASSED and error["type"] == "service_unavailable", error
    assert response.headers["retry-after"] == "7"
    assert 0.7 < elapsed < 5, f"answered after {elapsed:.2f} s (the hold itself lasts 60 s)"
    assert gateway.metric("sluice_gateway_hold_refusals_total", reason="deadline") == 1


def test_a_stream_held_for_a_starting_model_ends_with_the_budget_error_as_its_last_event(start_gateway):
    gateway = start_gateway(gateway_config(_tenants(), cold_start={"max_wait_s": 60, "keepalive_s": 0.2}),
                            table(chat={"backends": [backend("tiny")]}))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["default"], max_retries=0, timeout=30)
    started = time.monotonic()
    stream = client.with_options(timeout=0.8).chat.completions.create(model="chat", messages=CHAT, max_tokens=4,
                                                                      stream=True)
    with pytest.raises(openai.APIError) as ended:
        list(stream)
    assert "time budget" in str(ended.value) and 0.7 < time.monotonic() - started < 5


def test_a_refused_request_is_retried_on_another_replica_within_its_budget(single_seq_runtimes, tiny_runtimes,
                                                                          tmp_path):
    busy_runtime, idle_runtime = single_seq_runtimes[0], tiny_runtimes[0]
    # Loads are polled once, while both are idle: the gateway does not know which will refuse.
    config = gateway_config(_tenants(), routing={"poll_interval_s": 3600})
    with run_gateway(config, _routes(busy_runtime.url, idle_runtime.url), tmp_path) as gateway, \
            Busy(busy_runtime.url, 3):
        retried = None
        for n in range(12):
            response = _post(gateway, {"x-request-timeout": str(BUDGET_S), "x-request-id": f"retry-{n}"})
            assert response.status_code == 200, response.text
            line = gateway.access_lines(f"retry-{n}")[f"retry-{n}"]
            assert line["endpoint"] == idle_runtime.url, line
            if line["attempts"] == 2:
                retried = line
                break
        assert retried is not None, "no request was sent to the busy replica first"
        assert gateway.metric("sluice_gateway_retries_total") >= 1


def test_the_runtimes_refusal_reaches_the_client_when_no_replica_can_serve_in_time(single_seq_runtimes, tmp_path):
    config = gateway_config(_tenants(), routing={"poll_interval_s": 3600})
    urls = [server.url for server in single_seq_runtimes]
    with run_gateway(config, _routes(*urls), tmp_path) as gateway, Busy(urls[0], 3), Busy(urls[1], 3):
        response = _post(gateway, {"x-request-timeout": str(BUDGET_S), "x-request-id": "both-busy"}, stream=True)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == request_deadline.DEADLINE_UNATTAINABLE, response.text
        assert int(response.headers["retry-after"]) >= 1
        assert gateway.access_lines("both-busy")["both-busy"]["attempts"] == 2


def test_the_picker_passes_over_a_replica_whose_estimated_queue_exceeds_the_budget(single_seq_runtimes,
                                                                                  tiny_runtimes, tmp_path):
    long_queue, room = single_seq_runtimes[0], tiny_runtimes[1]
    # A poll slowed by the busy runtimes on a small machine does not count as a failed health check here.
    config = gateway_config(_tenants(), routing={"poll_interval_s": 0.2, "poll_timeout_s": 5})
    # The replica of one sequence runs one long stream and queues two: by its counts (each queued one counts two
    # running) the less loaded of the two; the other runs six and has room for more.
    with run_gateway(config, _routes(long_queue.url, room.url), tmp_path) as gateway, \
            Busy(long_queue.url, 3), Busy(room.url, 6, queued=False):
        _await_polled(gateway, long_queue.url, "waiting", 2)
        _await_polled(gateway, room.url, "running", 6)
        for n in range(4):
            response = _post(gateway, {"x-request-timeout": str(BUDGET_S), "x-request-id": f"fit-{n}"})
            assert response.status_code == 200, response.text
            line = gateway.access_lines(f"fit-{n}")[f"fit-{n}"]
            assert (line["endpoint"], line["attempts"]) == (room.url, 1), line


@pytest.mark.parametrize("limiter", ["memory", "redis"])
def test_a_refused_requests_reservation_is_handed_back(single_seq_runtimes, tmp_path, request, limiter):
    busy_runtime = single_seq_runtimes[0]
    # Room for one request's reservation (its prompt's bound and max_tokens) a minute, and one at a time.
    tenants = [{"name": "limited", "keys": [key_entry("limited-key", KEYS["limited"])],
                "limits": {"tokens_per_minute": 500, "max_concurrent": 1}}]
    overrides = {"redis": {"url": request.getfixturevalue("redis_server").url}} if limiter == "redis" else {}
    config = gateway_config(tenants, **overrides)
    with run_gateway(config, _routes(busy_runtime.url), tmp_path) as gateway, Busy(busy_runtime.url, 3):
        for _ in range(4):
            response = _post(gateway, {"x-request-timeout": str(BUDGET_S)}, tenant="limited", max_tokens=100)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == request_deadline.DEADLINE_UNATTAINABLE, response.text


BAD_TIMEOUTS = [
    [("x-stainless-read-timeout", "-1")], [("x-stainless-read-timeout", "nan")], [("x-request-timeout", "inf")],
    [("timeout", "1e999")], [("x-request-timeout", "0")], [("x-request-timeout", "ten")],
    [("x-request-timeout", "")], [("x-stainless-timeout", "99999999")], [("x-request-timeout", "0x10")],
    [("x-request-timeout", "5"), ("x-request-timeout", "5")],
]


@pytest.mark.parametrize("headers", BAD_TIMEOUTS, ids=lambda h: "+".join(f"{k}={v}" for k, v in h))
def test_a_bad_timeout_header_is_ignored_and_logged(tiny_runtimes, start_gateway, headers):
    gateway = start_gateway(gateway_config(_tenants()), _routes(tiny_runtimes[0].url))
    response = _post(gateway, headers)
    assert response.status_code == 200, response.text
    assert "budget header ignored" in gateway.log_text() and headers[0][0] in gateway.log_text()


def test_a_bad_timeout_header_gives_way_to_the_next_valid_one(single_seq_runtimes, tmp_path):
    busy_runtime = single_seq_runtimes[0]
    with run_gateway(gateway_config(_tenants()), _routes(busy_runtime.url), tmp_path) as gateway, \
            Busy(busy_runtime.url, 3):
        response = _post(gateway, [("x-stainless-read-timeout", "nan"), ("x-request-timeout", str(BUDGET_S))])
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == request_deadline.DEADLINE_UNATTAINABLE, response.text
