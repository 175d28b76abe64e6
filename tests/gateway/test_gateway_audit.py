"""The audit trail on its own sink (a file here), against a real runtime through the official OpenAI client:
a record for every request answered, refused ones and a client that leaves mid-stream included, never the
prompt, the completion or the key; batch lines as such; admin events for a reload's keys, a rejected file and a
routing change."""
import io
import json
import socket
import time

import httpx
import openai
import pytest
import yaml

from fixtures.gateway import ADMIN_KEY, backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY, KEPT, ADDED = "sk-audit-ann", "sk-audit-kept", "sk-audit-added"
# Words the tiny model's tokenizer knows, in an order nobody writes: grep-able in any file it reaches.
SECRET = "periwinkle walrus contemplates seventeen harmonicas"


def config(*keys: tuple[str, str], **overrides) -> dict:
    tenants = [{"name": "ann", "keys": [key_entry(key_id, key) for key_id, key in keys]}]
    settings = {"audit": {"sink": "audit.jsonl"}, "shutdown": {"ready_grace_s": 0},
                "routing": {"reload_interval_s": 0.2}, **overrides}
    return gateway_config(tenants, **settings)


def routes(runtime_url: str, weight: int = 1, generation: int = 1) -> dict:
    return table(generation, tiny={"backends": [backend("tiny-v1", runtime_url, weight=weight),
                                                backend("tiny-v2", runtime_url, weight=1)]})


def records(gateway) -> list[dict]:
    path = gateway.config_path.parent / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_records(gateway, matches, count: int = 1, timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(found := [r for r in records(gateway) if matches(r)]) < count:
        assert time.monotonic() < deadline, f"no audit record yet; the trail: {records(gateway)}"
        time.sleep(0.05)
    return found


def of_request(request_id: str):
    return lambda record: record.get("request_id") == request_id


def test_each_request_answered_has_a_record_without_its_text(tiny_runtimes, start_gateway):
    gateway = start_gateway(config(("ann-ci", KEY)), routes(tiny_runtimes[0].url))
    api = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"Repeat after me: {SECRET}"}]
    answer = api.chat.completions.with_raw_response.create(model="tiny", messages=messages, max_tokens=8)
    stream = api.chat.completions.with_raw_response.create(model="tiny", messages=messages, max_tokens=8,
                                                           stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream.parse() if chunk.choices)
    bad_key = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"authorization": "Bearer sk-nobody"},
                         json={"model": "tiny", "messages": messages})
    unknown = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                         json={"model": "no-such-model", "messages": messages})

    served = wait_for_records(gateway, of_request(answer.headers["x-sluice-request-id"]))[0]
    used = answer.parse().usage
    assert served["tenant"] == "ann" and served["key_id"] == "ann-ci" and served["mode"] == "online"
    assert served["batch_id"] is None
    assert served["source"] == "127.0.0.1" and served["path"] == "/v1/chat/completions"
    assert served["route"] == "tiny" and served["backend"] in ("tiny-v1", "tiny-v2")
    assert served["endpoint"] == tiny_runtimes[0].url and served["priority_class"] == "standard"
    assert (served["prompt_tokens"], served["completion_tokens"]) == (used.prompt_tokens, used.completion_tokens)
    assert served["status"] == 200 and served["error_code"] is None and served["finish_reason"] == "length"
    assert 0 < served["first_byte_ms"] <= served["total_ms"]

    stream_record = wait_for_records(gateway, of_request(stream.headers["x-sluice-request-id"]))[0]
    assert stream_record["stream"] is True and stream_record["events_sent"] >= 8
    assert stream_record["completion_tokens"] == 8  # the usage the gateway asked for, though the client did not

    refusals = {r["status"]: r for r in wait_for_records(gateway, lambda r: r.get("status") in (401, 404), 2)}
    assert refusals[401]["tenant"] is None and refusals[401]["error_code"] == "invalid_api_key"
    assert refusals[404]["tenant"] == "ann" and refusals[404]["route"] is None
    assert refusals[404]["error_code"] == "model_not_found"
    assert bad_key.status_code == 401 and unknown.status_code == 404

    trail = (gateway.config_path.parent / "audit.jsonl").read_text()
    assert "periwinkle" not in trail and "harmonicas" not in trail, "the prompt reached the audit trail"
    assert streamed and streamed not in trail and KEY not in trail and "sk-nobody" not in trail
    # The access log is the operational log: the trail has a sink of its own.
    assert '"audit"' not in gateway.log_text()


def test_a_client_that_leaves_mid_stream_gets_a_record_of_what_it_was_served(tiny_runtimes, start_gateway):
    gateway = start_gateway(config(("ann-ci", KEY)), routes(tiny_runtimes[0].url))
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1500,
                       "ignore_eos": True, "stream": True, "n": 8, "logprobs": True, "top_logprobs": 20}).encode()
    sock = socket.create_connection(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1])))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\nauthorization: Bearer {KEY}\r\nx-request-id: "
                 f"leaver\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while received.count(b"data:") < 3:
        received += sock.recv(65536)
    sock.close()

    left = wait_for_records(gateway, lambda r: r.get("client_request_id") == "leaver", timeout=30)[0]
    assert left["status"] == 499 and left["tenant"] == "ann" and left["route"] == "tiny"
    # At least what reached the client; what was still in the buffers between them counts as sent.
    assert left["events_sent"] >= received.count(b"data:") >= 3 and left["bytes_sent"] > 0
    assert left["completion_tokens"] is None  # the runtime never got to report usage: the limit charged it whole
    assert left["first_byte_ms"] is not None and left["total_ms"] >= left["first_byte_ms"]


def test_reloads_and_routing_changes_write_admin_events(tiny_runtimes, start_gateway):
    runtime = tiny_runtimes[0].url
    gateway = start_gateway(config(("ann-kept", KEPT), ("ann-ci", KEY)), routes(runtime))
    wait_for_records(gateway, lambda r: r.get("event") == "config_loaded")

    gateway.write_config(config(("ann-kept", KEPT), ("ann-new", ADDED)))
    added = wait_for_records(gateway, lambda r: r.get("event") == "key_added")
    removed = wait_for_records(gateway, lambda r: r.get("event") == "key_removed")
    assert [(e["tenant"], e["key_id"]) for e in added] == [("ann", "ann-new")]
    assert [(e["tenant"], e["key_id"]) for e in removed] == [("ann", "ann-ci")]
    assert httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {ADDED}"}).status_code == 200

    gateway.write_config("tenants: [: not yaml")
    rejected = wait_for_records(gateway, lambda r: r.get("event") == "file_rejected")[0]
    assert rejected["file"] == "config" and "not valid YAML" in rejected["reason"]

    first = wait_for_records(gateway, lambda r: r.get("event") == "routes_changed")[0]
    assert first["routes_added"] == ["tiny"]
    gateway.write_routes(table(2, tiny={"backends": [backend("tiny-v1", runtime, weight=9)]},
                               chat={"backends": [backend("chat-v1", runtime)]}))
    change = wait_for_records(gateway, lambda r: r.get("event") == "routes_changed", 2)[1]
    assert change["generation"] == 2 and change["routes_added"] == ["chat"] and change["routes_removed"] == []
    assert change["backends_removed"] == ["tiny/tiny-v2"] and change["backends_added"] == ["chat/chat-v1"]
    assert change["weights"] == {"tiny/tiny-v1": {"from": 1, "to": 9}}
    assert KEPT not in (gateway.config_path.parent / "audit.jsonl").read_text()


def test_an_audit_file_that_cannot_be_written_leaves_the_gateway_not_ready(start_gateway, tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    gateway = start_gateway(config(("ann-ci", KEY), audit={"sink": str(tmp_path / "not-a-dir" / "audit.jsonl")}),
                            table(), wait_for="/health")
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 503 and "audit.sink" in ready.json()["error"]["message"]


def test_batch_lines_have_records_and_usage_of_their_own_mode(tiny_runtimes, start_gateway):
    gateway = start_gateway(config(("ann-ci", KEY)), routes(tiny_runtimes[0].url))
    api = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "tiny", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 2 + i}}
             for i in range(2)]
    upload = api.files.create(file=("in.jsonl", io.BytesIO("".join(json.dumps(line) + "\n" for line in lines)
                                                          .encode())), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (batch := api.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and batch.status in ("validating", "in_progress", "finalizing"), batch
        time.sleep(0.2)
    answers = [json.loads(line)["response"] for line in api.files.content(batch.output_file_id).text.splitlines()]

    found = wait_for_records(gateway, lambda r: r.get("client_request_id") == batch.id, 2)
    assert {r["mode"] for r in found} == {"batch"} and {r["priority_class"] for r in found} == {"batch"}
    assert {r["batch_id"] for r in found} == {batch.id}
    assert {r["request_id"] for r in found} == {answer["request_id"] for answer in answers}
    assert {r["source"] for r in found} == {None}
    rows = httpx.get(f"{gateway.url}/v1/usage", params={"start": int(time.time()) - 60, "group_by": "mode,kind"},
                     headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()["data"]
    billed = {row["kind"]: row["value"] for row in rows if row["mode"] == "batch"}
    assert billed["requests"] == 2
    assert billed["prompt_tokens"] == sum(answer["body"]["usage"]["prompt_tokens"] for answer in answers)
    assert billed["completion_tokens"] == sum(answer["body"]["usage"]["completion_tokens"] for answer in answers)
    assert "walrus" not in (gateway.config_path.parent / "audit.jsonl").read_text()


def test_the_sink_setting_is_checked_and_a_file_follows_the_config(tmp_path):
    from sluice_gateway.config import GatewayConfig, load_config

    (tmp_path / "gateway.yaml").write_text("audit: {sink: trail.jsonl}")
    assert load_config(tmp_path / "gateway.yaml").audit.sink == tmp_path / "trail.jsonl"
    assert GatewayConfig.model_validate(yaml.safe_load("audit: {sink: off}")).audit.sink == "off"  # YAML's false
    for bad in ("", True, 3):
        with pytest.raises(ValueError, match="audit.sink"):
            GatewayConfig.model_validate({"audit": {"sink": bad}})
