"""The routing table: the operator's output and the gateway's input (schema in DESIGN.md).

The operator builds a `RoutingTable` and writes `table.to_json()` into a ConfigMap; the gateway reads the
same document with `parse_routing_table` / `load_routing_table`. Field names on the wire are camelCase
(`servedModelName`, `maxModelLen`, `jsonSchema`); Python code may use either spelling.

Every backend is also reachable under its own name (the InferenceModel) as an implicit route with one
backend; `RoutingTable.route(name)` resolves both, so the operator does not need to emit those routes.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

Affinity = Literal["prefix", "session", "none"]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Capabilities(_Wire):
    max_model_len: int | None = Field(default=None, gt=0)
    tools: bool = False
    json_schema: bool = False
    vision: bool = False


class Backend(_Wire):
    name: str = Field(min_length=1, description="The InferenceModel serving this backend.")
    served_model_name: str = Field(min_length=1, description="The model name the runtime answers to.")
    weight: int = Field(default=1, ge=0, description="Relative share of the route's traffic.")
    endpoints: tuple[str, ...] = Field(default=(), description="Ready endpoints; empty while none is ready.")
    capabilities: Capabilities = Capabilities()

    @field_validator("endpoints")
    @classmethod
    def _endpoints_are_http_urls(cls, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        cleaned = []
        for url in endpoints:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"endpoint {url!r} must look like http://HOST:PORT (no path)")
            cleaned.append(url.rstrip("/"))
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("endpoints must be unique within a backend")
        return tuple(cleaned)


class Route(_Wire):
    affinity: Affinity = "none"
    backends: tuple[Backend, ...] = Field(min_length=1)
    fallbacks: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _weights_and_names(self) -> "Route":
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique within a route, got {names}")
        if sum(b.weight for b in self.backends) <= 0:
            raise ValueError("at least one backend needs a weight above 0")
        return self


class RoutingTable(_Wire):
    version: Literal[1] = 1
    generation: int = Field(default=0, ge=0, description="Increases on every change.")
    routes: dict[str, Route] = {}

    _resolved: dict[str, Route] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _resolve_and_check_fallbacks(self) -> "RoutingTable":
        implicit: dict[str, Route] = {}
        for route in self.routes.values():
            for backend in route.backends:
                implicit.setdefault(
                    backend.name,
                    Route(backends=(backend.model_copy(update={"weight": 1}),), affinity=route.affinity),
                )
        self._resolved = {**implicit, **self.routes}
        for public_name, route in self.routes.items():
            for fallback in route.fallbacks:
                if fallback == public_name:
                    raise ValueError(f"route {public_name!r} lists itself as a fallback")
                if fallback not in self._resolved:
                    raise ValueError(f"route {public_name!r} falls back to unknown route {fallback!r}")
        return self

    def route(self, public_name: str) -> Route | None:
        """The explicit route of that name, else the implicit one-backend route of a backend so named."""
        return self._resolved.get(public_name)

    def reachable(self, public_name: str, allowed: Callable[[str], bool]) -> list[tuple[str, Route]]:
        """The route of that name, then its fallbacks, theirs, ..., in the order they are tried, each with only
        the backends the tenant may be served by.

        The allow-list (`allowed`) is over public names. Only routes it allows are listed or followed, so a tenant
        allowed one model is never served by another because the first is down. A backend named like an explicit
        route is that model: it is dropped for a tenant who may not use that name, even as another route's canary.
        A backend with a private name is covered by the route that holds it. A route left with no backend that
        takes traffic is skipped (its fallbacks are still followed).
        """
        found: list[tuple[str, Route]] = []
        pending, seen = [public_name], set()
        while pending:
            name = pending.pop(0)
            route = self._resolved.get(name)
            if name in seen or route is None or not allowed(name):
                continue
            seen.add(name)
            pending.extend(route.fallbacks)
            kept = tuple(b for b in route.backends if b.name not in self.routes or allowed(b.name))
            if len(kept) < len(route.backends):
                if not any(b.weight > 0 for b in kept):
                    continue
                route = route.model_copy(update={"backends": kept})
            found.append((name, route))
        return found

    def public_names(self) -> list[str]:
        """Every name a client may send: explicit routes and the implicit backend routes."""
        return sorted(self._resolved)

    def endpoints(self) -> set[str]:
        return {url for route in self.routes.values() for b in route.backends for url in b.endpoints}

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def max_model_len(routes: list[tuple[str, Route]]) -> int | None:
    """The largest context among these routes' backends (any may serve); None if one does not say."""
    lengths = [b.capabilities.max_model_len for _, route in routes for b in route.backends if b.weight > 0]
    if not lengths or None in lengths:
        return None
    return max(lengths)


class RoutingTableError(ValueError):
    """The document is not a valid routing table; the message says where and why."""


def parse_routing_table(text: str | bytes) -> RoutingTable:
    """Parse JSON (the contract) or YAML (handy for hand-written local files)."""
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RoutingTableError(f"routing table is neither JSON nor YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RoutingTableError("routing table must be a mapping with version, generation and routes")
    try:
        return RoutingTable.model_validate(data)
    except ValidationError as exc:
        raise RoutingTableError(_describe(exc)) from None


def load_routing_table(path: str | Path) -> RoutingTable:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise RoutingTableError(f"cannot read routing table {path}: {exc.strerror}") from None
    return parse_routing_table(text)


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        problems.append(f"{where}: {err['msg']}")
    return "invalid routing table: " + "; ".join(problems)
