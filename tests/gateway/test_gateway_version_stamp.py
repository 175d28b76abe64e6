"""The fingerprint the gateway stamps on an answer, in the bodies engines write: Sluice's (a null or its own
value), one with no such key (vLLM, SGLang), and text that merely mentions it."""
import json

import pytest

from sluice_gateway.version_stamp import field, stamp_body, stamp_events

STAMP = field("fp_0123456789ab")


@pytest.mark.parametrize("body", [
    {"id": "x", "system_fingerprint": None, "choices": []},
    {"id": "x", "system_fingerprint": "fp_engine's \"own\"", "choices": []},
    {"id": "x", "choices": [{"message": {"content": '"system_fingerprint": "fp_in_the_text"'}}]},
    {},
])
def test_the_answers_own_key_is_replaced_or_added_and_text_is_left_alone(body):
    stamped = json.loads(stamp_body(json.dumps(body).encode(), STAMP))
    assert stamped == {**body, "system_fingerprint": "fp_0123456789ab"}


def test_each_chunk_of_a_stream_is_stamped_and_nothing_else():
    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}]}
    events = (f"data: {json.dumps(chunk)}\n\ndata:{json.dumps({**chunk, 'system_fingerprint': None})}\n\n"
              ': keepalive\n\ndata: {"error": {"message": "cut"}}\n\ndata: [DONE]\n\n').encode()
    out = stamp_events(events, STAMP).split(b"\n\n")
    assert [json.loads(e[5:])["system_fingerprint"] for e in out[:2]] == ["fp_0123456789ab"] * 2
    assert out[2:] == [b": keepalive", b'data: {"error": {"message": "cut"}}', b"data: [DONE]", b""]
