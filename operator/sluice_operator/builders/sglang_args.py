"""SGLang's server: `python3 -m sglang.launch_server` and its flags, from an InferenceModel spec.

Flags as SGLang defines them in python/sglang/srt/server_args.py (ServerArgs), read at sgl-project/sglang
commit 001067ff; the ones used here have kept their names since 0.4: `--model-path`, `--served-model-name`,
`--revision`, `--dtype` (auto, half, float16, bfloat16, float, float32), `--context-length`,
`--max-running-requests`, `--page-size`, `--disable-radix-cache` (its prefix cache), `--mem-fraction-static`,
`--tp-size`, `--host`, `--port`, `--api-key`, and `--enable-metrics`, without which it serves no /metrics.
It has no flag for a KV-cache size in bytes (the CRD refuses runtime.kvCacheMemory for it). Its `--api-key`
leaves paths open as vLLM's does, so a pod that checks the runtime credential runs it on loopback behind the
engine guard, without a key of its own.
"""
from __future__ import annotations

from ..crd import InferenceModelSpec
from .engine_command import EngineCommand, listen_address
from .model_mount import ModelMount


def sglang_command(name: str, spec: InferenceModelSpec, mount: ModelMount,
                   guarded: bool) -> EngineCommand:
    rt = spec.runtime
    host, port = listen_address(guarded)
    args = [
        "--model-path", mount.hub_arg,
        "--host", host,
        "--port", str(port),
        "--served-model-name", spec.served_name(name),
        "--context-length", str(rt.max_model_len),
        "--max-running-requests", str(rt.max_num_seqs),
        "--page-size", str(rt.block_size),
        "--enable-metrics",
    ]
    if mount.revision:
        args += ["--revision", mount.revision]
    if rt.dtype is not None:
        args += ["--dtype", rt.dtype]
    if rt.gpu_memory_utilization is not None:
        args += ["--mem-fraction-static", str(rt.gpu_memory_utilization)]
    if spec.tensor_parallel_size > 1:
        args += ["--tp-size", str(spec.tensor_parallel_size)]
    if not rt.prefix_caching:
        args.append("--disable-radix-cache")
    args += list(rt.args)
    return EngineCommand(command=["python3", "-m", "sglang.launch_server"], args=args, ready_path="/health",
                         guarded=guarded)
