"""Tenant priority end to end: gateway.yaml classes, the headers the gateway sends (whatever the client sent), the
runtime's fair admission and shedding, and the gateway's hold for less urgent classes at saturation.

One tiny runtime with a batch of one sequence and a queue of four, so that saturation is a handful of requests.
"""
import asyncio
import time

import httpx
import openai
import pytest
import yaml

from fixtures.gateway import backend, gateway_config, key_entry, runtimes, table

pytestmark = pytest.mark.integration

KEYS = {"critical": "sk-test-critical", "batch": "sk-test-batch", "flood": "sk-test-flood",
        "single": "sk-test-single"}
CHAT = [{"role": "user", "content": "Count."}]


@pytest.fixture(scope="module")
def saturable_runtime(tiny_model_dir):
    with runtimes(tiny_model_dir, 1, "--max-num-seqs", "1", "--max-waiting", "4") as servers:
        yield servers[0]


@pytest.fixture(scope="module")
def gateway(saturable_runtime, tmp_path_factory):
    from fixtures.gateway import run_gateway

    config = gateway_config(
        [{"name": "team critical", "keys": [key_entry("critical-key", KEYS["critical"])], "priority": "critical"},
         {"name": "nightly", "keys": [key_entry("batch-key", KEYS["batch"])], "priority": "batch"},
         {"name": "flood", "keys": [key_entry("flood-key", KEYS["flood"])]},
         {"name": "single", "keys": [key_entry("single-key", KEYS["single"])], "share": 1}],
        routing={"poll_interval_s": 0.2},
        priority={"hold_s": 1.0, "max_held": 8},
    )
    routes = table(chat={"affinity": "none", "backends": [backend("tiny", saturable_runtime.url)]})
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def _client(gateway, tenant):
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=120)


async def _chat(gateway, tenant, max_tokens, extra_body=None, **extra):
    """The completion's token count, or the error the client got."""
    try:
        response = await _client(gateway, tenant).chat.completions.create(
            model="chat", messages=CHAT, max_tokens=max_tokens,
            extra_body={"ignore_eos": True, **(extra_body or {})}, **extra)
    except openai.APIStatusError as err:
        return err
    return response.usage.completion_tokens


async def _endless(gateway, tenant):
    """A stream that runs until its task is cancelled (the gateway then aborts it upstream); or its error."""
    try:
        stream = await _client(gateway, tenant).chat.completions.create(
            model="chat", messages=CHAT, max_tokens=1900, stream=True, extra_body={"ignore_eos": True})
    except openai.APIStatusError as err:
        return err
    async for _ in stream:
        pass


async def _load_reaches(url, waiting, running=1, timeout=60):
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            load = (await client.get(f"{url}/load", timeout=5)).json()
            if load["waiting"] >= waiting and load["running"] >= running:
                return
            assert time.monotonic() < deadline, f"the runtime never reached {waiting} waiting: {load}"
            await asyncio.sleep(0.02)


def _wait_idle(url, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        load = httpx.get(f"{url}/load", timeout=5).json()
        if not load["running"] and not load["waiting"]:
            return
        assert time.monotonic() < deadline, f"the runtime never went idle: {load}"
        time.sleep(0.05)


async def _cancel(tasks):
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_the_runtime_gets_the_tenants_priority_whatever_the_client_sent(gateway, saturable_runtime):
    _wait_idle(saturable_runtime.url)

    async def scenario():
        await _chat(gateway, "batch", 2, extra_body={"priority": -1000},
                    extra_headers={"x-sluice-priority": "-1000", "x-sluice-tenant": "team%20critical",
                                   "x-sluice-tenant-share": "1000", "x-request-id": "forged-1"})
        await _chat(gateway, "critical", 2, extra_headers={"x-request-id": "honest-1"})

    asyncio.run(scenario())
    lines = gateway.access_lines("forged-1", "honest-1")
    assert lines["forged-1"]["status"] == lines["honest-1"]["status"] == 200
    # The gateway's own request id goes upstream as the runtime's client request id.
    logged = {line.get("client_request_id"): line for line in saturable_runtime.request_log()}
    forged, honest = logged[lines["forged-1"]["request_id"]], logged[lines["honest-1"]["request_id"]]
    assert (forged["priority"], forged["tenant"]) == (10, "nightly")
    assert (honest["priority"], honest["tenant"]) == (-10, "team%20critical")


def test_a_tenant_with_one_request_goes_ahead_of_another_tenants_backlog(gateway, saturable_runtime):
    _wait_idle(saturable_runtime.url)
    url = saturable_runtime.url

    async def scenario():
        finished: list[str] = []

        async def run(tenant, name):
            assert await _chat(gateway, tenant, 4) == 4
            finished.append(name)

        holder = asyncio.create_task(_endless(gateway, "flood"))  # takes the runtime's only slot
        await _load_reaches(url, waiting=0)
        backlog = [asyncio.create_task(run("flood", f"flood-{i}")) for i in range(3)]
        await _load_reaches(url, waiting=3)
        single = asyncio.create_task(run("single", "single"))
        await _load_reaches(url, waiting=4)
        await _cancel([holder])  # the slot frees: the next admission is the single request, not the backlog
        await asyncio.gather(*backlog, single)
        return finished

    finished = asyncio.run(scenario())
    assert finished[0] == "single", finished


def test_at_saturation_batch_is_shed_with_retry_after_while_critical_is_served(gateway, saturable_runtime):
    _wait_idle(saturable_runtime.url)
    url = saturable_runtime.url

    async def scenario():
        flood = [asyncio.create_task(_endless(gateway, "flood"))]
        await _load_reaches(url, waiting=0)
        for i in range(1, 5):  # the runtime's queue of four fills up
            flood.append(asyncio.create_task(_endless(gateway, "flood")))
            await _load_reaches(url, waiting=i)
        await asyncio.sleep(0.5)  # the gateway polls the load: it sees the replica saturated
        batch = asyncio.create_task(_chat(gateway, "batch", 8))
        critical = await _chat(gateway, "critical", 8)
        batch = await batch
        shed = await asyncio.wait_for(flood[4], 30)
        unfinished = [task for task in flood[:4] if not task.done()]
        await _cancel(flood)
        return critical, batch, shed, unfinished

    critical, batch, shed, unfinished = asyncio.run(scenario())
    assert critical == 8
    assert isinstance(batch, openai.APIStatusError) and batch.status_code == 503
    assert batch.body["code"] == "saturated" and "'batch'" in batch.body["message"]
    assert int(batch.response.headers["retry-after"]) >= 1
    own_id = batch.response.headers["x-sluice-request-id"]
    held = gateway.access_lines(own_id)[own_id]["held_ms"]
    assert held >= 900, f"the hold's wait (hold_s: 1) belongs in held_ms, got {held}"
    # The runtime's full queue made room for the critical request by shedding the least urgent, latest one...
    assert isinstance(shed, openai.APIStatusError) and shed.status_code == 503
    assert int(shed.response.headers["retry-after"]) >= 1 and "more urgent" in shed.body["message"]
    # ...and no other: the rest were still streaming or queued until the test ended them.
    assert len(unfinished) == 4
    assert gateway.metric("sluice_gateway_priority_shed_total", priority_class="batch") >= 1
    metrics = httpx.get(f"{url}/metrics").text
    assert 'sluice_runtime_requests_shed_total{model_name="tiny",priority="0"}' in metrics


def test_a_tenants_class_is_reloaded_without_a_restart(gateway, saturable_runtime):
    _wait_idle(saturable_runtime.url)
    config = yaml.safe_load(gateway.config_path.read_text())
    config["priority"]["classes"] = {"critical": -10, "standard": 0, "batch": 10, "urgent": -20}
    for tenant in config["tenants"]:
        if tenant["name"] == "nightly":
            tenant["priority"] = "urgent"
    gateway.write_config(config)
    deadline = time.monotonic() + 30
    while True:
        asyncio.run(_chat(gateway, "batch", 2, extra_headers={"x-request-id": "after-reload"}))
        own_id = gateway.access_lines("after-reload")["after-reload"]["request_id"]
        line = next(r for r in saturable_runtime.request_log() if r.get("client_request_id") == own_id)
        if line["priority"] == -20:
            break
        assert time.monotonic() < deadline, f"the new class never reached the runtime: {line}"
        time.sleep(0.5)
