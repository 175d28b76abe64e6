"""Pre-packed bfloat16 linears must compute exactly what the plain layers compute."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sluice_runtime.executor.packed_linear import packing_available, prepack_linears

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 7, 32, 300])
def test_packed_linear_matches_plain(rows):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96, bias=True), nn.Linear(96, 48, bias=False)).to(torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(x)
        assert prepack_linears(model) == 2
        actual = model(x)
    torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1e-2)


def test_float32_layers_are_left_alone():
    model = nn.Linear(8, 8)
    assert prepack_linears(model) == 0
    assert not hasattr(model, "packed_weight")
