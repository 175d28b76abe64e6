"""A launched pod's volumes: written under a directory of its own, mount paths rewritten (no cluster needed)."""
import json
import os
import sys
from pathlib import Path

import pytest

from localcluster import podspec
from localcluster.podspec import ContainerConfigError, Mount
from localcluster.volumes import SERVICE_ACCOUNT_DIR, PodVolumes, service_account_kubeconfig

POD = {
    "metadata": {"name": "gw-1", "namespace": "prod", "uid": "0123456789abcdef"},
    "spec": {
        "nodeName": "kwok-node-0",
        "serviceAccountName": "gateway",
        "volumes": [
            {"name": "config", "secret": {"secretName": "gw", "items": [{"key": "gateway.yaml", "path": "gateway.yaml"}]}},
            {"name": "routes", "configMap": {"name": "table", "optional": True}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]}},
        ],
    },
    "status": {"podIP": "127.1.0.9"},
}
CONTAINER = {
    "name": "gateway",
    "command": ["python"],
    "args": ["--config=/etc/gw/gateway.yaml", "--routes", "/etc/routes/table.json", "--other=/etc/gwx"],
    "env": [{"name": "CACHE", "value": "/tmp/cache"}, {"name": "SEARCH", "value": "/opt:/tmp/bin"}],
    "volumeMounts": [
        {"name": "config", "mountPath": "/etc/gw"},
        {"name": "routes", "mountPath": "/etc/routes/"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR},
    ],
}


class Objects:
    def __init__(self):
        self.data = {
            ("Secret", "prod", "gw"): {"gateway.yaml": "listen: {port: 8080}\n", "unused": "x"},
            ("ConfigMap", "prod", "table"): {"table.json": '{"generation": 1}'},
            ("ConfigMap", "prod", "kube-root-ca.crt"): {"ca.crt": "CA"},
        }
        self.tokens = []

    def read(self, kind, namespace, name):
        return self.data.get((kind, namespace, name))

    def issue(self, namespace, account, pod, uid, audience, seconds):
        self.tokens.append((namespace, account, pod, uid, audience, seconds))
        return f"token-{len(self.tokens)}"


@pytest.fixture
def volumes(tmp_path):
    objects = Objects()
    return PodVolumes(tmp_path / "pod", POD, objects.read, objects.issue), objects


def test_mount_paths_in_args_and_env_become_local_directories(volumes, tmp_path):
    vols, objects = volumes
    vols.setup()
    mounts = vols.mounts(CONTAINER)
    spec = podspec.process_spec(POD, CONTAINER, objects.read, Path(sys.executable).parent,
                                {"PATH": "/usr/bin", "KUBECONFIG": "/admin"}, mounts=mounts)
    root = tmp_path / "pod"
    assert spec.argv[1:] == [f"--config={root}/config/gateway.yaml", "--routes", f"{root}/routes/table.json",
                             "--other=/etc/gwx"]
    assert spec.env["CACHE"] == f"{root}/tmp/cache" and spec.env["SEARCH"] == f"/opt:{root}/tmp/bin"
    assert "KUBECONFIG" not in spec.env, "a pod must never run with the launcher's admin credentials"
    assert (root / "config" / "gateway.yaml").read_text() == "listen: {port: 8080}\n"
    assert not (root / "config" / "unused").exists()
    assert (root / "tmp").is_dir()


def test_the_service_account_mount_becomes_the_pods_kubeconfig(volumes, tmp_path):
    vols, objects = volumes
    vols.setup()
    local = tmp_path / "pod" / "kube-api-access"
    assert objects.tokens == [("prod", "gateway", "gw-1", "0123456789abcdef", None, 3607)]
    assert (local / "token").read_text() == "token-1" and (local / "ca.crt").read_text() == "CA"
    assert (local / "namespace").read_text() == "prod"
    path = service_account_kubeconfig(vols.mounts(CONTAINER), {"server": "https://127.0.0.1:6443"}, "prod",
                                      tmp_path / "kubeconfig")
    config = json.loads(Path(path).read_text())
    assert config["users"][0]["user"] == {"tokenFile": str(local / "token")}
    assert config["clusters"][0]["cluster"] == {"server": "https://127.0.0.1:6443"}
    spec = podspec.process_spec(POD, CONTAINER, objects.read, Path(sys.executable).parent, {"PATH": ""},
                                mounts=vols.mounts(CONTAINER), kubeconfig=path)
    assert spec.env["KUBECONFIG"] == path


def test_a_changed_config_map_is_swapped_in_atomically_and_a_deleted_optional_one_empties(volumes, tmp_path):
    vols, objects = volumes
    vols.setup()
    table = tmp_path / "pod" / "routes" / "table.json"
    before = os.stat(table)
    vols.refresh()
    assert os.stat(table).st_ino == before.st_ino, "an unchanged object is not rewritten"
    objects.data[("ConfigMap", "prod", "table")] = {"table.json": '{"generation": 2}'}
    vols.refresh()
    assert table.read_text() == '{"generation": 2}' and os.stat(table).st_ino != before.st_ino
    assert table.is_symlink() and os.readlink(table) == "..data/table.json"
    assert len([p for p in table.parent.iterdir() if p.name.startswith("..20")]) == 1, "old payloads are removed"
    del objects.data[("ConfigMap", "prod", "table")]
    vols.refresh()
    assert not table.exists()
    assert len(objects.tokens) == 1, "a refresh does not ask for new tokens"


def test_a_missing_required_object_or_unsupported_volume_is_a_config_error(tmp_path):
    pod = {**POD, "spec": {**POD["spec"], "volumes": [{"name": "config", "secret": {"secretName": "absent"}}]}}
    with pytest.raises(ContainerConfigError, match="Secret prod/absent not found"):
        PodVolumes(tmp_path, pod, lambda *_: None, None).setup()
    pod = {**POD, "spec": {**POD["spec"], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "x"}}]}}
    with pytest.raises(ContainerConfigError, match="persistentVolumeClaim volumes are not supported"):
        PodVolumes(tmp_path, pod, lambda *_: None, None).setup()
    with pytest.raises(ContainerConfigError, match="names no volume 'nope'"):
        PodVolumes(tmp_path, pod, lambda *_: None, None).mounts({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]})


def test_remap_only_touches_whole_path_components():
    mounts = [Mount("/cache", Path("/local/c")), Mount("/cache/hf", Path("/local/hf"))]
    assert podspec.remap("/cache", mounts) == "/local/c"
    assert podspec.remap("/cache/hf/x", mounts) == "/local/hf/x"
    assert podspec.remap("/cachex", mounts) == "/cachex"
    assert podspec.remap("a/cache", mounts) == "a/cache"
    assert podspec.remap("--dir=/cache/models", mounts) == "--dir=/local/c/models"


def test_mount_paths_inside_config_files_become_local_directories(tmp_path):
    """The gateway's config names the credential file at its mount path; a process must find it locally."""
    pod = {**POD, "spec": {**POD["spec"], "containers": [CONTAINER]}}
    objects = Objects()
    objects.data[("Secret", "prod", "gw")] = {"gateway.yaml": (
        "upstream_credential_file: /etc/routes/key\nquoted: '/tmp/x'\nflag: --dir=/tmp\n"
        "url: http://host/tmp/x\nother: /etc/gwx\nnested: a/tmp/b\n")}
    objects.data[("ConfigMap", "prod", "table")] = {"table.json": '{"path": "/tmp/y"}'}
    vols = PodVolumes(tmp_path / "pod", pod, objects.read, objects.issue)
    vols.setup()
    root = tmp_path / "pod"
    assert (root / "config" / "gateway.yaml").read_text() == (
        f"upstream_credential_file: {root}/routes/key\nquoted: '{root}/tmp/x'\nflag: --dir={root}/tmp\n"
        "url: http://host/tmp/x\nother: /etc/gwx\nnested: a/tmp/b\n")
    assert (root / "routes" / "table.json").read_text() == f'{{"path": "{root}/tmp/y"}}'
    assert podspec.remap_contents(b"\xff/tmp", vols.mounts(CONTAINER)) == b"\xff/tmp", "not text: left alone"
