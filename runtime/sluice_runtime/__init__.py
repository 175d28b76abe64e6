"""Sluice runtime: the pod that serves one model replica."""
