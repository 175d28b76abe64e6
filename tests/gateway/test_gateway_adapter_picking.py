"""A LoRA adapter's request goes to a replica that has the adapter resident and room for it, else to the least
loaded replica (which swaps it in); requests for the base model are picked as before."""
import collections

from sluice_contracts.routing_table import RoutingTable
from sluice_gateway.config import Routing
from sluice_gateway.picker import Picker

EPS = [f"http://127.0.0.1:{9100 + i}" for i in range(3)]


def make(affinity: str = "none") -> tuple[Picker, RoutingTable]:
    routes = {
        "sql-v1": {"affinity": affinity, "backends": [
            {"name": "base", "adapter": "sql-v1", "servedModelName": "sql-v1", "endpoints": EPS}]},
        "base": {"affinity": affinity, "backends": [{"name": "base", "servedModelName": "base", "endpoints": EPS}]},
    }
    table = RoutingTable.model_validate({"version": 1, "generation": 1, "routes": routes})
    picker = Picker(Routing())
    picker.sync(table)
    return picker, table


def order(picker, table, route, prefix=None) -> list[str]:
    return [a.endpoint.url for a in picker.plan(table, route, prefix=prefix, session=None)]


def test_the_replica_with_the_adapter_resident_wins_over_a_less_loaded_one():
    picker, table = make()
    picker.state(EPS[1]).loaded_adapters = frozenset({"sql-v1", "tone"})
    picker.state(EPS[1]).running = 5
    picker.state(EPS[2]).loaded_adapters = frozenset({"tone"})
    assert order(picker, table, "sql-v1")[0] == EPS[1]
    # Then, should it fail, every other replica in turn: each can load the adapter.
    assert sorted(order(picker, table, "sql-v1")) == sorted(EPS)
    # The base model's requests ignore where adapters are resident.
    assert order(picker, table, "base")[0] != EPS[1]


def test_a_resident_replica_with_a_queue_is_passed_over_for_the_least_loaded():
    picker, table = make()
    picker.state(EPS[0]).loaded_adapters = frozenset({"sql-v1"})
    picker.state(EPS[0]).waiting = 2
    picker.state(EPS[1]).running = 3
    assert order(picker, table, "sql-v1")[0] == EPS[2]


def test_resident_nowhere_goes_to_the_least_loaded_even_under_prefix_affinity():
    picker, table = make("prefix")
    picker.state(EPS[0]).running = 4
    picker.state(EPS[2]).running = 2
    firsts = {order(picker, table, "sql-v1", prefix=f"prompt {i}".encode())[0] for i in range(50)}
    assert firsts == {EPS[1]}


def test_among_resident_replicas_the_prefix_ring_still_applies():
    picker, table = make("prefix")
    for url in EPS[:2]:
        picker.state(url).loaded_adapters = frozenset({"sql-v1"})
    homes = collections.Counter(order(picker, table, "sql-v1", prefix=f"prompt {i}".encode())[0] for i in range(200))
    assert set(homes) == set(EPS[:2]) and min(homes.values()) > 40
    again = {i: order(picker, table, "sql-v1", prefix=f"prompt {i}".encode())[0] for i in range(200)}
    assert again == {i: order(picker, table, "sql-v1", prefix=f"prompt {i}".encode())[0] for i in range(200)}


def test_an_adapter_named_like_another_is_not_taken_for_it():
    picker, table = make()
    picker.state(EPS[2]).loaded_adapters = frozenset({"sql-v1x", "SQL-V1", "sql-v1 "})
    picker.state(EPS[2]).running = 9
    assert order(picker, table, "sql-v1")[0] != EPS[2]


def test_an_endpoint_shared_by_a_model_and_its_adapters_reads_the_base_models_load():
    # Routes in any order: the endpoint's /metrics samples are labelled with the base model's name.
    for adapter_route in ("aaa-sql", "zzz-sql"):
        routes = {
            adapter_route: {"backends": [{"name": "base", "adapter": adapter_route, "servedModelName": adapter_route,
                                          "engine": "vllm", "endpoints": EPS[:1]}]},
            "base": {"backends": [{"name": "base", "servedModelName": "base-served", "engine": "vllm",
                                   "endpoints": EPS[:1]}]},
        }
        picker = Picker(Routing())
        picker.sync(RoutingTable.model_validate({"version": 1, "generation": 1, "routes": routes}))
        assert picker.state(EPS[0]).served_model_name == "base-served"
