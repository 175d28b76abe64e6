"""A tiny HTTP server the launcher tests run as a pod's container.

    python gated_http_server.py HOST PORT GATE_FILE

GET /healthz answers 200 only once GATE_FILE exists (503 before), so a test decides when the pod
may become Ready; GET / answers with this process's pid and the pod env it was started with.
"""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/healthz":
            code, body = (200, b"ok") if os.path.exists(sys.argv[3]) else (503, b"gate closed")
        else:
            code = 200
            body = json.dumps({
                "pid": os.getpid(),
                "greeting": os.environ.get("GREETING"),
                "pod_name": os.environ.get("POD_NAME"),
                "bound_to": self.server.server_address[0],
            }).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
