"""Test harness: runs opted-in pods of the simulated (kwok) nodes as local processes.

A pod labelled `sluice.dev/launch: "true"` and scheduled to a kwok node gets a loopback IP from kwok
but no container. The launcher claims it, starts each container's command with the pod's env as a
local process (argv may bind `$(POD_IP)`), reports readiness from the container's readinessProbe in
the pod's status, restarts exited processes per restartPolicy, and stops them when the pod goes away.
See e2e/README.md.

    python -m e2e.launcher --kubeconfig PATH [--namespace NS]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from e2e import podspec
from e2e.binaries import cache_dir
from e2e.probes import ProbeState

LAUNCH_LABEL = "sluice.dev/launch"
CLAIM_ANNOTATION = "sluice.dev/launcher"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
MAX_GRACE_SECONDS = 30
MAX_BACKOFF_SECONDS = 30
CONFIG_RETRY_SECONDS = 2
WATCH_SECONDS = 30


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(response) -> dict:
    return json.loads(response.data)


@dataclass
class ContainerRun:
    """One container's local process and what the pod status says about it."""

    spec: dict
    process: podspec.ProcessSpec | None = None
    popen: subprocess.Popen | None = None
    readiness: ProbeState | None = None
    liveness: ProbeState | None = None
    startup: ProbeState | None = None
    restarts: int = 0
    started_at: str | None = None
    restart_at: float = 0.0
    last_exit: dict | None = None
    finished: dict | None = None
    config_error: str | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def ready(self) -> bool:
        if not self.running or (self.startup and not self.startup.passed):
            return False
        return self.readiness.passed if self.readiness else True

    def status(self) -> dict:
        entry = {
            "name": self.spec["name"],
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.running and (self.startup is None or self.startup.passed),
            "restartCount": self.restarts,
        }
        if self.running:
            entry["state"] = {"running": {"startedAt": self.started_at}}
        elif self.finished:
            entry["state"] = {"terminated": self.finished}
        elif self.config_error:
            entry["state"] = {"waiting": {"reason": "CreateContainerConfigError", "message": self.config_error}}
        else:
            entry["state"] = {"waiting": {"reason": "CrashLoopBackOff" if self.restarts else "ContainerCreating"}}
        if self.last_exit:
            entry["lastState"] = {"terminated": self.last_exit}
        return entry


class PodRunner(threading.Thread):
    """Runs one pod's containers until the pod goes away or the launcher stops."""

    def __init__(self, launcher: "Launcher", pod: dict):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.launcher = launcher
        self.pod = pod
        self.stopping = threading.Event()
        self.containers = [ContainerRun(spec=c) for c in pod["spec"]["containers"]]
        self._reported: str | None = None
        self._transitions: dict[str, tuple[str, str]] = {}

    @property
    def key(self) -> tuple[str, str]:
        return self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]

    def update(self, pod: dict) -> None:
        self.pod = pod

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            while not self.stopping.is_set() and not self.pod.get("status", {}).get("podIP"):
                self.stopping.wait(0.1)
            if self.stopping.is_set():
                return
            while not self.stopping.is_set():
                self._tick()
                self._report()
                self.stopping.wait(0.2)
        except Exception as error:  # a harness bug must show up in the log, not kill the thread silently
            self.launcher.log(f"launcher: pod {self.key[0]}/{self.key[1]} failed: {error!r}")
        finally:
            for run in self.containers:
                self._terminate(run)
            self._report(final=True)

    def _log_path(self, run: ContainerRun) -> Path:
        namespace, name = self.key
        return self.launcher.log_dir / f"{namespace}_{name}_{run.spec['name']}.log"

    def _start(self, run: ContainerRun) -> None:
        now = time.monotonic()
        try:
            # Resolved at every start, as the kubelet does: a ConfigMap created late is picked up on retry.
            run.process = podspec.process_spec(
                self.pod, run.spec, self.launcher.read_object, self.launcher.venv_bin, dict(os.environ)
            )
            run.readiness = ProbeState.start(run.spec.get("readinessProbe"), run.spec, now)
            run.liveness = ProbeState.start(run.spec.get("livenessProbe"), run.spec, now)
            run.startup = ProbeState.start(run.spec.get("startupProbe"), run.spec, now)
            self.launcher.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self._log_path(run), "ab") as log:
                run.popen = subprocess.Popen(
                    run.process.argv,
                    env=run.process.env,
                    cwd=run.process.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except (ValueError, OSError) as error:  # ContainerConfigError included
            if run.config_error != str(error):
                self._event("Warning", "Failed", f"container {run.spec['name']}: {error}")
            run.config_error = str(error)
            run.restart_at = now + CONFIG_RETRY_SECONDS
            return
        run.config_error = None
        run.started_at = _now()
        run.finished = None
        self._event("Normal", "Started", f"container {run.spec['name']}: started {run.process.argv[0]} as pid {run.popen.pid}")

    def _exited(self, run: ContainerRun) -> None:
        code = run.popen.returncode
        record = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": _now(),
        }
        run.popen = None
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if self.stopping.is_set():
            run.finished = record
        elif policy == "Always" or (policy == "OnFailure" and code != 0):
            run.last_exit = record
            run.restarts += 1
            delay = min(2 ** (run.restarts - 1), MAX_BACKOFF_SECONDS)
            run.restart_at = time.monotonic() + delay
            self._event("Warning", "BackOff",
                        f"container {run.spec['name']} exited with code {record['exitCode']}; restarting in {delay} s")
        else:
            run.finished = record

    def _tick(self) -> None:
        pod_ip = self.pod["status"]["podIP"]
        for run in self.containers:
            if run.finished:
                continue
            if run.popen is None:
                if time.monotonic() >= run.restart_at:
                    self._start(run)
                continue
            if run.popen.poll() is not None:
                self._exited(run)
                continue
            if run.startup and not run.startup.passed:
                if self._probe(run, run.startup, "Startup", pod_ip):
                    self._terminate(run)
                continue
            if run.liveness and self._probe(run, run.liveness, "Liveness", pod_ip):
                self._terminate(run)
                continue
            if run.readiness:
                self._probe(run, run.readiness, "Readiness", pod_ip)

    def _probe(self, run: ContainerRun, probe: ProbeState, kind: str, pod_ip: str) -> bool:
        """Runs a due probe; True when it just failed for good (an event says why)."""
        if not probe.run_if_due(time.monotonic(), pod_ip, run.process.env, run.process.cwd):
            return False
        self._event("Warning", "Unhealthy", f"container {run.spec['name']}: {kind} probe failed: {probe.failure}")
        return True

    def _event(self, kind: str, reason: str, message: str) -> None:
        meta = self.pod["metadata"]
        now = _now()
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": kind, "reason": reason, "message": message,
            "source": {"component": "sluice-launcher"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.launcher.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as error:
            if error.status != 404:  # the namespace going away is no news
                self.launcher.log(f"launcher: event for {meta['namespace']}/{meta['name']} not recorded: {error.reason}")

    def _terminate(self, run: ContainerRun) -> None:
        if not run.running:
            return
        grace = min(self.pod["spec"].get("terminationGracePeriodSeconds", 30), MAX_GRACE_SECONDS)
        try:
            os.killpg(run.popen.pid, signal.SIGTERM)
            run.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(run.popen.pid, signal.SIGKILL)
            run.popen.wait()
        except ProcessLookupError:
            run.popen.wait()
        self._exited(run)

    def _condition(self, kind: str, ready: bool, reason: str) -> dict:
        status = "True" if ready else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            self._transitions[kind] = (status, _now())
        condition = {"type": kind, "status": status, "lastTransitionTime": self._transitions[kind][1]}
        if not ready:
            condition["reason"] = reason
        return condition

    def _report(self, final: bool = False) -> None:
        ready = not final and all(run.ready for run in self.containers)
        status = {
            "conditions": [
                self._condition("ContainersReady", ready, "ContainersNotReady"),
                self._condition("Ready", ready, "ContainersNotReady"),
            ],
            "containerStatuses": [run.status() for run in self.containers],
        }
        # A launcher stopping is not the pod ending: a terminal phase could never be left again.
        if not final and all(run.finished for run in self.containers):
            failed = any(run.finished["exitCode"] != 0 for run in self.containers)
            status["phase"] = "Failed" if failed else "Succeeded"
        digest = json.dumps([status["phase"] if "phase" in status else "", ready, status["containerStatuses"]], sort_keys=True)
        if digest == self._reported:
            return
        namespace, name = self.key
        try:
            self.launcher.core.patch_namespaced_pod_status(
                name, namespace, {"status": status},
                _content_type="application/strategic-merge-patch+json",
            )
            self._reported = digest
        except ApiException as error:
            if error.status != 404:
                self.launcher.log(f"launcher: status of {namespace}/{name} not updated: {error.reason}")


@dataclass
class Launcher:
    """Watches pods carrying `sluice.dev/launch=true` on kwok nodes and runs them; start()/stop() or a context."""

    kubeconfig: str
    namespace: str | None = None
    venv_bin: Path = field(default_factory=lambda: Path(sys.executable).parent)
    log_dir: Path = field(default_factory=lambda: cache_dir() / "launcher-logs")
    log: Callable[[str], None] = print

    def __post_init__(self):
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=self.kubeconfig))
        self.identity = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._runners: dict[str, PodRunner] = {}
        self._started: list[PodRunner] = []
        self._kwok_nodes: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self) -> "Launcher":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        # Each start gets its own event: a watch thread of an earlier start may still be winding down.
        self._stopping = threading.Event()
        threading.Thread(target=self._watch_forever, args=(self._stopping,), name="launcher-watch", daemon=True).start()

    def stop(self) -> None:
        """Stops the processes and releases the pods; the watch thread ends on its own at its next event or timeout."""
        with self._lock:
            self._stopping.set()
            started, running = list(self._started), list(self._runners.values())
            self._runners.clear()
            self._started.clear()
        for runner in started:
            runner.stop()
        for runner in started:
            runner.join(timeout=MAX_GRACE_SECONDS + 5)
        for runner in running:
            self._release(runner.pod)

    def read_object(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "ConfigMap":
                return self.core.read_namespaced_config_map(name, namespace).data or {}
            return podspec.decode_secret(self.core.read_namespaced_secret(name, namespace).data)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _list(self, **kwargs):
        selector = f"{LAUNCH_LABEL}=true"
        if self.namespace:
            return self.core.list_namespaced_pod, dict(namespace=self.namespace, label_selector=selector, **kwargs)
        return self.core.list_pod_for_all_namespaces, dict(label_selector=selector, **kwargs)

    def _watch_forever(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                method, kwargs = self._list(_preload_content=False)
                listing = _json(method(**kwargs))
                with self._lock:
                    if stopping.is_set():
                        return
                    for pod in listing["items"]:
                        self._handle("MODIFIED", pod)
                    for uid in set(self._runners) - {pod["metadata"]["uid"] for pod in listing["items"]}:
                        self._runners.pop(uid).stop()
                method, kwargs = self._list(resource_version=listing["metadata"]["resourceVersion"], timeout_seconds=WATCH_SECONDS)
                for event in watch.Watch().stream(method, **kwargs):
                    if event["type"] == "ERROR":
                        break  # usually an expired resourceVersion: list again
                    with self._lock:
                        if stopping.is_set():
                            return
                        self._handle(event["type"], event["raw_object"])
            except Exception as error:  # the API server restarting must not end the launcher
                if not stopping.is_set():
                    self.log(f"launcher: watch interrupted ({error!r}); listing again")
                    stopping.wait(1)

    def _handle(self, kind: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        ended = kind == "DELETED" or bool(pod["metadata"].get("deletionTimestamp"))
        runner = self._runners.get(uid)
        if runner is not None:
            if ended:
                self._runners.pop(uid).stop()
            else:
                runner.update(pod)
            return
        finished = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if ended or finished or not self._on_kwok_node(pod) or not self._claim(pod):
            return
        runner = PodRunner(self, pod)
        self._runners[uid] = runner
        self._started.append(runner)
        runner.start()

    def _on_kwok_node(self, pod: dict) -> bool:
        node = pod["spec"].get("nodeName")
        if not node:
            return False
        if node not in self._kwok_nodes:
            try:
                annotations = self.core.read_node(node).metadata.annotations or {}
            except ApiException:
                return False
            self._kwok_nodes[node] = annotations.get(KWOK_NODE_ANNOTATION) == "fake"
        return self._kwok_nodes[node]

    def _claim(self, pod: dict) -> bool:
        """Marks the pod as ours, so that two launchers on one cluster never run the same pod."""
        holder = (pod["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION)
        if holder == self.identity:
            return True
        if holder and not _holder_gone(holder):
            return False
        patch = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"], "annotations": {CLAIM_ANNOTATION: self.identity}}}
        try:
            self.core.patch_namespaced_pod(
                pod["metadata"]["name"], pod["metadata"]["namespace"], patch,
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status in (404, 409):
                return False  # gone, or another launcher was quicker; the next event tells
            raise
        return True

    def _release(self, pod: dict) -> None:
        patch = {"metadata": {"annotations": {CLAIM_ANNOTATION: None}}}
        try:
            self.core.patch_namespaced_pod(
                pod["metadata"]["name"], pod["metadata"]["namespace"], patch,
                _content_type="application/merge-patch+json",
            )
        except ApiException:
            pass  # the pod is gone, which is what releasing is for


def _holder_gone(holder: str) -> bool:
    host, _, rest = holder.partition(":")
    pid = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.launcher", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    parser.add_argument("--namespace", help="only run pods of this namespace (default: all)")
    parser.add_argument("--log-dir", type=Path, default=cache_dir() / "launcher-logs", help="default: %(default)s")
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error("--kubeconfig is required when KUBECONFIG is not set")
    launcher = Launcher(args.kubeconfig, namespace=args.namespace, log_dir=args.log_dir,
                        log=lambda line: print(line, flush=True))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    launcher.start()
    print(f"launcher: running pods labelled {LAUNCH_LABEL}=true (logs in {args.log_dir})", flush=True)
    done.wait()
    launcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
