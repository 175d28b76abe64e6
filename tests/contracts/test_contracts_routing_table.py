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
