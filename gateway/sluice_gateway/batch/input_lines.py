"""A batch's input file read and checked before any line runs.

What fails the whole batch at validation (in `errors.data`, naming the line, as OpenAI does): a line that is
not a JSON object, a missing or repeated `custom_id`, a `method` other than POST, a `url` other than the
batch's endpoint, a body that is not an object or names no model, a streamed body, a model the tenant may not
use, and a file with no line. A body the endpoint itself would refuse (a bad parameter) is not checked here: it
runs, and its refusal is that line's entry in the error file, while the other lines run.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_MAX_REPORTED = 100  # errors.data lists this many problems at most; the first ones are the useful ones


def problem(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def read_lines(content: bytes, endpoint: str,
               may_use: Callable[[str], bool]) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """The lines as (custom_id, body), and the problems found (the batch fails when there is any)."""
    lines: list[tuple[str, dict[str, Any]]] = []
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        found = _check(raw, number, endpoint, may_use, seen)
        if isinstance(found, dict):
            problems.append(found)
            if len(problems) == _MAX_REPORTED:
                break
        else:
            lines.append(found)
    if not lines and not problems:
        problems.append(problem("empty_file", "The input file has no line."))
    return lines, problems


def _check(raw: bytes, number: int, endpoint: str, may_use: Callable[[str], bool],
           seen: set[str]) -> tuple[str, dict[str, Any]] | dict[str, Any]:
    try:
        line = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return problem("invalid_json_line", f"Line {number} is not valid JSON.", number)
    if not isinstance(line, dict):
        return problem("invalid_json_line", f"Line {number} is not a JSON object.", number)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return problem("missing_required_parameter", f"Line {number} has no custom_id (a string).", number,
                       "custom_id")
    if custom_id in seen:
        return problem("duplicate_custom_id", f"The custom_id {custom_id!r} of line {number} is used by an earlier "
                                              "line; each line needs its own.", number, "custom_id")
    seen.add(custom_id)
    if line.get("method") != "POST":
        return problem("invalid_method", f"Line {number}: method must be POST.", number, "method")
    if line.get("url") != endpoint:
        return problem("invalid_url", f"Line {number}: url must be the batch's endpoint, {endpoint}.", number, "url")
    body = line.get("body")
    if not isinstance(body, dict):
        return problem("invalid_request", f"Line {number}: body must be a JSON object.", number, "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return problem("missing_required_parameter", f"Line {number}: body.model is required.", number,
                       "body.model")
    if body.get("stream"):
        return problem("invalid_request", f"Line {number}: batch lines cannot be streamed.", number, "body.stream")
    if not may_use(model):
        return problem("model_not_found", f"Line {number}: your key may not use the model {model!r}.", number,
                       "body.model")
    return custom_id, body
