"""Pydantic JSON schema → structural OpenAPI v3 schema, the dialect CustomResourceDefinitions accept."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# JSON-schema keys with no meaning (or no permission) in a structural schema.
_DROPPED = {"title", "additionalProperties_false", "$defs"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "additionalProperties" and value is False):
            continue
        if key == "default" and value is None:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs)
        elif key == "anyOf":
            out[key] = [_convert(sub, defs) for sub in value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    return out


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline `$ref`s and unwrap `X | None`; the sibling keys of the reference win (field descriptions)."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **siblings}, defs)
    options = node.get("anyOf")
    if options and any(o.get("type") == "null" for o in options):
        rest = [o for o in options if o.get("type") != "null"]
        siblings = {k: v for k, v in node.items() if k != "anyOf"}
        inner = rest[0] if len(rest) == 1 else {"anyOf": rest}
        return _resolve({**inner, **siblings}, defs)
    return node
