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


def _http_get(spec: dict, container: dict, pod_ip: str, timeout: float) -> str | None:
    scheme = spec.get("scheme", "HTTP").lower()
    host = spec.get("host") or pod_ip
    path = spec.get("path", "/")
    url = f"{scheme}://{host}:{_port(spec['port'], container)}{path if path.startswith('/') else '/' + path}"
    request = urllib.request.Request(url, headers={h["name"]: h["value"] for h in spec.get("httpHeaders") or []})
    handlers = [_NoRedirect()]
    if scheme == "https":
        # Like the kubelet, an HTTPS probe does not verify the server's certificate.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as error:
        return None if 300 <= error.code < 400 else f"HTTP probe failed with statuscode: {error.code}"
    except (OSError, ValueError) as error:
        return f"Get {url!r}: {error}"


def _tcp_socket(spec: dict, container: dict, pod_ip: str, timeout: float) -> str | None:
    address = (spec.get("host") or pod_ip, _port(spec["port"], container))
    try:
        with socket.create_connection(address, timeout=timeout):
            return None
    except OSError as error:
        return f"dial tcp {address[0]}:{address[1]}: {error}"


def _exec(spec: dict, env: dict[str, str], cwd: str, timeout: float) -> str | None:
    try:
        result = subprocess.run(spec["command"], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"command {spec['command']!r}: {error}"
    return None if result.returncode == 0 else f"command {spec['command']!r} exited {result.returncode}: {result.stdout[-200:]}"


@dataclass
class ProbeState:
    """One probe of one container: when it is next due and what it last concluded."""

    spec: dict
    container: dict
    passed: bool = False
    due: float = 0.0
    _successes: int = 0
    _failures: int = 0

    failure: str | None = None
    # The kubelet records every failed probe (its event recorder folds repeats into a count); a failure here is
    # recorded once per distinct message while the probe keeps failing.
    _recorded: str | None = None

    @classmethod
    def start(cls, spec: dict | None, container: dict, now: float) -> "ProbeState | None":
        if spec is None:
            return None
        action = next((spec[kind] for kind in ("httpGet", "tcpSocket") if kind in spec), None)
        if action is None and "exec" not in spec:
            raise ValueError(f"container {container['name']!r}: only httpGet, tcpSocket and exec probes are supported")
        if action is not None:
            _port(action["port"], container)  # an undeclared named port is a config error, found before running
        return cls(spec=spec, container=container, due=now + spec.get("initialDelaySeconds", 0))

    def run_if_due(self, now: float, pod_ip: str, env: dict[str, str], cwd: str) -> bool:
        """Probes when due; returns True when this probe just reached its failure threshold."""
        if now < self.due:
            return False
        timeout = self.spec.get("timeoutSeconds", 1)
        if "httpGet" in self.spec:
            self.failure = _http_get(self.spec["httpGet"], self.container, pod_ip, timeout)
        elif "tcpSocket" in self.spec:
            self.failure = _tcp_socket(self.spec["tcpSocket"], self.container, pod_ip, timeout)
        else:
            self.failure = _exec(self.spec["exec"], env, cwd, timeout)
        self.due = time.monotonic() + self.spec.get("periodSeconds", 10)
        ok = self.failure is None
        self._successes, self._failures = (self._successes + 1, 0) if ok else (0, self._failures + 1)
        threshold = self.spec.get("failureThreshold", 3)
        if self._successes >= self.spec.get("successThreshold", 1):
            self.passed = True
        elif self._failures >= threshold:
            self.passed = False
        return self._failures == threshold

    def take_news(self) -> str | None:
        """The last failure, if it has not been recorded yet (it is recorded by taking it)."""
        news = self.failure if self.failure is not None and self.failure != self._recorded else None
        self._recorded = self.failure
        return news

    @property
    def failed(self) -> bool:
        return self._failures >= self.spec.get("failureThreshold", 3)
