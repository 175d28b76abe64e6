"""Routing through real runtimes: the canary split, sticky sessions, prefix and session affinity."""
import asyncio
import collections
import time

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, table

pytestmark = pytest.mark.integration

KEY = "sk-test-routing"
HEADERS = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def urls(tiny_runtimes):
    return [server.url for server in tiny_runtimes]


@pytest.fixture(scope="module")
def gateway(urls, tmp_path_factory):
    a, b = urls
    routes = table(**{
        "canary": {"backends": [backend("stable", a, weight=90), backend("candidate", b, weight=10)]},
        "even": {"backends": [backend("blue", a, weight=50), backend("green", b, weight=50)]},
        "prefixed": {"affinity": "prefix", "backends": [backend("pool-p", a, b)]},
        "sessions": {"affinity": "session", "backends": [backend("pool-s", a, b)]},
    })
    config = gateway_config([{"name": "routing", "keys": [key_entry("routing-key", KEY)]}],
                            routing={"sticky_canary": True})
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def success_count(runtime_url: str) -> float:
    text = httpx.get(f"{runtime_url}/metrics").text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


async def fire(gateway_url: str, bodies: list[dict], concurrency: int, headers_of=lambda i: {}) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=gateway_url, limits=limits, timeout=120) as client:
        queue = collections.deque(enumerate(bodies))
        responses: list[httpx.Response | None] = [None] * len(bodies)

        async def worker():
            while queue:
                i, body = queue.popleft()
                responses[i] = await client.post("/v1/chat/completions", json=body,
                                                 headers={**HEADERS, **headers_of(i)})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return responses


def chat(model: str, text: str = "Hi") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}


def test_canary_split_is_90_10_within_3_points_over_2000_requests(gateway, urls):
    before = [success_count(u) for u in urls]
    responses = asyncio.run(fire(gateway.url, [chat("canary")] * 2000, concurrency=24))
    assert [r.status_code for r in responses].count(200) == 2000
    served = collections.Counter(r.headers["x-sluice-backend"] for r in responses)
    assert abs(served["stable"] / 2000 - 0.90) <= 0.03, served
    # The runtimes' own counters agree with the gateway's headers (they count just after responding).
    expected = [before[0] + served["stable"], before[1] + served["candidate"]]
    deadline = time.monotonic() + 15
    while [success_count(u) for u in urls] != expected:
        assert time.monotonic() < deadline, ([success_count(u) for u in urls], expected)
        time.sleep(0.1)


def test_sticky_sessions_stay_on_one_version(gateway):
    sessions = [f"user-{i}" for i in range(24)]
    bodies = [chat("even") for _ in sessions for _ in range(4)]
    responses = asyncio.run(fire(gateway.url, bodies, concurrency=8,
                                 headers_of=lambda i: {"x-session-id": sessions[i // 4]}))
    per_session = collections.defaultdict(set)
    for i, response in enumerate(responses):
        assert response.status_code == 200
        per_session[sessions[i // 4]].add(response.headers["x-sluice-backend"])
    assert all(len(backends) == 1 for backends in per_session.values()), per_session
    assert set().union(*per_session.values()) == {"blue", "green"}


def endpoints_by_request_id(gateway, request_ids) -> dict[str, str]:
    return {rid: line["endpoint"] for rid, line in gateway.access_lines(*request_ids).items()}


def test_prefix_affinity_keeps_a_prefix_on_one_endpoint_and_spreads_prefixes(gateway):
    prompts = [f"Document {i}: " + "shared system context " * 40 for i in range(12)]
    ids = {}
    for round_ in range(3):
        for i, prompt in enumerate(prompts):
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("prefixed", prompt),
                                  headers={**HEADERS, "x-request-id": f"prefix-{round_}-{i}"}, timeout=60)
            assert response.status_code == 200
            ids[(round_, i)] = f"prefix-{round_}-{i}"
    where = endpoints_by_request_id(gateway, ids.values())
    homes = [{where[ids[(r, i)]] for r in range(3)} for i in range(len(prompts))]
    assert all(len(home) == 1 for home in homes), homes
    assert len(set().union(*homes)) == 2, "twelve prefixes all hashed to one endpoint"


def test_session_affinity_pins_a_session_to_an_endpoint(gateway):
    for session in ("alpha", "beta", "gamma", "delta"):
        for n in range(3):
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("sessions", f"turn {n}"),
                                  headers={**HEADERS, "x-session-id": session, "x-request-id": f"s-{session}-{n}"})
            assert response.status_code == 200
    where = endpoints_by_request_id(gateway, [f"s-{s}-{n}" for s in ("alpha", "beta", "gamma", "delta")
                                              for n in range(3)])
    for session in ("alpha", "beta", "gamma", "delta"):
        assert len({where[f"s-{session}-{n}"] for n in range(3)}) == 1
