"""The local cluster's real node: pods run as containers under their cgroup limits, Pod Security `restricted` is
enforced, Services and cluster DNS work through kube-proxy and CoreDNS, the chart's NetworkPolicies are enforced
by kube-router, and Secret volumes are updated the kubelet's way while a pod runs."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import openai
import pytest

from fixtures.cluster import wait_for
from fixtures.real_node import (
    memory_peak,
    operator_image,
    pod_manifest,
    probe_pod,
    restricted_namespace,
    run_pod,
    runtime_image,
    runtime_image_on,
)
from fixtures.sluice_stack import ready
from localcluster import node_network
from localcluster.real_node import NODE_NAME, PLACEMENT
from sluice_operator.builders.pod_security import RUN_AS_USER, WRITABLE_DIRS

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "sluice"
RELEASE = "real-node"
TENANT_KEY = "sk-sluice-real-node"
TENANT_KEY_SHA256 = hashlib.sha256(TENANT_KEY.encode()).hexdigest()
MODEL = "smollm2"
# One of the node's two cores, so the runtime's thread count shows the pod's quota rather than the node's cores.
MODEL_CPU = "1"
MODEL_MEMORY = "3Gi"
MODEL_LEN = 1024

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
        "gateway": {**PLACEMENT, "replicaCount": 1,
                    "config": {"tenants": [{"name": "node", "keys": [{"id": "node-key", "sha256": TENANT_KEY_SHA256}],
                                            "models": ["*"]}]}},
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


# Named in fixtures.real_node.RUNTIME_FIXTURES, which starts the runtime image's load early when a test needs it.
@pytest.fixture(scope="module")
def model_on_node(kube_cluster, real_node, chart_on_node, record_testsuite_property):
    """The embedded model as an InferenceModel in the chart's namespace: its runtime pod in a container on the real
    node, from the runtime image `make images` built, served through the gateway pod."""
    namespace, _, _ = chart_on_node
    image = runtime_image_on(real_node)
    model = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel",
             "metadata": {"name": MODEL, "namespace": namespace},
             "spec": {"model": {"source": "smollm2"}, "replicas": 1,
                      "runtime": {"image": image, "dtype": "float32", "maxModelLen": MODEL_LEN,
                                  "kvCacheMemory": "128Mi"},
                      "resources": {"cpu": MODEL_CPU, "memory": MODEL_MEMORY, **PLACEMENT}}}
    started = time.monotonic()
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(model))

    def serving():
        pods = _model_pods(kube_cluster, namespace)
        return len(pods) == 1 and ready(pods[0]) and _chat(_gateway_url(kube_cluster, namespace), MODEL) and pods[0]

    try:
        pod = wait_for(serving, timeout=420, interval=2, what="the model's pod to serve through the gateway")
    except AssertionError as error:
        described = kube_cluster.kubectl("describe", "pods", "-n", namespace, "-l",
                                         f"sluice.dev/inference-model={MODEL}", check=False).stdout
        logs = kube_cluster.kubectl("logs", "-n", namespace, "-l", f"sluice.dev/inference-model={MODEL}",
                                    "--tail=40", check=False).stdout
        raise AssertionError(f"{error}\n{described[-3000:]}\n{logs}") from None
    record_testsuite_property("real_node_model_serving_s", round(time.monotonic() - started, 1))
    return pod


def _model_pods(kube_cluster, namespace: str) -> list[dict]:
    return json.loads(kube_cluster.kubectl("get", "pods", "-n", namespace, "-l",
                                           f"sluice.dev/inference-model={MODEL}", "-o", "json").stdout)["items"]


def _gateway_url(kube_cluster, namespace: str) -> str:
    return f"http://{_pod(kube_cluster, namespace, 'gateway')['status']['podIP']}:8080/v1"


def _chat(base_url: str, model: str) -> str | None:
    """The answer's text, or None while the gateway does not serve `model` yet."""
    client = openai.OpenAI(base_url=base_url, api_key=TENANT_KEY, max_retries=0, timeout=60)
    try:
        answer = client.chat.completions.create(model=model, max_tokens=8,
                                                messages=[{"role": "user", "content": "Say hello."}])
    except (openai.APIStatusError, openai.APIConnectionError):
        return None
    return answer.choices[0].message.content


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


def test_network_policies_keep_every_other_pod_off_the_runtime_metrics_and_operator_ports(
        kube_cluster, chart_on_node, model_on_node, record_property):
    """Who reaches whom on the enforcing dataplane. A pod that copies the operator's or the gateway's labels
    would pass their NetworkPolicies, so the chart refuses it at admission, and a ReplicaSet that would make it.
    The gateway reaching the runtime is the model serving through it (`model_on_node`)."""
    namespace, other, _ = chart_on_node
    operator, gateway = _pod(kube_cluster, namespace, "operator"), _pod(kube_cluster, namespace, "gateway")
    runtime = f"{model_on_node['status']['podIP']}:8000"
    targets = {"gateway metrics": f"{gateway['status']['podIP']}:9090",
               "operator health": f"{operator['status']['podIP']}:8081",
               "runtime api": runtime,
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
    # The operator itself, from inside its own container, to the gateway's metrics (each model's demand) and the
    # runtime (its metrics and adapters).
    matrix["the operator"] = {}
    for target, address in (("gateway metrics", f"{gateway['status']['podIP']}:9090"), ("runtime api", runtime)):
        host, port = address.split(":")
        reached = kube_cluster.kubectl(
            "exec", operator["metadata"]["name"], "-n", namespace, "--", "python3", "-c",
            f"import socket; socket.create_connection(('{host}', {port}), timeout=3); print('open')", check=False)
        matrix["the operator"][target] = reached.stdout.strip() or reached.stderr.strip()[-200:]
    record_property("network_policy_matrix", json.dumps(matrix))
    assert set(matrix["the operator"].values()) == {"open"}, matrix
    for client in ("pod in another namespace", "pod with no labels"):
        seen = matrix[client]
        assert seen["gateway api"] == "open", (client, matrix)
        # The whole matrix as text: pytest would shorten a dict in the failure line.
        assert {seen["gateway metrics"], seen["operator health"], seen["runtime api"]}.isdisjoint({"open"}), \
            f"{client}: {json.dumps(matrix)}"


_THREADS = """
import json, os
from sluice_runtime.executor.cpu_budget import usable_cpus
print(json.dumps({"cores": len(os.sched_getaffinity(0)), "threads": usable_cpus()}))
"""
def _exec_json(kube_cluster, pod: dict, script: str) -> dict:
    return json.loads(kube_cluster.kubectl("exec", pod["metadata"]["name"], "-n", pod["metadata"]["namespace"],
                                           "--", "python3", "-c", script).stdout)


def test_a_model_pod_serves_from_its_container_with_threads_for_its_cpu_quota(kube_cluster, model_on_node):
    pod = model_on_node
    assert pod["spec"]["nodeName"] == NODE_NAME
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://") and status["image"] == runtime_image()
    assert pod["spec"]["containers"][0]["image"] == runtime_image()
    namespace = pod["metadata"]["namespace"]
    url = _gateway_url(kube_cluster, namespace)
    for _ in range(4):
        assert _chat(url, MODEL), "the gateway stopped serving the model"
    seen = _exec_json(kube_cluster, pod, _THREADS)
    # The node has more cores than the pod's quota; torch's threads follow the quota.
    assert seen["cores"] > int(MODEL_CPU) and seen["threads"] == int(MODEL_CPU), seen


# What a container may write: the writable paths, and nothing else even where the permissions would allow it
# (/var/tmp is world-writable in Debian; only the read-only root stops it).
_WRITE_PROBE = """id -u; id -g
for path in "$@"; do
  if touch "$path/.probe" 2>/dev/null; then echo "writable $path"; else echo "refused $path"; fi
done"""


def _write_probe(kube_cluster, pod: dict, paths: list[str]) -> list[str]:
    return kube_cluster.kubectl("exec", pod["metadata"]["name"], "-n", pod["metadata"]["namespace"], "--",
                                "/bin/sh", "-c", _WRITE_PROBE, "probe", *paths).stdout.split("\n")


def test_each_image_runs_as_its_user_and_writes_only_to_its_volumes(kube_cluster, chart_on_node, model_on_node):
    namespace, _, _ = chart_on_node
    writable = list(WRITABLE_DIRS.values())
    assert _write_probe(kube_cluster, model_on_node, [*writable, "/var/tmp", "/opt/sluice", "/"]) == [
        str(RUN_AS_USER), str(RUN_AS_USER), *(f"writable {path}" for path in writable),
        "refused /var/tmp", "refused /opt/sluice", "refused /", ""]
    for component in ("operator", "gateway"):
        # The chart mounts an emptyDir on /tmp in the operator's and the gateway's pods, and nothing else writable.
        seen = _write_probe(kube_cluster, _pod(kube_cluster, namespace, component), ["/tmp", "/var/tmp", "/opt/sluice"])
        assert seen[2:] == ["writable /tmp", "refused /var/tmp", "refused /opt/sluice", ""], (component, seen)
    torch = kube_cluster.kubectl("exec", _pod(kube_cluster, namespace, "operator")["metadata"]["name"], "-n",
                                 namespace, "--", "python3", "-c", "import torch", check=False)
    assert torch.returncode != 0, "the control-plane image must not carry torch"


def test_the_runtime_image_answers_as_the_hosts_runtime_does(kube_cluster, chart_on_node, model_on_node):
    """The image installs its own environment: greedy, its pod answers as this machine's runtime does with the same
    configuration and one thread (the pod's quota), so a dependency that changed in the image shows here."""
    from fixtures.runtime_server import start_runtime_server

    namespace, _, _ = chart_on_node
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    through_pod = openai.OpenAI(base_url=_gateway_url(kube_cluster, namespace), api_key=TENANT_KEY, max_retries=0,
                                timeout=120).chat.completions.create(model=MODEL, messages=question, temperature=0,
                                                                     max_tokens=24)
    cores = os.sched_getaffinity(0)
    with contextlib.ExitStack() as running:
        os.sched_setaffinity(0, {min(cores)})  # inherited by the server: one thread, as in the pod
        try:
            host = running.enter_context(start_runtime_server("--max-model-len", str(MODEL_LEN), "--kv-cache-memory",
                                                              "128MiB", "--dtype", "float32"))
        finally:
            os.sched_setaffinity(0, cores)
        on_host = openai.OpenAI(base_url=f"{host.url}/v1", api_key="unused", max_retries=0,
                                timeout=120).chat.completions.create(model=MODEL, messages=question, temperature=0,
                                                                     max_tokens=24)
    assert through_pod.choices[0].message.content == on_host.choices[0].message.content


_CALL_RUNTIME = """
import sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
try:
    print(urllib.request.urlopen(request, timeout=5).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


def _credential(kube_cluster, namespace: str) -> tuple[str, str]:
    secrets = json.loads(kube_cluster.kubectl("get", "secrets", "-n", namespace, "-o", "json").stdout)["items"]
    (secret,) = [s for s in secrets if s["metadata"]["name"].endswith("-runtime-credential")]
    api_key = base64.b64decode((secret.get("data") or {}).get("api-key", "")).decode()
    return secret["metadata"]["name"], api_key


def _restarts(kube_cluster, namespace: str) -> dict[str, int]:
    pods = json.loads(kube_cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"].get("containerStatuses", []))
            for p in pods}


def test_a_rotated_runtime_credential_reaches_the_running_runtime_and_gateway(kube_cluster, chart_on_node,
                                                                            model_on_node, record_property):
    """The kubelet rewrites the Secret volume (its `..data` swap); the runtime takes the new key (the old one stays
    valid for the rotation's grace, as the gateway's volume may lag) and the gateway calls with it, neither
    restarted."""
    namespace, _, _ = chart_on_node
    operator = _pod(kube_cluster, namespace, "operator")["metadata"]["name"]
    models_url = f"http://{model_on_node['status']['podIP']}:8000/v1/models"

    def runtime_answers(key: str) -> str:
        return kube_cluster.kubectl("exec", operator, "-n", namespace, "--", "python3", "-c", _CALL_RUNTIME,
                                    models_url, key, check=False).stdout.strip()

    name, old = _credential(kube_cluster, namespace)
    assert old and runtime_answers(old) == "200"
    before = _restarts(kube_cluster, namespace)
    written = time.monotonic()
    # Removing the release key is the documented rotation: the operator makes a new one and every credential.
    kube_cluster.kubectl("patch", "secret", name, "-n", namespace, "--type=json",
                         "-p", json.dumps([{"op": "remove", "path": "/data/release-key"}]))
    new = wait_for(lambda: (key := _credential(kube_cluster, namespace)[1]) != old and key, timeout=30,
                   what="the operator to write a new credential")
    record_property("credential_rewritten_s", round(time.monotonic() - written, 1))
    wait_for(lambda: runtime_answers(new) == "200", timeout=150, interval=1,
             what="the runtime to take the new credential")
    assert runtime_answers(old) == "200", "the replaced credential is refused within its grace"
    assert runtime_answers(old[::-1]) == "401"
    record_property("runtime_took_new_credential_s", round(time.monotonic() - written, 1))
    url = _gateway_url(kube_cluster, namespace)
    wait_for(lambda: _chat(url, MODEL), timeout=150, interval=1, what="the gateway to call with the new credential")
    record_property("gateway_took_new_credential_s", round(time.monotonic() - written, 1))
    assert _restarts(kube_cluster, namespace) == before


def test_a_new_model_route_reaches_the_running_gateway(kube_cluster, chart_on_node, model_on_node, record_property):
    """The operator writes the routing table's ConfigMap; the kubelet swaps the gateway's volume, which reloads it."""
    namespace, _, _ = chart_on_node
    url = _gateway_url(kube_cluster, namespace)
    alias = f"alias-{uuid.uuid4().hex[:6]}"
    assert _chat(url, alias) is None
    before = _restarts(kube_cluster, namespace)
    route = {"apiVersion": "sluice.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": alias, "namespace": namespace},
             "spec": {"model": alias, "backends": [{"inferenceModel": MODEL, "weight": 100}]}}
    written = time.monotonic()
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(route))
    wait_for(lambda: _chat(url, alias), timeout=150, interval=1, what=f"the gateway to route {alias}")
    record_property("route_served_s", round(time.monotonic() - written, 1))
    assert _restarts(kube_cluster, namespace) == before


def test_a_memory_limit_too_small_for_the_model_is_reported_on_the_model(kube_cluster, chart_on_node,
                                                                       model_on_node, record_property):
    """The kernel kills the runtime for its cgroup's limit; the InferenceModel says so (Degraded OOMKilled with
    the limit and what to raise, and a Warning event), rather than leaving a silent crash loop."""
    namespace, _, _ = chart_on_node
    name = "too-small"
    model = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"model": {"source": "smollm2"}, "replicas": 1,
                      "runtime": {"dtype": "float32", "maxModelLen": 1024, "kvCacheMemory": "128Mi"},
                      "resources": {"cpu": "250m", "memory": "256Mi", **PLACEMENT}}}
    started = time.monotonic()
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(model))
    try:
        def degraded():
            body = json.loads(kube_cluster.kubectl("get", "im", name, "-n", namespace, "-o", "json").stdout)
            found = [c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "Degraded"]
            return found and found[0]["reason"] == "OOMKilled" and found[0]

        condition = wait_for(degraded, timeout=240, interval=2, what="Degraded OOMKilled on the model")
        record_property("oom_reported_s", round(time.monotonic() - started, 1))
        assert "256Mi" in condition["message"] and "spec.resources.memory" in condition["message"], condition
        events = json.loads(kube_cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                                 f"involvedObject.name={name},reason=OOMKilled", "-o",
                                                 "json").stdout)["items"]
        assert [e["type"] for e in events] == ["Warning"], events
    finally:
        kube_cluster.kubectl("delete", "im", name, "-n", namespace, "--wait=false", check=False)


def test_every_pod_stayed_within_its_memory_limit(kube_cluster, chart_on_node, model_on_node, record_property):
    """Last in this module: each Sluice container's peak since it started (the runtime's includes loading the model
    and every request of this module) against its limit, with no restart."""
    namespace, _, _ = chart_on_node
    pods = {"operator": _pod(kube_cluster, namespace, "operator"), "gateway": _pod(kube_cluster, namespace, "gateway"),
            "runtime": _model_pods(kube_cluster, namespace)[0]}
    for component, pod in pods.items():
        seen = memory_peak(kube_cluster, pod)
        record_property(f"{component}_peak_memory", f"{seen['peak'] / 2**20:.0f} MiB of {seen['limit'] / 2**20:.0f}")
        assert seen["peak"] < seen["limit"], (component, seen)
        assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0], component
    assert memory_peak(kube_cluster, pods["runtime"])["limit"] == 3 * 2**30
