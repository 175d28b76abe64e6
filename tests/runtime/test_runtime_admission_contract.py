"""The budget contract (sluice_contracts.request_deadline) as the runtime reads it and the gateway will write it."""
from __future__ import annotations

import math

import pytest

from sluice_contracts import request_deadline as contract
from sluice_contracts.request_priority import DEFAULT_CLASSES


@pytest.mark.parametrize("text, seconds", [("600.0", 600.0), ("1e-05", 1e-05), ("0.5", 0.5), ("86400", 86400.0),
                                           (" 30 ", 30.0)])
def test_seconds_as_clients_print_them_are_read(text, seconds):
    assert contract.parse_seconds("timeout", [text]) == seconds


@pytest.mark.parametrize("values", [["0"], ["-1"], ["nan"], ["inf"], ["1e400"], ["86400.001"], ["10" * 20], ["soon"],
                                    [""], ["0x10"], ["1,5"], ["+5"], ["5", "5"], []])
def test_anything_else_is_refused_naming_the_header(values):
    with pytest.raises(contract.InvalidBudget, match="the x-request-timeout header"):
        contract.parse_seconds("x-request-timeout", values)


@pytest.mark.parametrize("seconds", [0, -3, 1e-9, 1e12, 12.3456])
def test_what_the_gateway_writes_the_runtime_reads_within_bounds(seconds):
    read = contract.parse_seconds(contract.BUDGET_HEADER, [contract.header_value(seconds)])
    assert 0 < read <= contract.MAX_BUDGET_S
    assert math.isclose(read, min(max(seconds, 0.001), contract.MAX_BUDGET_S), abs_tol=0.0005)


def test_critical_is_short_batch_long_and_standard_has_none():
    assert contract.class_budget(DEFAULT_CLASSES["critical"]) < contract.class_budget(DEFAULT_CLASSES["batch"])
    assert contract.class_budget(DEFAULT_CLASSES["critical"] - 5) == contract.CLASS_BUDGET_S["critical"]
    assert contract.class_budget(DEFAULT_CLASSES["batch"] + 5) == contract.CLASS_BUDGET_S["batch"]
    assert contract.class_budget(DEFAULT_CLASSES["standard"]) is None
