"""Test harness: runs opted-in pods of the simulated (kwok) nodes as local processes.

A pod labelled `sluice.dev/launch: "true"` and scheduled to a kwok node gets a loopback IP from kwok
but no container. The launcher claims it, starts each container's command with the pod's env as a
local process (argv may bind `$(POD_IP)`), reports readiness from the container's readinessProbe in
the pod's status, restarts exited processes per restartPolicy, and stops them when the pod goes away.
The per-pod work is localcluster/pod_runner.py, which gets only what node.py gives it. See localcluster/README.md.

    python -m localcluster.launcher --kubeconfig PATH [--namespace NS]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from localcluster.binaries import cache_dir
from localcluster.node import Node
from localcluster.pod_runner import MAX_GRACE_SECONDS, PodRunner

LAUNCH_LABEL = "sluice.dev/launch"
CLAIM_ANNOTATION = "sluice.dev/launcher"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
WATCH_SECONDS = 30


def _json(response) -> dict:
    return json.loads(response.data)


@dataclass
class Launcher:
    """Watches pods carrying `sluice.dev/launch=true` on kwok nodes and runs them; start()/stop() or a context."""

    kubeconfig: str
    namespace: str | None = None
    venv_bin: Path = field(default_factory=lambda: Path(sys.executable).parent)
    log_dir: Path = field(default_factory=lambda: cache_dir() / "launcher-logs")
    volume_dir: Path = field(default_factory=lambda: cache_dir() / "launcher-volumes")
    log: Callable[[str], None] = print
    # Set in every process after the pod's own env: a host directory standing in for what a real node would
    # give the pod from a volume the launcher cannot share between pods (a model cache converted once).
    pinned_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=self.kubeconfig))
        self.node = Node(self.core, _cluster_entry(Path(self.kubeconfig)), self.venv_bin, self.log_dir, self.volume_dir,
                         self.pinned_env, self.log)
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
            if runner.is_alive():  # a deleted pod still draining within its own, longer grace period
                runner.kill()
                runner.join(timeout=5)
        for runner in running:
            self._release(runner.pod)

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
                        self._runners.pop(uid).stop(deleted=True)
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
            runner.update(pod)  # a deleted pod's last state carries its grace period
            if ended:
                self._runners.pop(uid).stop(deleted=True)
            return
        finished = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if ended or finished or not self._on_kwok_node(pod) or not self._claim(pod):
            return
        runner = PodRunner(self.node, pod)
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


def _cluster_entry(kubeconfig: Path) -> dict:
    """The current context's cluster (server and CA) with file paths made absolute, for the pods' kubeconfigs."""
    document = yaml.safe_load(kubeconfig.read_text())
    current = document.get("current-context")
    context = next(c["context"] for c in document["contexts"] if c["name"] == current)
    cluster = dict(next(c["cluster"] for c in document["clusters"] if c["name"] == context["cluster"]))
    if cluster.get("certificate-authority"):
        cluster["certificate-authority"] = str((kubeconfig.parent / cluster["certificate-authority"]).resolve())
    return cluster


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
    parser = argparse.ArgumentParser(prog="python -m localcluster.launcher", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    parser.add_argument("--namespace", help="only run pods of this namespace (default: all)")
    parser.add_argument("--log-dir", type=Path, default=cache_dir() / "launcher-logs", help="default: %(default)s")
    parser.add_argument("--pin-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in every process after the pod's own env (repeatable)")
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error("--kubeconfig is required when KUBECONFIG is not set")
    pinned = dict(item.split("=", 1) for item in args.pin_env if "=" in item)
    if len(pinned) != len(args.pin_env):
        parser.error("--pin-env takes NAME=VALUE")
    launcher = Launcher(args.kubeconfig, namespace=args.namespace, log_dir=args.log_dir,
                        log=lambda line: print(line, flush=True), pinned_env=pinned)
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
