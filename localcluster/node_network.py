"""The real node's addresses, which the control plane's settings, the CNI configuration, kube-proxy, CoreDNS
and the tests all read from here.

Everything lives in 10.213.0.0/16, a private range that exists only on this machine: the node's own address
is the gateway of its pod bridge, pods sit behind it in network namespaces the CNI plugin makes, and Service
addresses are rewritten to pod addresses by kube-proxy (a pod's packets before they are routed; this
machine's own, such as a test's client of a Service, after a route onto the bridge). A blackhole route for the
rest of the range makes sure nothing addressed into it ever leaves the machine.
"""
from __future__ import annotations

RANGE = "10.213.0.0/16"
BRIDGE = "sluice0"
POD_CIDR = "10.213.0.0/24"
# The bridge's address: the pods' gateway, and the node address the kubelet serves on.
NODE_IP = "10.213.0.1"
SERVICE_CIDR = "10.213.128.0/24"
# The first address of the Service range is the API server's `kubernetes` Service.
API_SERVICE_IP = "10.213.128.1"
DNS_SERVICE_IP = "10.213.128.10"
# The API server's port on loopback: a NetworkPolicy that lets a pod reach the API server names it, as it
# names the Service's 443.
API_SERVER_PORT = 6443
CLUSTER_DOMAIN = "cluster.local"
