"""Billable usage: counters by tenant, model (the route), mode (online or batch line) and kind, in hour buckets
(UTC, by the gateway's clock, the hour a request ended in). Tenants come from gateway.yaml and models from the
routing table, so the counters grow with the configuration, never with what clients send.

Kinds, per request, settled as the token limit settles it (admission.used_tokens): a request whose usage the
runtime reported counts one in `requests` and its `prompt_tokens` and `completion_tokens`, the numbers of the
`usage` its client received (or would have, on a stream that did not ask: the gateway asks for it); one the
gateway or the runtime refused counts nothing; one admitted whose usage is unknown (its client left, its
upstream cut off) counts one in `unmetered_requests`, since the limit charged it its whole reservation.

Stores: `redis_store` when the limits use Redis (every replica's counts in one place, kept across restarts),
else `memory_store` (this replica's own, lost when it stops).
"""
