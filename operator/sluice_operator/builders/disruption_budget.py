"""InferenceModel → a PodDisruptionBudget, so node drains take one replica at a time."""
from __future__ import annotations

from typing import Any

from .names import Owner, selector_labels


def build_disruption_budget(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.metadata(),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}},
    }
