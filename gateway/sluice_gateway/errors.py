"""OpenAI-format error bodies: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import json

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "api_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A request the gateway answers itself, with an OpenAI error body."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or []

    def body(self) -> bytes:
        return error_body(self.status, self.message, code=self.code, param=self.param)


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error")


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> bytes:
    error = {"message": message, "type": error_type(status), "param": param, "code": code}
    return json.dumps({"error": error}).encode()
