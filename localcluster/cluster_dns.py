"""Cluster DNS for the real node: CoreDNS (built from the Go module proxy) in a pod of kube-system, behind the
`kube-dns` Service at `node_network.DNS_SERVICE_IP`, answering `*.svc.cluster.local` from the API server.

It forwards nothing: there is no resolver outside this machine to ask, so any other name is NXDOMAIN.
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from localcluster import node_images, node_network
from localcluster.cluster import ClusterError

if TYPE_CHECKING:
    from localcluster.real_node import RealNode

IMAGE = "localhost/sluice-coredns:1"
NAMESPACE = "kube-system"
NAME = "coredns"
# Unprivileged in the pod; the Service maps the DNS port to it.
CONTAINER_PORT = 1053

COREFILE = f""".:{CONTAINER_PORT} {{
    errors
    health 127.0.0.1:8080
    ready :8181
    kubernetes {node_network.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""


def manifests(placement: dict) -> list[dict]:
    labels = {"k8s-app": "kube-dns"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels},
                 "spec": {
                     "serviceAccountName": NAME,
                     **placement,
                     "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "coredns", "image": IMAGE, "imagePullPolicy": "Never",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"containerPort": CONTAINER_PORT, "protocol": "UDP", "name": "dns"},
                                   {"containerPort": CONTAINER_PORT, "protocol": "TCP", "name": "dns-tcp"}],
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                         "resources": {"limits": {"memory": "128Mi"}, "requests": {"cpu": "50m", "memory": "64Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                             "capabilities": {"drop": ["ALL"]}},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": NAMESPACE,
                                                             "labels": labels},
         "spec": {"clusterIP": node_network.DNS_SERVICE_IP, "selector": labels, "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": CONTAINER_PORT},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": CONTAINER_PORT},
         ]}},
    ]


def up(node: RealNode, placement: dict, timeout: float = 180) -> None:
    node_images.load(node, node_images.binary_image(node.cluster.bin_dir / "coredns", IMAGE))
    document = {"apiVersion": "v1", "kind": "List", "items": manifests(placement)}
    node.cluster.kubectl("apply", "-f", "-", input=json.dumps(document))
    deadline = time.monotonic() + timeout
    while True:
        ready = node.cluster.kubectl("get", "deployment", NAME, "-n", NAMESPACE, "-o",
                                     "jsonpath={.status.readyReplicas}", check=False).stdout.strip()
        if ready == "1":
            return
        if time.monotonic() > deadline:
            described = node.cluster.kubectl("describe", "pods", "-n", NAMESPACE, "-l", "k8s-app=kube-dns",
                                             check=False).stdout
            raise ClusterError(f"CoreDNS did not become ready in {timeout:.0f} s:\n{described[-3000:]}")
        time.sleep(1)
