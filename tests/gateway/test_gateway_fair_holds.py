"""The scale-from-zero hold and the priority hold are shared fairly, per model and per tenant: one tenant that
fills a hold does not get every other tenant 503 at once."""
import asyncio
import threading
import time

import httpx
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, table
from sluice_gateway.auth import Rank
from sluice_gateway.config import Priority, Routing
from sluice_gateway.errors import GatewayError
from sluice_gateway.fair_holds import FairHolds
from sluice_gateway.metrics import GatewayMetrics
from sluice_gateway.picker import Picker
from sluice_gateway.priority_hold import PriorityHold

TENANTS = "abcd"


def test_a_tenant_gets_its_share_and_a_newcomer_always_finds_room_until_the_hold_is_full():
    holds = FairHolds()
    for _ in range(2):
        assert holds.refusal("m", "a", 4) is None
        holds.add("m", "a")
    assert holds.refusal("m", "a", 4) == "tenant_share"  # alone: half
    assert holds.refusal("other-model", "a", 4) is None  # per model
    holds.add("m", "b")
    assert holds.refusal("m", "b", 4) == "tenant_share"  # two others hold: a quarter... at least one
    holds.add("m", "c")
    assert holds.refusal("m", "d", 4) == "full"
    holds.remove("m", "a")
    assert holds.refusal("m", "d", 4) is None and holds.held("m") == 3


async def test_the_priority_hold_is_counted_per_model_and_per_tenant():
    hold = PriorityHold(Picker(Routing()), GatewayMetrics())
    batch = Rank("batch", 10, 1.0, 1)
    settings = Priority(hold_s=1.0, max_held=2)

    async def wait(model: str, tenant: str) -> str:
        try:
            await hold.wait(batch, settings, lambda: True, model=model, tenant=tenant)
        except GatewayError as err:
            return "shed at once" if "could not wait" in err.message else "waited"
        return "forwarded"

    results = await asyncio.gather(wait("m", "a"), wait("m", "a"), wait("m", "b"), wait("n", "c"))
    # a's second exceeds its share of m; b still waits beside it; c, on another model, is not touched by m's.
    assert results == ["waited", "shed at once", "waited", "waited"]


@pytest.mark.integration
def test_one_tenant_cannot_fill_the_cold_start_hold(start_gateway):
    tenants = [{"name": t, "keys": [key_entry(t, f"sk-test-fair-{t}")], "models": ["*"]} for t in TENANTS]
    config = gateway_config(tenants, cold_start={"max_held_per_model": 4, "max_wait_s": 20, "keepalive_s": 1})
    gateway = start_gateway(config, table(1, tiny={"backends": [backend("tiny-im")]}))
    statuses: dict[str, list[int]] = {t: [] for t in TENANTS}
    release = threading.Event()

    def hold(tenant: str) -> None:
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", timeout=60,
                          headers={"authorization": f"Bearer sk-test-fair-{tenant}"},
                          json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                "stream": True}) as response:
            statuses[tenant].append(response.status_code)
            if response.status_code == 200:  # held: its headers and a keepalive came at once
                release.wait(30)

    def held() -> float:
        return gateway.metric("sluice_gateway_held_requests", backend="tiny-im")

    threads = []
    for tenant, count in (("a", 3), ("b", 2), ("c", 1), ("d", 1)):
        for _ in range(count):
            thread = threading.Thread(target=hold, args=(tenant,), daemon=True)
            thread.start()
            threads.append(thread)
            time.sleep(0.3)  # in order: each sees the hold as the ones before left it
    deadline = time.monotonic() + 30
    while sum(map(len, statuses.values())) < len(threads):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    # a: half of 4; b: a quarter (at least one); c: one more fills it; d finds it full.
    assert {t: sorted(s) for t, s in statuses.items()} == {"a": [200, 200, 503], "b": [200, 503], "c": [200],
                                                         "d": [503]}, statuses
    assert gateway.metric("sluice_gateway_hold_refusals_total", reason="tenant_share") == 2
    assert gateway.metric("sluice_gateway_hold_refusals_total", reason="full") == 1
    deadline = time.monotonic() + 30
    while held():  # every held client left, and left the hold
        assert time.monotonic() < deadline
        time.sleep(0.1)
