"""Runs a container's Kubernetes probes (httpGet, tcpSocket, exec) against a local process.

Timing and thresholds follow the pod spec with the kubelet's defaults; results are counted the way
the kubelet counts them (successThreshold consecutive successes, failureThreshold consecutive failures).
"""
from __future__ import annotations

import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


def _port(value, container: dict) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"probe refers to port {value!r}, which container {container['name']!r} does not declare")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # The kubelet counts a redirect as success without following it off-host; so do we.
    def redirect_request(self, *args, **kwargs):
        return None


def _http_get(spec: dict, container: dict, pod_ip: str, timeout: float) -> bool:
    scheme = spec.get("scheme", "HTTP").lower()
    host = spec.get("host") or pod_ip
    path = spec.get("path", "/")
    url = f"{scheme}://{host}:{_port(spec['port'], container)}{path if path.startswith('/') else '/' + path}"
    request = urllib.request.Request(url, headers={h["name"]: h["value"] for h in spec.get("httpHeaders") or []})
    handlers = [_NoRedirect()]
    if scheme == "https":
        handlers.append(urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=timeout) as response:
            return 200 <= response.status < 400
    except urllib.error.HTTPError as error:
        return 300 <= error.code < 400
    except (OSError, ValueError):
        return False


def _tcp_socket(spec: dict, container: dict, pod_ip: str, timeout: float) -> bool:
    try:
        with socket.create_connection((spec.get("host") or pod_ip, _port(spec["port"], container)), timeout=timeout):
            return True
    except OSError:
        return False


def _exec(spec: dict, env: dict[str, str], cwd: str, timeout: float) -> bool:
    try:
        return subprocess.run(spec["command"], env=env, cwd=cwd, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class ProbeState:
    """One probe of one container: when it is next due and what it last concluded."""

    spec: dict
    container: dict
    passed: bool = False
    due: float = 0.0
    _successes: int = 0
    _failures: int = 0

    @classmethod
    def start(cls, spec: dict | None, container: dict, now: float) -> "ProbeState | None":
        if spec is None:
            return None
        if not any(kind in spec for kind in ("httpGet", "tcpSocket", "exec")):
            raise ValueError(f"container {container['name']!r}: only httpGet, tcpSocket and exec probes are supported")
        return cls(spec=spec, container=container, due=now + spec.get("initialDelaySeconds", 0))

    def run_if_due(self, now: float, pod_ip: str, env: dict[str, str], cwd: str) -> bool:
        """Probes when due; returns True when the conclusion (passed) changed."""
        if now < self.due:
            return False
        timeout = self.spec.get("timeoutSeconds", 1)
        if "httpGet" in self.spec:
            ok = _http_get(self.spec["httpGet"], self.container, pod_ip, timeout)
        elif "tcpSocket" in self.spec:
            ok = _tcp_socket(self.spec["tcpSocket"], self.container, pod_ip, timeout)
        else:
            ok = _exec(self.spec["exec"], env, cwd, timeout)
        self.due = time.monotonic() + self.spec.get("periodSeconds", 10)
        self._successes, self._failures = (self._successes + 1, 0) if ok else (0, self._failures + 1)
        before = self.passed
        if self._successes >= self.spec.get("successThreshold", 1):
            self.passed = True
        elif self._failures >= self.spec.get("failureThreshold", 3):
            self.passed = False
        return self.passed != before

    @property
    def failed(self) -> bool:
        return self._failures >= self.spec.get("failureThreshold", 3)
