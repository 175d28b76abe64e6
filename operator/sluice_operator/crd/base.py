"""Shared building blocks of the custom resource models: base config, quantities, CEL rules."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema
from pydantic.alias_generators import to_camel

GROUP = "sluice.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# The runtime serves HTTP, probes and /metrics on this port.
RUNTIME_PORT = 8000
# Every object and pod Sluice makes for an InferenceModel carries its name under this label.
LABEL_MODEL = "sluice.dev/inference-model"
MANAGED_BY = "sluice-operator"


class SpecModel(BaseModel):
    """Spec fragments: camelCase on the wire, unknown fields refused (the API server prunes them too)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(BaseModel):
    """Status fragments: tolerant when reading, since older operators may have written other fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel(rule: str, message: str, field_path: str | None = None,
        message_expression: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry, evaluated by the API server on admission; `message_expression`
    (CEL) says what is wrong in the object's own terms, `message` where it cannot be evaluated."""
    entry = {"rule": rule, "message": message}
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    return entry


# Kubernetes resource quantities ("2", "500m", "4Gi"); users write both `cpu: 2` and `cpu: "2"`.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
_QUANTITY = re.compile(QUANTITY_PATTERN)


def _quantity(value: Any) -> str:
    text = str(value)
    if isinstance(value, bool) or not _QUANTITY.match(text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as '2', '500m' or '4Gi'")
    return text


_UNITS = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def cpu_cores(quantity: str) -> float:
    """A CPU quantity ("2", "500m") in cores."""
    number = re.match(r"^[0-9.]+", quantity).group(0)
    return float(number) * _UNITS[quantity[len(number):]]


Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]

# Deployment rollout knobs: an absolute pod count or a percentage.
_INT_OR_PERCENT = re.compile(r"^[0-9]+%?$")


def _int_or_percent(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _INT_OR_PERCENT.match(value):
        return value
    raise ValueError(f"{value!r} must be a pod count such as 1 or a percentage such as '25%'")


IntOrPercent = Annotated[
    int | str,
    BeforeValidator(_int_or_percent),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^[0-9]+%?$",
        }
    ),
]


# The last printer columns of every kind: its readiness in a word, and its age.
STATUS_AND_AGE_COLUMNS = (
    {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


@dataclass(frozen=True)
class Kind:
    """A custom resource: the names the API server knows it by, its models and what `kubectl get` shows."""

    kind: str
    plural: str
    short_names: list[str]
    spec: type
    status: type
    description: str
    columns: list[dict[str, str]]  # printer columns before Status and Age
    root_rules: list[dict[str, str]] = field(default_factory=list)
    scale: dict[str, str] | None = None

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def printer_columns(self) -> list[dict[str, str]]:
        return [*self.columns, *STATUS_AND_AGE_COLUMNS]
