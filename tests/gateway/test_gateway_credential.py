"""The runtime credential: the gateway presents it upstream instead of the client's key, and follows rotations."""
import contextlib
import time

import httpx
import pytest
from openai import OpenAI

from fixtures.gateway import RUNTIME_ARGS, backend, gateway_config, key_entry, replace_file, table

pytestmark = pytest.mark.integration

KEY = "sk-test-tenant-key"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@contextlib.contextmanager
def guarded(model_dir, path, *args: str):
    """A runtime that refuses inference calls without the credential in its (rotatable) file."""
    from fixtures.runtime_server import start_runtime_server

    path.write_text("credential-one\n")  # a Secret's value may end in a newline
    with start_runtime_server(*RUNTIME_ARGS, "--api-key-file", str(path), *args, model=str(model_dir),
                              timeout=240) as server:
        yield server, path


@pytest.fixture
def guarded_runtime(tiny_model_dir, tmp_path):
    with guarded(tiny_model_dir, tmp_path / "runtime-credential") as server:
        yield server


def wait_for(condition, what: str, timeout: float = 15):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


def test_the_gateway_presents_the_runtime_credential_never_the_clients_key(guarded_runtime, start_gateway, tmp_path):
    runtime, runtime_file = guarded_runtime
    # The tenant's own key is refused by the runtime: only the credential opens it.
    assert httpx.post(f"{runtime.url}/v1/chat/completions", json=CHAT,
                      headers={"authorization": f"Bearer {KEY}"}).status_code == 401

    gateway_file = tmp_path / "gateway-credential"
    gateway_file.write_text("credential-one\n")
    tenants = [{"name": "t", "keys": [key_entry("t-key", KEY)]}]
    routes = table(tiny={"backends": [backend("b", runtime.url)]})
    gateway = start_gateway(gateway_config(tenants, upstream_credential_file=str(gateway_file),
                                           routing={"reload_interval_s": 0.1}), routes)
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0)
    # The runtime refuses a request with two Authorization headers: one answer means only the credential went.
    reply = client.chat.completions.create(**CHAT)
    assert reply.usage.completion_tokens == 2
    streamed = list(client.chat.completions.create(**CHAT, stream=True))
    assert streamed[-1].choices[0].finish_reason == "length"

    # The kubelet updates each pod's copy of a rotated Secret in its own time: either side may go first, and
    # the client is served throughout (never a 401 about its key, nor the gateway's 502).
    def served() -> bool:
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                              headers={"authorization": f"Bearer {KEY}"})
        assert response.status_code == 200, response.text
        return True

    def gateway_rotates(credential: str) -> None:
        loaded = gateway.log_text().count("upstream credential file")
        replace_file(gateway_file, credential)
        wait_for(lambda: gateway.log_text().count("upstream credential file") > loaded, "the gateway to read it")

    replace_file(runtime_file, "credential-two")  # the runtime first: it still takes the one it replaced
    assert served()
    gateway_rotates("credential-two")
    assert served()
    gateway_rotates("credential-three")  # the gateway first: the runtime refuses it, the one it replaced is taken
    assert served() and served()
    replace_file(runtime_file, "credential-three")
    assert served()
    assert gateway.metric("sluice_gateway_upstream_errors_total", kind="unauthorized") == 0

    # A rotated file that cannot be sent (a line break would split the upstream request) is refused and the
    # credential in force stays.
    replace_file(gateway_file, "credential-three\r\nx-injected: 1")
    wait_for(lambda: gateway.metric("sluice_gateway_file_rejected", file="credential") == 1, "the rejection")
    assert client.chat.completions.create(**CHAT).usage.completion_tokens == 2
    assert httpx.get(f"{gateway.url}/ready").status_code == 200
    log = gateway.log_text()
    assert not any(f"credential-{n}" in log for n in ("one", "two", "three")), "the credential must never be logged"


def test_without_a_usable_credential_file_the_gateway_is_not_ready_until_one_appears(
        guarded_runtime, start_gateway, tmp_path):
    runtime, _ = guarded_runtime
    gateway_file = tmp_path / "not-yet-mounted"
    tenants = [{"name": "t", "keys": [key_entry("t-key", KEY)]}]
    gateway = start_gateway(gateway_config(tenants, upstream_credential_file=str(gateway_file),
                                           routing={"reload_interval_s": 0.1}),
                            table(tiny={"backends": [backend("b", runtime.url)]}), wait_for="/health")
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 503 and ready.json()["error"]["message"] == "no valid credential file yet"
    assert gateway.metric("sluice_gateway_ready") == 0
    assert gateway.metric("sluice_gateway_file_rejected", file="credential") == 1
    assert "cannot read the upstream credential file" in gateway.log_text()

    gateway_file.write_text("credential-one")
    wait_for(lambda: httpx.get(f"{gateway.url}/ready").status_code == 200, "the gateway to become ready")
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"})
    assert response.status_code == 200, response.text


def test_a_refused_credential_is_read_again_at_once_and_a_wrong_one_is_the_gateways_502(
        tiny_model_dir, start_gateway, tmp_path):
    # A runtime that takes no replaced credential, and a gateway that would not look at its file for an hour:
    # only reading it again when refused keeps the client served.
    with guarded(tiny_model_dir, tmp_path / "runtime-credential", "--api-key-grace-s", "0") as (runtime, runtime_file):
        gateway_file = tmp_path / "gateway-credential"
        gateway_file.write_text("credential-one\n")
        tenants = [{"name": "t", "keys": [key_entry("t-key", KEY)]}]
        gateway = start_gateway(gateway_config(tenants, upstream_credential_file=str(gateway_file),
                                               routing={"reload_interval_s": 3600}),
                                table(tiny={"backends": [backend("b", runtime.url)]}))
        client = OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0)
        assert client.chat.completions.create(**CHAT).usage.completion_tokens == 2
        replace_file(runtime_file, "credential-two")
        replace_file(gateway_file, "credential-two")
        assert client.chat.completions.create(**CHAT).usage.completion_tokens == 2
        assert gateway.metric("sluice_gateway_upstream_errors_total", kind="unauthorized") == 0

        # A credential the gateway does not hold (a wrong Secret): the client's key is not at fault, so it gets
        # the gateway's 502, never a 401 about its key.
        replace_file(runtime_file, "credential-elsewhere")
        refused = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                             headers={"authorization": f"Bearer {KEY}"})
        assert refused.status_code == 502 and refused.json()["error"]["code"] == "upstream_unauthorized", refused.text
        assert gateway.metric("sluice_gateway_upstream_errors_total", kind="unauthorized") == 1
