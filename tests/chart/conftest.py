"""The chart tests' `helm`: the chart rendered and installed with the helm binary of helm_tool.helm_binary."""
from __future__ import annotations

import pytest
from chart.helm_tool import Helm, helm_binary


@pytest.fixture(scope="module")
def helm(request) -> Helm:
    return Helm(helm_binary(request))
