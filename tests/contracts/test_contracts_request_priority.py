"""What the gateway writes in the priority headers, the runtime reads back; nothing else gets through."""
import pytest

from sluice_contracts import request_priority as contract


@pytest.mark.parametrize("name", ["team-a", "équipe b", "a/b c%", "x" * 300])
def test_any_tenant_name_travels_as_one_plain_header_value(name):
    value = contract.tenant_value(name)
    assert contract.parse_tenant(value) == value
    assert value.isascii() and " " not in value


@pytest.mark.parametrize("share", [contract.MIN_SHARE, 0.5, 1, 2.5, contract.MAX_SHARE])
def test_every_share_the_gateway_allows_reads_back(share):
    assert contract.parse_share(contract.share_value(share)) == pytest.approx(share, rel=1e-3)


@pytest.mark.parametrize("value", ["", "1.", ".5", "1e2", "0x10", "−1", "1_0", "0.0000001"])
def test_shares_in_other_spellings_are_refused(value):
    with pytest.raises(contract.InvalidPriorityHeader, match=contract.SHARE_HEADER):
        contract.parse_share(value)


def test_the_default_classes_are_in_bounds_and_ordered():
    classes = contract.DEFAULT_CLASSES
    assert contract.DEFAULT_CLASS in classes
    assert classes["critical"] < classes["standard"] < classes["batch"]
    assert all(contract.MIN_PRIORITY <= v <= contract.MAX_PRIORITY for v in classes.values())
