"""A tiny HTTP server the launcher's volume test runs as a pod's container.

    python volume_http_server.py HOST PORT FILE

GET /file answers FILE's contents (a path inside a mounted volume, rewritten by the launcher);
GET /whoami asks the API server who this process is, with whatever credentials $KUBECONFIG gives it.
"""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def whoami() -> dict:
    from kubernetes import client, config

    if not os.environ.get("KUBECONFIG"):
        return {"user": None}
    api = client.AuthenticationV1Api(config.new_client_from_config())
    review = api.create_self_subject_review({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return {"user": review.status.user_info.username}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            if self.path == "/file":
                with open(sys.argv[3]) as file:
                    body = json.dumps({"path": sys.argv[3], "content": file.read()}).encode()
            else:
                body = json.dumps(whoami()).encode()
            code = 200
        except Exception as error:
            code, body = 500, json.dumps({"error": repr(error)}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
