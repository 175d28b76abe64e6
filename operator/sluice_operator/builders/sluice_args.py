"""Sluice's runtime: `sluice-runtime serve` and its flags (README's engine table), from an InferenceModel spec."""
from __future__ import annotations

from sluice_contracts import runtime_credential

from ..crd import RUNTIME_PORT, SLUICE_DTYPE, SLUICE_KV_CACHE_MEMORY, InferenceModelSpec
from .engine_command import EngineCommand
from .model_mount import ModelMount
from .model_version import weights


def kv_cache_arg(quantity: str) -> str:
    """Kubernetes binary units (1Gi) to the runtime's (1GiB)."""
    return quantity + "B"


def sluice_command(name: str, spec: InferenceModelSpec, mount: ModelMount, drain_seconds: int,
                   credential_secret: str | None) -> EngineCommand:
    rt = spec.runtime
    args = [
        "serve",
        "--model", mount.sluice_arg,
        # The pod's own address (downward API): probes and the gateway reach it there.
        "--host", "$(POD_IP)",
        "--port", str(RUNTIME_PORT),
        "--served-model-name", spec.served_name(name),
        "--max-model-len", str(rt.max_model_len),
        "--max-num-seqs", str(rt.max_num_seqs),
        "--dtype", rt.dtype or SLUICE_DTYPE,
        "--kv-cache-memory", kv_cache_arg(rt.kv_cache_memory or SLUICE_KV_CACHE_MEMORY),
        "--block-size", str(rt.block_size),
        "--device", "cuda" if spec.resources.gpus else "cpu",
        "--shutdown-timeout", str(drain_seconds),
        # The weights only: the generation moves with any edit, and in the pods' arguments it would roll them all.
        "--model-version", weights(spec),
    ]
    if not rt.prefix_caching:
        args.append("--no-prefix-caching")
    if rt.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(rt.gpu_memory_utilization)]
    if spec.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if rt.quantization is not None:
        args += ["--quantization", rt.quantization]
    if rt.speculative is not None:
        args += ["--speculative-config", rt.speculative.flag_value()]
    args += list(rt.args)
    if credential_secret is not None:
        args += ["--api-key-file", runtime_credential.MOUNT_PATH]
    return EngineCommand(command=["sluice-runtime"], args=args, ready_path="/ready",
                         credential_file=credential_secret is not None)
