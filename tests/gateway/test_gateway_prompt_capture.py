"""Prompt capture through the real gateway and the official OpenAI client: nothing captured unless a tenant opts
in; an opted-in tenant's prompts and answers (streamed ones put together) on their own sink, redacted, bounded and
joined to the audit record, batch lines too; another tenant's never; a rate below one samples; settings that
would mix the capture into another sink refused at load; a sink that cannot be written leaves requests served.

The upstream is an echo server (it answers with the prompt's text), since the answer must carry given secrets."""
import io
import json
import time
from http.server import BaseHTTPRequestHandler

import httpx
import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from fixtures.loopback_http import LoopbackServer, reply

pytestmark = pytest.mark.integration

ANN, BOB, CY = "sk-capture-ann", "sk-capture-bob", "sk-capture-cy"
EMAIL, API_KEY, CARD = "jane.doe@example.com", "sk-live0123456789abcdef", "4111 1111 1111 1111"
SECRETS = f"mail {EMAIL}, key {API_KEY}, card {CARD}."
REDACTED = "mail [redacted], key [redacted], card [redacted]."


class Echo(BaseHTTPRequestHandler):
    """A model server whose answer is `echo: ` and the prompt's last text, a stream of it in pieces of four
    characters, so that every secret is split across events."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the gateway polls /load
        reply(self, 200, json.dumps({"waiting": 0, "running": 0, "kv_cache_usage": 0.0, "block_size": 16}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
        if self.path == "/v1/embeddings":
            reply(self, 200, json.dumps({"object": "list", "model": "tiny", "usage": usage, "data": [
                {"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}]}).encode())
            return
        chat = self.path == "/v1/chat/completions"
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        text = "echo: " + (prompt if isinstance(prompt, str) else json.dumps(prompt))
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            choice = {"index": 0, "finish_reason": "stop",
                      **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
            reply(self, 200, json.dumps({"id": "x", "object": kind, "created": 0, "model": "tiny",
                                         "choices": [choice], "usage": usage}).encode())
            return
        events = [{"index": 0, "finish_reason": None, **({"delta": {"content": text[i:i + 4]}} if chat
                                                         else {"text": text[i:i + 4]})}
                  for i in range(0, len(text), 4)]
        chunks = [{"id": "x", "object": f"{kind}.chunk", "created": 0, "model": "tiny", "choices": [choice]}
                  for choice in events]
        chunks.append({"id": "x", "object": f"{kind}.chunk", "created": 0, "model": "tiny", "choices": [],
                       "usage": usage})
        stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        reply(self, 200, stream.encode(), "text/event-stream")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def echo():
    server = LoopbackServer(Echo)
    yield server.url
    server.close()


def config(capture: dict | None, rates: dict[str, float], audit_sink: str = "audit.jsonl", **overrides) -> dict:
    tenants = [{"name": name, "keys": [key_entry(f"{name}-ci", key)],
                **({"prompt_capture_rate": rates[name]} if name in rates else {})}
               for name, key in (("ann", ANN), ("bob", BOB), ("cy", CY))]
    audit = {"sink": audit_sink, **({"prompt_capture": capture} if capture else {})}
    return gateway_config(tenants, audit=audit, shutdown={"ready_grace_s": 0}, **overrides)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(path, matches, count: int = 1, timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(found := [r for r in lines(path) if matches(r)]) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} lines in {path.name}: {lines(path)}"
        time.sleep(0.05)
    return found


def of_request(response):
    return lambda r: r.get("request_id") == response.headers["x-sluice-request-id"]


@pytest.fixture
def http():
    """A client for each gateway, kept for the test: one per request would cost more than the request."""
    clients: dict[str, httpx.Client] = {}
    yield lambda gateway: clients.setdefault(gateway.url, httpx.Client(base_url=gateway.url, timeout=30))
    for client in clients.values():
        client.close()


def chat(http: httpx.Client, key: str, content: str, **fields) -> httpx.Response:
    response = http.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                         json={"model": "tiny", "messages": [{"role": "user", "content": content}], **fields})
    assert response.status_code == 200, response.text
    return response


def test_nothing_is_captured_unless_a_tenant_opts_in(echo, start_gateway, http):
    gateway = start_gateway(config(None, {}), table(tiny={"backends": [backend("echo", echo)]}))
    client = http(gateway)
    answers = [chat(client, ANN, SECRETS), chat(client, ANN, SECRETS, stream=True)]
    assert answers[0].json()["choices"][0]["message"]["content"] == f"echo: {SECRETS}"
    workdir = gateway.config_path.parent
    for answer in answers:
        wait_for(workdir / "audit.jsonl", of_request(answer))
    for path in workdir.rglob("*"):
        if path.is_file():
            assert EMAIL.encode() not in path.read_bytes(), f"the prompt reached {path.name}"


def test_an_opted_in_tenant_is_captured_redacted_and_bounded_and_the_others_not(echo, start_gateway, http):
    gateway = start_gateway(config({"sink": "captured.jsonl", "max_chars": 1000, "redact": [r"(?i)project \w+"]},
                                   {"ann": 1, "cy": 0.5}),
                            table(tiny={"backends": [backend("echo", echo)]}))
    client = http(gateway)
    workdir = gateway.config_path.parent
    captured = workdir / "captured.jsonl"
    api = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=ANN, max_retries=0, timeout=30)

    whole = chat(client, ANN, SECRETS + " Project Nightjar")
    record = wait_for(captured, of_request(whole))[0]
    assert record["request"]["messages"] == [{"role": "user", "content": REDACTED + " [redacted]"}]
    assert record["answer"] == [f"echo: {REDACTED} [redacted]"]
    assert record["truncated"] == {"request": False, "answer": False}
    assert (record["tenant"], record["key_id"], record["route"], record["mode"]) == ("ann", "ann-ci", "tiny", "online")
    audited = wait_for(workdir / "audit.jsonl", of_request(whole))[0]
    assert record["trace_id"] == audited["trace_id"] == whole.headers["x-sluice-trace-id"]

    stream = api.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": SECRETS}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices) == f"echo: {SECRETS}"
    assert wait_for(captured, of_request(stream))[0]["answer"] == [f"echo: {REDACTED}"]

    completion = api.completions.with_raw_response.create(model="tiny", prompt=SECRETS, stream=True)
    list(completion.parse())
    assert wait_for(captured, of_request(completion))[0]["answer"] == [f"echo: {REDACTED}"]
    embedding = api.embeddings.with_raw_response.create(model="tiny", input=[SECRETS, "plain"])
    embedded = wait_for(captured, of_request(embedding))[0]
    assert embedded["request"] == {"input": [REDACTED, "plain"]} and embedded["answer"] is None

    # A tenant cannot make a record as large as it likes: a long prompt is cut, and the record says so.
    # (A body this large is parsed off the event loop, and its prompt kept as the JSON text it was parsed to.)
    long = chat(client, ANN, "x" * 70_000 + SECRETS)
    cut = wait_for(captured, of_request(long))[0]
    assert cut["request"]["messages"].startswith('[{"role":"user","content":"xxx')
    assert len(cut["request"]["messages"]) == len(cut["answer"][0]) == 1000
    assert cut["truncated"] == {"request": True, "answer": True}

    bob = chat(client, BOB, SECRETS)
    sampled = [chat(client, CY, "hello") for _ in range(40)]
    wait_for(workdir / "audit.jsonl", of_request(sampled[-1]))
    wait_for(captured, lambda r: r["tenant"] == "cy")
    time.sleep(0.2)  # a record is written just after its response
    assert not [r for r in lines(captured) if r["request_id"] == bob.headers["x-sluice-request-id"]]
    assert 0 < len([r for r in lines(captured) if r["tenant"] == "cy"]) < len(sampled)

    upload = api.files.create(purpose="batch", file=("in.jsonl", io.BytesIO(json.dumps(
        {"custom_id": "one", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "tiny", "messages": [{"role": "user", "content": SECRETS}]}}).encode())))
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    line = wait_for(captured, lambda r: r["batch_id"] == batch.id, timeout=30)[0]
    assert line["mode"] == "batch" and line["answer"] == [f"echo: {REDACTED}"]

    text = captured.read_text()
    assert EMAIL not in text and API_KEY not in text and CARD not in text and "Nightjar" not in text
    assert "[redacted]" not in (workdir / "audit.jsonl").read_text(), "a prompt reached the audit trail"


def test_capture_settings_are_checked_at_load(tmp_path):
    from sluice_gateway.config import ConfigError, load_config

    def load(capture: dict, **overrides) -> None:
        (tmp_path / "gateway.yaml").write_text(json.dumps(config(capture, {"ann": 1}, **overrides)))
        load_config(tmp_path / "gateway.yaml")

    load({"sink": "captured.jsonl", "redact": [r"ACME-\d{6}"]})
    refusals = [
        ({"sink": "captured.jsonl", "redact": ["ok", "acme-(\\d"]}, {}, r"redact\[1\] 'acme-\(\\\\d' is not a regular"),
        ({"sink": "captured.jsonl", "redact": ["x*"]}, {}, "matches the empty string"),
        ({"sink": str(tmp_path / "audit.jsonl")}, {}, "the audit trail's own file"),
        ({"sink": "stdout"}, {}, "would mix captured prompts into the access log"),
        ({"sink": "stderr"}, {"audit_sink": "stderr"}, "the audit trail's own sink"),
        ({"sink": "off"}, {}, r"\['ann'\] set prompt_capture_rate, but audit.prompt_capture.sink is off"),
    ]
    for capture, overrides, message in refusals:
        with pytest.raises(ConfigError, match=message):
            load(capture, **overrides)
    for rate in (0, 1.5, "often"):
        with pytest.raises(ConfigError, match="prompt_capture_rate"):
            (tmp_path / "gateway.yaml").write_text(json.dumps(config({"sink": "c.jsonl"}, {"ann": rate})))
            load_config(tmp_path / "gateway.yaml")


def test_a_capture_sink_that_cannot_be_written_leaves_requests_served(echo, start_gateway, http, tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    routes = table(tiny={"backends": [backend("echo", echo)]})
    for sink, said in (("/dev/full", "prompt capture record not written: No space left on device"),
                       (str(tmp_path / "not-a-dir" / "captured.jsonl"), "audit.prompt_capture.sink")):
        gateway = start_gateway(config({"sink": sink}, {"ann": 1}), routes)  # ready all the same
        client = http(gateway)
        for _ in range(3):
            chat(client, ANN, SECRETS)
            chat(client, ANN, SECRETS, stream=True)
        deadline = time.monotonic() + 10
        while gateway.metric("sluice_gateway_prompt_capture_write_failures_total") < 6:
            assert time.monotonic() < deadline, "records that could not be written were not counted"
            time.sleep(0.05)
        assert said in gateway.log_text()
