"""gateway.yaml, the routing table document and API keys: defaults that work and errors that say what to fix."""
import hashlib
import json

import pytest

from sluice_contracts.routing_table import RoutingTableError
from sluice_gateway.auth import KeyStore
from sluice_gateway.config import ConfigError, GatewayConfig, load_config
from sluice_gateway.routing_table import load_routing_table, parse_routing_table

DIGEST = hashlib.sha256(b"sk-one").hexdigest()


def test_the_local_demo_config_is_valid_and_its_key_is_the_demo_key():
    config = load_config("config/gateway.local.yaml")
    assert config.listen.port == 8080
    principal = KeyStore(config).authenticate("Bearer sk-sluice-demo")
    assert principal is not None and principal.key_id == "demo-key"
    table = load_routing_table(config.routes_file)
    assert "smollm2" in table.public_names()


def test_an_empty_config_has_working_defaults(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("")
    config = load_config(path)
    assert config.listen.port == 8080 and config.redis is None and config.timeouts.connect_s > 0


@pytest.mark.parametrize("text, fragment", [
    ("tenants: [{name: a, keys: [{id: k, sha256: sk-plain-key}]}]", "64-character hex SHA-256"),
    ("timeouts: {connect_s: -1}", "timeouts.connect_s"),
    ("redis: {url: redis://x, on_failure: maybe}", "redis.on_failure"),
    ("listen: {prt: 80}", "listen.prt"),
    (f"tenants: [{{name: a, keys: [{{id: k, sha256: {DIGEST}}}]}}, {{name: b, keys: [{{id: l, sha256: {DIGEST}}}]}}]",
     "listed twice"),
    ("tenants: [: bad", "not valid YAML"),
    ("timeouts: {request_read_s: 0}", "timeouts.request_read_s"),
    ("timeouts: {keep_alive_s: .inf}", "timeouts.keep_alive_s"),
    ("timeouts: {total_s: .nan}", "timeouts.total_s"),
    ("timeouts: {request_read_s: 1e300}", "timeouts.request_read_s"),
    ("shutdown: {ready_grace_s: -1}", "shutdown.ready_grace_s"),
    ("shutdown: {drain_s: 0}", "shutdown.drain_s"),
    ("shutdown: {grace_s: 5}", "shutdown.grace_s"),
    ("max_response_bytes: 0", "max_response_bytes"),
    ("routing: {unhealthy_after_slow_polls: 0}", "routing.unhealthy_after_slow_polls"),
    ("routing: {unhealthy_after_slow_polls: '3'}", "routing.unhealthy_after_slow_polls"),
    ("routing: {unhealthy_after_slow_polls: 2.5}", "routing.unhealthy_after_slow_polls"),
    ("upstream_credential_file: [a]", "upstream_credential_file"),
    ("[]", "(top level)"),
    ("false", "(top level)"),
    ("metrics_port: 9091\nmetrics_port: 8080", "'metrics_port' appears twice"),
    ("batch: {database: a.sqlite3, database_file: /run/secret/url}", "set database or database_file, not both"),
    ("tenants: [{name: a, keys: [{id: k, sha256: %s, id: j}]}]" % DIGEST, "'id' appears twice"),
])
def test_invalid_configs_name_the_problem(tmp_path, text, fragment):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert fragment in str(err.value)


def test_drain_defaults_to_the_total_timeout_and_files_are_relative_to_the_config(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("timeouts: {total_s: 42}\nupstream_credential_file: secret/api-key\n")
    config = load_config(path)
    assert config.drain_s == 42 and config.shutdown.ready_grace_s == 5
    assert config.upstream_credential_file == tmp_path / "secret" / "api-key"
    path.write_text("shutdown: {drain_s: 7}\nupstream_credential_file: /var/run/sluice/runtime-credential/api-key\n")
    config = load_config(path)
    assert config.drain_s == 7 and str(config.upstream_credential_file).startswith("/var/run/sluice")
    path.write_text("batch: {database_file: secret/database-url}\n")
    assert load_config(path).batch.database_file == tmp_path / "secret" / "database-url"


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read gateway config"):
        load_config(tmp_path / "absent.yaml")


def test_keys_are_matched_by_digest_and_models_by_glob():
    config = GatewayConfig.model_validate({"tenants": [
        {"name": "t", "keys": [{"id": "k1", "sha256": DIGEST.upper()}], "models": ["chat-*", "embed"]},
    ]})
    store = KeyStore(config)
    principal = store.authenticate("Bearer sk-one")
    assert principal.tenant == "t" and principal.may_use("chat-small") and principal.may_use("embed")
    assert not principal.may_use("embed-2") and not principal.may_use("other")
    assert store.authenticate("Bearer sk-two") is None
    assert store.authenticate("Basic sk-one") is None
    assert store.authenticate("Bearer ") is None and store.authenticate(None) is None


ROUTES = {
    "version": 1, "generation": 7,
    "routes": {
        "chat": {"affinity": "prefix", "fallbacks": ["chat-small"], "backends": [
            {"name": "v1", "servedModelName": "smollm2", "weight": 90, "endpoints": ["http://10.0.0.1:8000/"],
             "capabilities": {"maxModelLen": 8192, "tools": True, "jsonSchema": True, "vision": False}},
            {"name": "v2", "servedModelName": "smollm2", "weight": 10, "endpoints": []},
        ]},
        "chat-small": {"backends": [{"name": "small", "servedModelName": "smollm2"}]},
    },
}


def test_routing_table_round_trips_in_the_documented_wire_format():
    table = parse_routing_table(json.dumps(ROUTES))
    wire = json.loads(table.to_json())
    assert wire["routes"]["chat"]["backends"][0]["servedModelName"] == "smollm2"
    assert wire["routes"]["chat"]["backends"][0]["capabilities"]["maxModelLen"] == 8192
    assert wire["routes"]["chat"]["backends"][0]["endpoints"] == ["http://10.0.0.1:8000"]
    assert parse_routing_table(table.to_json()) == table


def test_every_backend_is_also_an_implicit_route():
    table = parse_routing_table(json.dumps(ROUTES))
    assert table.public_names() == ["chat", "chat-small", "small", "v1", "v2"]
    implicit = table.route("v2")
    assert [b.name for b in implicit.backends] == ["v2"] and implicit.fallbacks == ()
    assert table.route("unknown") is None


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t.update(version=2), "version"),
    (lambda t: t["routes"]["chat"].update(fallbacks=["missing"]), "unknown route 'missing'"),
    (lambda t: t["routes"]["chat"].update(fallbacks=["chat"]), "lists itself"),
    (lambda t: t["routes"]["chat"].update(affinity="sticky"), "affinity"),
    (lambda t: t["routes"]["chat"]["backends"][0].update(endpoints=["10.0.0.1:8000"]), "http://HOST:PORT"),
    (lambda t: t["routes"]["chat"]["backends"][0].update(weight=-1), "weight"),
    (lambda t: [b.update(weight=0) for b in t["routes"]["chat"]["backends"]], "weight above 0"),
    (lambda t: t["routes"]["chat"]["backends"][1].update(name="v1"), "unique"),
    (lambda t: t["routes"]["chat"].update(backends=[]), "backends"),
])
def test_invalid_routing_tables_say_where_and_why(mutate, fragment):
    document = json.loads(json.dumps(ROUTES))
    mutate(document)
    with pytest.raises(RoutingTableError) as err:
        parse_routing_table(json.dumps(document))
    assert fragment in str(err.value)


def test_routing_table_that_is_not_a_mapping_is_rejected():
    with pytest.raises(RoutingTableError, match="mapping"):
        parse_routing_table("[1, 2]")
    with pytest.raises(RoutingTableError, match="neither JSON nor YAML"):
        parse_routing_table("{ broken: [")
