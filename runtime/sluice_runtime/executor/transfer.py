"""Host-to-device copies of step inputs: through pinned memory and without blocking the host.

A pageable host tensor is copied synchronously (the driver stages it first); a pinned one is
queued on the stream, so the host goes on preparing the rest of the step while it moves.
"""
from __future__ import annotations

import torch


def to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return torch.tensor(data, dtype=dtype)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
