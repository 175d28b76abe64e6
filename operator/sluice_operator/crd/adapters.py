"""LoRA adapters of an InferenceModel: where each comes from, and what the status says of it per replica."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from sluice_contracts import runtime_credential
from sluice_contracts.runtime_flags import MAX_LORA_RANK

from .base import SpecModel, StatusModel, cel

# A public model name clients send, and a DNS label: it can name a metric label, a file or a Service alike.
ADAPTER_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# No '.' or '..' segment, so no path leads out of the claim (or the directory) it names; '.cache' is fine.
# Dots as [.]: a backslash would be an escape in the CEL string literal the pattern is quoted in.
_SEGMENT = r"([A-Za-z0-9_@+-]|[.][A-Za-z0-9_@+-]|[.][.][A-Za-z0-9._@+-])[A-Za-z0-9._@+-]*"
ADAPTER_PVC_SOURCE = re.compile(rf"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/{_SEGMENT}(/{_SEGMENT})*$")
ADAPTER_FILE_SOURCE = re.compile(rf"^file:///{_SEGMENT}(/{_SEGMENT})*$")

MSG_ADAPTER_SOURCE = (
    "adapters[].source must be 'pvc://CLAIM/PATH' (a PEFT directory on a PersistentVolumeClaim, mounted read-only) "
    "or 'file:///PATH' (a PEFT directory in the runtime's own file system), without '.' or '..' segments"
)
# Kernel and runtime-state file systems, where Kubernetes also mounts Secrets (the runtime credential, the
# service account): no adapter lives there, and reading one could hang on a device or hand its bytes to the
# adapter loader. A link elsewhere pointing in is the runtime's reader's to refuse.
FILE_SOURCE_DENIED_ROOTS = tuple(dict.fromkeys(("/dev", "/proc", "/sys", "/run", "/var/run",
                                                runtime_credential.MOUNT_DIR)))
_DENIED = re.compile("^file://(" + "|".join(FILE_SOURCE_DENIED_ROOTS) + ")(/|$)")
MSG_ADAPTER_ROOT = ("adapters[].source: a 'file://' path may not be under "
                    + ", ".join(FILE_SOURCE_DENIED_ROOTS) + " (kernel and runtime-state file systems, mounted Secrets)")
MSG_ADAPTER_NAME = "adapters[].name must be a DNS label: at most 63 lowercase letters, digits or '-'"
MSG_ADAPTER_COUNT = "adapters may list at most runtime.maxLoras adapters"
MSG_ADAPTER_RANK = "an adapter's rank must not be above runtime.maxLoraRank"
MSG_ADAPTER_ENGINE = (
    "adapters are not supported with engine sglang here: its adapter API differs from vLLM's, which the operator "
    "speaks; use engine sluice or vllm"
)
MSG_ADAPTER_SERVED_NAME = "an adapter cannot take the name of its InferenceModel or of its servedModelName"


@dataclass(frozen=True)
class AdapterSource:
    kind: Literal["pvc", "file"]
    claim: str
    path: str  # inside the claim, or absolute for 'file'


class Adapter(SpecModel):
    name: str = Field(
        min_length=1, max_length=63, pattern=ADAPTER_NAME,
        description="The model name clients send for this adapter; a DNS label, unique in the namespace's models.",
    )
    source: str = Field(
        max_length=512,
        description=(
            "Where the PEFT directory (adapter_config.json, adapter_model.safetensors) is: 'pvc://CLAIM/PATH' on a "
            "PersistentVolumeClaim of the namespace, mounted read-only at /adapters/CLAIM, or 'file:///PATH' in the "
            "runtime's file system (an image with the adapter in it; on the local test cluster, this machine's)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(f"self.matches('{ADAPTER_PVC_SOURCE.pattern}') || self.matches('{ADAPTER_FILE_SOURCE.pattern}')",
                    MSG_ADAPTER_SOURCE),
                cel(f"!self.matches('{_DENIED.pattern}')", MSG_ADAPTER_ROOT),
            ]
        },
    )
    rank: int | None = Field(
        default=None, ge=MAX_LORA_RANK.minimum, le=MAX_LORA_RANK.maximum,
        description="The adapter's LoRA rank, if known: checked against runtime.maxLoraRank when applied.",
    )

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not ADAPTER_PVC_SOURCE.match(value) and not ADAPTER_FILE_SOURCE.match(value):
            raise ValueError(MSG_ADAPTER_SOURCE)
        if _DENIED.match(value):
            raise ValueError(MSG_ADAPTER_ROOT)
        return value

    def parsed(self) -> AdapterSource:
        if self.source.startswith("file://"):
            return AdapterSource("file", "", self.source[len("file://"):])
        claim, _, path = self.source[len("pvc://"):].partition("/")
        return AdapterSource("pvc", claim, path)


AdapterState = Literal["Loaded", "Failed"]


class AdapterReplica(StatusModel):
    pod: str = Field(description="The runtime pod.", max_length=253)
    state: AdapterState = Field(description="Loaded: requests for the adapter may go here. Failed: see message.")
    message: str = Field(default="", description="Why loading failed.", max_length=1024)


class AdapterStatus(StatusModel):
    name: str = Field(description="The adapter.", max_length=63)
    ready_replicas: int = Field(default=0, description="Serving replicas that have the adapter loaded.")
    replicas: list[AdapterReplica] = Field(
        default_factory=list, description="The adapter on each serving replica.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["pod"]},
    )
