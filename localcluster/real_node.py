"""A real node in the local cluster: pods scheduled to it run as containers.

containerd and runc (Debian's) run the containers, each pod in its own cgroup, mount and network namespace;
Debian's CNI plugins put each pod on a bridge with an address from `node_network.POD_CIDR`; the kubelet and
kube-proxy come from the control plane's own Go build; kube-proxy gives Services their addresses; kube-router
enforces NetworkPolicies; CoreDNS answers cluster names from a pod (`cluster_dns.py`). Every process runs on
this machine, bound to loopback or to the node's bridge address (`node_network`).

The node carries the label and taint of `PLACEMENT`: only pods that select and tolerate it land here, so the
simulated kwok node keeps every pod that does not ask for a real one.

    python -m localcluster.real_node up|down|status
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from localcluster import cluster_dns, node_images, node_network
from localcluster.cluster import ClusterError, LocalCluster

NODE_NAME = "node-0"
NODE_LABEL = ("sluice.dev/real-node", "true")
NODE_TAINT = {"key": NODE_LABEL[0], "value": NODE_LABEL[1], "effect": "NoSchedule"}
# What a pod spec (or a chart's values) sets to run on the real node.
PLACEMENT = {"nodeSelector": {NODE_LABEL[0]: NODE_LABEL[1]},
             "tolerations": [{**NODE_TAINT, "operator": "Equal"}]}
CNI_BIN_DIR = Path("/usr/lib/cni")
# The kubelet's pod sync period (its default is 60 s).
POD_SYNC_S = 10
# The pod sandbox image, made here from our own pause program (localcluster/gomod/pause).
PAUSE_IMAGE = "localhost/sluice-pause:1"
# The nft table holding the rule that lets pods reach the loopback-bound API server.
API_NAT_TABLE = "sluice-node"
# The node's own processes; each has a pid file under the node's home.
AGENTS = ("containerd", "kubelet", "kube-proxy", "kube-router")


class NodeUnavailable(ClusterError):
    """This machine cannot run a real node; the message names what is missing."""


def missing_capabilities() -> list[str]:
    """What a real node needs from this machine and the machine lacks, each named as a user would fix it."""
    missing = [f"the `{tool}` command (apt-get install {package})" for tool, package in (
        ("containerd", "containerd"), ("runc", "runc"), ("iptables", "iptables"), ("ipset", "ipset"),
        ("ip", "iproute2"), ("openssl", "openssl")) if shutil.which(tool) is None]
    if not (CNI_BIN_DIR / "bridge").exists():
        missing.append(f"the CNI plugins in {CNI_BIN_DIR} (apt-get install containernetworking-plugins)")
    if os.geteuid() != 0:
        missing.append("root (containers, cgroups and network namespaces need it)")
    if not os.access("/sys/fs/cgroup/memory", os.W_OK) and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        missing.append("a writable cgroup hierarchy with the memory controller (/sys/fs/cgroup)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        missing.append("overlayfs (the `overlay` file system in /proc/filesystems)")
    probe = subprocess.run(["ip", "netns", "add", "sluice-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing.append(f"network namespaces (`ip netns add` failed: {probe.stderr.strip()})")
    else:
        subprocess.run(["ip", "netns", "delete", "sluice-probe"], capture_output=True)
    return missing


@dataclass
class RealNode:
    """The node's processes and state, under `<cluster cache>/node`."""

    cluster: LocalCluster
    log: Callable[[str], None] = print

    @property
    def home(self) -> Path:
        return self.cluster.cache / "node"

    @property
    def socket(self) -> Path:
        return self.home / "containerd/state/containerd.sock"

    def _path(self, *parts: str) -> Path:
        path = self.home.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- configuration, written fresh on each start ------------------------------------------------------------

    def _containerd_config(self) -> str:
        root = self.home / "containerd"
        return f"""version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The kubelet asks for scores below this machine's own (-998 for a sandbox), which it may not lower.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.home / 'cni'}"
"""

    @staticmethod
    def _cni_config() -> dict:
        return {
            "cniVersion": "1.0.0",
            "name": "sluice",
            "plugins": [
                {
                    "type": "bridge", "bridge": node_network.BRIDGE, "isGateway": True, "ipMasq": False,
                    "hairpinMode": True,
                    # Pods get routes to each other and to Service addresses only: nothing else exists for them.
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": node_network.POD_CIDR,
                                                                  "gateway": node_network.NODE_IP}]],
                             "routes": [{"dst": node_network.SERVICE_CIDR}],
                             "dataDir": str(Path("/var/lib/cni/networks"))},
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _kubelet_config(self) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine mounts cgroup v1 only.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": node_network.NODE_IP,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cluster.pki_dir / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [node_network.DNS_SERVICE_IP],
            "clusterDomain": node_network.CLUSTER_DOMAIN,
            "resolvConf": str(self._path("kubelet", "resolv.conf")),
            "failSwapOn": False,
            "registerWithTaints": [NODE_TAINT],
            # The machine's disk is shared with image builds; images loaded here are never pulled again, so
            # the kubelet must not collect them.
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "podLogsDir": str(self.home / "pod-logs"),
            "serializeImagePulls": False,
            "maxPods": 64,
            # How often each pod is synced, which is when its Secret and ConfigMap volumes are rewritten: the
            # default minute would make every test of a rotation wait for it.
            "syncFrequency": f"{POD_SYNC_S}s",
        }

    def _node_credentials(self, server: str) -> Path:
        """A client certificate for the kubelet (system:node:NODE_NAME), signed by the cluster's CA, and its
        kubeconfig."""
        pki = self.cluster.pki_dir
        key, cert = self._path("pki", "kubelet.key"), self._path("pki", "kubelet.crt")
        if not cert.exists() or cert.stat().st_mtime < (pki / "ca.crt").stat().st_mtime:
            subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                            "-subj", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "-out", str(cert) + ".csr"],
                           check=True, capture_output=True)
            subprocess.run(["openssl", "x509", "-req", "-in", str(cert) + ".csr", "-CA", str(pki / "ca.crt"),
                            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "365", "-out", str(cert)],
                           check=True, capture_output=True)
        kubeconfig = self._path("kubelet", "kubeconfig")
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "local", "cluster": {"server": server,
                                                       "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
        }))
        return kubeconfig

    # -- network -----------------------------------------------------------------------------------------------

    def _api_server(self) -> str:
        """The API server's URL, as the cluster's admin kubeconfig names it (on loopback)."""
        config = json.loads(self.cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
        return config["clusters"][0]["cluster"]["server"]

    def _network_up(self, server: str) -> None:
        def ip(*args: str, check: bool = True) -> None:
            subprocess.run(["ip", *args], check=check, capture_output=True, text=True)

        if subprocess.run(["ip", "link", "show", node_network.BRIDGE], capture_output=True).returncode != 0:
            ip("link", "add", node_network.BRIDGE, "type", "bridge")
        ip("addr", "replace", f"{node_network.NODE_IP}/{node_network.POD_CIDR.split('/')[1]}",
           "dev", node_network.BRIDGE)
        ip("link", "set", node_network.BRIDGE, "up")
        ip("route", "replace", "blackhole", node_network.RANGE)
        # This machine's own connections to a Service address are routed before kube-proxy's rules rewrite
        # them, so they need a route too: onto the bridge, where no Service address exists but pods do.
        ip("route", "replace", node_network.SERVICE_CIDR, "dev", node_network.BRIDGE, "src", node_network.NODE_IP)
        # Pods reach the API server, which listens on loopback only, at its Service address and at the address
        # it advertises: rewritten to loopback before kube-proxy's rules see them (a higher nat priority).
        port = int(server.rsplit(":", 1)[1])
        for key in ("net.ipv4.ip_forward", f"net.ipv4.conf.{node_network.BRIDGE}.route_localnet",
                    "net.bridge.bridge-nf-call-iptables"):
            Path("/proc/sys", *key.split(".")).write_text("1")
        rules = f"""table ip {API_NAT_TABLE}
delete table ip {API_NAT_TABLE}
table ip {API_NAT_TABLE} {{
  chain api {{
    type nat hook prerouting priority -110; policy accept;
    ip saddr {node_network.POD_CIDR} ip daddr {node_network.API_SERVICE_IP} tcp dport 443 dnat to 127.0.0.1:{port}
    ip saddr {node_network.POD_CIDR} ip daddr {node_network.NODE_IP} tcp dport {port} dnat to 127.0.0.1:{port}
  }}
}}
"""
        subprocess.run(["nft", "-f", "-"], input=rules, check=True, capture_output=True, text=True)

    def _network_down(self) -> None:
        subprocess.run(["nft", "delete", "table", "ip", API_NAT_TABLE], capture_output=True)
        subprocess.run(["ip", "link", "delete", node_network.BRIDGE], capture_output=True)
        subprocess.run(["ip", "route", "delete", node_network.SERVICE_CIDR], capture_output=True)
        subprocess.run(["ip", "route", "delete", "blackhole", node_network.RANGE], capture_output=True)

    # -- processes ---------------------------------------------------------------------------------------------

    def _pid_file(self, name: str) -> Path:
        return self._path("pids", name)

    def _running(self, name: str) -> int | None:
        pid_file = self._pid_file(name)
        if not pid_file.exists():
            return None
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def _start(self, name: str, argv: list[str]) -> None:
        if self._running(name):
            return
        log = open(self._path("logs", f"{name}.log"), "ab")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        self._pid_file(name).write_text(str(process.pid))

    def _stop(self, name: str, timeout: float = 20) -> None:
        pid = self._running(name)
        if pid is None:
            return
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._running(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._running(name):
            os.killpg(pid, signal.SIGKILL)
        self._pid_file(name).unlink(missing_ok=True)

    def ctr(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("text", True)
        return subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
                              check=check, capture_output=True, **kwargs)

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float, log_name: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                tail = self._path("logs", f"{log_name}.log").read_text(errors="replace")[-3000:]
                raise ClusterError(f"the real node's {what} did not come up in {timeout:.0f} s:\n{tail}")
            time.sleep(0.5)

    def up(self) -> float:
        missing = missing_capabilities()
        if missing:
            raise NodeUnavailable("this machine cannot run the local cluster's real node; missing: "
                                  + "; ".join(missing))
        started = time.monotonic()
        self.cluster.up()
        if any(self._running(name) for name in AGENTS):
            # Agents of an earlier start that is not whole (a session killed midway, a cluster started afresh
            # under them, whose node they no longer hold credentials for): a kubelet left running would keep
            # the new one from starting, and the node would never be Ready.
            self.log("real node: restarting the agents of an earlier start")
            self.down()
        bins = self.cluster.bin_dir
        server = self._api_server()
        self._network_up(server)
        config = self._path("containerd", "config.toml")
        config.write_text(self._containerd_config())
        self._path("cni", "10-sluice.conflist").write_text(json.dumps(self._cni_config()))
        self._start("containerd", ["containerd", "--config", str(config)])
        self._wait("containerd", lambda: self.ctr("version", check=False).returncode == 0, 60, "containerd")
        node_images.load(self, node_images.binary_image(bins / "pause", PAUSE_IMAGE))
        self._path("kubelet", "resolv.conf").write_text(f"nameserver {node_network.DNS_SERVICE_IP}\n")
        kubelet_config = self._path("kubelet", "config.json")
        kubelet_config.write_text(json.dumps(self._kubelet_config()))
        self._start("kubelet", [
            str(bins / "kubelet"), "--config", str(kubelet_config),
            "--kubeconfig", str(self._node_credentials(server)),
            "--hostname-override", NODE_NAME, "--node-ip", node_network.NODE_IP, "--node-labels", "=".join(NODE_LABEL),
            "--root-dir", str(self.home / "kubelet/root"), "--cert-dir", str(self.home / "kubelet/pki"),
            "--v", "1",
        ])
        self._start("kube-proxy", [
            str(bins / "kube-proxy"), "--kubeconfig", self.cluster.kubeconfig, "--hostname-override", NODE_NAME,
            "--proxy-mode", "iptables", "--cluster-cidr", node_network.POD_CIDR,
            "--nodeport-addresses", f"{node_network.NODE_IP}/32",
            "--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249",
            "--conntrack-max-per-core", "0",
        ])
        self._wait("kubelet", self._node_ready, 120, "kubelet")
        self._start("kube-router", [
            str(bins / "kube-router"), "--kubeconfig", self.cluster.kubeconfig, "--hostname-override", NODE_NAME,
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
            "--health-port=0", "--metrics-port=0", "--service-cluster-ip-range", node_network.SERVICE_CIDR,
        ])
        cluster_dns.up(self, PLACEMENT)
        seconds = time.monotonic() - started
        self.log(f"real node: {NODE_NAME} ready in {seconds:.1f} s")
        return seconds

    def _node_ready(self) -> bool:
        result = self.cluster.kubectl("get", "node", NODE_NAME, "-o",
                                      "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return result.returncode == 0 and result.stdout.strip() == "True"

    def is_running(self) -> bool:
        return all(self._running(name) for name in AGENTS) and self._node_ready()

    def down(self) -> None:
        self._stop("kube-router")
        self._stop("kubelet")
        self._stop("kube-proxy")
        if self._running("containerd"):
            # Containers outlive containerd (each has its own shim): end them first.
            for line in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", line, check=False)
            time.sleep(1)
            for sandbox in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", sandbox, check=False)
                self.ctr("containers", "delete", sandbox, check=False)
        self._stop("containerd")
        subprocess.run([str(self.cluster.bin_dir / "kube-proxy"), "--cleanup"], capture_output=True)
        subprocess.run([str(self.cluster.bin_dir / "kube-router"), "--cleanup-config"], capture_output=True)
        for netns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").exists() else ():
            subprocess.run(["ip", "netns", "delete", netns.name], capture_output=True)
        self._network_down()
        self.cluster.kubectl("delete", "node", NODE_NAME, "--ignore-not-found", check=False)
        self.log(f"real node: {NODE_NAME} down")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.real_node", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    node = RealNode(LocalCluster(log=lambda line: print(line, flush=True)), log=lambda line: print(line, flush=True))
    try:
        if args.action == "up":
            node.up()
        elif args.action == "down":
            node.down()
        else:
            running = node.is_running()
            print(f"{NODE_NAME}: {'running' if running else 'not running'}")
            return 0 if running else 1
    except ClusterError as error:
        print(f"real node: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
