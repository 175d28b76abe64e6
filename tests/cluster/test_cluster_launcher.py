"""The launcher runs opted-in pods of the kwok node as local processes bound to their pod IP."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from fixtures.cluster import wait_for

pytestmark = pytest.mark.integration

SERVER = str(Path(__file__).with_name("gated_http_server.py"))
PORT = 8080


def _container(name: str, command: list[str], args: list[str] | None = None, **extra) -> dict:
    return {
        "name": name,
        "image": "local/process:1",
        "command": command,
        "args": args or [],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "GREETING", "value": "hello from $(POD_NAME)"},
        ],
        **extra,
    }


def _gated_server_deployment(name: str, gate: Path) -> str:
    container = _container(
        "server", ["python"], [SERVER, "$(POD_IP)", str(PORT), str(gate)],
        ports=[{"name": "http", "containerPort": PORT}],
        readinessProbe={"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1},
    )
    return yaml.safe_dump({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "sluice.dev/launch": "true"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 5},
            },
        },
    })


def _pods(cluster, namespace: str, selector: str) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.loads(response.read())
    except (OSError, urllib.error.URLError):
        return None


def _events(cluster, namespace: str, pod: str) -> list[tuple[str, str]]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}", "-o", "json").stdout
    return [(e["reason"], e["message"]) for e in json.loads(out)["items"]]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_pod_becomes_ready_only_once_its_server_answers_the_readiness_probe(kube_cluster, kube_namespace, launcher, tmp_path):
    gate = tmp_path / "ready"
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=_gated_server_deployment("gated", gate))

    pod = wait_for(lambda: next(iter(_pods(kube_cluster, kube_namespace, "app=gated")), None), what="the pod")
    name = pod["metadata"]["name"]
    pod_ip = wait_for(lambda: _pods(kube_cluster, kube_namespace, "app=gated")[0]["status"].get("podIP"), what="a pod IP")
    served = wait_for(lambda: _get(f"http://{pod_ip}:{PORT}/"), what="the local process to serve on the pod IP")
    assert served == {"pid": served["pid"], "greeting": f"hello from {name}", "pod_name": name, "bound_to": pod_ip}

    # Serving but failing its probe: several probe periods later the pod is still not Ready.
    time.sleep(3)
    pod = _pods(kube_cluster, kube_namespace, "app=gated")[0]
    assert not _ready(pod)
    assert pod["status"]["containerStatuses"][0]["state"].keys() == {"running"}
    available = kube_cluster.kubectl("get", "deployment", "gated", "-n", kube_namespace, "-o", "jsonpath={.status.availableReplicas}").stdout
    assert available in ("", "0")
    assert ("Unhealthy", "container server: Readiness probe failed: HTTP probe failed with statuscode: 503") in _events(kube_cluster, kube_namespace, name)

    gate.touch()
    wait_for(lambda: _ready(_pods(kube_cluster, kube_namespace, "app=gated")[0]), timeout=30, what="Ready after the gate opened")
    kube_cluster.kubectl("rollout", "status", "-n", kube_namespace, "deployment/gated", "--timeout=30s")

    # Readiness keeps following the probe: closing the gate takes the pod out of service again.
    gate.unlink()
    wait_for(lambda: not _ready(_pods(kube_cluster, kube_namespace, "app=gated")[0]), timeout=30, what="NotReady after the gate closed")


def _serving_gated_pod(kube_cluster, namespace: str, name: str, tmp_path: Path) -> dict:
    """The pod of a one-replica gated server whose gate is open, once its rollout finished."""
    gate = tmp_path / "ready"
    gate.touch()
    kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_gated_server_deployment(name, gate))
    kube_cluster.kubectl("rollout", "status", "-n", namespace, f"deployment/{name}", "--timeout=60s")
    return _pods(kube_cluster, namespace, f"app={name}")[0]


def test_deleting_the_pod_stops_its_process(kube_cluster, kube_namespace, launcher, tmp_path):
    pod = _serving_gated_pod(kube_cluster, kube_namespace, "doomed", tmp_path)
    first = _get(f"http://{pod['status']['podIP']}:{PORT}/")
    assert first is not None and _alive(first["pid"])

    kube_cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", kube_namespace, "--wait=true", "--timeout=30s")
    wait_for(lambda: not _alive(first["pid"]), timeout=15, what="the deleted pod's process to stop")

    # The ReplicaSet's replacement gets a process of its own.
    kube_cluster.kubectl("rollout", "status", "-n", kube_namespace, "deployment/doomed", "--timeout=60s")
    replacement = wait_for(
        lambda: [p for p in _pods(kube_cluster, kube_namespace, "app=doomed") if p["metadata"]["name"] != pod["metadata"]["name"] and _ready(p)],
        what="a Ready replacement pod",
    )[0]
    second = wait_for(lambda: _get(f"http://{replacement['status']['podIP']}:{PORT}/"), what="the replacement to serve")
    assert second["pid"] != first["pid"] and second["pod_name"] == replacement["metadata"]["name"]


def _bare_pod(name: str, container: dict) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"sluice.dev/launch": "true"}},
        "spec": {"containers": [container], "restartPolicy": "Always"},
    })


def test_a_crashing_process_is_restarted_and_reported(kube_cluster, kube_namespace, launcher):
    crash = _container("crash", ["python"], ["-c", "import sys; sys.exit(3)"])
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=_bare_pod("crasher", crash))

    def restarted():
        pod = json.loads(kube_cluster.kubectl("get", "pod", "crasher", "-n", kube_namespace, "-o", "json").stdout)
        statuses = pod["status"].get("containerStatuses") or [{}]
        return statuses[0] if statuses[0].get("restartCount", 0) >= 2 else None

    status = wait_for(restarted, timeout=30, what="two restarts")
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["ready"] is False
    assert ("BackOff", "container crash exited with code 3; restarting in 1 s") in _events(kube_cluster, kube_namespace, "crasher")


def test_an_unrunnable_command_is_reported_in_the_pod_status(kube_cluster, kube_namespace, launcher):
    missing = _container("main", ["no-such-program-anywhere"])
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=_bare_pod("broken", missing))

    def waiting():
        pod = json.loads(kube_cluster.kubectl("get", "pod", "broken", "-n", kube_namespace, "-o", "json").stdout)
        state = ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get("waiting", {})
        return state if state.get("reason") == "CreateContainerConfigError" else None

    state = wait_for(waiting, timeout=30, what="CreateContainerConfigError")
    assert "no-such-program-anywhere" in state["message"]
    assert [reason for reason, message in _events(kube_cluster, kube_namespace, "broken") if "no-such-program-anywhere" in message] == ["Failed"]


def test_a_stopped_launcher_hands_its_pods_to_the_next_one(kube_cluster, kube_namespace, tmp_path):
    from localcluster.launcher import CLAIM_ANNOTATION, Launcher

    gate = tmp_path / "ready"
    gate.touch()
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=_gated_server_deployment("handover", gate))
    with Launcher(kube_cluster.kubeconfig, namespace=kube_namespace, log_dir=tmp_path / "logs"):
        kube_cluster.kubectl("rollout", "status", "-n", kube_namespace, "deployment/handover", "--timeout=60s")
        pod = _pods(kube_cluster, kube_namespace, "app=handover")[0]
        first = _get(f"http://{pod['status']['podIP']}:{PORT}/")
    assert first is not None and not _alive(first["pid"])
    pod = _pods(kube_cluster, kube_namespace, "app=handover")[0]
    assert not _ready(pod)
    assert CLAIM_ANNOTATION not in pod["metadata"].get("annotations", {})

    # The command-line launcher, in a process of its own, takes the pod over.
    repo = Path(__file__).resolve().parents[2]
    cli = subprocess.Popen([sys.executable, "-m", "localcluster.launcher", "--kubeconfig", kube_cluster.kubeconfig,
                            "--namespace", kube_namespace, "--log-dir", str(tmp_path / "logs")], cwd=repo)
    try:
        wait_for(lambda: _ready(_pods(kube_cluster, kube_namespace, "app=handover")[0]), timeout=30, what="Ready under the new launcher")
        second = _get(f"http://{pod['status']['podIP']}:{PORT}/")
        assert second is not None and second["pid"] != first["pid"]
    finally:
        cli.terminate()
        assert cli.wait(timeout=30) == 0
    assert not _alive(second["pid"])


def test_a_pod_claimed_by_a_dead_launcher_is_taken_over_and_a_live_claim_is_respected(kube_cluster, kube_namespace, launcher):
    from localcluster.launcher import CLAIM_ANNOTATION

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    claims = {"orphan": f"{host}:{dead.pid}:gone", "taken": f"{host}:{os.getpid()}:someone-else"}
    for name, holder in claims.items():
        pod = yaml.safe_load(_bare_pod(name, _container("main", ["python"], ["-c", "import time; time.sleep(600)"])))
        pod["metadata"]["annotations"] = {CLAIM_ANNOTATION: holder}
        kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(pod))

    def pod(name):
        return json.loads(kube_cluster.kubectl("get", "pod", name, "-n", kube_namespace, "-o", "json").stdout)

    wait_for(lambda: _ready(pod("orphan")), timeout=30, what="the orphaned pod to be run")
    assert pod("orphan")["metadata"]["annotations"][CLAIM_ANNOTATION] == launcher.identity
    assert pod("taken")["metadata"]["annotations"][CLAIM_ANNOTATION] == claims["taken"]
    assert not _ready(pod("taken"))


def test_volumes_follow_their_config_map_and_the_process_has_its_service_account_only(kube_cluster, kube_namespace, launcher):
    kube_cluster.kubectl("create", "configmap", "table", "-n", kube_namespace, "--from-literal=table.json=one")
    server = str(Path(__file__).with_name("volume_http_server.py"))
    container = _container(
        "server", ["python"], [server, "$(POD_IP)", str(PORT), "/etc/table/table.json"],
        volumeMounts=[{"name": "table", "mountPath": "/etc/table", "readOnly": True}],
        lifecycle={"preStop": {"sleep": {"seconds": 2}}},
    )
    pod = yaml.safe_load(_bare_pod("mounted", container))
    pod["spec"]["volumes"] = [{"name": "table", "configMap": {"name": "table"}}]
    pod["spec"]["terminationGracePeriodSeconds"] = 10
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(pod))
    kube_cluster.kubectl("wait", "-n", kube_namespace, "--for=condition=Ready", "pod/mounted", "--timeout=60s")
    ip = _pods(kube_cluster, kube_namespace, "sluice.dev/launch=true")[0]["status"]["podIP"]

    served = wait_for(lambda: _get(f"http://{ip}:{PORT}/file"), what="the mounted file")
    assert served["content"] == "one" and not served["path"].startswith("/etc/table")
    # The ServiceAccount admission plugin mounted the default account's token; that is who the process is.
    assert _get(f"http://{ip}:{PORT}/whoami") == {"user": f"system:serviceaccount:{kube_namespace}:default"}

    patch = json.dumps({"data": {"table.json": "two"}})
    kube_cluster.kubectl("patch", "configmap", "table", "-n", kube_namespace, "--type=merge", "-p", patch)
    wait_for(lambda: (_get(f"http://{ip}:{PORT}/file") or {}).get("content") == "two", timeout=10,
              what="the new ConfigMap contents in the volume")

    # preStop runs before SIGTERM: the process still serves for the hook's 2 seconds after the deletion, and
    # the pod object (its IP, its token) stays until the process has exited.
    started = time.monotonic()
    kube_cluster.kubectl("delete", "pod", "mounted", "-n", kube_namespace, "--wait=false")
    time.sleep(1)
    assert _get(f"http://{ip}:{PORT}/file") is not None, "SIGTERM came before the preStop sleep ended"
    assert _get(f"http://{ip}:{PORT}/whoami") == {"user": f"system:serviceaccount:{kube_namespace}:default"}
    wait_for(lambda: _get(f"http://{ip}:{PORT}/file") is None, timeout=15, what="the process to stop")
    assert time.monotonic() - started >= 2
    kube_cluster.kubectl("wait", "-n", kube_namespace, "--for=delete", "pod/mounted", "--timeout=10s")
    assert not any(Path(launcher.volume_dir).glob(f"{kube_namespace}_mounted_*")), "the pod's volumes are removed"


def test_a_deleted_pod_no_launcher_runs_goes_when_its_grace_period_ends(kube_cluster, kube_namespace):
    pod = yaml.safe_load(_bare_pod("orphan", _container("main", ["python"], ["-c", "pass"])))
    pod["spec"]["terminationGracePeriodSeconds"] = 3
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(pod))
    wait_for(lambda: _pods(kube_cluster, kube_namespace, "sluice.dev/launch=true"), what="the pod")
    started = time.monotonic()
    kube_cluster.kubectl("delete", "pod", "orphan", "-n", kube_namespace, "--wait=false")
    kube_cluster.kubectl("wait", "-n", kube_namespace, "--for=delete", "pod/orphan", "--timeout=30s")
    assert time.monotonic() - started >= 2, "kwok removed a launched pod before its grace period was over"


def test_a_pod_given_a_new_address_gets_its_process_started_again_on_it(kube_cluster, kube_namespace, launcher, tmp_path):
    """kwok sometimes runs its stage twice on a new pod and hands out a second IP right after the first."""
    pod = _serving_gated_pod(kube_cluster, kube_namespace, "moved", tmp_path)
    old_ip = pod["status"]["podIP"]
    first = wait_for(lambda: _get(f"http://{old_ip}:{PORT}/"), what="the process on the first address")
    # Outside kwok's pod range (127.1.0.0/24), so it can never be the address kwok gave the pod: once a
    # long test run had handed out .250, the "new" address was the old one and nothing moved.
    new_ip = "127.1.1.250"
    kube_cluster.kubectl("patch", "pod", pod["metadata"]["name"], "-n", kube_namespace, "--subresource=status",
                         "--type=merge", "-p", json.dumps({"status": {"podIP": new_ip, "podIPs": [{"ip": new_ip}]}}))
    second = wait_for(lambda: _get(f"http://{new_ip}:{PORT}/"), timeout=30, what="the process on the new address")
    assert second["bound_to"] == new_ip and second["pid"] != first["pid"] and not _alive(first["pid"])
    assert any(reason == "SandboxChanged" for reason, _ in _events(kube_cluster, kube_namespace, pod["metadata"]["name"]))


def test_a_deleted_pod_gets_its_whole_grace_period_past_thirty_seconds(kube_cluster, kube_namespace, launcher, tmp_path):
    """A runtime drains its streams for the pod's grace period; the launcher once cut every pod at 30 s."""
    done = tmp_path / "drained"
    # Ignores SIGTERM as a draining server does, and finishes its work 33 s after it.
    script = ("import signal, sys, time, pathlib\n"
              "def drain(*_):\n"
              "    time.sleep(33); pathlib.Path(sys.argv[1]).write_text('done'); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, drain)\n"
              "while True: time.sleep(1)\n")
    pod = yaml.safe_load(_bare_pod("draining", _container("main", ["python"], ["-c", script, str(done)])))
    pod["spec"]["terminationGracePeriodSeconds"] = 45
    kube_cluster.kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(pod))
    wait_for(lambda: any(c.get("state", {}).get("running") for p in _pods(kube_cluster, kube_namespace,
                                                                        "sluice.dev/launch=true")
                         for c in p["status"].get("containerStatuses", [])), what="the process to run")
    kube_cluster.kubectl("delete", "pod", "draining", "-n", kube_namespace, "--wait=false")
    kube_cluster.kubectl("wait", "-n", kube_namespace, "--for=delete", "pod/draining", "--timeout=60s")
    assert done.is_file(), "the process was killed before its grace period ended"
