"""A request's priority and tenant at the runtime: vLLM's `priority` field for direct callers, the gateway's
headers (sluice_contracts.request_priority) over it, and a clear 400 for anything malformed in either."""
import time

import openai
import pytest

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
