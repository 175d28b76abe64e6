"""`GET /v1/models/{model}` at the gateway, as `client.models.retrieve` calls it: the list's allow-list applies."""
import httpx
import openai
import pytest

from fixtures.gateway import ADMIN_KEY, backend, gateway_config, key_entry, run_gateway, table

pytestmark = pytest.mark.integration

ALICE, BOB = "sk-models-alice", "sk-models-bob"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    # Nothing is generated: the gateway answers this itself, so no upstream needs to run.
    config = gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)]},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)], "models": ["chat-*"]},
    ])
    routes = table(**{
        "chat-small": {"backends": [backend("tiny-v1", "http://127.0.0.1:9")]},
        "secret": {"backends": [backend("tiny-secret", "http://127.0.0.1:9")]},
        "org/with-slash": {"backends": [backend("tiny-org", "http://127.0.0.1:9")]},
        # A name bob may use whose only backend is a model he may not: not listed, so not retrievable.
        "chat-behind-secret": {"backends": [backend("secret", "http://127.0.0.1:9")]},
    })
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway"), wait_for="/health") as gw:
        yield gw


def client(gateway, key):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_retrieve_answers_what_the_list_shows(gateway):
    alice = client(gateway, ALICE)
    listed = {m.id for m in alice.models.list()}
    for name in listed:
        model = alice.models.retrieve(name)
        assert model.id == name and model.object == "model"
    assert "org/with-slash" in listed


def test_a_model_the_key_may_not_use_is_404_as_an_unknown_one(gateway):
    bob = client(gateway, BOB)
    assert {m.id for m in bob.models.list()} == {"chat-small"}
    assert bob.models.retrieve("chat-small").id == "chat-small"
    errors = {}
    for name in ("secret", "chat-behind-secret", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as missing:
            bob.models.retrieve(name)
        errors[name] = {k: v for k, v in missing.value.body.items() if k != "message"}
        assert name in missing.value.body["message"]
    assert errors["secret"] == errors["no-such-model"] == errors["chat-behind-secret"] == {
        "type": "not_found_error", "param": "model", "code": "model_not_found"}


def test_retrieve_needs_a_tenant_key(gateway):
    for headers in ({}, {"authorization": "Bearer sk-wrong"}):
        answer = httpx.get(f"{gateway.url}/v1/models/chat-small", headers=headers)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    # An admin key sees every model in the list, and retrieves each.
    admin = client(gateway, ADMIN_KEY)
    assert {m.id for m in admin.models.list()} == {admin.models.retrieve(m.id).id for m in admin.models.list()}
    assert httpx.post(f"{gateway.url}/v1/models/chat-small",
                      headers={"authorization": f"Bearer {ALICE}"}).status_code == 405
