"""Per-tenant limits: requests and tokens per sliding minute, concurrent requests.

Both backends implement one rule (stated for users in gateway/README.md, "Limits"):
- Counts live in one-second buckets; a bucket counts until its end is 60 s old, so a limit of N is never
  exceeded over any 60 s, whatever the bucket boundaries. State per tenant is bounded (61 buckets, and one
  lease per request in flight).
- A request is admitted if its request count fits, and if the tokens charged in the window plus the
  reservations of the tenant's requests in flight plus its own reservation fit the token limit.
- Tokens are charged to the second they were produced (as a stream goes, and the rest when the request
  settles), taken out of the request's reservation; the reservation left over is released.
`memory` serves one replica; `redis` runs the same steps in Lua scripts so many replicas share them exactly.
"""
from .base import Decision, Grant, Limiter, LimiterUnavailable, Usage

__all__ = ["Decision", "Grant", "Limiter", "LimiterUnavailable", "Usage"]
