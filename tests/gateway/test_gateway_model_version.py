"""Which model version answered, through the real gateway and runtimes and the official OpenAI client: a canary's
two backends name their own versions (header, system_fingerprint in bodies and every stream chunk, audit record);
a backend the table gives no version answers with its runtime's own."""
import json
import time

import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_contracts.model_version import fingerprint, weights_version

pytestmark = pytest.mark.integration

KEY = "sk-version-vic"
STABLE, CANARY = "hf:org/chat@v1+g3", "hf:org/chat@v2+g1"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def versioned(name: str, url: str, version: str) -> dict:
    return {**backend(name, url), "version": version}


def audit_records(gateway, count: int, timeout: float = 15) -> list[dict]:
    path, deadline = gateway.config_path.parent / "audit.jsonl", time.monotonic() + timeout
    while len(found := [r for r in map(json.loads, path.read_text().splitlines() if path.exists() else [])
                        if r.get("audit") == "request"]) < count:
        assert time.monotonic() < deadline, "audit records missing"
        time.sleep(0.05)
    return found


def test_a_canarys_backends_each_name_their_version(tiny_runtimes, tiny_model_dir, start_gateway):
    first, second = (r.url for r in tiny_runtimes)
    routes = table(chat={"backends": [versioned("chat-v1", first, STABLE), versioned("chat-v2", second, CANARY)]},
                   plain={"backends": [backend("plain", first)]})
    gateway = start_gateway(gateway_config([{"name": "vic", "keys": [key_entry("vic-ci", KEY)]}],
                                           audit={"sink": "audit.jsonl"}, shutdown={"ready_grace_s": 0}), routes)
    api = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    expected = {"chat-v1": STABLE, "chat-v2": CANARY}

    seen, sent = set(), 0
    while seen != set(expected):
        assert sent < 40, f"the canary split never reached both backends: {seen}"
        sent += 1
        stream = sent % 2 == 0
        raw = api.chat.completions.with_raw_response.create(model="chat", stream=stream, **CHAT)
        name = raw.headers["x-sluice-backend"]
        assert raw.headers["x-sluice-model-version"] == expected[name]
        chunks = list(raw.parse()) if stream else [raw.parse()]
        assert chunks and {c.system_fingerprint for c in chunks} == {fingerprint(expected[name])}
        seen.add(name)
    legacy = api.completions.with_raw_response.create(model="chat", prompt="Hi", max_tokens=2)
    assert legacy.parse().system_fingerprint == fingerprint(legacy.headers["x-sluice-model-version"])

    # No version in the table: the runtime's own (its --model, by default) goes through untouched.
    plain = api.chat.completions.with_raw_response.create(model="plain", **CHAT)
    own = weights_version(str(tiny_model_dir), None)
    assert plain.headers["x-sluice-model-version"] == own and plain.parse().system_fingerprint == fingerprint(own)

    by_backend = {r["backend"]: r["model_version"] for r in audit_records(gateway, sent + 2)}
    assert by_backend == {**expected, "plain": own}
