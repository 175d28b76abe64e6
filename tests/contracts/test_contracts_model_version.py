"""The model version the operator writes, the runtime is given and the gateway passes on, and its fingerprint."""
import pytest

from sluice_contracts import model_version as contract
from sluice_contracts.routing_table import RoutingTableError, routing_table_from


def test_one_version_one_fingerprint_and_each_generation_its_own():
    weights = contract.weights_version("hf:HuggingFaceTB/SmolLM2-135M-Instruct", "a1b2c3")
    assert weights == "hf:HuggingFaceTB/SmolLM2-135M-Instruct@a1b2c3"
    first, second = contract.model_version(weights, 1), contract.model_version(weights, 2)
    assert contract.fingerprint(first) == contract.fingerprint(first).lower() != contract.fingerprint(second)
    assert contract.fingerprint(first).startswith("fp_") and contract.check(first) == first


def test_weights_in_any_spelling_make_a_version_a_header_can_hold():
    weights = contract.weights_version("pvc://models/Llama 3 (café)/", None)
    assert contract.check(weights) == "pvc://models/Llama_3_(caf_)/"


@pytest.mark.parametrize("version", ["", "two words", "tab\there", "é", "x" * 1025])
def test_a_version_a_header_cannot_hold_is_refused_in_the_routing_table(version):
    with pytest.raises(ValueError, match="1 to 1024 printable ASCII"):
        contract.check(version)
    backend = {"name": "m", "servedModelName": "m", "endpoints": [], "version": version}
    with pytest.raises(RoutingTableError, match="version"):
        routing_table_from({"version": 1, "routes": {"m": {"backends": [backend]}}})
