"""The fused CPU norm and rotary must compute what the torch layers compute: float32 as torch's own
arithmetic (rotary bit for bit, the norm up to its sum's order), bfloat16 to its rounding."""
from __future__ import annotations

import pytest
import torch

from sluice_runtime.layers import fused_cpu
from sluice_runtime.layers.norm import RMSNorm
from sluice_runtime.layers.rotary import Rope, RotaryEmbedding, apply_rotary

pytestmark = pytest.mark.skipif(not fused_cpu.applies(torch.bfloat16, torch.device("cpu")),
                                reason="no C++ compiler: the fused CPU ops could not be built")


def torch_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)).to(x.dtype)


# bfloat16 rounds the norm's input and output; float32 differs from torch only in the order of
# the sum of squares, a few units in the last place.
TOLERANCE = {torch.bfloat16: 2 ** -7, torch.float32: 2 ** -20}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_norm_with_residual_matches_torch_and_updates_the_skip_stream(rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=gen).to(dtype)
    skip = (3 * torch.randn(rows, 576, generator=gen)).to(dtype)
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data = torch.randn(576, generator=gen).to(dtype)
    expected_skip = x + skip

    out, new_skip = norm(x, skip.clone())

    assert torch.equal(new_skip, expected_skip)
    torch.testing.assert_close(out, torch_norm(norm, expected_skip), atol=0, rtol=TOLERANCE[dtype])
    torch.testing.assert_close(norm(x), torch_norm(norm, x), atol=0, rtol=TOLERANCE[dtype])


def test_float32_rotary_is_torchs_arithmetic_bit_for_bit():
    rotary = RotaryEmbedding(64, 4096, 10000.0, {})
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(40, (9 + 3 + 3) * 64, generator=gen)
    # The last position of the table too: each row reads its own position's cos and sin.
    positions = torch.cat([torch.randint(0, 4096, (39,), generator=gen), torch.tensor([4095])])
    q, k = qkv[:, :576].view(-1, 9, 64), qkv[:, 576:768].view(-1, 3, 64)
    expected = apply_rotary(q.clone(), k.clone(), Rope(positions, rotary.cos[positions].unsqueeze(1),
                                                       rotary.sin[positions].unsqueeze(1)))

    rope = rotary.tables(positions, torch.float32)
    assert rope.fused
    for actual, reference in zip(apply_rotary(q, k, rope), expected):
        assert torch.equal(actual, reference)


@pytest.mark.parametrize("scaling", [{}, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rotary_rotates_query_and_key_views_in_place(scaling):
    rotary = RotaryEmbedding(64, 4096, 10000.0, scaling)
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(33, (9 + 3 + 3) * 64, generator=gen).bfloat16()
    before = qkv.clone()
    positions = torch.randint(0, 4096, (33,), generator=gen)
    q, k = qkv[:, :576].view(-1, 9, 64), qkv[:, 576:768].view(-1, 3, 64)
    reference = apply_rotary(q.float(), k.float(), Rope(positions, rotary.cos[positions].unsqueeze(1),
                                                        rotary.sin[positions].unsqueeze(1)))

    rope = rotary.tables(positions, torch.bfloat16)
    assert rope.fused
    rotated_q, rotated_k = apply_rotary(q, k, rope)

    assert rotated_q.data_ptr() == q.data_ptr()
    for actual, expected in zip((rotated_q, rotated_k), reference):
        torch.testing.assert_close(actual.float(), expected, atol=2e-2, rtol=2 ** -7)
    assert torch.equal(qkv[:, 768:], before[:, 768:]), "the value heads must not be touched"
