"""Test harness for a local Kubernetes control plane built from source (see e2e/README.md); not shipped."""
