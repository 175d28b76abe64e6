"""OpenAI-style error responses: one exception type, and handlers that turn everything into it."""
from __future__ import annotations

import re
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    """An error the client sees as `{"error": {message, type, param, code}}` with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def overloaded(message: str, retry_after_s: float) -> APIError:
    seconds = max(1, round(retry_after_s))
    return APIError(503, message, type="overloaded_error", code="overloaded",
                    headers={"Retry-After": str(seconds)})


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down; retry on another replica.",
                    type="overloaded_error", code="shutting_down", headers={"Retry-After": "1"})


def internal_error(request_id: str | None) -> APIError:
    return APIError(500, f"Internal server error (request id {request_id}); this is a bug in the server.",
                    type="server_error", code="internal_error")


_FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_TYPE_NAMES = {"str", "int", "float", "bool", "none", "list", "dict", "bytes"}
_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error"}


def _location(loc: tuple) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'.

    Pydantic also names the union member it tried ('str', 'list[str]', 'NamedToolChoice'); those
    mean nothing to a client and are left out. Our own field names are all lower snake case.
    """
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i == 0 and (part == "body" or (part in ("query", "path") and len(loc) > 1)):
            continue  # FastAPI's prefix; "query" alone is the field of that name (/v1/rerank's query)
        elif not _FIELD_NAME.match(str(part)) or part in _TYPE_NAMES:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


def validation_error(errors: Sequence[dict]) -> APIError:
    """The first of pydantic's errors (a schema check failed) as a 400 naming the parameter."""
    if not errors:
        return invalid_request("Invalid request body.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", first["msg"])
        return invalid_request(f"The request body is not valid JSON: {reason}.", code="invalid_json")
    param = _location(tuple(first.get("loc", ())))
    if param is None and first.get("type") in ("model_attributes_type", "dict_type"):
        return invalid_request("The request body must be a JSON object.", code="invalid_json")
    if first.get("type") == "missing":
        return invalid_request(f"Missing required parameter: '{param}'.", param=param,
                               code="missing_required_parameter")
    message = first.get("msg", "Invalid value")
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    where = f"'{param}'" if param else "the request body"
    extra = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return invalid_request(f"Invalid value for {where}: {message}.{extra}", param=param, code="invalid_value")


def _noted(request: Request, err: APIError) -> JSONResponse:
    record = getattr(request.state, "record", None)
    if record is not None:
        record.error_code = err.code or err.type
    return err.response()


def install_error_handlers(app: FastAPI) -> None:
    """Unexpected exceptions are caught by the request-context middleware, so they get a request id too."""
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _noted(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _noted(request, validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
        if exc.status_code == 404:
            message = f"Unknown path: {request.method} {request.url.path}"
        err = APIError(exc.status_code, message, type=_HTTP_TYPES.get(exc.status_code, "invalid_request_error"),
                       code="not_found" if exc.status_code == 404 else None,
                       headers=dict(exc.headers or {}))
        return _noted(request, err)
