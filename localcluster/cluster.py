"""Starts and stops a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) on loopback.

kwokctl's binary runtime runs the components as local processes, with generated certificates,
service-account signing keys, RBAC and admission on. One simulated node, whose pods get
loopback addresses from its podCIDR, is created on top.

    python -m localcluster.cluster up|down|status|build
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from localcluster import binaries, node_network

DEFAULT_NAME = "sluice"
NODE_NAME = "kwok-node-0"
STAGES_FILE = Path(__file__).resolve().parent / "kwok" / "stages.yaml"
# 127.0.0.0/8 is all local on Linux, so every pod address can be bound by a local process.
POD_CIDR = "127.1.0.0/24"

NODE_MANIFEST = f"""
apiVersion: v1
kind: Node
metadata:
  name: {NODE_NAME}
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: {NODE_NAME}
    kubernetes.io/os: linux
    type: kwok
spec:
  podCIDR: {POD_CIDR}
  podCIDRs: [{POD_CIDR}]
"""


class ClusterError(RuntimeError):
    pass


@dataclass
class LocalCluster:
    """A named cluster whose binaries and state live under `cache` (default: $SLUICE_CLUSTER_CACHE)."""

    name: str = DEFAULT_NAME
    cache: Path = field(default_factory=binaries.cache_dir)
    kubeconfig_path: Path | None = None
    log: Callable[[str], None] = print

    @property
    def bin_dir(self) -> Path:
        return self.cache / "bin"

    @property
    def kubeconfig(self) -> str:
        if self.kubeconfig_path is not None:
            return str(self.kubeconfig_path)
        suffix = "" if self.name == DEFAULT_NAME else f"-{self.name}"
        return str(self.cache / f"kubeconfig{suffix}")

    @property
    def kwok_workdir(self) -> Path:
        return self.cache / "kwok"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["KWOK_WORKDIR"] = str(self.kwok_workdir)
        env["KWOK_KUBE_VERSION"] = binaries.KUBERNETES_VERSION
        # The helm client keeps its own state; keep it with the cluster, not in the user's home.
        env.setdefault("HELM_CACHE_HOME", str(self.cache / "helm/cache"))
        env.setdefault("HELM_CONFIG_HOME", str(self.cache / "helm/config"))
        env.setdefault("HELM_DATA_HOME", str(self.cache / "helm/data"))
        return env

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120):
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", self.kubeconfig, *args]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()}")
        return result

    def _kwokctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / "kwokctl"), "--name", self.name, *args]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise ClusterError(f"kwokctl {' '.join(args)} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
        return result

    @contextmanager
    def _locked(self, what: str):
        # Several test sessions may share one cache; only one of them builds or starts a cluster at a time.
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / f".lock-{what}", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def build(self) -> dict[str, float]:
        with self._locked("build"):
            return binaries.build(self.bin_dir, log=self.log)

    def is_running(self) -> bool:
        if not (self.kwok_workdir / "clusters" / self.name).exists() or not Path(self.kubeconfig).exists():
            return False
        probe = self.kubectl("get", "--raw", "/readyz", check=False, timeout=15)
        return probe.returncode == 0 and probe.stdout.strip() == "ok"

    @property
    def _settings_file(self) -> Path:
        return self.kwok_workdir / "clusters" / self.name / "sluice-settings"

    @property
    def pki_dir(self) -> Path:
        """The cluster's CA, and the admin certificate the API server serves with and presents to kubelets."""
        return self.kwok_workdir / "clusters" / self.name / "pki"

    def _kwokctl_config(self) -> str:
        """kwokctl settings that have no command-line flag. Every component binds to loopback (kwokctl binds to
        0.0.0.0 unless told otherwise). For the real node (localcluster/real_node.py), the API server is
        advertised at the node's address, with the Service range and certificate names its pods reach it by,
        and presents the admin certificate to the kubelet; kwok fakes only the nodes marked as its own."""
        pki = self.pki_dir
        cluster = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": {"bindAddress": "127.0.0.1",
                        "kubeApiserverCertSANs": [node_network.API_SERVICE_IP, node_network.NODE_IP],
                        # Only the default cluster has a real node; other clusters may run beside it.
                        **({"kubeApiserverPort": node_network.API_SERVER_PORT} if self.name == DEFAULT_NAME
                           else {})},
            "componentsPatches": [
                {"name": "kube-apiserver", "extraArgs": [
                    {"key": "advertise-address", "value": node_network.NODE_IP},
                    {"key": "service-cluster-ip-range", "value": node_network.SERVICE_CIDR},
                    {"key": "kubelet-client-certificate", "value": str(pki / "admin.crt")},
                    {"key": "kubelet-client-key", "value": str(pki / "admin.key")},
                    # The node's name resolves nowhere here; its address does.
                    {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
                ]},
                {"name": "kube-controller-manager", "extraArgs": [
                    {"key": "service-cluster-ip-range", "value": node_network.SERVICE_CIDR},
                    # Each controller acts as its own service account, as kubeadm and managed clusters run them:
                    # admission policies tell a ReplicaSet's pods from anyone else's by that name.
                    {"key": "use-service-account-credentials", "value": "true"},
                ]},
                {"name": "kwok-controller", "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false"},
                    {"key": "manage-nodes-with-annotation-selector", "value": "kwok.x-k8s.io/node=fake"},
                ]},
            ],
        }
        return json.dumps(cluster) + "\n"

    def _settings(self) -> str:
        """What the running cluster was made from, to notice a cluster left over from older settings."""
        digest = hashlib.sha256(STAGES_FILE.read_bytes() + NODE_MANIFEST.encode())
        digest.update(self._kwokctl_config().encode())
        digest.update(" ".join(self._create_args()).encode())
        digest.update((self.bin_dir / ".built.json").read_bytes())
        return digest.hexdigest()

    def up(self) -> float:
        """Builds if needed, then starts the cluster unless it already runs; returns seconds spent starting."""
        self.build()
        with self._locked(f"cluster-{self.name}"):
            if self.is_running():
                recorded = self._settings_file.read_text() if self._settings_file.exists() else ""
                if recorded != self._settings():
                    # Restarting it here would break other sessions using it; say so instead.
                    self.log(f"cluster: {self.name} runs with older binaries or settings; "
                             "`make cluster-down cluster-up` to refresh it")
                self._ensure_node()
                return 0.0
            started = time.monotonic()
            if (self.kwok_workdir / "clusters" / self.name).exists():
                # State from a cluster whose processes are gone (a reboot, a killed session): start afresh.
                self._kwokctl("delete", "cluster", "--kubeconfig", self.kubeconfig, check=False)
            self._kwokctl_config_file.write_text(self._kwokctl_config())
            self._kwokctl(*self._create_args())
            self._settings_file.write_text(self._settings())
            self._ensure_node()
            seconds = time.monotonic() - started
            self.log(f"cluster: {self.name} up in {seconds:.1f} s, KUBECONFIG={self.kubeconfig}")
            return seconds

    @property
    def _kwokctl_config_file(self) -> Path:
        return self.cache / f"kwokctl-{self.name}.yaml"

    def _create_args(self) -> list[str]:
        bins = self.bin_dir
        return [
            "--config", str(self._kwokctl_config_file),
            "--config", str(STAGES_FILE),
            "create", "cluster",
            "--runtime", "binary",
            "--kubeconfig", self.kubeconfig,
            "--kube-apiserver-binary", str(bins / "kube-apiserver"),
            "--kube-controller-manager-binary", str(bins / "kube-controller-manager"),
            "--kube-scheduler-binary", str(bins / "kube-scheduler"),
            "--kwok-controller-binary", str(bins / "kwok"),
            "--etcd-binary", str(bins / "etcd"),
            "--kube-authorization=true",
            "--kube-admission=true",
            "--wait", "120s",
        ]

    def _ensure_node(self) -> None:
        self.kubectl("apply", "-f", "-", input=NODE_MANIFEST)
        self.kubectl("wait", "--for=condition=Ready", f"node/{NODE_NAME}", "--timeout=120s")
        # Pods are rejected until the service-account controller has made the namespace's default account.
        deadline = time.monotonic() + 120
        while self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise ClusterError("the default service account never appeared; is kube-controller-manager running?")
            time.sleep(0.5)

    def down(self) -> None:
        with self._locked(f"cluster-{self.name}"):
            if (self.kwok_workdir / "clusters" / self.name).exists():
                self._kwokctl("delete", "cluster", "--kubeconfig", self.kubeconfig)
            Path(self.kubeconfig).unlink(missing_ok=True)
            self.log(f"cluster: {self.name} down")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["build", "up", "down", "status"])
    parser.add_argument("--name", default=DEFAULT_NAME, help="cluster name (default: %(default)s)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(name=args.name, log=lambda line: print(line, flush=True))
    try:
        if args.action in ("build", "up"):
            started = time.monotonic()
            spent = cluster.build()
            print(f"cluster: build took {time.monotonic() - started:.0f} s" if spent else "cluster: binaries up to date")
        if args.action == "up":
            cluster.up()
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        if args.action == "down":
            cluster.down()
        if args.action == "status":
            running = cluster.is_running()
            print(f"{cluster.name}: {'running' if running else 'not running'}, KUBECONFIG={cluster.kubeconfig}")
            return 0 if running else 1
    except (ClusterError, binaries.BuildError) as error:
        print(f"cluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
