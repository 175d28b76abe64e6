"""The local cluster's real node: pods run as containers under their cgroup limits, Pod Security `restricted` is
enforced, Services and cluster DNS work through kube-proxy and CoreDNS, the chart's NetworkPolicies are enforced
by kube-router, and Secret volumes are updated the kubelet's way while a pod runs."""
from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from fixtures.cluster import wait_for
from fixtures.real_node import operator_image, pod_manifest, probe_pod, restricted_namespace, run_pod
from localcluster import node_network
from localcluster.real_node import NODE_NAME, PLACEMENT

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "sluice"
RELEASE = "real-node"

_CGROUP = """
import json, os
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
print(json.dumps({
    "memory_limit": read("/sys/fs/cgroup/memory/memory.limit_in_bytes") or read("/sys/fs/cgroup/memory.max"),
    "cpu_quota": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    "cpu_period": read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    "uid": os.getuid(),
    "hostname": os.uname().nodename,
}))
"""


def test_a_pod_runs_in_a_container_within_its_cgroup_limits(kube_cluster, real_node):
    namespace = restricted_namespace(kube_cluster, f"rn-{uuid.uuid4().hex[:6]}")
    try:
        manifest = pod_manifest("limits", namespace, ["python3", "-c", _CGROUP],
                                resources={"limits": {"memory": "96Mi", "cpu": "500m"}})
        seen = json.loads(run_pod(kube_cluster, manifest).strip().splitlines()[-1])
        assert int(seen["memory_limit"]) == 96 * 2**20
        assert int(seen["cpu_quota"]) == int(seen["cpu_period"]) // 2
        assert seen["uid"] != 0 and seen["hostname"] == "limits"
        pod = json.loads(kube_cluster.kubectl("get", "pod", "limits", "-n", namespace, "-o", "json").stdout)
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
        assert pod["status"]["podIP"].startswith(node_network.POD_CIDR.rsplit(".", 1)[0] + ".")
    finally:
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_a_pod_over_its_memory_limit_is_oom_killed_and_says_so(kube_cluster, real_node):
    namespace = restricted_namespace(kube_cluster, f"rn-{uuid.uuid4().hex[:6]}")
    try:
        manifest = pod_manifest("hog", namespace, ["python3", "-c", "x = bytearray(400 * 2**20); print(len(x))"],
                                resources={"limits": {"memory": "64Mi"}})
        kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

        def terminated():
            pod = json.loads(kube_cluster.kubectl("get", "pod", "hog", "-n", namespace, "-o", "json").stdout)
            state = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {})
            return state.get("terminated")

        state = wait_for(terminated, timeout=120, what="the hog to be killed")
        assert state["reason"] == "OOMKilled" and state["exitCode"] == 137, state
    finally:
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_restricted_pod_security_refuses_a_privileged_pod(kube_cluster, real_node):
    namespace = restricted_namespace(kube_cluster, f"rn-{uuid.uuid4().hex[:6]}")
    try:
        manifest = pod_manifest("privileged", namespace, ["true"])
        manifest["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        refused = kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert refused.returncode != 0
        assert 'violates PodSecurity "restricted' in refused.stderr and "privileged" in refused.stderr
    finally:
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_a_secret_volume_changes_in_a_running_pod(kube_cluster, real_node, record_property):
    """The kubelet swaps a Secret volume's `..data` link: a running pod sees the new value, no restart."""
    namespace = restricted_namespace(kube_cluster, f"rn-{uuid.uuid4().hex[:6]}")
    try:
        kube_cluster.kubectl("create", "secret", "generic", "key", "-n", namespace, "--from-literal=value=one")
        manifest = pod_manifest("reader", namespace, ["python3", "-c", "import time; time.sleep(600)"],
                                volumeMounts=[{"name": "key", "mountPath": "/etc/key", "readOnly": True}])
        manifest["spec"]["volumes"] = [{"name": "key", "secret": {"secretName": "key"}}]
        manifest["spec"]["restartPolicy"] = "Always"
        kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        kube_cluster.kubectl("wait", "--for=condition=Ready", "pod/reader", "-n", namespace, "--timeout=120s")

        def value() -> str:
            return kube_cluster.kubectl("exec", "reader", "-n", namespace, "--", "cat", "/etc/key/value",
                                        check=False).stdout

        assert value() == "one"
        started = time.monotonic()
        patch = json.dumps({"stringData": {"value": "two"}})
        kube_cluster.kubectl("patch", "secret", "key", "-n", namespace, "--type=merge", "-p", patch)
        wait_for(lambda: value() == "two", timeout=150, interval=0.5, what="the new Secret value in the pod")
        record_property("secret_propagation_s", round(time.monotonic() - started, 1))
        listing = kube_cluster.kubectl("exec", "reader", "-n", namespace, "--", "ls", "-la", "/etc/key").stdout
        assert "..data ->" in listing and "value -> ..data/value" in listing
        restarts = kube_cluster.kubectl("get", "pod", "reader", "-n", namespace, "-o",
                                        "jsonpath={.status.containerStatuses[0].restartCount}").stdout
        assert restarts == "0"
    finally:
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def chart_on_node(kube_cluster, real_node, tmp_path_factory):
    """The chart (operator and gateway, one replica, no Redis) installed in a `restricted` namespace, its pods
    on the real node, with the images `make images` built."""
    namespace = restricted_namespace(kube_cluster, f"rn-chart-{uuid.uuid4().hex[:6]}")
    other = restricted_namespace(kube_cluster, f"rn-other-{uuid.uuid4().hex[:6]}")
    values = {
        "operator": {**PLACEMENT, "watchNamespaces": [namespace]},
        "gateway": {**PLACEMENT, "replicaCount": 1},
        "redis": {"bundled": {"enabled": False}},
    }
    values_file = tmp_path_factory.mktemp("chart") / "values.json"
    values_file.write_text(json.dumps(values))
    helm = [str(kube_cluster.bin_dir / "helm"), "--kubeconfig", kube_cluster.kubeconfig]
    started = time.monotonic()
    # Not the e2e suite's release name: the chart's cluster-scoped objects are named after the release.
    installed = subprocess.run([*helm, "install", RELEASE, str(CHART), "--namespace", namespace, "-f",
                                str(values_file), "--wait", "--timeout", "4m"],
                               env=kube_cluster.env, capture_output=True, text=True, timeout=300)
    try:
        if installed.returncode != 0:
            described = kube_cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout
            pytest.fail(f"helm install failed:\n{installed.stderr}\n{described[-4000:]}", pytrace=False)
        yield namespace, other, time.monotonic() - started
    finally:
        subprocess.run([*helm, "uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "2m"],
                       env=kube_cluster.env, capture_output=True, timeout=180)
        for name in (namespace, other):
            kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _pod(kube_cluster, namespace: str, component: str) -> dict:
    pods = json.loads(kube_cluster.kubectl("get", "pods", "-n", namespace, "-l",
                                           f"app.kubernetes.io/component={component}", "-o", "json").stdout)
    (pod,) = pods["items"]
    return pod


def test_the_chart_runs_in_containers_under_restricted_pod_security(kube_cluster, chart_on_node,
                                                                      record_property):
    namespace, _, install_s = chart_on_node
    record_property("install_s", round(install_s, 1))
    for component in ("operator", "gateway"):
        pod = _pod(kube_cluster, namespace, component)
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert all(status["ready"] and status["containerID"].startswith("containerd://")
                   for status in pod["status"]["containerStatuses"])
        assert pod["spec"]["containers"][0]["image"] == operator_image()


def test_the_gateway_service_answers_by_its_cluster_dns_name(kube_cluster, chart_on_node):
    namespace, other, _ = chart_on_node
    services = json.loads(kube_cluster.kubectl("get", "services", "-n", namespace, "-l",
                                               "app.kubernetes.io/component=gateway", "-o", "json").stdout)
    (service,) = services["items"]
    assert service["spec"]["clusterIP"].startswith(node_network.SERVICE_CIDR.rsplit(".", 1)[0] + ".")
    name = f"{service['metadata']['name']}.{namespace}.svc.{node_network.CLUSTER_DOMAIN}:8080"
    # The gateway admits clients from anywhere (gatewayIngressFrom is empty by default).
    assert probe_pod(kube_cluster, other, [name]) == {name: "open"}


def test_network_policies_keep_every_other_pod_off_the_metrics_and_operator_ports(kube_cluster, chart_on_node,
                                                                                 record_property):
    """Who reaches whom on the enforcing dataplane. A pod that copies the operator's or the gateway's labels
    would pass their NetworkPolicies, so the chart refuses it at admission, and a ReplicaSet that would make it."""
    namespace, other, _ = chart_on_node
    operator, gateway = _pod(kube_cluster, namespace, "operator"), _pod(kube_cluster, namespace, "gateway")
    targets = {"gateway metrics": f"{gateway['status']['podIP']}:9090",
               "operator health": f"{operator['status']['podIP']}:8081",
               "gateway api": f"{gateway['status']['podIP']}:8080"}
    matrix = {}
    for client, where in (("pod in another namespace", other), ("pod with no labels", namespace)):
        seen = probe_pod(kube_cluster, where, list(targets.values()))
        matrix[client] = {target: seen[address] for target, address in targets.items()}
    for client, pod in (("pod forging the gateway's labels", gateway), ("pod forging the operator's labels", operator)):
        # Every label but the ReplicaSet's hash, which would make the ReplicaSet adopt the pod and delete it.
        labels = {k: v for k, v in pod["metadata"]["labels"].items() if k != "pod-template-hash"}
        manifest = pod_manifest(f"forged-{uuid.uuid4().hex[:6]}", namespace, ["sleep", "60"], labels)
        refused = kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert refused.returncode != 0 and "is made only by its Deployment" in refused.stderr, refused.stderr
        replica_set = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                       "metadata": {"name": f"{pod['metadata']['generateName']}forged", "namespace": namespace},
                       "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                "template": {"metadata": {"labels": labels},
                                             "spec": {**manifest["spec"], "restartPolicy": "Always"}}}}
        refused_rs = kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(replica_set), check=False)
        assert refused_rs.returncode != 0 and "is made only by its Deployment" in refused_rs.stderr
        matrix[client] = {target: "refused at admission" for target in targets}
    # An unlabelled pod that takes the labels afterwards is refused too.
    relabel = pod_manifest("relabelled", namespace, ["sleep", "60"])
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(relabel))
    forged = [f"{k}={v}" for k, v in operator["metadata"]["labels"].items() if k != "pod-template-hash"]
    relabelled = kube_cluster.kubectl("label", "pod", "relabelled", "-n", namespace, *forged, check=False)
    assert relabelled.returncode != 0 and "is made only by its Deployment" in relabelled.stderr
    # The operator itself, from inside its own container, to the gateway's metrics (each model's demand).
    reached = kube_cluster.kubectl(
        "exec", operator["metadata"]["name"], "-n", namespace, "--", "python3", "-c",
        f"import socket; socket.create_connection(('{gateway['status']['podIP']}', 9090), timeout=3); print('open')",
        check=False)
    matrix["the operator"] = {"gateway metrics": reached.stdout.strip() or reached.stderr.strip()[-200:]}
    record_property("network_policy_matrix", json.dumps(matrix))
    assert matrix["the operator"]["gateway metrics"] == "open", matrix
    for client in ("pod in another namespace", "pod with no labels"):
        seen = matrix[client]
        assert seen["gateway api"] == "open", (client, matrix)
        assert seen["gateway metrics"] != "open" and seen["operator health"] != "open", (client, matrix)
