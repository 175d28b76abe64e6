"""Per-tenant limits: requests and tokens per sliding minute, concurrent requests.

Both backends implement one algorithm: a 60-second window made of one-second buckets, so a limit of N is
never exceeded over any 60 s, and state per tenant is bounded (60 buckets plus at most N leases).
`memory` serves one replica; `redis` runs the same steps in one Lua script so many replicas share it exactly.
"""
from .base import Decision, Grant, Limiter, LimiterUnavailable, Usage

__all__ = ["Decision", "Grant", "Limiter", "LimiterUnavailable", "Usage"]
