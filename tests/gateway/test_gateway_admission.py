"""Admission through a real gateway in front of real runtimes, tried as a hostile tenant would: what a request
reserves, the context check before any limit, the allow-list before existence, request ids, malformed bodies."""
import asyncio
import json

import httpx
import openai
import pytest

from fixtures.cluster import wait_for
from fixtures.gateway import TINY_CONTEXT, backend, free_port, gateway_config, key_entry, run_gateway, table
from sluice_gateway.request import (
    TEMPLATE_TOKENS_PER_CHAT,
    TEMPLATE_TOKENS_PER_ELEMENT,
    TEMPLATE_TOKENS_PER_MESSAGE,
)

pytestmark = pytest.mark.integration

WIDE, NARROW, TIGHT, LOWERING = "sk-test-wide", "sk-test-narrow", "sk-test-tight", "sk-test-lowering"
HI = [{"role": "user", "content": "Hi"}]
# The gateway's upper bound of that prompt (sluice_gateway.request): the bytes of its strings, keys included, an
# allowance for the message and each of its members, one per message and one per chat request.
HI_PROMPT_BOUND = (len("role" "user" "content" "Hi") + 3 * TEMPLATE_TOKENS_PER_ELEMENT + TEMPLATE_TOKENS_PER_MESSAGE
                   + TEMPLATE_TOKENS_PER_CHAT)
PROBES = iter([f"sk-test-probe-{i}" for i in range(8)])  # one fresh tenant per reservation measured


def tenant(name: str, key: str, **limits) -> dict:
    return {"name": name, "keys": [key_entry(f"{name}-key", key)], "limits": limits}


@pytest.fixture(scope="module")
def gateway(tiny_runtimes, tmp_path_factory):
    a, b = tiny_runtimes
    config = gateway_config([
        tenant("wide", WIDE, tokens_per_minute=1_000_000),
        tenant("narrow", NARROW, tokens_per_minute=1000),
        tenant("tight", TIGHT, tokens_per_minute=2 * (HI_PROMPT_BOUND + 1), requests_per_minute=2),
        tenant("lowering", LOWERING, tokens_per_minute=1000, over_budget="lower_max_tokens"),
        *(tenant(f"probe-{i}", f"sk-test-probe-{i}", tokens_per_minute=1_000_000) for i in range(8)),
    ])
    routes = table(tiny={"backends": [backend("tiny-v1", a.url, b.url, max_model_len=TINY_CONTEXT)]})
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def post(gateway, key: str, body: dict, path: str = "/v1/chat/completions", **headers) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, headers={"authorization": f"Bearer {key}", **headers},
                      timeout=120)


def reserved_by(gateway, body: dict, path: str = "/v1/chat/completions") -> int:
    """What the gateway reserved for a request of a tenant with nothing else in flight or in the window."""
    with httpx.stream("POST", f"{gateway.url}{path}", json={**body, "stream": True}, timeout=120,
                      headers={"authorization": f"Bearer {next(PROBES)}"}) as response:
        assert response.status_code == 200, response.read()
        limit = int(response.headers["x-ratelimit-limit-tokens"])
        return limit - int(response.headers["x-ratelimit-remaining-tokens"])  # closing cancels the generation


def refusal(response: httpx.Response) -> tuple[int, str | None, str | None]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return response.status_code, error["code"], error["param"]


def test_max_tokens_is_read_under_both_names_and_without_a_value_runs_to_the_end_of_the_context(gateway):
    # max_completion_tokens: null means absent, so max_tokens decides (the gateway once read the null as 'unset'
    # and reserved its default of 512 while the runtime generated all 1,500).
    body = {"model": "tiny", "messages": HI, "max_completion_tokens": None, "max_tokens": 1500}
    assert reserved_by(gateway, body) == HI_PROMPT_BOUND + 1500
    too_large = post(gateway, NARROW, {**body, "ignore_eos": True})
    assert refusal(too_large) == (429, "rate_limit_exceeded", None)
    assert f"{HI_PROMPT_BOUND + 1500} tokens" in too_large.json()["error"]["message"]
    # Without max_tokens the runtime may generate to the end of the context, so that is what is reserved.
    assert reserved_by(gateway, {"model": "tiny", "messages": HI}) == TINY_CONTEXT
    assert post(gateway, NARROW, {"model": "tiny", "messages": HI, "ignore_eos": True}).status_code == 429


def test_every_choice_and_every_prompt_is_reserved(gateway):
    assert reserved_by(gateway, {"model": "tiny", "messages": HI, "max_tokens": 50, "n": 16}) \
        == HI_PROMPT_BOUND + 16 * 50
    prompts = {"model": "tiny", "prompt": ["hello"] * 64, "max_tokens": 20}
    assert reserved_by(gateway, prompts, "/v1/completions") == 64 * (len("hello") + TEMPLATE_TOKENS_PER_ELEMENT + 20)
    assert post(gateway, NARROW, prompts, "/v1/completions").status_code == 429
    served = post(gateway, WIDE, prompts, "/v1/completions").json()
    assert len(served["choices"]) == 64 and served["usage"]["completion_tokens"] <= 64 * 20
    # n as a string, a float or a boolean is refused before the runtime can read it its own way.
    for n in ("16", 16.0, True):
        response = post(gateway, NARROW, {"model": "tiny", "messages": HI, "max_tokens": 5, "n": n})
        assert refusal(response) == (400, "invalid_value", "n")


def test_a_request_that_can_never_fit_is_400_before_any_limit(gateway):
    # The tenant has tokens for two short requests and 2 requests a minute: none of these refusals may use them up.
    cases = [
        ({"model": "tiny", "messages": HI, "max_tokens": 10_000_000}, "/v1/chat/completions", "max_tokens"),
        ({"model": "tiny", "prompt": list(range(TINY_CONTEXT)), "max_tokens": 1}, "/v1/completions", "prompt"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "word " * (TINY_CONTEXT * 52)}]},
         "/v1/chat/completions", "messages"),
    ]
    for body, path, param in cases:
        response = post(gateway, TIGHT, body, path)
        assert refusal(response) == (400, "context_length_exceeded", param)
        assert "maximum context length is 2048 tokens" in response.json()["error"]["message"]
    for _ in range(2):
        assert post(gateway, TIGHT, {"model": "tiny", "messages": HI, "max_tokens": 1}).status_code == 200
    assert post(gateway, TIGHT, {"model": "tiny", "messages": HI, "max_tokens": 1}).status_code == 429


def test_a_reservation_over_what_is_left_is_refused_or_lowered_as_the_tenant_chose(gateway):
    body = {"model": "tiny", "messages": HI, "max_tokens": 1500, "ignore_eos": True}
    refused = post(gateway, NARROW, body)
    assert refused.status_code == 429 and "x-sluice-max-tokens-lowered" not in refused.headers
    lowered = post(gateway, LOWERING, body)
    assert lowered.status_code == 200, lowered.text
    granted = int(lowered.headers["x-sluice-max-tokens-lowered"])
    assert granted == 1000 - HI_PROMPT_BOUND
    assert lowered.json()["usage"]["completion_tokens"] == granted
    # The real usage (the template's system prompt included) now fills the minute: nothing is lent on credit.
    again = post(gateway, LOWERING, body)
    assert refusal(again) == (429, "rate_limit_exceeded", None)


def test_each_request_gets_its_own_id_and_the_clients_is_only_echoed_and_logged(gateway, tiny_runtimes):
    async def twice() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(
                f"{gateway.url}/v1/chat/completions", headers={"authorization": f"Bearer {WIDE}",
                                                               "x-request-id": "same-id"},
                json={"model": "tiny", "messages": HI, "max_tokens": 40, "ignore_eos": True}) for _ in range(2)))

    responses = asyncio.run(twice())
    assert [r.status_code for r in responses] == [200, 200]
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [40, 40]
    assert [r.headers["x-request-id"] for r in responses] == ["same-id", "same-id"]
    own = {r.headers["x-sluice-request-id"] for r in responses}
    assert len(own) == 2 and "same-id" not in own
    def seen_upstream() -> set:
        return {line.get(key) for server in tiny_runtimes for line in server.request_log()
                for key in ("request_id", "client_request_id")}

    # A runtime writes a request's log line once its answer has gone out, so it may come a moment after it.
    seen = wait_for(lambda: own <= (ids := seen_upstream()) and ids, timeout=10,
                    what="both requests in the runtimes' logs")
    assert "same-id" not in seen
    logged = {line["request_id"]: line for line in gateway.log_lines() if line.get("request_id") in own}
    assert {line["client_request_id"] for line in logged.values()} == {"same-id"}
    # An id with odd bytes or of any length is neither echoed nor logged, and does no harm.
    for odd in (b"\xff\xfe trace", b"x" * 8000, b"a\tb"):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                              headers=[(b"authorization", f"Bearer {WIDE}".encode()), (b"x-request-id", odd)],
                              json={"model": "tiny", "messages": HI, "max_tokens": 1})
        assert response.status_code == 200
        assert response.headers["x-request-id"] == response.headers["x-sluice-request-id"]
    assert "x" * 200 not in gateway.log_text()


@pytest.mark.parametrize("depth", [64, 250, 100_000])  # within the top-level object: 65 levels and more
def test_deeply_nested_bodies_are_400_not_500(gateway, depth):
    nested = b"[" * depth + b"]" * depth
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "metadata": ' + nested + b"}"
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body,
                          headers={"authorization": f"Bearer {WIDE}"})
    assert refusal(response) == (400, "invalid_json", None)
    assert "nested too deeply" in response.json()["error"]["message"]


def test_an_allow_list_is_checked_before_existence_and_bounds_fallbacks(tiny_runtimes, start_gateway):
    dead = f"http://127.0.0.1:{free_port()}"  # the small model is down: nothing listens there
    config = gateway_config([
        tenant("small-only", NARROW) | {"models": ["small"]},
        tenant("everything", WIDE),
    ])
    routes = table(
        small={"backends": [backend("small-v1", dead)], "fallbacks": ["premium"]},
        premium={"backends": [backend("premium-v1", tiny_runtimes[0].url)]},
    )
    gateway = start_gateway(config, routes)
    body = {"model": "small", "messages": HI, "max_tokens": 2}
    # The fallback serves a tenant allowed both; never one allowed only the model that is down.
    served = post(gateway, WIDE, body)
    assert served.status_code == 200 and served.headers["x-sluice-backend"] == "premium-v1"
    for _ in range(3):
        refused = post(gateway, NARROW, body)
        assert refused.status_code == 503 and "x-sluice-backend" not in refused.headers
    # Whether a model exists is not told to a key that may not use it.
    for model in ("premium", "premium-v1", "no-such-model"):
        assert refusal(post(gateway, NARROW, {**body, "model": model})) == (403, "model_not_allowed", "model")
    assert refusal(post(gateway, WIDE, {**body, "model": "no-such-model"})) == (404, "model_not_found", "model")
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=NARROW, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="no-such-model", messages=HI, max_tokens=1)
    assert json.loads(httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {NARROW}"}).text)[
        "data"] == [{"id": "small", "object": "model", "created": 0, "owned_by": "sluice"}]


def test_a_canary_backend_that_is_a_model_the_tenant_may_not_use_never_serves_it(tiny_runtimes, start_gateway):
    small_only, both, alias_only = "sk-test-small-only", "sk-test-both", "sk-test-alias-only"
    config = gateway_config([
        tenant("small-only", small_only) | {"models": ["small"]},
        tenant("both", both) | {"models": ["small", "premium"]},
        tenant("alias-only", alias_only) | {"models": ["alias"]},
    ])
    premium_runtime = tiny_runtimes[1]
    routes = table(
        # `premium` is a public model and also `small`'s canary; `small-canary` is a private name.
        small={"backends": [backend("small-v1", tiny_runtimes[0].url), backend("small-canary", tiny_runtimes[0].url),
                            backend("premium", premium_runtime.url, weight=2)]},
        premium={"backends": [backend("premium", premium_runtime.url)]},
        alias={"backends": [backend("premium", premium_runtime.url)]},
    )
    gateway = start_gateway(config, routes)
    body = {"model": "small", "messages": HI, "max_tokens": 1}

    def served_by(key: str, count: int = 16) -> tuple[set[str], set[str]]:
        responses = [post(gateway, key, body) for _ in range(count)]
        assert [r.status_code for r in responses] == [200] * count
        return {r.headers["x-sluice-backend"] for r in responses}, {r.headers["x-sluice-request-id"] for r in responses}

    backends, ids = served_by(small_only)
    assert backends == {"small-v1", "small-canary"}  # the private canary still serves
    assert not ids & {line.get("request_id") for line in premium_runtime.request_log()}
    backends, _ = served_by(both)
    assert "premium" in backends
    # A route whose every backend is a model the key may not use: 403 saying so, never another model.
    refused = post(gateway, alias_only, {**body, "model": "alias"})
    assert refusal(refused) == (403, "model_not_allowed", "model")
    assert "Every backend" in refused.json()["error"]["message"]
    listed = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {alias_only}"}).json()["data"]
    assert listed == []
