"""The local control plane behaves like a Kubernetes cluster: nodes, scheduling, controllers, RBAC, helm."""
import json
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from fixtures.cluster import wait_for
from localcluster import binaries
from localcluster.cluster import NODE_NAME, LocalCluster

pytestmark = pytest.mark.integration


def _node_ready(cluster, node: str) -> bool:
    result = cluster.kubectl("get", "node", node, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    conditions = json.loads(result.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _non_loopback_addresses() -> list[str]:
    listed = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return [a for a in listed if "." in a and not a.startswith("127.")]


def test_a_fresh_cluster_comes_up_from_nothing_with_a_ready_kwok_node(kube_cluster, tmp_path):
    fresh = LocalCluster(name=f"fresh-{uuid.uuid4().hex[:6]}", kubeconfig_path=tmp_path / "kubeconfig", log=lambda _: None)
    assert not fresh.is_running()
    try:
        fresh.up()
        assert fresh.is_running()
        nodes = fresh.kubectl("get", "nodes", "-o", "json").stdout
        assert [n["metadata"]["name"] for n in json.loads(nodes)["items"]] == [NODE_NAME]
        assert _node_ready(fresh, NODE_NAME)
        server = urlsplit(yaml.safe_load(Path(fresh.kubeconfig).read_text())["clusters"][0]["cluster"]["server"])
        assert server.hostname == "127.0.0.1"
        for address in _non_loopback_addresses():
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((address, server.port), timeout=5).close()
        version = json.loads(fresh.kubectl("version", "-o", "json").stdout)
        assert version["serverVersion"]["gitVersion"] == binaries.KUBERNETES_VERSION
        assert version["clientVersion"]["gitVersion"] == binaries.KUBERNETES_VERSION
    finally:
        fresh.down()
    assert not fresh.is_running()
    assert not (fresh.kwok_workdir / "clusters" / fresh.name).exists()


def test_the_installed_kubectl_works_against_it(kube_cluster):
    installed = shutil.which("kubectl", path="/usr/local/bin:/usr/bin")
    if installed is None:
        pytest.skip("no kubectl installed on this machine besides the one we build")
    result = subprocess.run([installed, "--kubeconfig", kube_cluster.kubeconfig, "get", "nodes", "-o", "name"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # The kwok node, and the real node once a test has started it.
    assert f"node/{NODE_NAME}" in result.stdout.split()


def test_admission_rejects_a_pod_beyond_the_namespace_quota(kube_cluster, kube_namespace):
    kube_cluster.kubectl("create", "quota", "one-pod", "--hard=pods=1", "-n", kube_namespace)
    wait_for(lambda: kube_cluster.kubectl("get", "quota", "one-pod", "-n", kube_namespace,
                                           "-o", "jsonpath={.status.hard.pods}").stdout == "1",
              what="the quota controller to publish the quota")
    pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: main\n    image: none\n"
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=pod.format(name="first"))
    second = kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=pod.format(name="second"), check=False)
    assert second.returncode != 0
    assert "exceeded quota: one-pod" in second.stderr


def _deployment(name: str, replicas: int, labels: dict | None = None) -> str:
    return yaml.safe_dump({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **(labels or {})}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:1"}]},
            },
        },
    })


def _pods(cluster, namespace: str, selector: str) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return json.loads(out)["items"]


def test_a_deployment_scales_to_two_running_pods_with_loopback_addresses(kube_cluster, kube_namespace):
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=_deployment("web", 1))
    kube_cluster.kubectl("scale", "-n", kube_namespace, "deployment/web", "--replicas=2")

    def two_running():
        pods = _pods(kube_cluster, kube_namespace, "app=web")
        running = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return running if len(running) == 2 else None

    pods = wait_for(two_running, what="two running pods")
    addresses = {p["status"]["podIP"] for p in pods}
    assert len(addresses) == 2
    assert all(address.startswith("127.1.0.") for address in addresses)
    assert all(p["spec"]["nodeName"] == NODE_NAME for p in pods)
    kube_cluster.kubectl("rollout", "status", "-n", kube_namespace, "deployment/web", "--timeout=60s")


def test_deleting_an_owner_garbage_collects_its_dependents(kube_cluster, kube_namespace):
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=_deployment("owned", 2))
    wait_for(lambda: len(_pods(kube_cluster, kube_namespace, "app=owned")) == 2, what="the deployment's pods")
    replicasets = kube_cluster.kubectl("get", "rs", "-n", kube_namespace, "-l", "app=owned", "-o", "name").stdout
    assert replicasets.strip()

    kube_cluster.kubectl("delete", "-n", kube_namespace, "deployment/owned", "--cascade=background")

    def collected():
        rs = kube_cluster.kubectl("get", "rs", "-n", kube_namespace, "-l", "app=owned", "-o", "name").stdout
        return not rs.strip() and not _pods(kube_cluster, kube_namespace, "app=owned")

    wait_for(collected, what="the garbage collector to remove the ReplicaSet and its pods")


def test_rbac_denies_a_service_account_what_its_role_does_not_grant(kube_cluster, kube_namespace, tmp_path):
    ns = kube_namespace
    kube_cluster.kubectl("create", "serviceaccount", "reader", "-n", ns)
    kube_cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", ns)
    kube_cluster.kubectl("create", "rolebinding", "reader-binds", "--role=pod-reader", f"--serviceaccount={ns}:reader", "-n", ns)
    token = kube_cluster.kubectl("create", "token", "reader", "-n", ns, "--duration=10m").stdout.strip()

    # A kubeconfig holding only the service account's signed token, so the API server authenticates it as that account.
    admin = yaml.safe_load(kube_cluster.kubectl("config", "view", "--raw", "--minify").stdout)
    sa_config = tmp_path / "reader.kubeconfig"
    sa_config.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "reader", "user": {"token": token}}],
        "contexts": [{"name": "reader", "context": {"cluster": admin["clusters"][0]["name"], "user": "reader", "namespace": ns}}],
        "current-context": "reader",
    }))

    def as_reader(*args):
        return subprocess.run([str(kube_cluster.bin_dir / "kubectl"), "--kubeconfig", str(sa_config), *args],
                              capture_output=True, text=True, timeout=60)

    assert as_reader("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == f"system:serviceaccount:{ns}:reader"
    allowed = as_reader("get", "pods")
    assert allowed.returncode == 0, allowed.stderr
    for denied_args in (("get", "secrets"), ("create", "configmap", "x", "--from-literal=a=b"), ("get", "pods", "-n", "default")):
        denied = as_reader(*denied_args)
        assert denied.returncode != 0
        assert "forbidden" in denied.stderr.lower() and f"system:serviceaccount:{ns}:reader" in denied.stderr


def test_helm_installs_a_chart_into_the_cluster(kube_cluster, kube_namespace, tmp_path):
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\ndata:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    install = subprocess.run(
        [str(kube_cluster.bin_dir / "helm"), "install", "demo", str(chart), "-n", kube_namespace,
         "--set", "greeting=bonjour", "--wait", "--timeout", "60s"],
        env=kube_cluster.env, capture_output=True, text=True, timeout=120,
    )
    assert install.returncode == 0, install.stderr
    data = kube_cluster.kubectl("get", "configmap", "demo-cm", "-n", kube_namespace, "-o", "jsonpath={.data.greeting}").stdout
    assert data == "bonjour"
