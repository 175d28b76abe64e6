"""Only a model's own replicas are its replicas: look-alike pods against the real API server.

A Deployment built by the operator's builder runs under the controller-manager, which makes its ReplicaSet and
pods; kwok marks them Ready at 127.x addresses, where the test listens as the runtime would. Beside them, pods
anyone allowed to create pods could make: the model's labels and pod spec with no owner, and under a ReplicaSet
of their own. The operator's own code paths (routing table, adapter sync, autoscaler) run in-process against
the API server. Then the ownership check itself meets the real pod with one field forged at a time.
"""
from __future__ import annotations

import asyncio
import copy
import json
import uuid
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from fixtures.cluster import wait_for
from sluice_contracts import runtime_credential
from sluice_contracts.engines import LOAD_GAUGES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODEL = "trusted"
CREDENTIAL = "release-key-for-the-test"
SPEC = {"model": {"source": "smollm2"}, "adapters": [{"name": "tone", "source": "file:///adapters/tone"}],
        "autoscaling": {"minReplicas": 1, "maxReplicas": 1}}


def _kubectl_json(cluster, namespace: str, *args: str) -> dict:
    return json.loads(cluster.kubectl("-n", namespace, *args, "-o", "json").stdout)


def _ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return bool(pod["status"].get("podIP")) and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _pods(cluster, namespace: str) -> dict[str, dict]:
    items = _kubectl_json(cluster, namespace, "get", "pods", "-l", "sluice.dev/inference-model")["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def _bare(pod: dict, name: str, owner: dict | None = None, drop: str = "pod-template-hash") -> dict:
    """A pod of the same labels (less `drop`) and spec as `pod`, written by hand. Without the template hash the
    ReplicaSet's selector does not match it, so the controller neither adopts nor removes it."""
    spec = copy.deepcopy(pod["spec"])
    for key in ("nodeName", "serviceAccount"):
        spec.pop(key, None)
    spec["volumes"] = [v for v in spec.get("volumes") or [] if not v["name"].startswith("kube-api-access-")]
    for container in spec["containers"]:
        container["volumeMounts"] = [m for m in container.get("volumeMounts") or []
                                     if not m["name"].startswith("kube-api-access-")]
    meta = {"name": name, "labels": {k: v for k, v in pod["metadata"]["labels"].items() if k != drop}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Runtime:
    """Listens where kwok put a pod, answering as the runtime's adapter API and /metrics do; records each call."""

    def __init__(self, address: str):
        self.address, self.calls = address, []
        self.runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.calls.append((request.method, request.path, request.headers.get("Authorization")))
        if request.path == "/metrics":
            return web.Response(text="".join(f"{gauge} 0\n" for gauge in LOAD_GAUGES["sluice"].names()))
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        return web.json_response({})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.address, 8000).start()

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
def lookalikes(kube_cluster, kube_namespace):
    """(namespace, the model's own pod, look-alike pods by name) once all are Ready."""
    import kubernetes

    from sluice_operator.builders import Owner, build_deployment
    from sluice_operator.crd import InferenceModelSpec

    cluster, ns = kube_cluster, kube_namespace
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s", "crd/inferencemodels.sluice.dev")
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": MODEL}, "spec": SPEC}))
    uid = _kubectl_json(cluster, ns, "get", "im", MODEL)["metadata"]["uid"]
    deployment = build_deployment(Owner(MODEL, ns, uid), InferenceModelSpec.model_validate(SPEC))
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(deployment))
    own = wait_for(lambda: [p for p in _pods(cluster, ns).values() if _ready(p)], what="the model's own pod")[0]

    # A ReplicaSet of its own with the model's label, but not the Deployment's selector (which would adopt it).
    decoy_template = _bare(own, "unused", drop="app.kubernetes.io/name")
    labels = decoy_template["metadata"]["labels"]
    decoy = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "decoy", "labels": labels},
             "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels}, "spec": decoy_template["spec"]}}}
    docs = [_bare(own, "no-owner"), decoy]
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
    pods = wait_for(lambda: (found := _pods(cluster, ns)) and len(found) == 3 and all(map(_ready, found.values()))
                    and found, what="the look-alike pods to be Ready")
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig))
    return ns, own, {name: pod for name, pod in pods.items() if name != own["metadata"]["name"]}


def test_only_the_models_own_replicas_get_requests_the_credential_and_the_table(lookalikes):
    from sluice_operator.handlers import adapters, autoscaling, routing
    from sluice_operator.kube import Kube
    from sluice_operator.state import OperatorState

    ns, own, others = lookalikes
    assert {p["metadata"]["name"][:5] for p in others.values()} == {"no-ow", "decoy"}
    own_ip = own["status"]["podIP"]

    async def scenario():
        state = OperatorState(kube=Kube(), autoscale_interval=1.0, credential=CREDENTIAL)
        listeners = {name: Runtime(pod["status"]["podIP"]) for name, pod in {**others, "own": own}.items()}
        for listener in listeners.values():
            await listener.start()
        try:
            listed = await state.kube.list_pods(ns, "sluice.dev/inference-model")
            await adapters.sync(state, ns, MODEL)
            model = await state.kube.get_custom("inferencemodels", ns, MODEL)
            await autoscaling.tick(state, model, ns, MODEL, model["metadata"]["uid"])
            await routing._compile_namespace(state, ns)
        finally:
            for listener in listeners.values():
                await listener.stop()
        return state, listed, listeners

    state, listed, listeners = asyncio.run(scenario())
    assert [p["metadata"]["name"] for p in listed] == [own["metadata"]["name"]]
    own_calls = listeners.pop("own").calls
    presented = runtime_credential.header_value(runtime_credential.for_namespace(CREDENTIAL, ns))
    assert ("GET", "/v1/models", presented) in own_calls and ("GET", "/metrics", None) in own_calls
    assert {name: listener.calls for name, listener in listeners.items()} == {name: [] for name in listeners}
    assert state.decisions[(ns, MODEL)]["metrics"]["podsScraped"] == 1
    assert list(state.adapters[(ns, MODEL)].replicas) == [own["metadata"]["name"]]
    table = json.loads(state.tables[ns].to_json())
    assert table["routes"][MODEL]["backends"][0]["endpoints"] == [f"http://{own_ip}:8000"]


def test_a_pod_under_the_real_replicaset_must_run_its_template(lookalikes, kube_cluster):
    """Pods that name the model's own ReplicaSet but run something else, or another template's hash, or
    whose ReplicaSet the Deployment has rolled past twice: the API server's objects, each changed in one field."""
    from sluice_operator.pods import replicas

    ns, own, _ = lookalikes
    get = lambda kind: _kubectl_json(kube_cluster, ns, "get", kind)["items"]  # noqa: E731
    replica_sets, deployments, models = get("replicasets"), get("deployments"), get("inferencemodels")
    assert replicas([own], replica_sets, deployments, models) == [own]

    other_args = copy.deepcopy(own)
    container = other_args["spec"]["containers"][0]
    container["args"] = [*(container.get("args") or []), "--log-prompts"]
    other_image = copy.deepcopy(own)
    other_image["spec"]["containers"][0]["image"] = "registry.example/evil:1"
    extra_volume = copy.deepcopy(own)
    extra_volume["spec"]["volumes"].append({"name": "host", "emptyDir": {}})
    other_hash = copy.deepcopy(own)
    other_hash["metadata"]["labels"]["pod-template-hash"] = "abcdef123"
    other_model = copy.deepcopy(own)
    other_model["metadata"]["labels"]["sluice.dev/inference-model"] = "decoy"
    # A controller reference to a ReplicaSet that does not exist (the garbage collector removes such a pod, but
    # not at once), and to one that is not the Deployment's, under the real one's name.
    missing_owner = copy.deepcopy(own)
    missing_owner["metadata"]["ownerReferences"][0]["uid"] = str(uuid.uuid4())
    decoy_owner = copy.deepcopy(own)
    decoy_owner["metadata"]["ownerReferences"][0]["uid"] = next(
        rs["metadata"]["uid"] for rs in replica_sets if rs["metadata"]["name"] == "decoy")
    two_controllers = copy.deepcopy(own)
    two_controllers["metadata"]["ownerReferences"].append(
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "decoy", "uid": str(uuid.uuid4()), "controller": True})
    for pod in (other_args, other_image, extra_volume, other_hash, other_model, missing_owner, decoy_owner,
                two_controllers):
        assert replicas([pod], replica_sets, deployments, models) == []

    # A Deployment not controlled by the model (another uid), and a model recreated under a new uid.
    assert replicas([own], replica_sets, deployments, [{"metadata": {"name": MODEL, "uid": str(uuid.uuid4())}}]) == []
    # One rollout later its pods still serve; two rollouts later they are no longer believed.
    second = copy.deepcopy(next(rs for rs in replica_sets if rs["metadata"]["name"].startswith(f"{MODEL}-")))
    second["metadata"].update(uid=str(uuid.uuid4()), name=f"{MODEL}-second")
    second["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "2"
    rolled = copy.deepcopy(deployments)
    rolled[0]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "2"
    assert replicas([own], [*replica_sets, second], rolled, models) == [own]
    rolled[0]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"
    assert replicas([own], [*replica_sets, second], rolled, models) == []
