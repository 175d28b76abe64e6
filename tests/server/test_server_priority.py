"""A request's priority and tenant at the runtime: vLLM's `priority` field for direct callers, the gateway's
headers (sluice_contracts.request_priority) over it, and a clear 400 for anything malformed in either."""
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from fixtures.runtime_server import runtime_metric
from sluice_contracts import metric_names as names
from sluice_contracts import request_priority as contract

pytestmark = pytest.mark.integration

BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _logged(server, client_id: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        lines = [r for r in server.request_log() if r.get("client_request_id") == client_id]
        if lines or time.monotonic() > deadline:
            assert lines, f"no request-log line for {client_id}"
            return lines[0]
        time.sleep(0.1)


@pytest.mark.parametrize("value", ["5", 5.5, True, 1001, -1001, 10**30, [1]])
def test_the_priority_field_must_be_a_bounded_integer(runtime_openai, value):
    with pytest.raises(openai.BadRequestError) as err:
        runtime_openai.chat.completions.create(**BODY, extra_body={"priority": value})
    assert err.value.body["param"] == "priority" or "priority" in err.value.body["message"]


def test_a_null_priority_is_the_default_one(runtime_server_process, runtime_openai):
    runtime_openai.chat.completions.create(**BODY, extra_body={"priority": None},
                                           extra_headers={"x-request-id": "null-priority"})
    runtime_openai.chat.completions.create(**BODY, extra_headers={"x-request-id": "no-priority"})
    assert _logged(runtime_server_process, "null-priority")["priority"] == \
        _logged(runtime_server_process, "no-priority")["priority"]


@pytest.mark.parametrize("header,value", [
    (contract.PRIORITY_HEADER, "urgent"), (contract.PRIORITY_HEADER, "1e3"), (contract.PRIORITY_HEADER, "99999"),
    (contract.PRIORITY_HEADER, "+"), (contract.PRIORITY_HEADER, "-0x1"),
    (contract.TENANT_HEADER, "two words"), (contract.TENANT_HEADER, "x" * 300),
    (contract.SHARE_HEADER, "0"), (contract.SHARE_HEADER, "-1"), (contract.SHARE_HEADER, "nan"),
    (contract.SHARE_HEADER, "inf"), (contract.SHARE_HEADER, "1001"),
])
def test_a_malformed_priority_header_is_refused_naming_it(runtime_openai, header, value):
    with pytest.raises(openai.BadRequestError) as err:
        runtime_openai.chat.completions.create(**BODY, extra_headers={header: value})
    assert err.value.body["code"] == "invalid_priority_header"
    assert header in err.value.body["message"]


def test_the_headers_win_over_the_body_field(runtime_server_process, runtime_openai):
    runtime_openai.chat.completions.create(
        **BODY, extra_body={"priority": -1000},
        extra_headers={contract.PRIORITY_HEADER: "10", contract.TENANT_HEADER: "team%20a",
                       contract.SHARE_HEADER: "2.5", "x-request-id": "priority-headers"})
    line = _logged(runtime_server_process, "priority-headers")
    assert (line["priority"], line["tenant"]) == (10, "team%20a")
    runtime_openai.chat.completions.create(**BODY, extra_body={"priority": -3},
                                           extra_headers={"x-request-id": "priority-body"})
    line = _logged(runtime_server_process, "priority-body")
    assert line["priority"] == -3 and "tenant" not in line


def test_an_online_chat_interrupts_a_batch_step_and_the_batch_line_loses_nothing(runtime_server_process):
    url = runtime_server_process.url
    before = runtime_metric(url, f"{names.STEPS_INTERRUPTED}_total")
    # A prompt of several full steps at the batch class: the chats below each arrive while one of them runs.
    document = "Quarterly tax filing deadlines fall in April, and late filers pay interest on what they owe. " * 120
    line = {"model": "smollm2", "messages": [{"role": "user", "content": document}], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=300) as client, ThreadPoolExecutor(1) as pool:
        batch_line = pool.submit(client.post, "/v1/chat/completions", json=line,
                                 headers={contract.PRIORITY_HEADER: "10"})
        deadline = time.monotonic() + 60
        while not client.get("/load").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.02)
        for n in range(3):
            chat = client.post("/v1/chat/completions", json={**BODY, "messages": [
                {"role": "user", "content": f"Hi number {n}"}]})
            assert chat.status_code == 200
        answer = batch_line.result()
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    assert runtime_metric(url, f"{names.STEPS_INTERRUPTED}_total") >= before + 1, "a chat arriving during a step of batch work alone abandons it"
