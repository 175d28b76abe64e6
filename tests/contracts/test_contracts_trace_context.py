"""What the gateway and the runtime keep of a client's trace context, and what they start instead."""
import re

import pytest

from sluice_contracts import trace_context as contract

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")


def test_a_valid_traceparent_is_kept_and_passed_on_under_a_span_of_the_hop():
    context = contract.read([VALID], ["rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"])
    assert (context.trace_id, context.parent_id, context.sampled) == (TRACE, SPAN, True)
    sent = context.child().headers()
    assert sent["traceparent"].startswith(f"00-{TRACE}-") and sent["traceparent"].endswith("-01")
    assert SPAN not in sent["traceparent"], "the next hop's parent is this hop, not the client"
    assert sent["tracestate"] == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert context.child().parent_id != context.child().parent_id, "each attempt is a span of its own"


def test_a_later_version_is_read_as_version_00_and_unknown_flags_are_dropped():
    context = contract.read([f"cc-{TRACE}-{SPAN}-09-what-comes-later"])
    assert context.trace_id == TRACE and context.sampled
    assert context.child().traceparent.endswith("-01") and context.child().traceparent.startswith("00-")


@pytest.mark.parametrize("values", [
    [], [""], ["garbage"], [VALID.upper()], [VALID + "-extra"], [VALID, VALID],
    [f"ff-{TRACE}-{SPAN}-01"], [f"00-{'0' * 32}-{SPAN}-01"], [f"00-{TRACE}-{'0' * 16}-01"],
    [f"00-{TRACE}-{SPAN}-1"], [f"00-{TRACE[:-1]}g-{SPAN}-01"], [f"00-{TRACE}-{SPAN}-01\n"], [" " + VALID],
    [f"cc-{TRACE}-{SPAN}-01x"],
])
def test_a_malformed_or_repeated_traceparent_starts_a_new_trace(values):
    assert contract.read(values, ["rojo=1"]) is None
    started = contract.read_or_start(values, ["rojo=1"])
    assert TRACEPARENT.fullmatch(started.traceparent) and started.state is None


@pytest.mark.parametrize("state", [
    "UPPER=1", "a=1,a=2", "a=", "=1", "a=b,c", "a=x\ty", "a=x=y", ",".join(f"k{i}=v" for i in range(33)),
    "a=" + "x" * 600,
])
def test_an_invalid_or_oversized_tracestate_is_dropped_whole(state):
    context = contract.read([VALID], [state])
    assert context.trace_id == TRACE and context.state is None and "tracestate" not in context.headers()


def test_tracestate_sent_in_several_headers_is_one_list():
    assert contract.read([VALID], ["a=1", "b@vendor=2,, c=3"]).state == "a=1,b@vendor=2,c=3"


def test_started_traces_are_valid_and_distinct():
    started = [contract.new_trace() for _ in range(1000)]
    assert len({t.trace_id for t in started}) == 1000
    for trace in started[:50]:
        assert contract.read([trace.traceparent]) == trace
