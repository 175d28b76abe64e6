"""An InferenceModel's LoRA adapters on its runtime pods: the start-time list, its volumes and flags, and which
list a new template starts with.

The running pods learn of later changes to the list through the runtime's API (handlers/adapters.py), so an
edit of the list alone must leave the pod template as it is: the template keeps the start-time list it was
built with (the "pinned" list) until something else in it changes, and a new template takes the list of the
spec. Claims stay mounted while the pinned list or the spec names them.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from ..crd import InferenceModelSpec
from ..crd.adapters import Adapter
from .engine_command import EngineCommand

ADAPTERS_DIR = "/adapters"
# On the Deployment (not its template): the start-time list the template carries, and a digest of the template.
START_ADAPTERS_ANNOTATION = "sluice.dev/start-adapters"
TEMPLATE_DIGEST_ANNOTATION = "sluice.dev/template-digest"


def adapter_path(adapter: Adapter) -> str:
    """Where the runtime finds the adapter's PEFT directory."""
    source = adapter.parsed()
    if source.kind == "file":
        return source.path
    return f"{ADAPTERS_DIR}/{source.claim}/{source.path}"


def _volume_name(claim: str) -> str:
    # A digest rather than a position: adding a claim leaves the other volumes' names as they were.
    return "adapters-" + hashlib.sha256(claim.encode()).hexdigest()[:12]


def adapter_volumes(adapters: list[Adapter]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): each claim the adapters name, once, read-only at ADAPTERS_DIR/CLAIM."""
    claims = sorted({a.parsed().claim for a in adapters if a.parsed().kind == "pvc"})
    volumes = [{"name": _volume_name(c), "persistentVolumeClaim": {"claimName": c, "readOnly": True}} for c in claims]
    mounts = [{"name": _volume_name(c), "mountPath": f"{ADAPTERS_DIR}/{c}", "readOnly": True} for c in claims]
    return volumes, mounts


# The flag naming one start-time adapter, NAME=PATH, per engine (the CRD refuses adapters for sglang).
_ADAPTER_FLAG = {"sluice": "--lora", "vllm": "--lora-modules"}
# vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set.
VLLM_RUNTIME_LORA_ENV = {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}


def lora_command(spec: InferenceModelSpec, start: list[Adapter], command: EngineCommand) -> None:
    """Adds the engine's LoRA flags to `command`: on whenever the spec has an adapter list, even an empty one."""
    if spec.adapters is None:
        return
    engine = spec.runtime.engine
    args = ["--enable-lora", "--max-loras", str(spec.runtime.max_loras),
            "--max-lora-rank", str(spec.runtime.max_lora_rank)]
    pairs = [f"{adapter.name}={adapter_path(adapter)}" for adapter in start]
    if engine == "vllm":
        args += ["--lora-modules", *pairs] if pairs else []
        command.env.append(dict(VLLM_RUNTIME_LORA_ENV))
    else:
        for pair in pairs:
            args += [_ADAPTER_FLAG[engine], pair]
    command.args += args


def encode_start(start: list[Adapter]) -> str:
    return json.dumps([a.wire() for a in start], sort_keys=True, separators=(",", ":"))


def pinned_start(deployment: dict[str, Any] | None) -> list[Adapter] | None:
    """The start-time list the Deployment's template was built with; None when it records none readable."""
    annotations = ((deployment or {}).get("metadata") or {}).get("annotations") or {}
    try:
        return [Adapter.model_validate(a) for a in json.loads(annotations[START_ADAPTERS_ANNOTATION])]
    except (KeyError, TypeError, ValueError):
        return None


def template_digest(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recorded_digest(deployment: dict[str, Any] | None) -> str | None:
    return (((deployment or {}).get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_DIGEST_ANNOTATION)
