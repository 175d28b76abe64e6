"""The runtime called directly reads a caller's W3C trace context, or starts a trace, and names it in its answer
and its request log, refusals included."""
import re
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def log_line(server, client_id: str) -> dict:
    deadline = time.monotonic() + 10
    while not (lines := [r for r in server.request_log() if r.get("client_request_id") == client_id]):
        assert time.monotonic() < deadline, f"no request-log line of {client_id}"
        time.sleep(0.05)
    return lines[0]


def test_a_callers_trace_is_logged_and_answered_and_a_missing_one_started(runtime_server_process, runtime_openai):
    traced = runtime_openai.chat.completions.with_raw_response.create(
        **CHAT, stream=True, extra_headers={"traceparent": f"00-{TRACE}-{SPAN}-01", "x-request-id": "traced"})
    list(traced.parse())
    untraced = runtime_openai.chat.completions.with_raw_response.create(
        **CHAT, extra_headers={"traceparent": "00-not-a-trace-01", "x-request-id": "untraced"})
    with pytest.raises(openai.BadRequestError) as refused:
        runtime_openai.chat.completions.create(**{**CHAT, "max_tokens": -1}, extra_headers={"x-request-id": "refused"})

    assert traced.headers["x-sluice-trace-id"] == TRACE
    line = log_line(runtime_server_process, "traced")
    assert (line["trace_id"], line["parent_span_id"]) == (TRACE, SPAN)
    for response, client_id in ((untraced, "untraced"), (refused.value.response, "refused")):
        started = response.headers["x-sluice-trace-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", started) and started != TRACE
        line = log_line(runtime_server_process, client_id)
        assert line["trace_id"] == started and "parent_span_id" not in line
    assert untraced.headers["x-sluice-trace-id"] != refused.value.response.headers["x-sluice-trace-id"]
    assert httpx.get(f"{runtime_server_process.url}/health").headers["x-sluice-trace-id"]
