"""The runtime credential accepts exactly one presentation of the key."""
import pytest

from sluice_contracts.runtime_credential import header_value, presented_matches, secret_name


def test_the_gateways_header_matches():
    assert presented_matches(header_value("s3cret"), "s3cret")


@pytest.mark.parametrize("presented", [
    None, "", "s3cret", "Bearer s3cre", "Bearer s3cret ", "bearer s3cret", "Bearer  s3cret", "Bearer s3cretX",
    "Bearer s3cret, Bearer s3cret", "Basic s3cret",
])
def test_anything_else_is_refused(presented):
    assert not presented_matches(presented, "s3cret")


def test_non_ascii_presentations_are_refused_not_raised():
    assert not presented_matches("Bearer s\u00e9cret\ud800", "s3cret")


def test_one_secret_per_release():
    assert secret_name("prod") == "prod-runtime-credential" != secret_name("staging")
