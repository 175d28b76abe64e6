"""A namespace's routing table → the ConfigMap the gateway mounts (the chart names it too, in _helpers.tpl)."""
from __future__ import annotations

from typing import Any

from .names import GENERATION_ANNOTATION, managed_labels, model_owner_references

ROUTING_TABLE = "sluice-routing-table"
ROUTING_TABLE_KEY = "routing-table.json"


def build_routing_table(namespace: str, generation: int, document: str,
                        models: list[dict[str, Any]]) -> dict[str, Any]:
    """`document`: the table's JSON; owned by every model of the namespace, so it goes with the last of them."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROUTING_TABLE,
            "namespace": namespace,
            "labels": managed_labels(),
            "annotations": {GENERATION_ANNOTATION: str(generation)},
            "ownerReferences": model_owner_references(models),
        },
        "data": {ROUTING_TABLE_KEY: document},
    }
