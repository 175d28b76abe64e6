"""Running helm on the chart: the binary the local control plane's build puts beside kubectl."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "sluice"
FULL_VALUES = CHART / "ci" / "full-values.yaml"

if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


def helm_binary(request: pytest.FixtureRequest) -> Path:
    """helm from the cluster cache; builds the cluster's binaries (through `kube_cluster`) when it is missing."""
    from localcluster.cluster import LocalCluster

    helm = LocalCluster().bin_dir / "helm"
    if not helm.is_file():
        helm = request.getfixturevalue("kube_cluster").bin_dir / "helm"
    return helm


class Helm:
    def __init__(self, binary: Path):
        self.binary = binary

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def template_text(self, *args: str, namespace: str = "sluice") -> str:
        return self.run("template", "sluice", str(CHART), "--namespace", namespace, *args).stdout

    def template(self, *args: str, namespace: str = "sluice") -> list[dict]:
        return [doc for doc in yaml.safe_load_all(self.template_text(*args, namespace=namespace)) if doc]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [obj for obj in by_kind(objects, kind) if obj["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def gateway_config(objects: list[dict], tmp_path: Path):
    """The gateway's settings as the gateway reads them from the rendered chart's Secret."""
    from sluice_gateway.config import load_config  # noqa: PLC0415

    (tmp_path / "gateway.yaml").write_text(one(objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    return load_config(tmp_path / "gateway.yaml")
