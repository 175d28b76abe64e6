"""Where a runtime pod finds its model: the volume, the token variable and the source as each engine names it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..crd import InferenceModelSpec

MODEL_DIR = "/model"
# The Hub repository the embedded model was converted from, for engines that cannot read the embedded GGUF.
EMBEDDED_MODEL_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass
class ModelMount:
    sluice_arg: str  # sluice-runtime's --model: 'smollm2', 'hf:ORG/NAME[@REV]' or a directory
    hub_arg: str  # vLLM's and SGLang's model: an HF repository or a directory
    revision: str | None = None  # the Hub revision, for engines that take it as its own flag
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)


def model_mount(spec: InferenceModelSpec) -> ModelMount:
    source = spec.model.parsed()
    if source.kind == "embedded":
        return ModelMount(sluice_arg=spec.model.source, hub_arg=EMBEDDED_MODEL_REPO)
    if source.kind == "pvc":
        path = f"{MODEL_DIR}/{source.path}".rstrip("/")
        return ModelMount(
            sluice_arg=path, hub_arg=path,
            volumes=[{"name": "model", "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}}],
            mounts=[{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}],
        )
    # The runtime reads a pinned revision from the source itself: hf:ORG/NAME@REVISION.
    revision = spec.model.revision
    mount = ModelMount(sluice_arg=spec.model.source + (f"@{revision}" if revision else ""), hub_arg=source.repo,
                       revision=revision)
    secret = spec.model.token_secret
    if secret is not None:
        mount.env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}
        )
    return mount
