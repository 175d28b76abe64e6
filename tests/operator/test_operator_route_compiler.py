"""ModelRoutes + InferenceModels + ready runtime pods → the gateway's routing table."""
from sluice_contracts.routing_table import parse_routing_table
from sluice_operator.crd import InferenceModelSpec, ModelRouteSpec
from sluice_operator.pods import ready_endpoints
from sluice_operator.route_compiler import compile_routes


def _model(**fields):
    return InferenceModelSpec.model_validate({"model": {"source": "smollm2"}, **fields})


def _route(model, backends, **fields):
    return ModelRouteSpec.model_validate({"model": model, "backends": backends, **fields})


def _pod(model, ip, name, ready=True, deleting=False, draining=False):
    meta = {"name": name, "labels": {"sluice.dev/inference-model": model}, "annotations": {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if draining:
        meta["annotations"]["sluice.dev/draining"] = "true"
    return {"metadata": meta, "status": {"podIP": ip, "podIPs": [{"ip": ip}] if ip else [],
                                         "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_only_ready_pods_that_are_not_leaving_are_published():
    pods = [
        _pod("v1", "10.0.0.2", "v1-a"), _pod("v1", "10.0.0.1", "v1-b"), _pod("v1", "10.0.0.3", "v1-c", ready=False),
        _pod("v1", "10.0.0.4", "v1-d", deleting=True), _pod("v1", "fd00::5", "v1-e"),
        _pod("v2", "10.0.1.1", "v2-a"), _pod("v2", "10.0.1.2", "v2-b", draining=True), _pod("v2", None, "v2-c"),
        _pod("v3", "10.0.2.1", "v3-a", ready=False),
        {"metadata": {"name": "stranger", "labels": {}}, "status": {"podIP": "10.9.9.9"}},
    ]
    assert ready_endpoints(pods) == {
        "v1": ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::5]:8000"],
        "v2": ["http://10.0.1.1:8000"],
        "v3": [],
    }


def test_routes_carry_weights_capabilities_and_fallbacks():
    models = {"v1": _model(servedModelName="smol", runtime={"maxModelLen": 4096}),
              "v2": _model(capabilities={"tools": False, "tasks": ["embedding", "rerank"]})}
    routes = {"chat": _route("chat", [{"inferenceModel": "v1", "weight": 90}, {"inferenceModel": "v2", "weight": 10}],
                             fallbacks=["small"], affinity="session"),
              "small": _route("small", [{"inferenceModel": "v2"}])}
    compiled = compile_routes(models, routes, {"v1": ["http://10.0.0.1:8000"]})
    table = parse_routing_table(compiled.table.to_json())
    chat = table.route("chat")
    assert chat.affinity == "session" and chat.fallbacks == ("small",)
    assert [(b.name, b.weight, b.served_model_name) for b in chat.backends] == [("v1", 90, "smol"), ("v2", 10, "v2")]
    assert chat.backends[0].endpoints == ("http://10.0.0.1:8000",)
    assert chat.backends[0].capabilities.max_model_len == 4096 and not chat.backends[1].capabilities.tools
    assert chat.backends[0].capabilities.tasks == ("chat", "completion", "embedding", "rerank"), "the default"
    assert chat.backends[1].capabilities.tasks == ("embedding", "rerank")
    assert table.route("v2").backends[0].name == "v2", "each InferenceModel is routable under its own name"
    assert compiled.verdicts["chat"].ready and compiled.verdicts["chat"].endpoints == 1
    assert not compiled.verdicts["small"].ready and compiled.verdicts["small"].reason == "NoReadyEndpoints"


def test_a_missing_model_is_named_and_the_rest_still_routes():
    compiled = compile_routes({"v1": _model()}, {"chat": _route("chat", [{"inferenceModel": "v1"},
                                                                          {"inferenceModel": "ghost"}])},
                              {"v1": ["http://10.0.0.1:8000"]})
    verdict = compiled.verdicts["chat"]
    assert not verdict.ready and verdict.reason == "BackendsMissing" and "ghost" in verdict.message
    assert [b.name for b in compiled.table.routes["chat"].backends] == ["v1"]


def test_a_route_with_no_existing_backend_is_left_out():
    compiled = compile_routes({}, {"chat": _route("chat", [{"inferenceModel": "ghost"}])}, {})
    assert "chat" not in compiled.table.routes
    assert "ghost" in compiled.verdicts["chat"].message


def test_unknown_fallbacks_are_dropped_and_reported():
    compiled = compile_routes({"v1": _model()}, {"chat": _route("chat", [{"inferenceModel": "v1"}],
                                                                fallbacks=["v1", "nowhere"])}, {})
    assert compiled.table.routes["chat"].fallbacks == ("v1",)
    assert compiled.verdicts["chat"].reason == "FallbackMissing" and "nowhere" in compiled.verdicts["chat"].message


def test_two_routes_cannot_claim_one_public_name():
    models = {"v1": _model()}
    compiled = compile_routes(models, {"a": _route("chat", [{"inferenceModel": "v1"}]),
                                       "b": _route("chat", [{"inferenceModel": "v1"}])}, {})
    assert compiled.verdicts["b"].reason == "NameConflict" and "'a'" in compiled.verdicts["b"].message


def test_generation_moves_only_when_the_routes_change():
    models = {"v1": _model()}
    first = compile_routes(models, {}, {"v1": ["http://10.0.0.1:8000"]}).table
    assert first.generation == 1
    same = compile_routes(models, {}, {"v1": ["http://10.0.0.1:8000"]}, previous=first).table
    assert same.generation == 1 and same.to_json() == first.to_json()
    moved = compile_routes(models, {}, {"v1": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]}, previous=same).table
    assert moved.generation == 2


def test_backends_column_lists_each_backend_with_its_weight():
    from sluice_operator.route_compiler import backends_column

    spec = {"model": "chat", "backends": [{"inferenceModel": "smollm2", "weight": 90},
                                          {"inferenceModel": "smollm2-canary", "weight": 10},
                                          {"inferenceModel": "reserve"}]}
    assert backends_column(spec) == "smollm2=90,smollm2-canary=10,reserve=1"
    # Whatever an older or broken object holds, the column is text and never an error.
    for odd in ({}, {"backends": None}, {"backends": "x"}, {"backends": [None, 3]}, None):
        assert backends_column(odd) == ""


def test_routes_carry_each_backends_engine():
    models = {"a": _model(runtime={"engine": "vllm"}), "b": _model(runtime={"engine": "sglang"}), "c": _model()}
    table = compile_routes(models, {}, {}).table
    assert [table.route(n).backends[0].engine for n in "abc"] == ["vllm", "sglang", "sluice"]


def test_a_route_cannot_take_a_models_or_an_adapters_own_name():
    models = {"v1": _model(), "v2": _model(adapters=[{"name": "sql", "source": "file:///adapters/sql"}])}
    endpoints = {"v1": ["http://10.0.0.1:8000"], "v2": ["http://10.0.0.2:8000"]}
    routes = {"steal-model": _route("v1", [{"inferenceModel": "v2"}]),
              "steal-adapter": _route("sql", [{"inferenceModel": "v1"}]),
              "fine": _route("chat", [{"inferenceModel": "v2"}], fallbacks=["v1"])}
    compiled = compile_routes(models, routes, endpoints, loaded={"v2": {"http://10.0.0.2:8000": frozenset({"sql"})}})
    table = parse_routing_table(compiled.table.to_json())
    # Each name keeps its own route: the model's, the adapter's.
    assert [b.name for b in table.route("v1").backends] == ["v1"]
    assert [(b.name, b.adapter) for b in table.route("sql").backends] == [("v2", "sql")]
    model, adapter = compiled.verdicts["steal-model"], compiled.verdicts["steal-adapter"]
    assert not model.ready and model.reason == "NameConflict" and "InferenceModel 'v1'" in model.message
    assert not adapter.ready and adapter.reason == "NameConflict" and "adapter 'sql' of InferenceModel 'v2'" in adapter.message
    # A route of its own name may still fall back to a model's.
    assert compiled.verdicts["fine"].ready and table.route("chat").fallbacks == ("v1",)


def test_each_backend_names_its_models_weights_and_generation():
    models = {"stable": _model(model={"source": "hf:org/smol", "revision": "abc123"}),
              "canary": _model(model={"source": "hf:org/smol", "revision": "def456"})}
    routes = {"chat": _route("chat", [{"inferenceModel": "stable", "weight": 90},
                                      {"inferenceModel": "canary", "weight": 10}])}
    first = compile_routes(models, routes, {}, generations={"stable": 3, "canary": 1}).table
    chat = parse_routing_table(first.to_json()).route("chat")
    assert [b.version for b in chat.backends] == ["hf:org/smol@abc123+g3", "hf:org/smol@def456+g1"]
    assert first.route("stable").backends[0].version == chat.backends[0].version
    # An edit of the canary (its generation moves) is a new version, and a new table for the gateway.
    edited = compile_routes(models, routes, {}, previous=first, generations={"stable": 3, "canary": 2}).table
    assert edited.route("chat").backends[1].version == "hf:org/smol@def456+g2"
    assert edited.route("chat").backends[0].version == chat.backends[0].version
    assert edited.generation == first.generation + 1
