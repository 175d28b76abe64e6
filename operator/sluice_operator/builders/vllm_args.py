"""vLLM's OpenAI server: `vllm serve MODEL` and its flags, from an InferenceModel spec.

Flags as vLLM defines them in vllm/engine/arg_utils.py (EngineArgs, the config dataclasses it draws from),
read at vllm-project/vllm commit 99d7eb5d (the v0.11 line, the default image's): `--served-model-name`,
`--revision`, `--dtype` (auto, half, float16, bfloat16, float, float32), `--max-model-len`, `--max-num-seqs`,
`--block-size`, `--[no-]enable-prefix-caching`, `--gpu-memory-utilization`, `--kv-cache-memory-bytes`,
`--tensor-parallel-size`, `--host`, `--port`. The server reads its API key from `VLLM_API_KEY` when `--api-key`
is not given; it guards the `/v1` paths and leaves `/health` and `/metrics` open, which is what the gateway
and the autoscaler need. `/health` answers once the engine is up, so it is the readiness probe too
(`/v1/models` sits behind the API key).
"""
from __future__ import annotations

from ..crd import RUNTIME_PORT, InferenceModelSpec
from .engine_command import EngineCommand, credential_env
from .model_mount import ModelMount

API_KEY_ENV = "VLLM_API_KEY"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(quantity: str) -> int:
    return int(quantity[:-2]) * _BINARY[quantity[-2:]]


def vllm_command(name: str, spec: InferenceModelSpec, mount: ModelMount, credential_secret: str | None) -> EngineCommand:
    rt = spec.runtime
    args = [
        mount.hub_arg,
        "--host", "$(POD_IP)",
        "--port", str(RUNTIME_PORT),
        "--served-model-name", spec.served_name(name),
        "--max-model-len", str(rt.max_model_len),
        "--max-num-seqs", str(rt.max_num_seqs),
        "--block-size", str(rt.block_size),
    ]
    if mount.revision:
        args += ["--revision", mount.revision]
    if rt.dtype is not None:
        args += ["--dtype", rt.dtype]
    if rt.kv_cache_memory is not None:
        args += ["--kv-cache-memory-bytes", str(quantity_bytes(rt.kv_cache_memory))]
    if rt.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(rt.gpu_memory_utilization)]
    if spec.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if not rt.prefix_caching:
        args.append("--no-enable-prefix-caching")
    env = [credential_env(credential_secret, API_KEY_ENV)] if credential_secret is not None else []
    return EngineCommand(command=["vllm", "serve"], args=args + list(rt.args), ready_path="/health", env=env)
