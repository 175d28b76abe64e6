"""The operator against a real kube-apiserver (the local control plane, pods simulated by kwok).

The operator runs as a subprocess (`sluice-operator run`) with the token of a service account bound to the
RBAC rules it ships (operator/sluice_operator/rbac/rules.yaml: Roles in the namespaces it watches, as the chart
grants them with `watchNamespaces`), not as admin. kwok marks the runtime pods
Ready without running them and gives them 127.1.0.x addresses; nothing listens there, which is what the
autoscaler safety-rail test relies on.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from fixtures.cluster import wait_for
from sluice_contracts import runtime_credential

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "operator" / "sluice_operator" / "rbac" / "rules.yaml"
SAMPLES = ROOT / "config" / "samples"
INVALID = yaml.safe_load((Path(__file__).parent / "data" / "invalid_specs.yaml").read_text())
TABLE = "sluice-routing-table"
RELEASE = "sluice"  # the release the RBAC file's resourceNames are written for
CREDENTIAL = runtime_credential.secret_name(RELEASE)
ENFORCE = "pod-security.kubernetes.io/enforce"
ALLOWED_IMAGES = "ghcr.io/sluice-dev/"  # the registry prefix the test's operator lets models use
GUARD_IMAGE = "ghcr.io/sluice-dev/sluice-operator:test"
class Api:
    """kubectl as the admin user, for the test's own reads and writes."""

    def __init__(self, cluster, namespace: str):
        self.cluster, self.namespace = cluster, namespace

    def run(self, *args: str, input: str | None = None, check: bool = True):
        return self.cluster.kubectl("-n", self.namespace, *args, input=input, check=check)

    def get(self, kind: str, name: str) -> dict | None:
        result = self.run("get", kind, name, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def apply(self, doc: dict | str):
        text = doc if isinstance(doc, str) else yaml.safe_dump(doc)
        return self.run("apply", "-f", "-", input=text)

    def condition(self, kind: str, name: str, type_: str) -> dict:
        obj = self.get(kind, name) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

    def table(self) -> dict | None:
        cm = self.get("configmap", TABLE)
        return json.loads(cm["data"]["routing-table.json"]) if cm else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _service_account_kubeconfig(cluster, namespace: str, path: Path) -> None:
    """A kubeconfig holding only the operator service account's token."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
    token = cluster.kubectl("-n", namespace, "create", "token", "sluice-operator", "--duration", "2h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": "sluice-operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "sluice-operator"}}],
    }))


class Operator:
    """`sluice-operator run` serving release RELEASE: its own namespace and `other`, each watched."""

    def __init__(self, kubeconfig: Path, namespace: str, other: str, log: Path, peering: str,
                 priority: int | None = None):
        self.kubeconfig, self.namespace, self.other, self.log = kubeconfig, namespace, other, log
        self.peering, self.priority = peering, priority
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        if self.process and self.process.poll() is None:
            return
        port = _free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "sluice-operator"), "run", "--namespace", self.namespace,
             "--namespace", self.other, "--release", RELEASE, "--release-namespace", self.namespace,
             "--network-policy-gateway", "app.kubernetes.io/component=gateway,app.kubernetes.io/instance=sluice",
             "--network-policy-operator", "app.kubernetes.io/component=operator,app.kubernetes.io/instance=sluice",
             "--allowed-image-prefix", ALLOWED_IMAGES, "--guard-image", GUARD_IMAGE,
             "--peering", self.peering, "--health-port", str(port), "--autoscale-interval", "2",
             *(["--priority", str(self.priority)] if self.priority is not None else [])],
            env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
        )

        def healthy():
            assert self.process.poll() is None, f"operator exited: {self.log.read_text()[-3000:]}"
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).status == 200
            except OSError:
                return False

        wait_for(healthy, timeout=60, what="the operator's /healthz")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def forbidden(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if "forbidden" in line.lower()]


def _rbac(namespace: str, other: str) -> list[dict]:
    """The service account with the shipped rules: `served` in both namespaces, `release` in its own."""
    rules = yaml.safe_load(RBAC.read_text())
    account = {"kind": "ServiceAccount", "name": "sluice-operator", "namespace": namespace}
    docs = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sluice-operator", "namespace": namespace}}]
    for where, name, rule_set in ((namespace, "sluice-operator", "served"), (other, "sluice-operator", "served"),
                                  (namespace, "sluice-operator-release", "release")):
        meta = {"name": name, "namespace": where}
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
                     "rules": rules[rule_set]})
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                     "subjects": [account]})
    return docs


@pytest.fixture(scope="module")
def setup(kube_cluster, tmp_path_factory):
    namespace = f"op-{uuid.uuid4().hex[:8]}"
    # Forced: the e2e scenarios install the same CRDs through helm, which then owns their fields.
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kube_cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                         "crd/inferencemodels.sluice.dev", "crd/modelroutes.sluice.dev")
    other = f"{namespace}-other"
    for created in (namespace, other):
        kube_cluster.kubectl("create", "namespace", created)
        # Every runtime pod the operator creates here must pass the strictest profile.
        kube_cluster.kubectl("label", "namespace", created, f"{ENFORCE}=restricted")
    kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_rbac(namespace, other)))
    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = tmp / "kubeconfig"
    _service_account_kubeconfig(kube_cluster, namespace, kubeconfig)
    operator = Operator(kubeconfig, namespace, other, tmp / "operator.log",
                        peering=f"sluice-test-{uuid.uuid4().hex[:6]}", priority=100)
    operator.start()
    yield Api(kube_cluster, namespace), operator
    operator.stop()
    print(f"operator log: {operator.log}")
    kube_cluster.kubectl("delete", "namespace", namespace, other, "--wait=false", check=False)


@pytest.fixture(scope="module")
def samples(setup):
    api, operator = setup
    # The CPU samples; the GPU ones could never schedule here and are dry-run by the chart tests.
    for name in ("inferencemodel-smollm2.yaml", "modelroute-chat.yaml"):
        api.apply((SAMPLES / name).read_text())
    wait_for(lambda: api.condition("im", "smollm2", "Ready").get("status") == "True", timeout=60,
             what="the sample InferenceModel to be Ready")
    return api


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["case"])
def test_api_server_refuses_invalid_specs(setup, case):
    api, _ = setup
    doc = {"apiVersion": "sluice.dev/v1alpha1", "kind": case["kind"], "metadata": {"name": "bad"},
           "spec": case["spec"]}
    result = api.run("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0, f"{case['case']} was accepted"
    assert case["api"] in result.stderr, result.stderr


def test_invalid_name_is_refused(setup):
    api, _ = setup
    doc = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "x." * 40 + "y"},
           "spec": {"model": {"source": "smollm2"}}}
    result = api.run("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert "the Service of the model takes the same name" in result.stderr


def test_an_adapter_named_like_its_model_is_refused(setup):
    api, _ = setup
    doc = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "base"},
           "spec": {"model": {"source": "smollm2"}, "adapters": [{"name": "base", "source": "file:///a"}]}}
    result = api.run("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert "an adapter cannot take the name of its InferenceModel" in result.stderr


def test_sample_becomes_deployment_service_and_budget(samples):
    api = samples
    model = api.get("im", "smollm2")
    for kind in ("deployment", "service", "poddisruptionbudget"):
        obj = api.get(kind, "smollm2")
        assert obj is not None, f"no {kind}"
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == model["metadata"]["uid"]
    container = api.get("deployment", "smollm2")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["serve", "--model", "smollm2"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    status = model["status"]
    assert status["observedGeneration"] == model["metadata"]["generation"]
    assert status["readyReplicas"] == 1 and status["selector"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True", "Progressing": "False", "Degraded": "False"}
    events = api.run("get", "events", "--field-selector", "involvedObject.name=smollm2", "-o", "json").stdout
    assert any(e["reason"] == "Reconciled" for e in json.loads(events)["items"])
    listed = api.run("get", "im").stdout
    assert "smollm2" in listed and "Serving" in listed


def test_routing_table_lists_ready_pods_and_routes(samples):
    api = samples
    pods = json.loads(api.run("get", "pods", "-l", "sluice.dev/inference-model=smollm2", "-o", "json").stdout)
    ips = sorted(f"http://{p['status']['podIP']}:8000" for p in pods["items"] if p["status"].get("podIP"))
    table = wait_for(lambda: (t := api.table()) and t["routes"].get("chat", {}).get("backends", [{}])[0].get(
        "endpoints") and t, what="the chat route with endpoints")
    chat = table["routes"]["chat"]
    assert chat["affinity"] == "prefix" and chat["backends"][0]["name"] == "smollm2"
    assert list(chat["backends"][0]["endpoints"]) == ips
    assert table["routes"]["smollm2"]["backends"][0]["servedModelName"] == "smollm2"
    assert table["routes"]["smollm2"]["backends"][0]["engine"] == "sluice"
    wait_for(lambda: api.condition("mr", "chat", "Ready").get("status") == "True", what="route Ready")
    # `kubectl get mr` shows the backends with their weights, without -o yaml.
    header, row = api.run("get", "mr", "chat").stdout.splitlines()
    assert header.split()[:3] == ["NAME", "MODEL", "BACKENDS"] and row.split()[:3] == ["chat", "chat", "smollm2=100"]


def test_routing_table_follows_ready_pods(samples):
    """Pods of a second model come and go with its replicas; the table follows within seconds."""
    api = samples
    api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "extra"},
               "spec": {"model": {"source": "smollm2"}}})

    def endpoints():
        routes = (api.table() or {}).get("routes") or {}
        return (routes.get("extra", {}).get("backends") or [{}])[0].get("endpoints") or []

    wait_for(lambda: len(endpoints()) == 1, what="the extra model's first endpoint")
    timings = {}
    for replicas in (3, 1):
        started = time.monotonic()
        api.run("scale", "im", "extra", "--replicas", str(replicas))
        wait_for(lambda replicas=replicas: len(endpoints()) == replicas, timeout=20, interval=0.05,
                 what=f"{replicas} endpoints in the table")
        timings[replicas] = time.monotonic() - started
    print(f"kubectl scale to the routing table: up {timings[3]:.2f} s, down {timings[1]:.2f} s")
    pods = json.loads(api.run("get", "pods", "-l", "sluice.dev/inference-model=extra", "-o", "json").stdout)
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    assert endpoints() == [f"http://{p['status']['podIP']}:8000" for p in live]
    api.run("delete", "im", "extra")
    wait_for(lambda: "extra" not in ((api.table() or {}).get("routes") or {}), what="the extra route to go")


def test_route_naming_a_missing_model_says_which(setup):
    api, _ = setup
    api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "broken"},
               "spec": {"model": "broken", "backends": [{"inferenceModel": "ghost"}]}})
    ready = wait_for(lambda: (c := api.condition("mr", "broken", "Ready")) and c.get("status") == "False" and c,
                     what="Ready=False on the broken route")
    assert ready["reason"] == "BackendsMissing" and "ghost" in ready["message"]
    assert api.condition("mr", "broken", "Degraded")["status"] == "True"
    api.run("delete", "mr", "broken")


def test_spec_change_rolls_out_and_scale_works(samples):
    api = samples
    before = api.get("deployment", "smollm2")
    api.run("patch", "im", "smollm2", "--type", "merge", "-p", json.dumps({"spec": {"runtime": {"maxNumSeqs": 16}}}))

    def rolled():
        dep = api.get("deployment", "smollm2")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        return args[args.index("--max-num-seqs") + 1] == "16" and dep

    after = wait_for(rolled, what="the new pod template")
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    generation = api.get("im", "smollm2")["metadata"]["generation"]
    wait_for(lambda: api.get("im", "smollm2")["status"].get("observedGeneration") == generation,
             what="observedGeneration to follow")
    api.run("scale", "im", "smollm2", "--replicas", "2")
    wait_for(lambda: api.get("deployment", "smollm2")["spec"]["replicas"] == 2, what="the Deployment to scale")
    wait_for(lambda: len(api.table()["routes"]["chat"]["backends"][0]["endpoints"]) == 2, timeout=30,
             what="two endpoints in the table")


def test_autoscaler_holds_when_metrics_are_missing(samples):
    """kwok pods are Ready but serve nothing: the scrape fails, so the autoscaler must hold, not shrink."""
    api = samples
    decision = wait_for(lambda: (api.get("im", "smollm2")["status"].get("autoscaler")), timeout=30,
                        what="an autoscaler decision in status")
    assert decision["action"] == "Hold" and "no usable metrics" in decision["reason"]
    assert "unreachable" in decision["reason"]
    assert decision["metrics"]["podsScraped"] == 0
    assert api.get("im", "smollm2")["spec"]["replicas"] >= 1


def test_unschedulable_model_is_degraded_not_retried(setup):
    api, _ = setup
    api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "big"},
               "spec": {"model": {"source": "smollm2"}, "resources": {"gpus": 1}}})
    degraded = wait_for(lambda: (c := api.condition("im", "big", "Degraded")) and c.get("status") == "True" and c,
                        timeout=60, what="Degraded on an unschedulable model")
    assert degraded["reason"] == "Unschedulable" and "nvidia.com/gpu" in degraded["message"]
    assert api.condition("im", "big", "Ready")["status"] == "False"
    api.run("delete", "im", "big")


def _credential(api, key: str = runtime_credential.SECRET_KEY) -> str:
    secret = api.get("secret", CREDENTIAL)
    return base64.b64decode(secret["data"][key]).decode()


def test_each_namespace_served_gets_its_own_credential_and_the_runtime_policy(setup, samples):
    """Each namespace gets a credential of its own, made from the release key (and renewed with it); both
    namespaces get the runtime pods' NetworkPolicy, accepted by the API server; everything goes with a
    namespace's last model."""
    api, operator = setup
    other = Api(api.cluster, operator.other)
    policy = api.get("networkpolicy", f"{RELEASE}-runtime")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "sluice-runtime"
    peers = [rule["from"] for rule in policy["spec"]["ingress"]]
    assert all(len(peer) == 1 and {"namespaceSelector", "podSelector"} <= peer[0].keys() for peer in peers), peers
    source = api.get("secret", CREDENTIAL)
    assert source["metadata"]["labels"]["sluice.dev/release"] == RELEASE
    release_key = _credential(api, runtime_credential.RELEASE_KEY)
    assert len(release_key) >= 32 and _credential(api) == runtime_credential.for_namespace(release_key, api.namespace)
    other.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "copied"},
                 "spec": {"model": {"source": "smollm2"}}})
    wait_for(lambda: other.get("deployment", "copied"), what="the model's Deployment")
    copy = other.get("secret", CREDENTIAL)
    assert copy is not None, "the copy is there before the Deployment that mounts it"
    assert _credential(other) == runtime_credential.for_namespace(release_key, other.namespace) != _credential(api)
    assert set(copy["data"]) == {runtime_credential.SECRET_KEY}, "the release key stays in the release's namespace"
    (ref,) = copy["metadata"]["ownerReferences"]
    assert ref["uid"] == other.get("im", "copied")["metadata"]["uid"]
    pod = other.get("deployment", "copied")["spec"]["template"]["spec"]
    assert any(v.get("secret", {}).get("secretName") == CREDENTIAL for v in pod["volumes"])
    assert runtime_credential.MOUNT_PATH in pod["containers"][0]["args"]
    assert other.get("networkpolicy", f"{RELEASE}-runtime")["spec"] == policy["spec"]

    def renewed(key: str) -> bool:
        return (_credential(api) == runtime_credential.for_namespace(key, api.namespace)
                and _credential(other) == runtime_credential.for_namespace(key, other.namespace))

    # A new release key by hand: both namespaces' credentials follow.
    rotated = "rotated-by-hand-" + uuid.uuid4().hex
    api.run("patch", "secret", CREDENTIAL, "--type=merge", "-p", json.dumps(
        {"data": {runtime_credential.RELEASE_KEY: base64.b64encode(rotated.encode()).decode()}}))
    wait_for(lambda: renewed(rotated), what="both credentials to follow the new release key")
    # A namespace's credential written by hand is not the key's: it is put back.
    api.run("patch", "secret", CREDENTIAL, "--type=merge", "-p", json.dumps(
        {"data": {runtime_credential.SECRET_KEY: base64.b64encode(b"chosen-by-hand").decode()}}))
    wait_for(lambda: renewed(rotated), what="the hand-written credential to be replaced")
    # Deleted, or its key emptied: the operator makes a fresh key, and both follow again.
    api.run("delete", "secret", CREDENTIAL)
    fresh = wait_for(lambda: api.get("secret", CREDENTIAL) and _credential(api, runtime_credential.RELEASE_KEY),
                     what="a fresh release key")
    assert fresh != rotated
    wait_for(lambda: renewed(fresh), what="both credentials to follow the fresh key")
    api.run("patch", "secret", CREDENTIAL, "--type=merge", "-p", json.dumps({"data": {runtime_credential.RELEASE_KEY: ""}}))
    wait_for(lambda: (value := _credential(api, runtime_credential.RELEASE_KEY)) and value != fresh,
             what="the emptied key to be made again")
    wait_for(lambda: renewed(_credential(api, runtime_credential.RELEASE_KEY)), what="both to follow the new key")

    other.run("delete", "im", "copied")
    wait_for(lambda: other.get("secret", CREDENTIAL) is None and other.get("networkpolicy", f"{RELEASE}-runtime") is None,
             what="the copy and the policy to go with the namespace's last model")


def test_an_object_in_the_way_is_reported_and_left_alone(setup):
    """Names taken by someone else's Service and Deployment: the model says so (condition and Warning event),
    the operator changes neither, and takes the names once they are free."""
    api, _ = setup
    api.run("create", "service", "clusterip", "taken", "--tcp=80:8080")
    api.run("create", "deployment", "taken", "--image=busybox", "--replicas=0")
    before = {kind: api.get(kind, "taken") for kind in ("service", "deployment")}
    api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "taken"},
               "spec": {"model": {"source": "smollm2"}}})
    degraded = wait_for(lambda: (c := api.condition("im", "taken", "Degraded")) and c.get("reason") == "NameConflict"
                        and c, what="Degraded/NameConflict")
    assert degraded["status"] == "True"
    assert "Service taken and Deployment taken already exist and do not belong" in degraded["message"], degraded
    events = json.loads(api.run("get", "events", "--field-selector", "involvedObject.name=taken,reason=NameConflict",
                                "-o", "json").stdout)["items"]
    assert events and events[0]["type"] == "Warning"
    time.sleep(2)
    for kind, obj in before.items():
        now = api.get(kind, "taken")
        assert now["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"], f"the {kind} was changed"
        assert not now["metadata"].get("ownerReferences")
    assert api.get("poddisruptionbudget", "taken") is None, "nothing is applied while a name is taken"

    api.run("delete", "service,deployment", "taken")
    wait_for(lambda: (d := api.get("deployment", "taken")) and d["metadata"].get("ownerReferences"), timeout=60,
             what="the freed names to be taken by the model")
    wait_for(lambda: api.condition("im", "taken", "Degraded").get("status") == "False", what="Degraded to clear")
    api.run("delete", "im", "taken")


def test_only_the_leader_acts(setup, samples):
    """A second replica with a lower peering priority waits, and takes over when the leader leaves."""
    api, leader = setup
    standby = Operator(leader.kubeconfig, leader.namespace, leader.other, leader.log.with_name("standby.log"),
                       peering=leader.peering, priority=1)
    standby.start()
    try:
        # kopf starts paused and stays so while a higher-priority peer is alive.
        api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "while-led"},
                   "spec": {"model": "while-led", "backends": [{"inferenceModel": "smollm2"}]}})
        wait_for(lambda: api.condition("mr", "while-led", "Ready").get("status") == "True", what="the leader's work")
        assert "Handler" not in standby.log.read_text() and "Resuming" not in standby.log.read_text()
        leader.stop()
        wait_for(lambda: "Resuming operations" in standby.log.read_text(), timeout=30, what="the standby to take over")
        api.run("delete", "mr", "while-led")
        wait_for(lambda: "while-led" not in api.table()["routes"], what="the standby's work")
    finally:
        standby.stop()
        leader.start()


def test_restart_changes_nothing(setup, samples):
    api, operator = setup
    time.sleep(1.0)
    watched = [("im", "smollm2"), ("deployment", "smollm2"), ("service", "smollm2"), ("configmap", TABLE),
               ("mr", "chat")]

    def versions():
        out = {}
        for kind, name in watched:
            obj = api.get(kind, name)
            out[(kind, name)] = obj["metadata"]["resourceVersion"] if kind != "im" else (
                obj["metadata"]["generation"], json.dumps(obj["status"].get("conditions")))
        return out

    before = versions()
    operator.stop()
    operator.start()
    time.sleep(4.0)
    assert versions() == before
    assert operator.forbidden() == [], "the operator needed a permission its RBAC does not grant"


POOLED = {
    "apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "pooled"},
    "spec": {"model": {"source": "smollm2"}, "runtime": {"engine": "vllm"},
             "inferencePool": {"endpointPicker": {"name": "epp", "port": 9002}}},
}


def test_inference_pool_is_made_valid_updated_reported_and_collected(setup):
    from fixtures.gie import inference_pool_crd

    api, operator = setup
    api.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(inference_pool_crd()))
    api.cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                        "crd/inferencepools.inference.networking.k8s.io")
    api.apply(POOLED)
    pool = wait_for(lambda: api.get("inferencepool", "pooled"), timeout=60, what="the InferencePool")
    model = api.get("im", "pooled")
    deployment = wait_for(lambda: api.get("deployment", "pooled"), timeout=30, what="the Deployment")
    assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "epp",
                                                 "port": {"number": 9002}, "failureMode": "FailClose"}
    (owner,) = pool["metadata"]["ownerReferences"]
    assert owner["uid"] == model["metadata"]["uid"] and owner["controller"]
    status = wait_for(lambda: (api.get("im", "pooled").get("status") or {}).get("inferencePool"), timeout=30,
                      what="the pool in the model's status")
    assert status["accepted"] == "Unknown" and "no gateway" in status["message"]

    # A gateway accepts the pool (written as a GIE controller writes it): the model reports it.
    parents = {"status": {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"},
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "attached",
                        "observedGeneration": 1, "lastTransitionTime": "2026-12-01T00:00:00Z"}]}]}}
    api.run("patch", "inferencepool", "pooled", "--subresource=status", "--type=merge", "-p", json.dumps(parents))
    wait_for(lambda: api.get("im", "pooled")["status"]["inferencePool"]["accepted"] == "True", timeout=40,
             what="the model to report the pool accepted")
    assert "Gateway inference-gateway" in api.get("im", "pooled")["status"]["inferencePool"]["message"]

    # The pool follows the model's spec.
    api.run("patch", "im", "pooled", "--type=merge", "-p",
            '{"spec": {"inferencePool": {"endpointPicker": {"name": "epp-2", "port": 9003, "failureMode": "FailOpen"}}}}')
    wait_for(lambda: api.get("inferencepool", "pooled")["spec"]["endpointPickerRef"]["name"] == "epp-2", timeout=60,
             what="the pool to follow the model")
    ref = api.get("inferencepool", "pooled")["spec"]["endpointPickerRef"]
    assert (ref["port"], ref["failureMode"]) == ({"number": 9003}, "FailOpen")
    # A picker name the CRD would not take is refused with the model, before any pool is touched.
    refused = api.run("patch", "im", "pooled", "--type=merge", "-p",
                      '{"spec": {"inferencePool": {"endpointPicker": {"name": "EPP_2"}}}}', check=False)
    assert refused.returncode != 0 and "spec.inferencePool.endpointPicker.name" in refused.stderr
    # Turned off: the pool goes, and so does its status.
    api.run("patch", "im", "pooled", "--type=merge", "-p", '{"spec": {"inferencePool": {"enabled": false}}}')
    wait_for(lambda: api.get("inferencepool", "pooled") is None, timeout=60, what="the pool to be deleted")
    wait_for(lambda: "inferencePool" not in (api.get("im", "pooled").get("status") or {}), timeout=30,
             what="the pool's status to go")
    # Back on, then the model deleted: the pool is garbage-collected with it.
    api.run("patch", "im", "pooled", "--type=merge", "-p", '{"spec": {"inferencePool": {"enabled": true}}}')
    wait_for(lambda: api.get("inferencepool", "pooled"), timeout=60, what="the pool again")
    api.run("delete", "im", "pooled", "--wait=true", "--timeout=60s")
    wait_for(lambda: api.get("inferencepool", "pooled") is None, timeout=60, what="the pool to be collected")
    assert operator.forbidden() == []


def test_a_route_taking_a_models_own_name_is_reported_and_the_model_keeps_it(samples):
    api = samples
    api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "takeover"},
               "spec": {"model": "smollm2", "backends": [{"inferenceModel": "smollm2"}], "affinity": "none"}})
    ready = wait_for(lambda: (c := api.condition("mr", "takeover", "Ready")).get("reason") == "NameConflict" and c,
                     what="Ready/NameConflict on the route")
    assert ready["status"] == "False" and "InferenceModel 'smollm2'" in ready["message"]
    assert api.condition("mr", "takeover", "Degraded")["status"] == "True"
    assert _events(api, "takeover", "NameConflict")[0]["type"] == "Warning"
    assert api.table()["routes"]["smollm2"]["affinity"] == "prefix", "the model's own route, not the ModelRoute's"
    api.run("delete", "mr", "takeover", "--wait=false")


def test_a_weight_change_is_one_normal_event_on_the_route_and_a_touch_writes_none(samples):
    api = samples
    route = {"apiVersion": "sluice.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "weighted"},
             "spec": {"model": "weighted", "backends": [{"inferenceModel": "smollm2", "weight": 90}]}}
    api.apply(route)

    def changes():
        return sorted((e["type"], e["message"]) for e in _events(api, "weighted", "RoutesChanged"))

    wait_for(lambda: len(changes()) == 1, what="the new route's RoutesChanged event")
    route["spec"]["backends"][0]["weight"] = 50
    api.apply(route)
    wait_for(lambda: len(changes()) == 2, what="the weight change's RoutesChanged event")
    # The annotation recompiles the namespace (every ModelRoute event does, its status patches too) and changes no route.
    api.run("annotate", "mr", "weighted", "touched=yes")
    time.sleep(2)
    assert changes() == [("Normal", "backend smollm2 weight 90 → 50"), ("Normal", "now in the routing table: smollm2=90")]
    api.run("delete", "mr", "weighted")


def test_deletion_leaves_nothing_behind(setup, samples):
    api, operator = setup
    api.run("delete", "mr", "chat")
    api.run("delete", "im", "smollm2", "served", "--ignore-not-found")

    def gone():
        left = [k for k in ("deployment", "service", "poddisruptionbudget", "configmap") if
                api.get(k, "smollm2" if k != "configmap" else TABLE)]
        left += ["networkpolicy"] if api.get("networkpolicy", f"{RELEASE}-runtime") else []
        pods = api.run("get", "pods", "-o", "name").stdout.strip()
        return not left and not pods and True

    wait_for(gone, timeout=60, what="owned objects and the routing table to be deleted")
    assert operator.forbidden() == []


def _events(api: Api, name: str, reason: str) -> list[dict]:
    return json.loads(api.run("get", "events", "--field-selector", f"involvedObject.name={name},reason={reason}",
                              "-o", "json").stdout)["items"]


def test_an_image_under_no_allowed_prefix_gets_no_deployment(setup):
    """runtime.image outside --allowed-image-prefix: a condition and a Warning event, no Deployment; under it,
    the model runs."""
    api, _ = setup
    model = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "foreign-image"},
             "spec": {"model": {"source": "smollm2"}, "runtime": {"image": "docker.io/library/busybox:1"}}}
    api.apply(model)
    degraded = wait_for(lambda: (c := api.condition("im", "foreign-image", "Degraded")).get("reason")
                        == "ImageNotAllowed" and c, what="Degraded/ImageNotAllowed")
    assert "'docker.io/library/busybox:1' is not under a registry prefix" in degraded["message"]
    assert ALLOWED_IMAGES in degraded["message"]
    assert _events(api, "foreign-image", "ImageNotAllowed")[0]["type"] == "Warning"
    assert api.get("deployment", "foreign-image") is None
    # A look-alike of the allowed registry is another registry.
    api.apply({**model, "spec": {**model["spec"], "runtime": {"image": "ghcr.io/sluice-devx/runtime:1"}}})
    wait_for(lambda: "sluice-devx" in api.condition("im", "foreign-image", "Degraded").get("message", ""),
             what="the second refusal")
    assert api.get("deployment", "foreign-image") is None
    allowed = "ghcr.io/sluice-dev/sluice-runtime:0.1.0-cuda"
    api.apply({**model, "spec": {**model["spec"], "runtime": {"image": allowed}}})
    deployment = wait_for(lambda: api.get("deployment", "foreign-image"), what="the Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == allowed
    api.run("delete", "im", "foreign-image", "--wait=false")


def test_a_token_secret_must_be_opened_to_models(setup):
    """model.tokenSecret naming a Secret without sluice.dev/model-token=true (or none at all): a condition and a
    Warning event, no Deployment; once the platform team labels it, the model runs with the token."""
    api, _ = setup
    api.run("create", "secret", "generic", "hf-plain", "--from-literal=HF_TOKEN=hf_secret")
    model = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "gated"},
             "spec": {"model": {"source": "hf:org/gated", "tokenSecret": {"name": "missing"}}}}
    api.apply(model)
    wait_for(lambda: "does not exist" in api.condition("im", "gated", "Degraded").get("message", ""),
             what="the missing Secret reported")
    api.apply({**model, "spec": {"model": {"source": "hf:org/gated", "tokenSecret": {"name": "hf-plain"}}}})
    degraded = wait_for(lambda: (c := api.condition("im", "gated", "Degraded")).get("reason") == "TokenSecretNotAllowed"
                        and "not open to models" in c.get("message", "") and c, what="Degraded/TokenSecretNotAllowed")
    assert "sluice.dev/model-token=true" in degraded["message"]
    assert _events(api, "gated", "TokenSecretNotAllowed")[0]["type"] == "Warning"
    assert api.get("deployment", "gated") is None
    # The label as an annotation, or with another value, opens nothing.
    api.run("annotate", "secret", "hf-plain", "sluice.dev/model-token=true")
    api.run("label", "secret", "hf-plain", "sluice.dev/model-token=yes")
    time.sleep(3)
    assert api.get("deployment", "gated") is None
    api.run("label", "--overwrite", "secret", "hf-plain", "sluice.dev/model-token=true")
    deployment = wait_for(lambda: api.get("deployment", "gated"), timeout=60, what="the Deployment once opened")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    token = next(e for e in env if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-plain", "key": "HF_TOKEN"}
    api.run("delete", "im", "gated", "--wait=false")


def test_a_vllm_model_runs_its_engine_behind_the_guard(setup):
    api, _ = setup
    api.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "guarded"},
               "spec": {"model": {"source": "smollm2"}, "runtime": {"engine": "vllm"}, "replicas": 0,
                        "autoscaling": {"minReplicas": 0, "scaleToZeroAfterSeconds": 60}}})
    deployment = wait_for(lambda: api.get("deployment", "guarded"), what="the Deployment")
    runtime, guard = deployment["spec"]["template"]["spec"]["containers"]
    assert guard["name"] == "engine-guard" and guard["image"] == GUARD_IMAGE
    assert [m["mountPath"] for m in guard["volumeMounts"]] == [runtime_credential.MOUNT_DIR]
    assert runtime_credential.MOUNT_DIR not in [m["mountPath"] for m in runtime["volumeMounts"]]
    api.run("delete", "im", "guarded", "--wait=false")
