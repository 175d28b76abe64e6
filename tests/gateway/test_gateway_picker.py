"""Backend and endpoint choice: weights, stickiness, fallbacks, consistent hashing with bounded load, ejection."""
import collections
import time

from sluice_contracts.routing_table import RoutingTable
from sluice_gateway.config import Routing
from sluice_gateway.picker import Picker

EPS = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]


def make(routes: dict, **settings) -> tuple[Picker, RoutingTable]:
    table = RoutingTable.model_validate({"version": 1, "generation": 1, "routes": routes})
    picker = Picker(Routing(**settings))
    picker.sync(table)
    return picker, table


def be(name: str, *endpoints: str, weight: int = 1) -> dict:
    return {"name": name, "servedModelName": "m", "weight": weight, "endpoints": list(endpoints)}


def first(picker, table, route, prefix=None, session=None):
    attempt = next(picker.plan(table, route, prefix=prefix, session=session), None)
    return attempt


def test_weights_split_traffic():
    picker, table = make({"r": {"backends": [be("stable", EPS[0], weight=90), be("canary", EPS[1], weight=10)]}})
    counts = collections.Counter(first(picker, table, "r").backend.name for _ in range(10000))
    assert abs(counts["canary"] / 10000 - 0.10) < 0.015


def test_sticky_sessions_always_get_the_same_backend_and_still_split_by_weight():
    picker, table = make({"r": {"backends": [be("stable", EPS[0], weight=80), be("canary", EPS[1], weight=20)]}})
    per_session = {s: {first(picker, table, "r", session=f"user-{s}").backend.name for _ in range(5)}
                   for s in range(2000)}
    assert all(len(names) == 1 for names in per_session.values())
    canary_share = sum(names == {"canary"} for names in per_session.values()) / 2000
    assert abs(canary_share - 0.20) < 0.04


def test_a_backend_without_ready_endpoints_gets_no_traffic():
    picker, table = make({"r": {"backends": [be("dead", EPS[0], weight=99), be("alive", EPS[1], weight=1)]}})
    picker.state(EPS[0]).healthy = False
    assert {first(picker, table, "r").backend.name for _ in range(200)} == {"alive"}


def test_plan_tries_the_route_then_its_fallbacks_in_order_without_loops():
    picker, table = make({
        "a": {"backends": [be("a1", EPS[0], EPS[1])], "fallbacks": ["b", "c"]},
        "b": {"backends": [be("b1", EPS[2])], "fallbacks": ["a"]},
        "c": {"backends": [be("c1", EPS[3])]},
    })
    order = [(a.route, a.endpoint.url) for a in picker.plan(table, "a", prefix=None, session=None)]
    assert [r for r, _ in order] == ["a", "a", "b", "c"]
    assert {u for _, u in order[:2]} == {EPS[0], EPS[1]}


def test_plan_never_falls_back_to_a_route_the_tenant_may_not_use():
    picker, table = make({
        "small": {"backends": [be("small-1", EPS[0])], "fallbacks": ["premium", "other"]},
        "premium": {"backends": [be("premium-1", EPS[1])], "fallbacks": ["other"]},
        "other": {"backends": [be("other-1", EPS[2])]},
    })
    picker.state(EPS[0]).healthy = False
    allowed = {"small", "other"}.__contains__
    order = [a.route for a in picker.plan(table, "small", prefix=None, session=None, allowed=allowed)]
    assert order == ["other"]
    assert list(picker.plan(table, "small", prefix=None, session=None, allowed={"small"}.__contains__)) == []


def test_a_route_with_no_endpoints_at_all_plans_nothing():
    picker, table = make({"r": {"backends": [be("none")]}})
    assert list(picker.plan(table, "r", prefix=None, session=None)) == []


def test_least_loaded_endpoint_wins_without_affinity():
    picker, table = make({"r": {"backends": [be("b", *EPS[:3])]}})
    picker.state(EPS[0]).waiting = 3
    picker.state(EPS[1]).kv_cache_usage = 0.9
    picker.state(EPS[2]).running = 1
    assert first(picker, table, "r").endpoint.url == EPS[2]


def test_prefix_affinity_is_stable_bounded_and_consistent():
    picker, table = make({"r": {"affinity": "prefix", "backends": [be("b", *EPS)]}})
    keys = [f"system prompt {i}".encode() for i in range(400)]
    home = {k: first(picker, table, "r", prefix=k).endpoint.url for k in keys}
    assert home == {k: first(picker, table, "r", prefix=k).endpoint.url for k in keys}
    assert min(collections.Counter(home.values()).values()) > 40, "the ring spreads prefixes unevenly"

    busy = home[keys[0]]
    picker.state(busy).in_flight = 10
    assert first(picker, table, "r", prefix=keys[0]).endpoint.url != busy, "the load bound did not apply"
    picker.state(busy).in_flight = 0

    # Removing one endpoint moves only the prefixes it owned.
    smaller, smaller_table = make({"r": {"affinity": "prefix", "backends": [be("b", *EPS[:3])]}})
    moved = [k for k in keys if home[k] != EPS[3] and first(smaller, smaller_table, "r", prefix=k).endpoint.url != home[k]]
    assert moved == []


def test_session_affinity_ignores_load_but_not_health():
    picker, table = make({"r": {"affinity": "session", "backends": [be("b", *EPS)]}})
    home = first(picker, table, "r", session="abc").endpoint.url
    picker.state(home).in_flight = 50
    assert first(picker, table, "r", session="abc").endpoint.url == home
    picker.state(home).healthy = False
    assert first(picker, table, "r", session="abc").endpoint.url != home


def test_repeated_failures_eject_an_endpoint_for_a_while():
    picker, table = make({"r": {"backends": [be("b", EPS[0])]}}, eject_after_failures=2, eject_for_s=0.2)
    state = picker.state(EPS[0])
    picker.report_failure(state)
    assert first(picker, table, "r") is not None
    picker.report_failure(state)
    assert first(picker, table, "r") is None
    time.sleep(0.25)
    assert first(picker, table, "r") is not None


def test_state_is_bounded_by_the_table_not_by_traffic():
    picker, table = make({"r": {"affinity": "prefix", "backends": [be("b", *EPS)]}})
    for i in range(5000):
        first(picker, table, "r", prefix=f"p{i}".encode(), session=f"s{i}")
    assert len(picker.endpoints()) == 4 and len(picker._rings) == 1
    picker.state(EPS[0]).waiting = 7
    shrunk = RoutingTable.model_validate({"routes": {"r": {"backends": [be("b", EPS[0], EPS[1])]}}})
    picker.sync(shrunk)
    assert sorted(s.url for s in picker.endpoints()) == EPS[:2]
    assert picker.state(EPS[0]).waiting == 7, "a kept endpoint lost its state on reload"


def test_urgent_requests_prefer_replicas_with_nothing_queued_over_their_cached_prefix():
    picker, table = make({"r": {"affinity": "prefix", "backends": [be("b", *EPS)]}})
    for url in EPS:
        picker.state(url).waiting = 3
    idle = EPS[2]
    picker.state(idle).waiting = 0
    prefixes = [f"prompt {i}".encode() for i in range(50)]
    homes = {next(picker.plan(table, "r", prefix=p, session=None)).endpoint.url for p in prefixes}
    assert len(homes) > 1, "prefix affinity spreads prompts over every replica"
    urgent = {next(picker.plan(table, "r", prefix=p, session=None, prefer_idle=True)).endpoint.url for p in prefixes}
    assert urgent == {idle}
    picker.state(idle).waiting = 1  # none idle: affinity decides again
    assert {next(picker.plan(table, "r", prefix=p, session=None, prefer_idle=True)).endpoint.url
            for p in prefixes} == homes


def test_a_route_is_saturated_only_while_every_replica_queues_or_fails():
    picker, table = make({"r": {"backends": [be("b", EPS[0], EPS[1])], "fallbacks": ["f"]},
                          "f": {"backends": [be("fb", EPS[2])]},
                          "empty": {"backends": [be("none")]}})
    anyone = lambda name: True  # noqa: E731
    for url in EPS[:3]:
        picker.state(url).waiting = 2
    assert picker.saturated(table, "r", anyone)
    picker.state(EPS[2]).waiting = 0
    assert not picker.saturated(table, "r", anyone), "a fallback with room takes the request"
    assert picker.saturated(table, "r", lambda name: name == "r"), "a fallback the tenant may not use does not"
    picker.state(EPS[2]).healthy = False
    assert picker.saturated(table, "r", anyone), "a replica failing its load polls has no room"
    assert not picker.saturated(table, "empty", anyone), "no replica at all is not saturation"
