"""Billable usage at `GET /v1/usage`: three tenants' traffic through two gateway replicas sharing a real
redis-server, against a real runtime and through the official OpenAI client; the report matches, to the token,
the `usage` the clients received and what the token limit charged, from either replica and after both restart.
Only admin keys read it, bad queries get 400 naming the parameter, and a tenant cannot grow it with names of its
own."""
import collections
import csv
import io
import time
import uuid

import httpx
import openai
import pytest
import redis as redis_client

from fixtures.gateway import ADMIN_KEY, backend, gateway_config, key_entry, run_gateway, table

pytestmark = pytest.mark.integration

TENANTS = {"ann": "sk-usage-ann", "ben": "sk-usage-ben", "cat": "sk-usage-cat"}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CHAT = [{"role": "user", "content": "Count to three."}]


def config(redis_url: str | None, prefix: str = "") -> dict:
    # ann has a token limit: the limiter's own count of what it charged is checked against the report.
    tenants = [{"name": prefix + name, "keys": [key_entry(f"{name}-key", key)],
                "limits": {"tokens_per_minute": 1_000_000} if name == "ann" else {}}
               for name, key in TENANTS.items()]
    overrides = {"redis": {"url": redis_url, "on_failure": "closed", "timeout_s": 10}} if redis_url else {}
    return gateway_config(tenants, shutdown={"ready_grace_s": 0}, **overrides)


def routes(runtime_url: str) -> dict:
    return table(tiny={"backends": [backend("tiny-v1", runtime_url)]},
                 chat={"backends": [backend("chat-v1", runtime_url)]})


def usage(gateway, **params) -> httpx.Response:
    return httpx.get(f"{gateway.url}/v1/usage", params=params, headers=ADMIN, timeout=30)


def span() -> dict:
    now = int(time.time())
    return {"start": now - 3600, "end": now + 3600}


def traffic(gateway_urls: list[str]) -> dict[tuple[str, str], collections.Counter]:
    """Each tenant's requests spread over both replicas; what their clients were told they used, by model."""
    received: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for turn, (name, key) in enumerate(TENANTS.items()):
        for i in range(turn + 2):  # a different amount per tenant
            api = openai.OpenAI(base_url=f"{gateway_urls[i % 2]}/v1", api_key=key, max_retries=0, timeout=60)
            model = ("tiny", "chat")[i % 2]
            answer = api.chat.completions.create(model=model, messages=CHAT, max_tokens=3 + i)
            reported = [answer.usage]
            stream = api.chat.completions.create(model=model, messages=CHAT, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True})
            reported += [chunk.usage for chunk in stream if chunk.usage is not None]
            completion = api.completions.create(model=model, prompt="Once upon a time", max_tokens=2 + i)
            reported.append(completion.usage)
            for used in reported:
                received[name, model].update(requests=1, prompt_tokens=used.prompt_tokens,
                                             completion_tokens=used.completion_tokens)
    return received


def report(gateway, prefix: str) -> dict[tuple[str, str], collections.Counter]:
    """The report by tenant and model, of this test's tenants (the session's Redis is shared with other tests)."""
    rows = usage(gateway, group_by="tenant,model", **span()).json()["data"]
    return {(row["tenant"], row["model"]): collections.Counter(
        {kind: row[kind] for kind in ("requests", "prompt_tokens", "completion_tokens") if row[kind]})
        for row in rows if row["tenant"].startswith(prefix)}


def wait_for(gateway, prefix: str, expected: dict, timeout: float = 15) -> None:
    """Replicas flush their counts to Redis every second; counts only grow, so a report past what the clients
    received never comes back down to it."""
    deadline = time.monotonic() + timeout
    while (got := report(gateway, prefix)) != expected:
        assert time.monotonic() < deadline, f"usage report {got} != what the clients received {expected}"
        time.sleep(0.2)


def test_three_tenants_on_two_replicas_are_billed_what_their_clients_received_to_the_token(
        redis_server, tiny_runtimes, start_gateway):
    prefix = f"u{uuid.uuid4().hex[:6]}-"
    gateways = [start_gateway(config(redis_server.url, prefix), routes(tiny_runtimes[0].url)) for _ in range(2)]
    received = traffic([g.url for g in gateways])
    expected = {(prefix + name, model): counts for (name, model), counts in received.items()}
    assert len(expected) == 6  # three tenants, two models each

    wait_for(gateways[0], prefix, expected)
    assert report(gateways[1], prefix) == expected, "another replica reads the same counts"

    # The token limit charged ann exactly the tokens of the usage she was sent (all within its 60 s window).
    charged = redis_client.Redis.from_url(redis_server.url).hvals(f"sluice:limits:{{{prefix}ann}}:tokens")
    ann = sum((counts for (tenant, _), counts in expected.items() if tenant == prefix + "ann"), collections.Counter())
    assert sum(int(n) for n in charged) == ann["prompt_tokens"] + ann["completion_tokens"]

    # Line items by kind and mode, as CSV: the same numbers.
    text = usage(gateways[1], group_by="tenant,mode,kind", format="csv", **span()).text
    items = {(row["tenant"], row["mode"], row["kind"]): int(row["value"]) for row in csv.DictReader(io.StringIO(text))
             if row["tenant"].startswith(prefix)}
    for kind in ("requests", "prompt_tokens", "completion_tokens"):
        for name in TENANTS:
            assert items[prefix + name, "online", kind] == sum(
                counts[kind] for (tenant, _), counts in expected.items() if tenant == prefix + name)
    assert {kind for (_, _, kind), n in items.items() if n} == {"requests", "prompt_tokens", "completion_tokens"}

    # Both replicas gone: a fresh one reads the same counts.
    for gateway in gateways:
        gateway.stop()
    fresh = start_gateway(config(redis_server.url, prefix), routes(tiny_runtimes[0].url))
    assert report(fresh, prefix) == expected


@pytest.fixture(scope="module")
def gateway(tiny_runtimes, tmp_path_factory):
    """One replica without Redis, for the tests that read no shared counts."""
    workdir = tmp_path_factory.mktemp("usage-gateway")
    with run_gateway(config(None), routes(tiny_runtimes[0].url), workdir) as gw:
        yield gw


def test_only_an_admin_key_reads_usage(gateway):
    url = f"{gateway.url}/v1/usage"
    assert httpx.get(url, params=span()).status_code == 401
    refused = httpx.get(url, params=span(), headers={"authorization": f"Bearer {TENANTS['ann']}"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
    answer = usage(gateway, **span())
    assert answer.status_code == 200
    assert answer.json()["counted_by"] == "this replica"  # no Redis: this replica's memory
    assert httpx.post(url, headers=ADMIN).status_code == 405


def test_bad_usage_queries_get_400_naming_the_parameter(gateway):
    now = int(time.time())
    bad = [
        ({"end": now}, "start"),
        ({"start": "yesterday"}, "start"),
        ({"start": "-5"}, "start"),
        ({"start": "1.5e9"}, "start"),
        ({"start": now, "end": "soon"}, "end"),
        ({"start": now, "end": now - 60}, "end"),
        ({"start": now, "end": now}, "end"),
        ({"start": now - 40 * 86400, "end": now}, "end"),
        ({"start": now, "group_by": "tenant,prompt"}, "group_by"),
        ({"start": now, "format": "xml"}, "format"),
        ({"start": now, "tenant": "ann"}, "tenant"),
        ([("start", now), ("start", now - 1)], "start"),
    ]
    for params, param in bad:
        answer = httpx.get(f"{gateway.url}/v1/usage", params=params, headers=ADMIN)
        assert answer.status_code == 400, (params, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", (params, error)
    assert usage(gateway, start=now - 60).status_code == 200  # end defaults to now


def test_a_tenant_cannot_add_names_of_its_own_to_the_counters(gateway):
    headers = {"authorization": f"Bearer {TENANTS['ben']}"}
    for i in range(20):
        body = {"model": f"made-up-{i}", "messages": CHAT, "max_tokens": 1}
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 404
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 1, "user": "x" * 200}
    served = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60).json()
    rows = usage(gateway, group_by="tenant,model,mode,kind", **span()).json()["data"]
    assert {(row["tenant"], row["model"], row["mode"]) for row in rows} == {("ben", "tiny", "online")}
    counted = {row["kind"]: row["value"] for row in rows}
    assert counted == {"requests": 1, "prompt_tokens": served["usage"]["prompt_tokens"],
                       "completion_tokens": served["usage"]["completion_tokens"], "unmetered_requests": 0}
