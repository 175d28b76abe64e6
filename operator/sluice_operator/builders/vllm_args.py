"""vLLM's OpenAI server: `vllm serve MODEL` and its flags, from an InferenceModel spec.

Flags as vLLM defines them in vllm/engine/arg_utils.py (EngineArgs, the config dataclasses it draws from), read at
vllm-project/vllm commit 99d7eb5d (the v0.11 line): `--served-model-name`, `--revision`, `--dtype` (auto, half,
float16, bfloat16, float, float32), `--max-model-len`, `--max-num-seqs`, `--block-size`,
`--[no-]enable-prefix-caching`, `--gpu-memory-utilization`, `--kv-cache-memory-bytes`, `--tensor-parallel-size`,
`--speculative-config`, `--host`, `--port`. vLLM's own API key guards only the `/v1` paths, so a pod that checks
the runtime credential runs the server on loopback (engine_guard.ENGINE_HOST:ENGINE_PORT) with no key and the
engine guard in front of it; the guard leaves `/health` and `/metrics` open. `/health` answers once the engine is
up, so it is the readiness probe too.
"""
from __future__ import annotations

from ..crd import InferenceModelSpec
from .engine_command import EngineCommand, listen_address
from .model_mount import ModelMount

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(quantity: str) -> int:
    return int(quantity[:-2]) * _BINARY[quantity[-2:]]


def vllm_command(name: str, spec: InferenceModelSpec, mount: ModelMount, guarded: bool) -> EngineCommand:
    rt = spec.runtime
    host, port = listen_address(guarded)
    args = [
        mount.hub_arg,
        "--host", host,
        "--port", str(port),
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
    if rt.speculative is not None:
        args += ["--speculative-config", rt.speculative.flag_value()]
    return EngineCommand(command=["vllm", "serve"], args=args + list(rt.args), ready_path="/health", guarded=guarded)
