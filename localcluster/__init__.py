"""Test harness for a local Kubernetes control plane built from source (see localcluster/README.md); not shipped."""
