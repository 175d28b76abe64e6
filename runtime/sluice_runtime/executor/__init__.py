"""Runs the model on a packed batch: input preparation, attention backends, sampling."""
