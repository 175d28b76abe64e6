"""Sluice routing gateway: the cluster-internal OpenAI endpoint (auth, limits, routing, proxying)."""
