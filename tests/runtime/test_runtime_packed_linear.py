"""CPU linears, packed for oneDNN or (half precision) computed in float32, must compute what the plain layers compute."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sluice_runtime.cpu_isa import cpu_paths
from sluice_runtime.executor.packed_linear import PACKED, WIDENED, packing_available, prepare_linears


def _modes():
    """Each way a layer can compute, skipped where this CPU (or SLUICE_CPU_ISA) rules it out."""
    packed_here = packing_available() and cpu_paths().onednn_bf16
    return [pytest.param(True, PACKED, id="packed", marks=pytest.mark.skipif(
                not packed_here, reason="oneDNN computes bfloat16 natively only with AVX-512 or AVX-NE-CONVERT")),
            pytest.param(False, WIDENED, id="float32")]


@pytest.mark.parametrize("native,mode", _modes())
@pytest.mark.parametrize("rows", [1, 2, 7, 32, 300])
def test_packed_linear_matches_plain(rows, native, mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96, bias=True), nn.Linear(96, 48, bias=False)).to(torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(x)
        assert prepare_linears(model, {torch.bfloat16: native}) == (mode, 2)
        actual = model(x)
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("rows", [1, 5, 3, 64])
def test_float16_without_native_support_computes_in_float32_and_answers_in_float16(rows):
    torch.manual_seed(1)
    layer = nn.Linear(32, 16).to(torch.float16)
    x = torch.randn(2, rows, 32, dtype=torch.float16)  # leading dims other than rows too
    with torch.inference_mode():
        expected = (x.float() @ layer.weight.float().T + layer.bias.float()).half()
        assert prepare_linears(layer, {torch.float16: False}) == (WIDENED, 1)
        actual = layer(x)
    assert actual.dtype == torch.float16 and actual.shape == (2, rows, 16)
    torch.testing.assert_close(actual, expected, atol=2e-3, rtol=2e-3)


def test_float32_layers_are_left_alone_unless_asked():
    model = nn.Linear(8, 8)
    assert prepare_linears(model, {torch.bfloat16: False, torch.float16: False, torch.float32: False}) == (None, 0)
    assert "forward" not in vars(model) and not hasattr(model, "packed_weight")


class Tied(nn.Module):
    """An embedding whose weight the LM head shares, as with tie_word_embeddings."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.proj = nn.Linear(24, 40, bias=True)
        self.head = nn.Linear(24, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.proj(self.embed(ids))[..., :24])


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN weight packing")
@pytest.mark.parametrize("shape", [(0,), (1,), (2, 1), (7,), (3, 33)])
def test_packed_float32_matches_plain_frees_its_weight_and_keeps_a_shared_one(shape):
    torch.manual_seed(2)
    model = Tied()
    ids = torch.randint(0, 50, shape)
    with torch.inference_mode():
        expected = model(ids)
        assert prepare_linears(model, {torch.float32: True}) == (PACKED, 2)
        actual = model(ids)
    assert actual.shape == expected.shape == (*shape, 50)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    # The packed copy replaces the projection's weight: same shape for what reads it, no memory of its own.
    assert model.proj.weight.shape == (40, 24) and model.proj.weight.stride() == (0, 0)
    # The head's weight is the embedding's: it stays whole, and embedding lookups still see it.
    assert model.head.weight is model.embed.weight and model.embed.weight.stride() == (24, 1)
    assert sum(p.numel() for p in model.parameters()) == 50 * 24 + 40 * 24 + 40
