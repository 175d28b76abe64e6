"""Runs one launched pod's containers as local processes and reports them in the pod's status and events.

The kubelet's part, for a process instead of a container: start with backoff per restartPolicy, probes,
`containerStatuses` and the Ready/ContainersReady conditions, SIGTERM then SIGKILL on the way out.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from localcluster import podspec
from localcluster.node import Node
from localcluster.probes import ProbeState
from localcluster.volumes import PodVolumes, service_account_kubeconfig

MAX_GRACE_SECONDS = 30
MAX_BACKOFF_SECONDS = 30
CONFIG_RETRY_SECONDS = 2
VOLUME_REFRESH_SECONDS = 1.0
# The kubelet's minimum time between SIGTERM and SIGKILL when a preStop hook used up the grace period.
MIN_TERM_SECONDS = 2


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    pod_ip: str | None = None  # the address the process was started with ($(POD_IP) in its argv and env)

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

    def __init__(self, node: Node, pod: dict):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.node = node
        self.pod = pod
        self.stopping = threading.Event()
        self.deleted = False
        self.containers = [ContainerRun(spec=c) for c in pod["spec"]["containers"]]
        self.volumes = PodVolumes(
            node.volume_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}", pod,
            node.read_object, node.issue_token,
        )
        self._volumes_ready = False
        self._refreshed_at = 0.0
        self._reported: str | None = None
        self._transitions: dict[str, tuple[str, str]] = {}

    @property
    def key(self) -> tuple[str, str]:
        return self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]

    def update(self, pod: dict) -> None:
        self.pod = pod
        self.volumes.pod = pod

    def stop(self, deleted: bool = False) -> None:
        """`deleted`: the pod is going away, so its object is removed once the processes have exited."""
        self.deleted = self.deleted or deleted
        self.stopping.set()

    def kill(self) -> None:
        """SIGKILL whatever still runs: the launcher leaves no process behind when it stops."""
        for run in self.containers:
            if run.running:
                try:
                    os.killpg(run.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def run(self) -> None:
        try:
            while not self.stopping.is_set() and not self.pod.get("status", {}).get("podIP"):
                self.stopping.wait(0.1)
            if self.stopping.is_set():
                return
            while not self.stopping.is_set():
                self._tick()
                self._refresh_volumes()
                self._report()
                self.stopping.wait(0.2)
        except Exception as error:  # a harness bug must show up in the log, not kill the thread silently
            self.node.log(f"launcher: pod {self.key[0]}/{self.key[1]} failed: {error!r}")
        finally:
            for run in self.containers:
                self._terminate(run)
            self._report(final=True)
            self.volumes.remove()
            if self.deleted:
                self._remove_object()

    def _remove_object(self) -> None:
        """The kubelet's last word on a deleted pod: with its containers stopped, the object may go."""
        namespace, name = self.key
        try:
            self.node.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0,
                body={"preconditions": {"uid": self.pod["metadata"]["uid"]}, "gracePeriodSeconds": 0},
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone already, or a new pod of the same name
                self.node.log(f"launcher: deleted pod {namespace}/{name} not removed: {error.reason}")

    def _refresh_volumes(self) -> None:
        now = time.monotonic()
        if not self._volumes_ready or now - self._refreshed_at < VOLUME_REFRESH_SECONDS:
            return
        self._refreshed_at = now
        try:
            self.volumes.refresh()
        except ApiException as error:  # the API server being away for a moment: the files stay as they are
            self.node.log(f"launcher: volumes of {self.key[0]}/{self.key[1]} not refreshed: {error.reason}")

    def _log_path(self, run: ContainerRun) -> Path:
        namespace, name = self.key
        return self.node.log_dir / f"{namespace}_{name}_{run.spec['name']}.log"

    def _start(self, run: ContainerRun) -> None:
        now = time.monotonic()
        pod = self.pod  # one version throughout: the watch thread may swap in a newer one meanwhile
        try:
            # Resolved at every start, as the kubelet does: a ConfigMap created late is picked up on retry.
            if not self._volumes_ready:
                self.volumes.setup()
                self._volumes_ready = True
            mounts = self.volumes.mounts(run.spec)
            kubeconfig = service_account_kubeconfig(
                mounts, self.node.cluster, self.key[0], self.volumes.root / f"kubeconfig-{run.spec['name']}"
            )
            run.process = podspec.process_spec(
                pod, run.spec, self.node.read_object, self.node.venv_bin, dict(os.environ),
                mounts=mounts, kubeconfig=kubeconfig, pinned_env=self.node.pinned_env,
            )
            run.readiness = ProbeState.start(run.spec.get("readinessProbe"), run.spec, now)
            run.liveness = ProbeState.start(run.spec.get("livenessProbe"), run.spec, now)
            run.startup = ProbeState.start(run.spec.get("startupProbe"), run.spec, now)
            self.node.log_dir.mkdir(parents=True, exist_ok=True)
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
        except (ValueError, OSError, ApiException) as error:  # ContainerConfigError included
            if run.config_error != str(error):
                self._event("Warning", "Failed", f"container {run.spec['name']}: {error}")
            run.config_error = str(error)
            run.restart_at = now + CONFIG_RETRY_SECONDS
            return
        run.config_error = None
        run.pod_ip = pod["status"]["podIP"]
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
            if run.pod_ip != pod_ip:
                self._readdressed(run, pod_ip)
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

    def _readdressed(self, run: ContainerRun, pod_ip: str) -> None:
        """kwok can give a pod a second address right after the first (two runs of its stage racing on a stale
        copy of the pod); a process started on the first would never pass a probe on the second, so it starts
        again at once on the address the pod has now, as the kubelet recreates a changed sandbox."""
        self._event("Normal", "SandboxChanged",
                    f"container {run.spec['name']}: pod IP changed from {run.pod_ip} to {pod_ip}; starting it again")
        os.killpg(run.popen.pid, signal.SIGKILL)
        run.popen.wait()
        run.popen = None
        run.restart_at = 0.0

    def _probe(self, run: ContainerRun, probe: ProbeState, kind: str, pod_ip: str) -> bool:
        """Runs a due probe; True when it just failed for good. An event tells each new way it fails."""
        failed = probe.run_if_due(time.monotonic(), pod_ip, run.process.env, run.process.cwd)
        news = probe.take_news()
        if news is not None:
            self._event("Warning", "Unhealthy", f"container {run.spec['name']}: {kind} probe failed: {news}")
        return failed

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
            self.node.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as error:
            if error.status != 404:  # the namespace going away is no news
                self.node.log(f"launcher: event for {meta['namespace']}/{meta['name']} not recorded: {error.reason}")

    def _pre_stop(self, run: ContainerRun, grace: float) -> None:
        """The container's preStop hook (sleep or exec), within the grace period, as the kubelet runs it."""
        hook = (run.spec.get("lifecycle") or {}).get("preStop") or {}
        if "sleep" in hook:
            time.sleep(min(hook["sleep"]["seconds"], grace))
        elif "exec" in hook:
            try:
                subprocess.run(hook["exec"]["command"], env=run.process.env, cwd=run.process.cwd,
                               capture_output=True, timeout=grace)
            except (OSError, subprocess.TimeoutExpired) as error:
                self._event("Warning", "FailedPreStopHook", f"container {run.spec['name']}: {error}")

    def _terminate(self, run: ContainerRun) -> None:
        if not run.running:
            return
        # The deletion's own grace period wins (`kubectl delete --grace-period`, 0 with --force), as in the kubelet.
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if not self.deleted:
            # The launcher stopping (its test ending), not the pod: a shorter wait, since nobody drains it.
            grace = min(grace, MAX_GRACE_SECONDS)
        deadline = time.monotonic() + grace
        self._pre_stop(run, grace)
        try:
            os.killpg(run.popen.pid, signal.SIGTERM)
            run.popen.wait(timeout=max(deadline - time.monotonic(), MIN_TERM_SECONDS))
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
        digest = json.dumps(status, sort_keys=True, default=str)
        if digest == self._reported:
            return
        namespace, name = self.key
        try:
            self.node.core.patch_namespaced_pod_status(
                name, namespace, {"status": status},
                _content_type="application/strategic-merge-patch+json",
            )
            self._reported = digest
        except ApiException as error:
            if error.status != 404:
                self.node.log(f"launcher: status of {namespace}/{name} not updated: {error.reason}")
