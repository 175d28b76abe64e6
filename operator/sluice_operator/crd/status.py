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


def merge_conditions(existing: list[dict], wanted: list[Condition], now: str) -> list[dict]:
    """Wanted conditions on the wire; a condition whose status did not change keeps its transition time."""
    before = {c.get("type"): c for c in existing or []}
    merged = []
    for condition in wanted:
        previous = before.get(condition.type)
        unchanged = previous is not None and previous.get("status") == condition.status
        stamp = previous.get("lastTransitionTime") if unchanged else now
        merged.append(condition.model_copy(update={"last_transition_time": stamp or now}).wire())
    return merged
