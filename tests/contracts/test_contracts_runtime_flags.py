"""The runtime's flag limits: the ranges hold integers only, the block sizes are exactly the powers of two."""
import pytest

from sluice_contracts import runtime_flags
from sluice_contracts.runtime_flags import (
    BLOCK_SIZES,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    TENSOR_PARALLEL_SIZE,
    block_size_message,
    is_block_size,
)


def test_block_sizes_are_the_powers_of_two_up_to_256():
    assert BLOCK_SIZES == tuple(n for n in range(1, 257) if n & (n - 1) == 0)
    assert all(is_block_size(n) for n in BLOCK_SIZES)
    assert not any(is_block_size(v) for v in (0, 3, 48, 512, True, 16.0, "16", None))
    assert block_size_message(3) == "block size must be a power of two up to 256, got 3"


@pytest.mark.parametrize("flag", [MAX_MODEL_LEN, MAX_NUM_SEQS, TENSOR_PARALLEL_SIZE])
def test_a_range_holds_its_bounds_and_nothing_else(flag):
    assert flag.minimum in flag and flag.maximum in flag
    for outside in (flag.minimum - 1, flag.maximum + 1, True, float(flag.minimum), str(flag.minimum), None):
        assert outside not in flag, outside
    assert flag.message(flag.minimum - 1).endswith(f"must be at least {flag.minimum}, got {flag.minimum - 1}")
    assert flag.message(flag.maximum + 1).endswith(f"must be at most {flag.maximum}, got {flag.maximum + 1}")
    assert flag.message("8").endswith(f"must be an integer from {flag.minimum} to {flag.maximum}, got '8'")


def test_the_runtime_and_the_crd_default_to_the_contracts_values():
    from sluice_operator.crd.inference_model import RuntimeSpec
    from sluice_runtime.engine_config import EngineConfig, parse_memory
    from sluice_runtime.executor.model_runner import DEFAULT_CPU_KV_CACHE

    engine, spec = EngineConfig(), RuntimeSpec()
    assert (engine.dtype, engine.block_size, engine.max_num_seqs, engine.max_lora_rank,
            engine.gpu_memory_utilization) == (
        runtime_flags.DEFAULT_DTYPE, runtime_flags.DEFAULT_BLOCK_SIZE, runtime_flags.DEFAULT_MAX_NUM_SEQS,
        runtime_flags.DEFAULT_MAX_LORA_RANK, runtime_flags.DEFAULT_GPU_MEMORY_UTILIZATION)
    assert (spec.block_size, spec.max_num_seqs, spec.max_lora_rank) == (
        runtime_flags.DEFAULT_BLOCK_SIZE, runtime_flags.DEFAULT_MAX_NUM_SEQS, runtime_flags.DEFAULT_MAX_LORA_RANK)
    assert parse_memory(runtime_flags.DEFAULT_CPU_KV_CACHE_MEMORY) == DEFAULT_CPU_KV_CACHE
