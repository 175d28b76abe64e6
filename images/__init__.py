"""Builds the Sluice container images without a daemon (buildah) and smoke-tests them inside the image."""
