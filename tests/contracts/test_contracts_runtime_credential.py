"""The runtime credential accepts exactly one presentation of the key."""
import pytest

from sluice_contracts.runtime_credential import (
    CredentialFileError,
    RotatedCredential,
    header_value,
    presented_matches,
    read_credential_file,
    secret_name,
)


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


@pytest.mark.parametrize("content,expected", [(b"s3cret\n", "s3cret"), (b"  s3cret \r\n", "s3cret")])
def test_a_mounted_secret_file_is_read_without_its_newline(tmp_path, content, expected):
    path = tmp_path / "api-key"
    path.write_bytes(content)
    assert read_credential_file(path) == expected


@pytest.mark.parametrize("content", [b"", b" \n\t", b"two words", b"line\nbreak", b"caf\xc3\xa9", b"x" * 5000])
def test_a_file_that_cannot_go_into_a_header_is_refused(tmp_path, content):
    path = tmp_path / "api-key"
    path.write_bytes(content)
    with pytest.raises(CredentialFileError, match=str(path)):
        read_credential_file(path, "api key file")


def test_a_missing_file_is_refused_by_name(tmp_path):
    with pytest.raises(CredentialFileError, match="cannot read the api key file"):
        read_credential_file(tmp_path / "absent", "api key file")


def test_a_rotation_keeps_the_replaced_credential_for_its_grace_only():
    credentials = RotatedCredential("old-key", grace_s=60)
    assert credentials.replaced is None
    assert credentials.rotate("old-key") is False and credentials.replaced is None
    assert credentials.rotate("new-key") is True
    assert (credentials.current, credentials.replaced) == ("new-key", "old-key")
    ended = RotatedCredential("old-key", grace_s=0)
    ended.rotate("new-key")
    assert (ended.current, ended.replaced) == ("new-key", None)
