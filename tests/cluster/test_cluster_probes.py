"""Probe counting and failure reasons, against a real local HTTP server (no cluster needed)."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localcluster.probes import ProbeState


class _Status(BaseHTTPRequestHandler):
    code = 503

    def do_GET(self):
        self.send_response(type(self).code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("Handler", (_Status,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, httpd.server_address[1]
    httpd.shutdown()


def _probe(spec: dict, port: int) -> ProbeState:
    container = {"name": "main", "ports": [{"name": "http", "containerPort": port}]}
    return ProbeState.start({"periodSeconds": 0, **spec}, container, now=0.0)


def test_readiness_needs_success_threshold_and_fails_after_failure_threshold(server):
    handler, port = server
    probe = _probe({"httpGet": {"path": "/healthz", "port": "http"}, "successThreshold": 2, "failureThreshold": 2}, port)
    handler.code = 200
    probe.run_if_due(time.monotonic(), "127.0.0.1", {}, ".")
    assert not probe.passed
    probe.run_if_due(time.monotonic(), "127.0.0.1", {}, ".")
    assert probe.passed

    handler.code = 503
    assert probe.run_if_due(time.monotonic(), "127.0.0.1", {}, ".") is False
    assert probe.passed
    assert probe.run_if_due(time.monotonic(), "127.0.0.1", {}, ".") is True
    assert not probe.passed and probe.failure == "HTTP probe failed with statuscode: 503"


def test_tcp_and_exec_probes_report_why_they_failed(server):
    _, port = server
    tcp = _probe({"tcpSocket": {"port": port}}, port)
    tcp.run_if_due(time.monotonic(), "127.0.0.2", {}, ".")
    assert tcp.failure is not None and tcp.failure.startswith(f"dial tcp 127.0.0.2:{port}:")
    exec_probe = _probe({"exec": {"command": ["sh", "-c", "echo not yet; exit 4"]}}, port)
    exec_probe.run_if_due(time.monotonic(), "127.0.0.1", {"PATH": "/usr/bin:/bin"}, ".")
    assert exec_probe.failure == "command ['sh', '-c', 'echo not yet; exit 4'] exited 4: not yet\n"


def test_a_probe_on_an_undeclared_named_port_is_a_config_error():
    with pytest.raises(ValueError, match="does not declare"):
        ProbeState.start({"httpGet": {"port": "metrics"}}, {"name": "main", "ports": []}, now=0.0)
    with pytest.raises(ValueError, match="only httpGet, tcpSocket and exec"):
        ProbeState.start({"grpc": {"port": 9000}}, {"name": "main"}, now=0.0)
