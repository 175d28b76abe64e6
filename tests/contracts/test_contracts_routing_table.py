"""The routing table is a contract: the operator writes it and the gateway reads it, and neither imports the other."""
import subprocess
import sys

import pytest

from sluice_contracts.routing_table import RoutingTableError, parse_routing_table

# Every module of the operator, the whole package imported as its CLI and handlers would.
_IMPORT_ALL = """
import importlib, pkgutil, sys
import sluice_operator
for module in pkgutil.walk_packages(sluice_operator.__path__, "sluice_operator."):
    importlib.import_module(module.name)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("sluice_gateway", "sluice_runtime")))
"""


def test_the_operator_imports_neither_the_gateway_nor_the_runtime():
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_contract_reads_the_wire_format_only():
    table = parse_routing_table('{"version": 1, "generation": 3, "routes": {"chat": {"backends": '
                                '[{"name": "v1", "servedModelName": "smollm2", "endpoints": ["http://10.0.0.1:8000/"]}]}}}')
    assert table.route("v1").backends[0].endpoints == ("http://10.0.0.1:8000",)
    for text, message in [("routes: {}", "not JSON"), ("[]", "mapping"), ('{"version": 2}', "version")]:
        with pytest.raises(RoutingTableError, match=message):
            parse_routing_table(text)


def _adapter_table(backends: list[dict]) -> str:
    import json
    return json.dumps({"version": 1, "generation": 1, "routes": {"sql": {"backends": backends}}})


def test_two_adapters_of_one_model_are_two_backends_each_reachable_by_its_own_name():
    table = parse_routing_table(_adapter_table([
        {"name": "base", "adapter": "sql-v1", "servedModelName": "sql-v1", "weight": 90,
         "endpoints": ["http://10.0.0.1:8000"]},
        {"name": "base", "adapter": "sql-v2", "servedModelName": "sql-v2", "weight": 10,
         "endpoints": ["http://10.0.0.2:8000"]},
        {"name": "base", "servedModelName": "base", "weight": 0, "endpoints": ["http://10.0.0.1:8000"]},
    ]))
    assert table.route("sql-v2").backends[0].endpoints == ("http://10.0.0.2:8000",)
    assert table.route("sql-v2").backends[0].adapter == "sql-v2"
    # The model's own name is the base model, never one of its adapters.
    assert table.route("base").backends[0].adapter is None
    assert table.public_names() == ["base", "sql", "sql-v1", "sql-v2"]


def test_one_adapter_twice_in_a_route_and_an_empty_adapter_name_are_refused():
    twice = {"name": "base", "adapter": "sql-v1", "servedModelName": "sql-v1"}
    with pytest.raises(RoutingTableError, match="unique"):
        parse_routing_table(_adapter_table([twice, dict(twice)]))
    with pytest.raises(RoutingTableError, match="adapter"):
        parse_routing_table(_adapter_table([{"name": "base", "adapter": "", "servedModelName": "x"}]))
