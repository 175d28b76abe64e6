"""One runtime credential per namespace (sluice_contracts.runtime_credential.for_namespace), against real runtime
and gateway processes: a namespace's runtimes take its own credential and refuse another namespace's, and each
namespace's gateway, holding its namespace's credential, is served by its runtimes."""
import contextlib
import secrets

import httpx
import pytest
from openai import OpenAI

from fixtures.gateway import RUNTIME_ARGS, backend, gateway_config, key_entry, table
from sluice_contracts import runtime_credential

pytestmark = pytest.mark.integration

KEY = "sk-test-namespaces"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
NAMESPACES = ("team-a", "team-b")


@pytest.fixture(scope="module")
def release_key() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def namespace_runtimes(tiny_model_dir, tmp_path_factory, release_key):
    """namespace → (runtime, its credential file), each runtime checking its namespace's credential."""
    from fixtures.runtime_server import start_runtime_server

    workdir = tmp_path_factory.mktemp("namespace-credentials")
    with contextlib.ExitStack() as stack:
        found = {}
        for namespace in NAMESPACES:
            path = workdir / namespace
            path.write_text(runtime_credential.for_namespace(release_key, namespace) + "\n")
            found[namespace] = (stack.enter_context(start_runtime_server(
                *RUNTIME_ARGS, "--api-key-file", str(path), model=str(tiny_model_dir), timeout=240)), path)
        yield found


def test_a_namespaces_credential_opens_its_runtimes_only(namespace_runtimes, release_key):
    a, b = (runtime_credential.for_namespace(release_key, n) for n in NAMESPACES)
    assert len({a, b, release_key}) == 3 and runtime_credential.for_namespace(release_key, NAMESPACES[0]) == a
    runtime_a = namespace_runtimes["team-a"][0]

    def status(credential: str) -> int:
        return httpx.post(f"{runtime_a.url}/v1/chat/completions", json=CHAT, timeout=60,
                          headers={"authorization": runtime_credential.header_value(credential)}).status_code

    assert status(a) == 200
    # Another namespace's credential, the release key itself, and a namespace name that only looks alike.
    for other in (b, release_key, runtime_credential.for_namespace(release_key, "team-a "),
                  runtime_credential.for_namespace(release_key, "Team-a")):
        assert status(other) == 401


def test_each_namespaces_gateway_reaches_its_runtimes_and_not_the_others(namespace_runtimes, start_gateway):
    tenants = [{"name": "t", "keys": [key_entry("t-key", KEY)]}]
    gateways = {}
    for namespace, (runtime, credential_file) in namespace_runtimes.items():
        routes = table(tiny={"backends": [backend("b", runtime.url)]})
        gateways[namespace] = start_gateway(
            gateway_config(tenants, upstream_credential_file=str(credential_file)), routes)
    for namespace, gateway in gateways.items():
        reply = OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0).chat.completions.create(**CHAT)
        assert reply.usage.completion_tokens == 2, namespace

    # Team b's gateway pointed at team a's runtime is refused there: the client gets the gateway's error, not
    # an answer.
    crossed = start_gateway(
        gateway_config(tenants, upstream_credential_file=str(namespace_runtimes["team-b"][1])),
        table(tiny={"backends": [backend("b", namespace_runtimes["team-a"][0].url)]}))
    response = httpx.post(f"{crossed.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"},
                          timeout=60)
    assert response.status_code >= 500 and response.json()["error"]["type"], response.text
