"""The native CPU decode kernel reads the paged cache in place; it must match the torch reference."""
from __future__ import annotations

import random

import pytest
import torch

from sluice_runtime.executor.attention import native_cpu
from sluice_runtime.executor.attention.torch_backend import gathered_decode

pytestmark = pytest.mark.skipif(native_cpu.load_library() is None,
                                reason="no C++ compiler: the native kernel could not be built")


def paged_case(lengths, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
    rng = random.Random(seed)
    blocks_needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_needed) + 8
    free = list(range(num_blocks))
    rng.shuffle(free)  # scattered blocks, as after many allocations and frees
    tables = torch.zeros(len(lengths), max(blocks_needed), dtype=torch.int32)
    for row, needed in enumerate(blocks_needed):
        tables[row, :needed] = torch.tensor([free.pop() for _ in range(needed)])
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks * block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks * block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(len(lengths), num_heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (4, 4, 64), (8, 2, 128), (20, 2, 64)])
@pytest.mark.parametrize("block_size", [4, 16, 32])
@pytest.mark.parametrize("window", [None, 40])
def test_native_decode_matches_reference(dtype, tolerance, num_heads, num_kv_heads, head_dim, block_size, window):
    lengths = [1, 15, 16, 17, 100, 333]
    q, k_cache, v_cache, tables, lens = paged_case(lengths, num_heads, num_kv_heads, head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    expected = gathered_decode(q, k_cache, v_cache, tables, lens, block_size, window, scale)
    actual = native_cpu.paged_decode(q, k_cache, v_cache, tables, lens, block_size, window, scale)
    assert actual.dtype == dtype and actual.shape == q.shape
    torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_unsupported_head_size_is_refused_not_miscomputed():
    assert not native_cpu.supports(torch.float32, torch.device("cpu"), 96)
    q, k_cache, v_cache, tables, lens = paged_case([5], 2, 2, 96, 16, torch.float32)
    with pytest.raises(ValueError, match="head size 96"):
        native_cpu.paged_decode(q, k_cache, v_cache, tables, lens, 16, None, 0.1)


def test_loading_the_kernel_leaves_the_process_float_environment_alone():
    native_cpu.load_library()
    assert 1e-310 * 1.0 != 0.0, "subnormals are flushed to zero: the library changed the FPU mode"
