"""How the launcher turns a pod's container spec into a local process (no cluster needed)."""
import sys
from pathlib import Path

import pytest

from localcluster import podspec

POD = {
    "metadata": {"name": "web-1", "namespace": "prod", "uid": "u-1", "labels": {"app": "web"}},
    "spec": {"nodeName": "kwok-node-0"},
    "status": {"podIP": "127.1.0.7", "hostIP": "10.0.0.1"},
}


def _read(objects):
    return lambda kind, namespace, name: objects.get((kind, namespace, name))


def test_expansion_follows_kubernetes_rules():
    variables = {"A": "1", "B": "two"}
    assert podspec.expand("$(A)-$(B)", variables) == "1-two"
    assert podspec.expand("$(MISSING) stays", variables) == "$(MISSING) stays"
    assert podspec.expand("$$(A) is escaped", variables) == "$(A) is escaped"


def test_env_resolves_field_refs_config_maps_secrets_and_earlier_variables():
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "OPTIONAL", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "x", "optional": True}}},
        ],
    }
    objects = {("ConfigMap", "prod", "settings"): {"mode": "fast"}, ("Secret", "prod", "creds"): {"token": "s3cret"}}
    env = podspec.container_env(POD, container, _read(objects))
    assert env == {"CFG_mode": "fast", "POD_IP": "127.1.0.7", "APP": "web", "URL": "http://127.1.0.7:8000", "TOKEN": "s3cret"}


def test_a_missing_required_key_is_a_config_error():
    container = {"name": "main", "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}}]}
    with pytest.raises(podspec.ContainerConfigError, match="Secret prod/creds has no key 'nope'"):
        podspec.container_env(POD, container, _read({("Secret", "prod", "creds"): {}}))


def test_bare_command_names_resolve_in_the_venv_first_and_args_expand(tmp_path):
    container = {"name": "main", "command": ["python"], "args": ["-m", "http.server", "--bind", "$(POD_IP)"],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}
    venv_bin = Path(sys.executable).parent
    spec = podspec.process_spec(POD, container, _read({}), venv_bin, {"PATH": "/usr/bin"})
    assert spec.argv == [str(venv_bin / "python"), "-m", "http.server", "--bind", "127.1.0.7"]
    assert spec.env["PATH"].startswith(f"{venv_bin}:")
    assert spec.env["HOSTNAME"] == "web-1" and spec.env["POD_IP"] == "127.1.0.7"


def test_a_container_without_command_cannot_be_launched():
    with pytest.raises(podspec.ContainerConfigError, match="has no command"):
        podspec.process_spec(POD, {"name": "main", "image": "x"}, _read({}), Path(sys.executable).parent, {})
