"""InferenceModel adapters in the routing table: each a public name of its own, served only by the endpoints
that have it loaded, and ModelRoute canaries between two adapters of one model."""
from sluice_contracts.routing_table import parse_routing_table
from sluice_operator.crd import InferenceModelSpec, ModelRouteSpec
from sluice_operator.route_compiler import backends_column, compile_routes

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def _model(adapters=(), **fields):
    return InferenceModelSpec.model_validate({
        "model": {"source": "smollm2"}, "adapters": [{"name": n, "source": f"file:///adapters/{n}"} for n in adapters],
        **fields})


def _route(model, backends):
    return ModelRouteSpec.model_validate({"model": model, "backends": backends})


def test_each_adapter_is_a_route_served_where_it_is_loaded():
    models = {"base": _model(["sql-v1", "tone"])}
    loaded = {"base": {A: frozenset({"sql-v1", "tone"}), B: frozenset({"tone"})}}
    table = compile_routes(models, {}, {"base": [A, B]}, loaded=loaded).table
    (sql,) = table.route("sql-v1").backends
    assert (sql.name, sql.adapter, sql.served_model_name, sql.endpoints) == ("base", "sql-v1", "sql-v1", (A,))
    assert table.route("tone").backends[0].endpoints == (A, B)
    (base,) = table.route("base").backends
    assert base.adapter is None and base.served_model_name == "base" and base.endpoints == (A, B)
    # The document the gateway reads says the same.
    assert parse_routing_table(table.to_json()).route("sql-v1").backends[0].adapter == "sql-v1"


def test_an_adapter_loaded_nowhere_is_listed_without_endpoints_and_loading_it_moves_the_generation():
    models = {"base": _model(["sql-v1"])}
    first = compile_routes(models, {}, {"base": [A]}, loaded={}).table
    assert first.route("sql-v1").backends[0].endpoints == ()
    second = compile_routes(models, {}, {"base": [A]}, first, loaded={"base": {A: frozenset({"sql-v1"})}}).table
    assert second.generation == first.generation + 1
    assert second.route("sql-v1").backends[0].endpoints == (A,)


def test_a_pod_reporting_an_undeclared_adapter_does_not_publish_it():
    models = {"base": _model(["sql-v1"])}
    table = compile_routes(models, {}, {"base": [A]}, loaded={"base": {A: frozenset({"sql-v1", "leftover"})}}).table
    assert table.route("leftover") is None


def test_an_adapter_name_taken_by_a_model_or_another_models_adapter_is_not_routed_and_says_why():
    models = {"base": _model(["other", "shared"]), "other": _model(), "second": _model(["shared"])}
    loaded = {"base": {A: frozenset({"other", "shared"})}, "second": {B: frozenset({"shared"})}}
    compiled = compile_routes(models, {}, {"base": [A], "other": [B], "second": [B]}, loaded=loaded)
    assert compiled.table.route("other").backends[0].adapter is None  # the model keeps its name
    assert compiled.table.route("shared").backends[0].name == "base"  # first model by name
    assert "already an InferenceModel's" in compiled.adapter_conflicts[("base", "other")]
    assert "adapter of InferenceModel 'base'" in compiled.adapter_conflicts[("second", "shared")]


def test_a_model_route_canary_between_two_adapter_versions():
    models = {"base": _model(["sql-v1", "sql-v2"])}
    loaded = {"base": {A: frozenset({"sql-v1", "sql-v2"}), B: frozenset({"sql-v1"})}}
    route = _route("sql", [{"inferenceModel": "base", "adapter": "sql-v1", "weight": 90},
                           {"inferenceModel": "base", "adapter": "sql-v2", "weight": 10}])
    compiled = compile_routes(models, {"sql": route}, {"base": [A, B]}, loaded=loaded)
    v1, v2 = compiled.table.route("sql").backends
    assert (v1.served_model_name, v1.weight, v1.endpoints) == ("sql-v1", 90, (A, B))
    assert (v2.served_model_name, v2.weight, v2.endpoints) == ("sql-v2", 10, (A,))
    assert compiled.verdicts["sql"].ready
    assert backends_column(route.wire()) == "base/sql-v1=90,base/sql-v2=10"


def test_a_route_naming_an_undeclared_adapter_says_which():
    models = {"base": _model(["sql-v1"])}
    route = _route("sql", [{"inferenceModel": "base", "adapter": "sql-v1", "weight": 90},
                           {"inferenceModel": "base", "adapter": "sql-v9", "weight": 10}])
    verdict = compile_routes(models, {"sql": route}, {"base": [A]},
                             loaded={"base": {A: frozenset({"sql-v1"})}}).verdicts["sql"]
    assert not verdict.ready and verdict.reason == "BackendsMissing" and "base/sql-v9" in verdict.message
