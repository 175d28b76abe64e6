"""Endpoints without /load (vLLM, SGLang): the gateway reads their load from /metrics and picks by it.

vLLM and SGLang cannot run here; our own runtime with `--no-load-endpoint` stands in for them: it answers
/load with 404 and serves vLLM's metric names on /metrics, as vLLM does.
"""
import asyncio
import time

import httpx
import pytest

from fixtures.gateway import TINY_MODEL_NAME, backend, gateway_config, key_entry, run_gateway, runtimes, table

pytestmark = pytest.mark.integration

KEY = "sk-test-metrics-load"
HEADERS = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def no_load_runtimes(tiny_model_dir):
    with runtimes(tiny_model_dir, 2, "--no-load-endpoint") as servers:
        yield [server.url for server in servers]


@pytest.fixture(scope="module")
def gateway(no_load_runtimes, tmp_path_factory):
    a, b = no_load_runtimes
    routes = table(**{
        "by-engine": {"backends": [backend("vllm-pool", a, b, engine="vllm")]},
        # A hand-written table naming no engine: the 404 on /load is what tells the gateway to read /metrics.
        "detected": {"backends": [backend("unnamed-pool", a, engine=None)]},
    })
    config = gateway_config([{"name": "metrics", "keys": [key_entry("metrics-key", KEY)]}],
                            routing={"poll_interval_s": 0.2, "poll_timeout_s": 2.0})
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def _wait_for(check, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"{url}/metrics has no {name}")


def _successes(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def test_the_stand_in_serves_metrics_but_no_load(no_load_runtimes):
    url = no_load_runtimes[0]
    assert httpx.get(f"{url}/load").status_code == 404
    assert httpx.get(f"{url}/ready").status_code == 200
    assert _gauge(url, "vllm:num_requests_running") == 0


@pytest.mark.parametrize("model", ["by-engine", "detected"])
def test_endpoints_without_load_stay_in_rotation(gateway, no_load_runtimes, model):
    _wait_for(lambda: all(gateway.metric("sluice_gateway_endpoint_up", endpoint=u) == 1 for u in no_load_runtimes),
              "both endpoints healthy")
    for _ in range(3):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", headers=HEADERS, timeout=60,
                              json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert response.status_code == 200, response.text
    assert "failed its health check" not in gateway.log_text()


async def _hold_streams(url: str, count: int, started: asyncio.Event, release: asyncio.Event) -> None:
    """`count` long generations on one runtime directly, open until `release`; the client reads nothing more."""
    body = {"model": TINY_MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": True,
            "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        streams = [await _open(client, body) for _ in range(count)]
        started.set()
        await release.wait()
        for stream in streams:
            await stream.aclose()


async def _open(client: httpx.AsyncClient, body: dict) -> httpx.Response:
    response = await client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    assert response.status_code == 200
    return response


def test_the_least_loaded_endpoint_by_metrics_is_picked(gateway, no_load_runtimes):
    busy, idle = no_load_runtimes

    async def scenario():
        started, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_streams(busy, 4, started, release))
        await started.wait()
        try:
            await asyncio.to_thread(_wait_for, lambda: gateway.metric(
                "sluice_gateway_endpoint_load", endpoint=busy, field="running") >= 2, "the gateway to see the load")
            before = [_successes(busy), _successes(idle)]
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
                for _ in range(6):
                    response = await client.post("/v1/chat/completions", headers=HEADERS, json={
                        "model": "by-engine", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
                    assert response.status_code == 200, response.text
            # The busy runtime was still busy throughout, so the picks were made on its load.
            assert _gauge(busy, "vllm:num_requests_running") >= 2
            await asyncio.to_thread(_wait_for, lambda: _successes(idle) == before[1] + 6, "the idle runtime's count")
            assert _successes(busy) == before[0]
        finally:
            release.set()
            await holder

    asyncio.run(scenario())
