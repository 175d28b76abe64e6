"""ModelRoute: a public model name spread over InferenceModels by weight, with fallbacks."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .adapters import ADAPTER_NAME
from .base import Kind, SpecModel, StatusModel, cel
from .status import Condition, conditions_schema_extra

MSG_WEIGHTS = "at least one backend needs a weight above 0"
MSG_SELF_FALLBACK = "a route cannot list its own model among its fallbacks"
MSG_DUPLICATE_BACKEND = "each InferenceModel (or each adapter of one) may appear only once in backends"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"


class Backend(SpecModel):
    inference_model: str = Field(
        description="Name of an InferenceModel in the route's namespace.", min_length=1, max_length=253
    )
    adapter: str = Field(
        default="", max_length=63, pattern=ADAPTER_NAME.replace("^", "^$|^", 1),
        description="One of the InferenceModel's adapters, to serve it rather than the base model (empty: the base).",
    )
    weight: int = Field(
        default=1, ge=0, le=1000,
        description="Share of the traffic relative to the other backends; 0 keeps a backend in reserve.",
    )


class ModelRouteSpec(SpecModel):
    model: str = Field(
        description="The public model name clients send in the `model` field.", min_length=1, max_length=253,
        pattern=NAME_PATTERN,
    )
    backends: list[Backend] = Field(
        min_length=1, max_length=16, description="InferenceModels that serve this name, with their weights.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["inferenceModel", "adapter"]},
    )
    fallbacks: list[str] = Field(
        default_factory=list, max_length=8,
        description="Other public model names tried in order when no backend of this route can serve.",
        json_schema_extra={
            "x-kubernetes-list-type": "set", "items": {"type": "string", "maxLength": 253}, "default": [],
        },
    )
    affinity: Literal["prefix", "session", "none"] = Field(
        default="prefix",
        description=(
            "How the gateway keeps related requests on one replica: 'prefix' (shared prompt prefixes, "
            "reusing KV cache), 'session' (a session header) or 'none' (least loaded)."
        ),
    )

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.backends.exists(b, b.weight > 0)", MSG_WEIGHTS, ".backends"),
                cel("!has(self.fallbacks) || !self.fallbacks.exists(f, f == self.model)", MSG_SELF_FALLBACK, ".fallbacks"),
            ]
        }
    }

    @model_validator(mode="after")
    def _routable(self) -> "ModelRouteSpec":
        if not any(b.weight > 0 for b in self.backends):
            raise ValueError(MSG_WEIGHTS)
        if self.model in self.fallbacks:
            raise ValueError(MSG_SELF_FALLBACK)
        names = [(b.inference_model, b.adapter) for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(MSG_DUPLICATE_BACKEND)
        return self


class ModelRouteStatus(StatusModel):
    observed_generation: int | None = Field(default=None, description="The metadata.generation last compiled.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing and Degraded.", json_schema_extra=conditions_schema_extra()
    )
    endpoints: int | None = Field(default=None, description="Ready endpoints over all backends.")
    ready_backends: int | None = Field(default=None, description="Backends with at least one ready endpoint.")
    backends: str | None = Field(default=None, max_length=8192,
                                 description="Each backend with its weight, e.g. smollm2=90,smollm2-canary=10.")


ModelRoute = Kind(
    kind="ModelRoute",
    plural="modelroutes",
    short_names=["mr"],
    spec=ModelRouteSpec,
    status=ModelRouteStatus,
    description=(
        "A public model name: the gateway spreads its requests over the listed InferenceModels by weight "
        "and tries the fallbacks in order when none can serve."
    ),
    columns=[
        {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
        {"name": "Backends", "type": "string", "jsonPath": ".status.backends"},
        {"name": "Affinity", "type": "string", "jsonPath": ".spec.affinity"},
        {"name": "Endpoints", "type": "integer", "jsonPath": ".status.endpoints"},
    ],
)
