"""What a request may cost, read as the runtime reads it: prompt bounds, the context check, the reservation."""
import json

import pytest

from sluice_gateway.cost import check_context, reserve
from sluice_gateway.errors import GatewayError
from sluice_gateway.request import (
    MAX_BODY_ELEMENTS,
    MAX_CHARS_PER_TOKEN,
    TEMPLATE_TOKENS_PER_CHAT,
    TEMPLATE_TOKENS_PER_ELEMENT,
    TEMPLATE_TOKENS_PER_MESSAGE,
    parse_request,
)

# The default message's bound: its 400 bytes, the keys and the role, an allowance for the message and its two
# members, one for the message and one for the request.
PROMPT = (400 + len("role") + len("content") + len("user") + 3 * TEMPLATE_TOKENS_PER_ELEMENT + TEMPLATE_TOKENS_PER_MESSAGE
          + TEMPLATE_TOKENS_PER_CHAT)
EACH = TEMPLATE_TOKENS_PER_ELEMENT


def parsed(kind: str = "chat", **body):
    if kind == "chat":
        body.setdefault("messages", [{"role": "user", "content": "x" * 400}])
    body.setdefault("model", "m")
    return parse_request(json.dumps(body).encode(), kind=kind, prefix_chars=64)


def reservation(kind: str = "chat", context: int | None = 2048, **body) -> int:
    return reserve(parsed(kind, **body), context, default_max_tokens=512).tokens


def test_every_name_and_type_of_max_tokens_is_read_as_the_runtime_reads_it():
    assert reservation(max_completion_tokens=None, max_tokens=1000) == PROMPT + 1000
    assert reservation(max_completion_tokens=1000) == PROMPT + 1000
    assert reservation(max_tokens=100, n=16) == PROMPT + 1600
    for n in ("16", 16.0, True):
        with pytest.raises(GatewayError) as err:
            parsed(max_tokens=10, n=n)
        assert err.value.status == 400 and err.value.param == "n"
    with pytest.raises(GatewayError) as err:
        parsed(max_tokens=10, max_completion_tokens=20)
    assert err.value.param == "max_tokens"


def test_without_max_tokens_the_reservation_runs_to_the_end_of_the_context():
    # One choice can use the whole context; each further choice what the shortest possible prompt leaves.
    assert reservation(context=2048) == 2048
    assert reservation(context=2048, n=4) == 2 + 4 * (2048 - 2)
    assert reservation(context=None) == PROMPT + 512  # no maxModelLen in the routing table: the configured default


def test_every_prompt_of_a_completions_list_is_reserved():
    prompts = ["hello"] * 64
    assert reservation("completion", prompt=prompts, max_tokens=10) == 64 * (5 + EACH + 10)
    assert reservation("completion", prompt=prompts) == 64 * (5 + EACH + 16)  # the endpoint's default max_tokens
    assert reservation("completion", prompt=[[1, 2, 3]] * 4, max_tokens=10, n=2) == 4 * (3 + 20)
    assert reservation("completion", prompt=[1, 2, 3], max_tokens=10) == 13
    assert reservation("embedding", input=["abcd", "efgh"]) == 2 * (4 + EACH)


def test_a_long_prompt_reserves_no_more_than_the_context_leaves_it():
    # 4,000 bytes of text, but the runtime serves it with max_tokens 1000 only if it is at most 1048 tokens.
    assert reservation(messages=[{"role": "user", "content": "y" * 4000}], max_tokens=1000) == 1048 + 1000


def test_lowering_max_tokens_finds_the_largest_that_fits():
    res = reserve(parsed(max_tokens=1000, n=2), 2048, default_max_tokens=512)
    assert res.max_tokens_within(res.tokens) == 1000
    assert res.max_tokens_within(PROMPT + 2 * 300) == 300
    assert res.max_tokens_within(PROMPT + 2 * 300 + 1) == 300
    assert res.tokens_with(300) == PROMPT + 600


@pytest.mark.parametrize("body, kind, param", [
    ({"max_tokens": 10_000_000}, "chat", "max_tokens"),
    ({"max_completion_tokens": 2048}, "chat", "max_completion_tokens"),
    ({"prompt": list(range(2048)), "max_tokens": 1}, "completion", "prompt"),
    ({"prompt": [list(range(2000))], "max_tokens": 100}, "completion", "max_tokens"),
    ({"messages": [{"role": "user", "content": "z" * (2048 * MAX_CHARS_PER_TOKEN)}]}, "chat", "messages"),
    ({"input": list(range(2049))}, "embedding", "input"),
])
def test_requests_that_cannot_fit_any_backend_are_refused_with_the_field(body, kind, param):
    with pytest.raises(GatewayError) as err:
        check_context(parsed(kind, **body), 2048)
    assert (err.value.status, err.value.code, err.value.param) == (400, "context_length_exceeded", param)


def test_only_certain_overflows_are_refused():
    # 8,000 characters may be 8,000 tokens or 32: the runtime, which can count, decides.
    check_context(parsed(messages=[{"role": "user", "content": "z" * 8000}], max_tokens=2000), 2048)
    check_context(parsed("completion", prompt=list(range(2047)), max_tokens=1), 2048)
    check_context(parsed("embedding", input=list(range(2048))), 2048)
    check_context(parsed(max_tokens=10_000_000), None)  # no maxModelLen known: nothing certain


@pytest.mark.parametrize("body, param", [
    (b"[1]", None),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "m", "messages": []}', "messages"),
    (b'{"model": "m", "messages": ["hi"]}', "messages"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}', "max_tokens"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "ignore_eos": "yes"}', "ignore_eos"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}', None),
    (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
])
def test_malformed_requests_are_400_naming_the_field(body, param):
    with pytest.raises(GatewayError) as err:
        parse_request(body, kind="chat", prefix_chars=64)
    assert err.value.status == 400 and err.value.param == param


def test_nesting_is_bounded_by_the_runtimes_limit_not_by_the_bracket_count():
    from sluice_contracts.json_depth import MAX_JSON_DEPTH

    def nested(levels: int) -> str:
        return "[" * levels + "]" * levels

    def body(metadata: str) -> bytes:  # the top-level object is the first level
        return ('{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + metadata + "}").encode()

    parse_request(body(nested(MAX_JSON_DEPTH - 1)), kind="chat", prefix_chars=64)
    # Many brackets side by side are no deeper than one of them.
    parse_request(body("[" + ", ".join([nested(2)] * 10_000) + "]"), kind="chat", prefix_chars=64)
    with pytest.raises(GatewayError) as refused:
        parse_request(body(nested(MAX_JSON_DEPTH)), kind="chat", prefix_chars=64)
    assert refused.value.status == 400 and refused.value.code == "invalid_json"
    assert f"more than {MAX_JSON_DEPTH} levels" in refused.value.message


@pytest.mark.parametrize("extra", [
    {"metadata": [0] * MAX_BODY_ELEMENTS},  # one flat array
    {"metadata": {f"k{i}": 0 for i in range(MAX_BODY_ELEMENTS)}},  # one object's members
    {"tools": [{"function": {"parameters": [[0] * 1024] * (MAX_BODY_ELEMENTS // 1024)}}]},  # spread, nested
])
def test_a_body_of_more_elements_than_the_bound_is_refused_whatever_holds_them(extra):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(GatewayError) as refused:
        parse_request(json.dumps(body).encode(), kind="chat", prefix_chars=64)
    assert (refused.value.status, refused.value.code) == (400, "invalid_json")
    assert f"more than {MAX_BODY_ELEMENTS} array elements" in refused.value.message
    # Just under the bound is read.
    parse_request(json.dumps({"model": "m", "prompt": [1] * (MAX_BODY_ELEMENTS - 8)}).encode(), kind="completion",
                  prefix_chars=64)


def tokens_reserved(kind: str, **body) -> int:
    return parsed(kind, **body).reserved_prompt_tokens


def test_text_in_any_field_reserves_at_least_its_bytes():
    text = "hidden words " * 100
    plain = tokens_reserved("chat", messages=[{"role": "user", "content": text}])
    hiding_places = [
        {"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": text}}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": text[i:i + 13]}} for i in range(0, len(text), 13)]}]},
        {"messages": [{"role": "user", "name": text, "content": ""}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"description": text}}]},
        {"messages": [{"role": "user", "content": "x"}], "some_future_field": {"deep": [text]}},
    ]
    for body in hiding_places:
        assert tokens_reserved("chat", **body) >= len(text), body
    assert plain >= len(text)
    # Empty parts and empty prompts cost their framing each.
    assert tokens_reserved("chat", messages=[{"role": "user", "content": [{"type": "text", "text": ""}] * 3000}]) \
        >= 3000 * (len("type" "text" "text") + 2 * EACH)
    assert tokens_reserved("completion", prompt=[""] * 3000) == 3000 * EACH
    # The settings never reach a prompt: a long stop string or user id costs nothing.
    assert tokens_reserved("chat", stop=["x" * 500], user="u" * 500) == PROMPT
