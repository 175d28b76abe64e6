"""The peering object under helm: an operator of a release waits for the release's, against the real API server.

helm creates the chart's peering object last in an install; an operator that started first and
created it made `helm install` fail with "already exists".
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import kubernetes
import pytest

from sluice_operator import runner
from sluice_operator.builders.peering import build_peering
from sluice_operator.kube import Kube

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kube(kube_cluster) -> Kube:
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubernetes.config.load_kube_config(config_file=str(kube_cluster.kubeconfig))
    return Kube()


def _peering(kube_cluster, namespace: str) -> dict | None:
    found = kube_cluster.kubectl("get", "kopfpeering", "sluice-operator", "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def test_an_operator_of_a_helm_release_waits_for_the_releases_peering(kube, kube_cluster, kube_namespace, monkeypatch):
    monkeypatch.setattr(runner, "PEERING_WAIT_S", 30.0)
    body = build_peering("sluice-operator", kube_namespace, ("sluice", kube_namespace))

    async def scenario() -> float:
        started = time.monotonic()
        waiting = asyncio.ensure_future(runner._ensure_peering(kube, body, wait=True))
        await asyncio.sleep(1.5)
        assert _peering(kube_cluster, kube_namespace) is None, "it created the object helm is about to"
        assert not waiting.done()
        # helm's create, as the chart renders it (no ownership annotations needed: it is helm's).
        helms = build_peering("sluice-operator", kube_namespace, None)
        kube_cluster.kubectl("create", "-f", "-", input=json.dumps(helms))
        await asyncio.wait_for(waiting, timeout=10)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 10
    assert "annotations" not in _peering(kube_cluster, kube_namespace)["metadata"], "helm's, not the operator's"


def test_in_vain_it_creates_the_peering_owned_by_the_release(kube, kube_cluster, kube_namespace, monkeypatch):
    monkeypatch.setattr(runner, "PEERING_WAIT_S", 2.0)
    body = build_peering("sluice-operator", kube_namespace, ("sluice", kube_namespace))
    asyncio.run(runner._ensure_peering(kube, body, wait=True))
    annotations = _peering(kube_cluster, kube_namespace)["metadata"]["annotations"]
    assert annotations == {"meta.helm.sh/release-name": "sluice", "meta.helm.sh/release-namespace": kube_namespace}


def test_outside_helm_it_creates_the_peering_at_once(kube, kube_cluster, kube_namespace):
    started = time.monotonic()
    asyncio.run(runner._ensure_peering(kube, build_peering("sluice-operator", kube_namespace, None), wait=False))
    assert time.monotonic() - started < 5 and _peering(kube_cluster, kube_namespace) is not None


def test_a_cluster_wide_peering_is_waited_for_and_created_alike(kube, kube_cluster, monkeypatch):
    import uuid

    monkeypatch.setattr(runner, "PEERING_WAIT_S", 1.0)
    name = f"peering-{uuid.uuid4().hex[:6]}"
    body = build_peering(name, None, ("sluice", "sluice"))
    try:
        assert not asyncio.run(kube.peering_exists(body))
        asyncio.run(runner._ensure_peering(kube, body, wait=True))
        assert asyncio.run(kube.peering_exists(body))
        found = json.loads(kube_cluster.kubectl("get", "clusterkopfpeering", name, "-o", "json").stdout)
        assert found["metadata"]["annotations"]["meta.helm.sh/release-name"] == "sluice"
    finally:
        kube_cluster.kubectl("delete", "clusterkopfpeering", name, check=False)
