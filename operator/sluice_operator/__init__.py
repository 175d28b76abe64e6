"""Sluice operator: InferenceModel and ModelRoute custom resources, reconciled with kopf."""
