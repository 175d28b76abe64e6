"""Attention backends: one interface, a torch reference for the CPU, GPU kernels behind the same calls."""
from .base import AttentionBackend, AttentionMetadata, SequenceSpan
from .torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "SequenceSpan", "TorchAttentionBackend", "select_backend"]


def select_backend(device: str) -> AttentionBackend:
    return TorchAttentionBackend()
