"""The Normal events an admin reads on the objects they changed (`kubectl describe mr`, `kubectl describe im`):
what a ModelRoute's route in the routing table changed, once per change, and which adapters were loaded on or
unloaded from a serving replica. Scaling writes none."""
import asyncio
import json
from http.server import BaseHTTPRequestHandler

import aiohttp

from fixtures.loopback_http import LoopbackServer, reply
from sluice_operator.admin_events import Event, adapter_events, route_events
from sluice_operator.crd import InferenceModelSpec, ModelRouteSpec
from sluice_operator.handlers.adapters import _sync_pod
from sluice_operator.route_compiler import compile_routes

A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"
MODELS = {name: InferenceModelSpec.model_validate({"model": {"source": "smollm2"}})
          for name in ("smollm2", "canary", "other")}


def _route(backends, **fields):
    return ModelRouteSpec.model_validate({"model": "chat", "backends": [
        {"inferenceModel": name, "weight": weight} for name, weight in backends], **fields})


class Namespace:
    """Compiles like the operator does, and keeps what each ModelRoute served, as the routing handler does."""

    def __init__(self):
        self.table, self.served = None, {}

    def compile(self, routes, models=MODELS, endpoints=None):
        compiled = compile_routes(models, routes, endpoints or {"smollm2": [A], "canary": [B]}, self.table)
        served = {route: compiled.table.routes[name] for route, name in compiled.served.items()}
        events = route_events(self.served, served, compiled.missing)
        self.table, self.served = compiled.table, served
        return events


def test_a_weight_change_is_one_event_naming_from_and_to():
    ns = Namespace()
    assert ns.compile({"chat": _route([("smollm2", 90), ("canary", 10)])}) == {
        "chat": Event("RoutesChanged", "now in the routing table: smollm2=90, canary=10")}
    events = ns.compile({"chat": _route([("smollm2", 50), ("canary", 50)])})
    assert events == {"chat": Event("RoutesChanged",
                                    "backend canary weight 10 → 50; backend smollm2 weight 90 → 50")}


def test_a_table_recompiled_unchanged_or_endpoints_scaling_give_no_event():
    ns = Namespace()
    routes = {"chat": _route([("smollm2", 90), ("canary", 10)])}
    ns.compile(routes)
    assert ns.compile(routes) == {}
    assert ns.compile(routes, endpoints={"smollm2": [A, C], "canary": [B]}) == {}  # scaled up
    assert ns.compile(routes, endpoints={}) == {}  # every replica gone: the route's readiness says so
    # Listing the same backends in another order moves the table's generation but routes nothing elsewhere.
    assert ns.compile({"chat": _route([("canary", 10), ("smollm2", 90)])}) == {}


def test_a_backend_whose_model_is_deleted_is_no_longer_routed_and_says_why_then_comes_back():
    ns = Namespace()
    routes = {"chat": _route([("smollm2", 90), ("canary", 10)])}
    ns.compile(routes)
    without = {name: spec for name, spec in MODELS.items() if name != "canary"}
    assert ns.compile(routes, models=without)["chat"].message == (
        "backend canary (weight 10) no longer routed: its InferenceModel (or adapter) is not found")
    assert ns.compile(routes)["chat"].message == "backend canary now routed (weight 10)"
    # Taken out of the spec, it is simply no longer routed.
    assert ns.compile({"chat": _route([("smollm2", 90)])})["chat"].message == (
        "backend canary (weight 10) no longer routed")


def test_a_route_leaving_the_table_says_what_it_routed():
    ns = Namespace()
    ns.compile({"chat": _route([("smollm2", 90), ("canary", 10)])})
    # An InferenceModel named like the public name takes it: the ModelRoute is out of the table.
    taken = {**MODELS, "chat": MODELS["smollm2"]}
    events = ns.compile({"chat": _route([("smollm2", 90), ("canary", 10)])}, models=taken)
    assert events == {"chat": Event("RoutesChanged",
                                    "no longer in the routing table (it routed smollm2=90, canary=10)")}


def test_a_route_refused_the_public_name_gets_no_event_when_the_one_serving_it_changes():
    ns = Namespace()
    ns.compile({"chat": _route([("smollm2", 1)]), "copy": _route([("other", 1)])})  # "copy": NameConflict
    assert ns.compile({"chat": _route([("smollm2", 1), ("canary", 1)]), "copy": _route([("other", 1)])}) == {
        "chat": Event("RoutesChanged", "backend canary now routed (weight 1)")}


def test_fallbacks_and_affinity_changed_by_the_operator_are_named():
    ns = Namespace()
    assert ns.compile({"chat": _route([("smollm2", 1)], fallbacks=["other"])})["chat"].message == (
        "now in the routing table: smollm2=1; fallbacks other")
    events = ns.compile({"chat": _route([("smollm2", 1)], affinity="none")})
    assert events["chat"].message == "fallbacks other → none; affinity prefix → none"


def test_an_adapter_loaded_or_unloaded_on_a_replica_is_an_event_naming_adapter_and_pod():
    before = {"pod-a": {"sql": ("Loaded", "")}, "pod-b": {"sql": ("Loaded", "")}}
    after = {"pod-a": {"tone": ("Loaded", "")}, "pod-b": {"sql": ("Loaded", ""), "tone": ("Loaded", "")}}
    assert adapter_events(before, after) == [
        Event("AdapterUnloaded", "adapter sql unloaded from pod-a"),
        Event("AdapterLoaded", "adapter tone loaded on pod-a"),
        Event("AdapterLoaded", "adapter tone loaded on pod-b"),
    ]
    assert adapter_events(after, after) == []


def test_replicas_coming_and_going_and_failed_loads_give_no_adapter_event():
    before = {"pod-a": {"sql": ("Loaded", "")}, "pod-gone": {"sql": ("Loaded", "")}}
    after = {"pod-a": {"sql": ("Loaded", ""), "big": ("Failed", "rank 64 is above --max-lora-rank 16")},
             "pod-new": {"sql": ("Loaded", "")}}
    assert adapter_events(before, after) == []  # the failure is the Warning AdapterLoadFailed
    assert adapter_events({}, after) == []  # the first sync since the operator started


class _Runtime(BaseHTTPRequestHandler):
    """A runtime holding adapters, which refuses to unload them while `refuse` is set."""

    held: set[str] = set()
    refuse = True

    def do_GET(self):
        cards = [{"id": "base"}] + [{"id": name, "parent": "base"} for name in sorted(self.held)]
        reply(self, 200, json.dumps({"data": cards}).encode())

    def do_POST(self):
        name = json.loads(self.rfile.read(int(self.headers["content-length"])))["lora_name"]
        if self.refuse:
            reply(self, 500, b'{"error": {"message": "the adapter is in use"}}')
            return
        self.held.discard(name)
        reply(self, 200, b"{}")

    def log_message(self, *args):
        pass


def test_an_adapter_whose_unload_the_runtime_refuses_is_reported_unloaded_only_once_it_is():
    _Runtime.held, _Runtime.refuse = {"sql"}, True
    server = LoopbackServer(_Runtime)

    def sync_once(wanted):
        async def run():
            async with aiohttp.ClientSession() as session:
                return {"pod-a": await _sync_pod(session, None, server.url, wanted)}
        return asyncio.run(run())

    try:
        declared = sync_once({"sql": "/adapters/sql"})
        refused = sync_once({})  # sql taken out of the spec; the runtime keeps it
        assert adapter_events(declared, refused) == []
        _Runtime.refuse = False
        assert adapter_events(refused, sync_once({})) == [Event("AdapterUnloaded", "adapter sql unloaded from pod-a")]
    finally:
        server.close()
