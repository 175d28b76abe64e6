"""Status shapes shared by both kinds: conditions that `kubectl wait` and Argo CD understand."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import StatusModel

CONDITION_TYPES = ("Ready", "Progressing", "Degraded")


class Condition(StatusModel):
    type: str = Field(description="Ready, Progressing or Degraded.", max_length=64)
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(default="", description="One CamelCase word saying why.", max_length=128)
    message: str = Field(default="", description="What happened and what to do about it.", max_length=4096)
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339).", max_length=64
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this condition was computed from."
    )


def conditions_schema_extra() -> dict:
    """Conditions are a map keyed by type, so server-side apply merges them one by one."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
