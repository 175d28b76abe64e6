"""A request's JSON body, read once: parsed, checked against its schema, and its cost fields read by the contract.

The fields that decide what a request costs (max tokens under either name, n, the prompt count, ignore_eos) are
read only by `sluice_contracts.request_cost`, on the raw JSON, as the gateway reads them to reserve a tenant's
tokens: one reading, so what the gateway reserved and what the engine generates cannot drift apart.
"""
from __future__ import annotations

import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from sluice_contracts.request_cost import Endpoint, InvalidCostField, RequestCost, read_request_cost

from . import json_limits
from .errors import invalid_request, validation_error

Model = TypeVar("Model", bound=BaseModel)
# Parsing, templating and tokenizing a larger body take long enough to stall every open stream; a worker
# thread does them then. Small bodies, the common case, skip the thread hop.
_LARGE_BODY_BYTES = 64 << 10


async def read_json(request: Request) -> dict:
    raw = await request.body()
    if len(raw) > _LARGE_BODY_BYTES:
        return await run_in_threadpool(parse_json, raw)
    return parse_json(raw)


def parse_json(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid_request(f"The request body is not UTF-8 text: {exc.reason} at byte {exc.start}.",
                              code="invalid_json") from None
    try:
        payload = json_limits.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except json_limits.UnsafeJSON as exc:
        raise invalid_request(str(exc), param=exc.path, code=exc.code) from None
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.", code="invalid_json")
    return payload


async def off_loop_if_large(request: Request, fn, *args):
    if int(request.headers.get("content-length") or 0) > _LARGE_BODY_BYTES:
        return await run_in_threadpool(fn, *args)
    return fn(*args)


def validated(model: type[Model], payload: dict) -> Model:
    """The body as `model`; types are strict, as in OpenAI's API (no "16", 16.0 or true for an integer)."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def request_cost(payload: dict, endpoint: Endpoint) -> RequestCost:
    try:
        return read_request_cost(payload, endpoint)
    except InvalidCostField as exc:
        raise invalid_request(str(exc), param=exc.param, code="invalid_value") from None

