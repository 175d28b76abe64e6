"""GPU memory: what the weights and a maximal step take, and how many KV-cache blocks fit in the rest.

At start the runner loads the weights and runs the largest prefill a step can hold, then the
KV cache gets what is left of --gpu-memory-utilization of the device. The arithmetic is a pure
function so it is tested without a GPU.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model_load_error import ModelLoadError


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass
class MemoryProfile:
    total: int  # device memory
    weights: int
    activations: int  # peak above the weights during the maximal step
    other: int  # outside torch's allocator: CUDA context, communication buffers, other processes


def plan_kv_cache_blocks(profile: MemoryProfile, utilization: float, bytes_per_block: int, block_size: int,
                         max_model_len: int, requested_bytes: int | None, graph_reserve: int) -> int:
    """KV-cache blocks for this device; ModelLoadError (one line) when the model or one sequence does not fit.

    requested_bytes (--kv-cache-memory) caps the cache; graph_reserve is kept free for the
    memory pool of captured CUDA graphs.
    """
    budget = int(profile.total * utilization)
    fixed = profile.weights + profile.activations + profile.other + graph_reserve
    if fixed >= budget:
        raise ModelLoadError(
            f"the model does not fit: weights {_gib(profile.weights)} + activations {_gib(profile.activations)} + "
            f"CUDA graphs {_gib(graph_reserve)} + other {_gib(profile.other)} = {_gib(fixed)}, but "
            f"--gpu-memory-utilization {utilization} of {_gib(profile.total)} allows {_gib(budget)}; raise "
            "--gpu-memory-utilization, shard across GPUs with --tensor-parallel-size, lower "
            "--max-num-batched-tokens, or use --enforce-eager")
    available = budget - fixed
    if requested_bytes is not None:
        available = min(available, requested_bytes)
    blocks = available // bytes_per_block
    needed = -(-max_model_len // block_size)
    if blocks < needed:
        raise ModelLoadError(
            f"the KV cache left over ({_gib(available)}, {blocks * block_size} tokens) cannot hold one sequence of "
            f"--max-model-len {max_model_len} tokens; lower --max-model-len or raise --gpu-memory-utilization"
            + (" or --kv-cache-memory" if requested_bytes is not None else ""))
    return blocks


def profile_cuda_memory(device: torch.device, run_maximal_step: Callable[[], None]) -> MemoryProfile:
    """Measure after the weights are loaded and before the KV cache exists."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    weights = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run_maximal_step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    other = max(0, total - free - torch.cuda.memory_reserved(device))
    torch.cuda.empty_cache()
    return MemoryProfile(total=total, weights=weights, activations=peak - weights, other=other)
