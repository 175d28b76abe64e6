"""Torch building blocks shared by the model architectures."""
