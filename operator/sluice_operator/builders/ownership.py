"""Which objects are the operator's to change: it never takes over one it did not make."""
from __future__ import annotations

from typing import Any


def controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether `obj` is one the InferenceModel `uid` made: its controller reference names it."""
    return any(ref.get("controller") and ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def foreign(manifests: list[dict[str, Any]], existing: list[dict[str, Any] | None], uid: str) -> list[str]:
    """'Kind name' of each object in the way: one that exists under a built object's name, not made by `uid`."""
    return [f"{m['kind']} {m['metadata']['name']}" for m, obj in zip(manifests, existing)
            if obj is not None and not controlled_by(obj, uid)]


def conflict_message(things: list[str]) -> str:
    many = len(things) > 1
    return (f"{' and '.join(things)} already {'exist' if many else 'exists'} and {'do' if many else 'does'} not "
            "belong to this InferenceModel; the operator left it as it is: rename the model or remove what is in "
            "the way")
