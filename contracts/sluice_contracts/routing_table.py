"""The routing table: the operator's output and the gateway's input; docs/architecture.md says how each side uses it.

The operator builds a `RoutingTable` and writes `table.to_json()` into a ConfigMap; the gateway reads the same
document back. Field names on the wire are camelCase (`servedModelName`, `maxModelLen`, `jsonSchema`); Python
code may use either spelling.

Every backend is also reachable under its own name (the InferenceModel) as an implicit route with one backend;
`RoutingTable.route(name)` resolves both, so the operator does not need to emit those routes. A backend that
serves a LoRA adapter of its InferenceModel names it in `adapter`: its public name is the adapter's, and its
endpoints are the model's replicas that have the adapter loaded.
"""
from __future__ import annotations

import json
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .engines import DEFAULT_ENGINE, Engine
from .model_tasks import DEFAULT_TASKS, Task
from .model_version import PATTERN as VERSION_PATTERN

Affinity = Literal["prefix", "session", "none"]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Capabilities(_Wire):
    max_model_len: int | None = Field(default=None, gt=0)
    tools: bool = False
    json_schema: bool = False
    vision: bool = False
    tasks: tuple[Task, ...] = Field(default=DEFAULT_TASKS, min_length=1, description="What the backend serves.")


class Backend(_Wire):
    name: str = Field(min_length=1, description="The InferenceModel serving this backend.")
    served_model_name: str = Field(min_length=1, description="The model name the runtime answers to.")
    adapter: str | None = Field(
        default=None, min_length=1,
        description="The InferenceModel's LoRA adapter this backend serves (its served model name); None: the base.",
    )
    weight: int = Field(default=1, ge=0, description="Relative share of the route's traffic.")
    endpoints: tuple[str, ...] = Field(default=(), description="Ready endpoints; empty while none is ready.")
    capabilities: Capabilities = Capabilities()
    engine: Engine = Field(default=DEFAULT_ENGINE, description="The server behind the endpoints (sluice_contracts."
                                                               "engines): how the gateway reads their load.")
    version: str | None = Field(
        default=None, pattern=VERSION_PATTERN,
        description="The model version its answers name (sluice_contracts.model_version); None: the engine's own.",
    )

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

    @property
    def public_name(self) -> str:
        """The name a client sends for this backend alone: the adapter's, else the InferenceModel's."""
        return self.adapter or self.name


class Route(_Wire):
    affinity: Affinity = "none"
    backends: tuple[Backend, ...] = Field(min_length=1)
    fallbacks: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _weights_and_names(self) -> "Route":
        names = [b.public_name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backends (InferenceModel, or its adapter) must be unique within a route, got {names}")
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
                    backend.public_name,
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

    def public_names(self) -> list[str]:
        """Every name a client may send: explicit routes and the implicit backend routes."""
        return sorted(self._resolved)

    def endpoints(self) -> set[str]:
        return {url for route in self.routes.values() for b in route.backends for url in b.endpoints}

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


class RoutingTableError(ValueError):
    """The document is not a valid routing table; the message says where and why."""


def parse_routing_table(text: str | bytes) -> RoutingTable:
    """The table in its wire format (JSON)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RoutingTableError(f"routing table is not JSON: {exc}") from None
    return routing_table_from(data)


def routing_table_from(data: Any) -> RoutingTable:
    """The table in a decoded document, or RoutingTableError saying where and why it is not one."""
    if not isinstance(data, dict):
        raise RoutingTableError("routing table must be a mapping with version, generation and routes")
    try:
        return RoutingTable.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            problems.append(f"{where}: {err['msg']}")
        raise RoutingTableError("invalid routing table: " + "; ".join(problems)) from None
