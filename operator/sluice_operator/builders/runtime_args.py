"""The runtime container's command line and model volume, from an InferenceModel spec."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..crd import InferenceModelSpec
from ..crd import RUNTIME_PORT

MODEL_DIR = "/model"


@dataclass
class ModelMount:
    model_arg: str
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)


def kv_cache_arg(quantity: str) -> str:
    """Kubernetes binary units (1Gi) to the runtime's (1GiB)."""
    return quantity + "B"


def model_mount(spec: InferenceModelSpec) -> ModelMount:
    source = spec.model.parsed()
    if source.kind == "embedded":
        return ModelMount(model_arg=spec.model.source)
    if source.kind == "pvc":
        return ModelMount(
            model_arg=f"{MODEL_DIR}/{source.path}".rstrip("/"),
            volumes=[{"name": "model", "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}}],
            mounts=[{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}],
        )
    # The runtime reads a pinned revision from the source itself: hf:ORG/NAME@REVISION.
    revision = f"@{spec.model.revision}" if spec.model.revision else ""
    mount = ModelMount(model_arg=spec.model.source + revision)
    secret = spec.model.token_secret
    if secret is not None:
        mount.env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}
        )
    return mount


def runtime_args(name: str, spec: InferenceModelSpec, mount: ModelMount, drain_seconds: int) -> list[str]:
    rt = spec.runtime
    args = [
        "serve",
        "--model", mount.model_arg,
        # The pod's own address (downward API): probes and the gateway reach it there.
        "--host", "$(POD_IP)",
        "--port", str(RUNTIME_PORT),
        "--served-model-name", spec.served_name(name),
        "--max-model-len", str(rt.max_model_len),
        "--max-num-seqs", str(rt.max_num_seqs),
        "--dtype", rt.dtype,
        "--kv-cache-memory", kv_cache_arg(rt.kv_cache_memory),
        "--block-size", str(rt.block_size),
        "--device", "cuda" if spec.resources.gpus else "cpu",
        "--shutdown-timeout", str(drain_seconds),
    ]
    if not rt.prefix_caching:
        args.append("--no-prefix-caching")
    if spec.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    return args + list(rt.args)
