"""A request's budget at the runtime (sluice_contracts.request_deadline): read from the client's timeout, the
gateway's header, its priority class or the runtime's default; a request not answerable within it is refused at once
with 503 and Retry-After, one whose budget passes while queued gets the same 503; bad values are ignored."""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from fixtures.runtime_server import runtime_metric, start_runtime_server
from sluice_contracts import metric_names as names
from sluice_contracts import request_deadline as contract

pytestmark = pytest.mark.integration

BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
# Shorter than any step of the model: never attainable, even on an idle runtime.
TINY = "0.0005"


def _refused(call) -> openai.APIStatusError:
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        call()
    elapsed = time.monotonic() - started
    assert err.value.status_code == 503, err.value.body
    assert err.value.response.headers["retry-after"].isdigit()
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert set(err.value.body) >= {"message", "type", "param", "code"}
    assert elapsed < 1.0, elapsed  # at once, not after queueing (loopback on a shared CPU)
    return err.value


@pytest.mark.parametrize("header", contract.CLIENT_TIMEOUT_HEADERS + (contract.BUDGET_HEADER,))
def test_each_budget_header_is_read(runtime_openai, header):
    # Without the official client's own header, which is read first.
    headers = {"x-stainless-read-timeout": openai.omit, header: TINY}
    err = _refused(lambda: runtime_openai.chat.completions.create(**BODY, extra_headers=headers))
    assert err.body["code"] == contract.DEADLINE_UNATTAINABLE
    assert "budget of 0.0005 s" in err.body["message"]


def test_the_client_timeout_goes_before_the_gateway_budget(runtime_openai):
    # The official client sends its own read timeout (120 s here), which wins over the gateway's header.
    answer = runtime_openai.chat.completions.create(**BODY, extra_headers={contract.BUDGET_HEADER: TINY})
    assert answer.choices[0].message.content is not None
    _refused(lambda: runtime_openai.chat.completions.create(
        **BODY, extra_headers={"x-stainless-read-timeout": TINY, contract.BUDGET_HEADER: "600"}))


def test_every_endpoint_and_a_stream_are_refused_alike(runtime_openai):
    headers = {"x-stainless-read-timeout": TINY}
    err = _refused(lambda: runtime_openai.completions.create(model="smollm2", prompt=["a", "b"], max_tokens=2,
                                                            extra_headers=headers))
    assert err.body["code"] == contract.DEADLINE_UNATTAINABLE
    err = _refused(lambda: runtime_openai.chat.completions.create(**BODY, stream=True, extra_headers=headers))
    assert err.body["code"] == contract.DEADLINE_UNATTAINABLE


@pytest.mark.parametrize("value", ["-1", "0", "nan", "NaN", "inf", "-inf", "1e400", "86401", "10" * 20, "soon",
                                   "", "1,5", "0x10", "1e-3e"])
def test_a_bad_value_is_ignored_and_logged_and_the_next_source_read(runtime_server_process, runtime_openai, value):
    # Ignored: the gateway's (tiny) budget is the one that applies, so the request is refused for it, not a 400/500.
    err = _refused(lambda: runtime_openai.chat.completions.create(
        **BODY, extra_headers={"x-stainless-read-timeout": value, "timeout": value, contract.BUDGET_HEADER: TINY}))
    assert err.body["code"] == contract.DEADLINE_UNATTAINABLE
    # Alone, it leaves the runtime's default: served.
    answer = runtime_openai.chat.completions.create(**BODY, extra_headers={"x-stainless-read-timeout": value,
                                                                          contract.BUDGET_HEADER: value})
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert "budget header ignored: the x-stainless-read-timeout header" in runtime_server_process.stderr()


def test_a_repeated_header_is_ignored(runtime_server):
    headers = [("x-stainless-read-timeout", "600"), ("x-stainless-read-timeout", "700"),
               (contract.BUDGET_HEADER, TINY)]
    response = httpx.post(f"{runtime_server}/v1/chat/completions", json=BODY, headers=headers, timeout=60)
    assert response.status_code == 503 and response.json()["error"]["code"] == contract.DEADLINE_UNATTAINABLE
    response = httpx.post(f"{runtime_server}/v1/chat/completions", json=BODY,
                          headers=[(contract.BUDGET_HEADER, TINY), (contract.BUDGET_HEADER, TINY)], timeout=60)
    assert response.status_code == 200, response.text  # both ignored: the runtime's default applies


def test_a_budget_never_changes_the_priority(runtime_server_process, runtime_openai):
    runtime_openai.chat.completions.create(**BODY, extra_body={"priority": 10},
                                           extra_headers={contract.BUDGET_HEADER: "0.5", "x-request-id": "budget-pri"})
    deadline = time.monotonic() + 10
    while not (lines := [r for r in runtime_server_process.request_log()
                         if r.get("client_request_id") == "budget-pri"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert lines[0]["priority"] == 10


def test_refusals_are_counted_by_reason(runtime_server, runtime_openai):
    before = runtime_metric(runtime_server, names.REQUESTS_REFUSED + "_total", reason=names.REFUSAL_DEADLINE)
    _refused(lambda: runtime_openai.chat.completions.create(**BODY, extra_headers={"x-stainless-read-timeout": TINY}))
    assert runtime_metric(runtime_server, names.REQUESTS_REFUSED + "_total", reason=names.REFUSAL_DEADLINE) == before + 1
    for reason in (names.REFUSAL_QUEUE_FULL, names.REFUSAL_BUDGET_PASSED):
        runtime_metric(runtime_server, names.REQUESTS_REFUSED + "_total", reason=reason)
    assert runtime_metric(runtime_server, names.ESTIMATED_QUEUE_SECONDS) >= 0


@pytest.fixture(scope="module")
def one_at_a_time():
    """A runtime that runs one sequence at a time, so a few requests make a queue of seconds."""
    with start_runtime_server("--max-num-seqs", "1") as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            yield server, client


def _in_background(client, count: int, max_tokens: int, priority: int = 0) -> list[threading.Thread]:
    def run():
        try:
            client.chat.completions.create(**{**BODY, "max_tokens": max_tokens},
                                           extra_body={"ignore_eos": True, "priority": priority})
        except openai.APIStatusError:
            pass
    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    return threads


def _wait_queue(url: str, at_least_s: float) -> float:
    deadline = time.monotonic() + 30
    while (queued := runtime_metric(url, names.ESTIMATED_QUEUE_SECONDS)) < at_least_s:
        assert time.monotonic() < deadline, queued
        time.sleep(0.05)
    return queued


def test_the_openai_client_timeout_is_the_budget_under_load(one_at_a_time):
    server, client = one_at_a_time
    threads = _in_background(client, 4, 64)
    queued = _wait_queue(server.url, 2.0)
    err = _refused(lambda: client.with_options(timeout=1.0).chat.completions.create(**BODY))
    assert err.body["code"] == contract.DEADLINE_UNATTAINABLE
    # Retry-After: when the queue ahead should have drained enough for a 1 s budget; of the order of what was
    # queued (the estimate moves as the queued prompts' prefills refit its cost and the host's load changes).
    assert 1 <= int(err.response.headers["retry-after"]) <= 4 * queued + 10
    answer = client.with_options(timeout=300).chat.completions.create(**BODY)  # a patient client waits its turn
    assert answer.choices[0].finish_reason in ("stop", "length")
    for thread in threads:
        thread.join(60)


def test_a_budget_that_passes_while_queued_ends_the_request_with_503(one_at_a_time):
    """A batch request admitted behind a short queue; critical ones arriving after it go first, and its budget
    passes before it starts: 503 deadline_passed, when its budget ran out, not when the criticals are done."""
    server, client = one_at_a_time
    running = _in_background(client, 1, 64)
    time.sleep(0.3)
    # Attainable when it arrives, by the runtime's own estimate of this host (which differs between machines).
    budget = max(3.0, 3 * runtime_metric(server.url, names.ESTIMATED_QUEUE_SECONDS) + 2)
    outcome: dict = {}
    answered = threading.Event()

    def batch():
        started = time.monotonic()
        try:
            # The gateway's budget: the client (120 s) would wait longer, and hears at once why it was not served.
            client.chat.completions.create(**BODY, extra_body={"priority": 10}, extra_headers={
                "x-stainless-read-timeout": openai.omit, contract.BUDGET_HEADER: f"{budget:.1f}"})
            outcome["status"] = 200
        except openai.APIStatusError as exc:
            outcome.update(status=exc.status_code, body=exc.body, headers=exc.response.headers)
        outcome["after_s"] = time.monotonic() - started
        answered.set()

    def critical():
        # Critical requests keep arriving until the batch request is answered, however fast this host serves
        # them: one of them is always ahead of it.
        while not answered.is_set():
            client.chat.completions.create(**{**BODY, "max_tokens": 16},
                                           extra_body={"ignore_eos": True, "priority": -10})

    waiting = threading.Thread(target=batch)
    waiting.start()
    time.sleep(0.1)
    criticals = [threading.Thread(target=critical, daemon=True) for _ in range(2)]
    for thread in criticals:
        thread.start()
    waiting.join(120)
    answered.set()
    assert outcome["status"] == 503, outcome
    assert outcome["body"]["code"] == contract.DEADLINE_PASSED
    assert outcome["headers"]["retry-after"].isdigit()
    assert budget - 0.5 < outcome["after_s"] < budget + 2.0, (budget, outcome)
    for thread in running + criticals:
        thread.join(120)
    assert runtime_metric(server.url, names.REQUESTS_REFUSED + "_total", reason=names.REFUSAL_BUDGET_PASSED) >= 1


def test_without_deadline_admission_a_budget_is_not_acted_on():
    with start_runtime_server("--no-deadline-admission") as server:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=BODY,
                              headers={contract.BUDGET_HEADER: TINY, "x-stainless-read-timeout": TINY}, timeout=60)
        assert response.status_code == 200, response.text


def test_a_default_budget_bounds_the_queue_and_a_stated_one_the_whole_answer():
    # Long answers read at once, one at a time: behind running ones, the runtime's default (300 s) only bounds the
    # wait for a first token, so the next is admitted; with the client's own 3 s timeout, which covers its whole
    # answer, it cannot be answered in time.
    long = {**BODY, "max_tokens": 150, "ignore_eos": True}
    with start_runtime_server("--max-num-seqs", "1", "--default-budget-s", "300") as server:
        url = f"{server.url}/v1/chat/completions"
        # A fresh runtime has fitted its prefill cost on its warm-up's few steps only; an idle one still admits a
        # long prompt, whose run corrects the fit, rather than refuse every prompt it overestimates.
        prompt = {**BODY, "messages": [{"role": "user", "content": "word " * 1500}]}
        served = httpx.post(url, json=prompt, headers={"x-request-timeout": "10"}, timeout=120)
        assert served.status_code == 200, served.text
        first = httpx.post(url, json=long, timeout=120)  # also measures the decode steps the estimate reads
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["completion_tokens"] == 150
        ahead = [threading.Thread(target=httpx.post, args=(url,), kwargs={"json": long, "timeout": 120})
                 for _ in range(2)]
        for thread in ahead:
            thread.start()
        _wait_queue(server.url, 1.0)
        started = time.monotonic()
        stated = httpx.post(url, json=long, headers={"x-request-timeout": "3"}, timeout=120)
        # Refused at once, or ended once too little of its budget is left (the estimate is the measured steps'):
        # never served late.
        assert stated.status_code == 503 and stated.json()["error"]["code"] in (contract.DEADLINE_UNATTAINABLE,
                                                                                contract.DEADLINE_PASSED)
        assert time.monotonic() - started < 3.0
        assert httpx.post(url, json=long, timeout=300).status_code == 200
        for thread in ahead:
            thread.join()
