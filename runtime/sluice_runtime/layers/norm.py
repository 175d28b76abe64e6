import torch
from torch import nn

from . import fused_cpu


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x); with `residual` (the layer's skip stream), adds x to it first and returns
        (norm(x + residual), x + residual), so the add and the norm can be one native pass."""
        if fused_cpu.norm_applies(x, self.weight):
            out = fused_cpu.rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, residual)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 and cast back before the scale, as the reference implementation does,
        # so greedy outputs match it token for token.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
