"""Which backend and endpoint serve a request, and the endpoint health and load that decision uses.

Backends are chosen by weight (canary), optionally sticky per session. Within a backend an endpoint is
chosen by load (last polled `/load` plus this replica's own in-flight count), by consistent hashing with
bounded load over a prompt-prefix hash (prefix affinity: the same prefix lands where its KV blocks are
cached, unless that endpoint is overloaded), or by a session hash (session affinity). A LoRA adapter's request
goes among the endpoints that have the adapter resident (polled `/load`) and room for it (nothing queued),
when there are such, else to the least loaded endpoint, which swaps the adapter in. A request more urgent
than the default priority class goes among the endpoints with nothing queued (idle or with room), when there
are such. A request with a budget (budget.py) goes among the endpoints whose polled estimate of their queue
(`estimated_queue_s` of /load) fits what is left of it, when there are such. Nothing is kept per prefix or per
session: state is per endpoint and per backend, both bounded by the routing table.
"""
from __future__ import annotations

import asyncio
import bisect
import hashlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sluice_contracts.engines import DEFAULT_ENGINE
from sluice_contracts.model_tasks import Task
from sluice_contracts.routing_table import Backend, Route, RoutingTable

from .config import Routing
from .routing_table import reachable

_VNODES = 64


def stable_hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(slots=True)
class EndpointState:
    url: str
    engine: str = DEFAULT_ENGINE  # which server answers there: how its load is read (load_poller)
    served_model_name: str = ""  # the model whose /metrics samples count
    no_load_document: bool = False  # its /load answered 404: polled on /metrics instead
    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    in_flight: int = 0
    healthy: bool = True
    slow_polls: int = 0  # consecutive load polls that timed out
    failures: int = 0
    ejected_until: float = 0.0
    polled_at: float = 0.0
    loaded_adapters: frozenset[str] = frozenset()  # LoRA adapters resident in the engine, as last polled
    estimated_queue_s: float | None = None  # the engine's estimate of a new request's wait, as last polled

    def available(self, now: float) -> bool:
        return self.healthy and self.ejected_until <= now

    def fits(self, budget_s: float) -> bool:
        """Whether a request with `budget_s` left is expected to start here in time (unknown: it may)."""
        return self.estimated_queue_s is None or self.estimated_queue_s <= budget_s

    @property
    def saturated(self) -> bool:
        """The engine queues requests: every slot of its batch (or its KV cache) is taken."""
        return self.waiting > 0

    def score(self) -> float:
        # Queued requests cost the most (they wait for a slot); a nearly full KV cache means preemptions soon.
        return 2 * self.waiting + self.running + self.in_flight + 4 * self.kv_cache_usage


@dataclass(frozen=True, slots=True)
class Attempt:
    route: str
    backend: Backend
    endpoint: EndpointState


class _Ring:
    """Consistent-hash ring over one backend's endpoints, with virtual nodes for an even spread."""

    __slots__ = ("points", "owners")

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        nodes = sorted((stable_hash(f"{url}#{i}".encode()), url) for url in endpoints for i in range(_VNODES))
        self.points = [p for p, _ in nodes]
        self.owners = [u for _, u in nodes]

    def walk(self, key: int) -> Iterator[str]:
        start = bisect.bisect(self.points, key)
        seen: set[str] = set()
        n = len(self.points)
        for i in range(n):
            url = self.owners[(start + i) % n]
            if url not in seen:
                seen.add(url)
                yield url


class Picker:
    def __init__(self, settings: Routing) -> None:
        self._settings = settings
        self._endpoints: dict[str, EndpointState] = {}
        self._rings: dict[tuple[str, ...], _Ring] = {}
        self._polled = asyncio.Event()

    # -- table and health bookkeeping -------------------------------------------------------------------
    def sync(self, table: RoutingTable) -> None:
        """Track exactly the endpoints of this table: new ones start healthy, removed ones are forgotten."""
        backends = sorted((b for route in table.routes.values() for b in route.backends), key=lambda b: b.adapter is None)
        # A base model's backend last, so it names the endpoint's model: an adapter's name labels no load gauge.
        wanted = {url: backend for backend in backends for url in backend.endpoints}
        for url in list(self._endpoints):
            if url not in wanted:
                del self._endpoints[url]
        for url, backend in wanted.items():
            state = self._endpoints.setdefault(url, EndpointState(url))
            if (state.engine, state.served_model_name) != (backend.engine, backend.served_model_name):
                state.engine, state.served_model_name = backend.engine, backend.served_model_name
                state.no_load_document = False
        self._rings = {}

    def endpoints(self) -> list[EndpointState]:
        return list(self._endpoints.values())

    def state(self, url: str) -> EndpointState | None:
        return self._endpoints.get(url)

    def loads_polled(self) -> None:
        """Every endpoint's load was just polled: wake the requests waiting for a change (next_poll)."""
        self._polled.set()
        self._polled = asyncio.Event()

    async def next_poll(self, timeout_s: float) -> None:
        """Until the next round of load polls, or `timeout_s`."""
        try:
            await asyncio.wait_for(self._polled.wait(), timeout_s)
        except TimeoutError:
            pass

    def saturated(
        self, table: RoutingTable, route_name: str, allowed: Callable[[str], bool], task: Task | None = None,
    ) -> bool:
        """Whether the route has endpoints and none has room: each is saturated, failing its load polls or ejected.
        (A route without endpoints is not saturated: its requests are answered as for a model with no replica.)"""
        now = time.monotonic()
        states = [s for _, route in reachable(table, route_name, allowed, task) for b in route.backends if b.weight > 0
                  for url in b.endpoints if (s := self._endpoints.get(url)) is not None]
        return bool(states) and not any(s.available(now) and not s.saturated for s in states)

    def report_success(self, endpoint: EndpointState) -> None:
        endpoint.failures = 0

    def report_failure(self, endpoint: EndpointState) -> None:
        """Passive ejection: enough consecutive failures take an endpoint out for a while."""
        endpoint.failures += 1
        if endpoint.failures >= self._settings.eject_after_failures:
            endpoint.ejected_until = time.monotonic() + self._settings.eject_for_s
            endpoint.failures = 0

    # -- choosing -----------------------------------------------------------------------------------------
    def plan(
        self, table: RoutingTable, route_name: str, *, prefix: bytes | None, session: str | None,
        allowed: Callable[[str], bool] = lambda name: True, task: Task | None = None, prefer_idle: bool = False,
        budget_left: Callable[[], float | None] = lambda: None,
    ) -> Iterator[Attempt]:
        """Endpoints to try, best first: the weighted backend, the route's other backends, then the fallbacks
        the tenant is `allowed` to use; only backends that serve `task`; with `prefer_idle`, endpoints with
        nothing queued first; endpoints whose estimated queue fits `budget_left()` seconds first.

        Lazy, so each retry sees the health reported by the attempt before it.
        """
        for name, route in reachable(table, route_name, allowed, task):
            for backend in self._backend_order(route, session):
                for endpoint in self._endpoint_order(backend, route, prefix, session, prefer_idle, budget_left):
                    yield Attempt(name, backend, endpoint)

    def _backend_order(self, route: Route, session: str | None) -> list[Backend]:
        now = time.monotonic()
        serving = [b for b in route.backends if b.weight > 0 and self._any_available(b, now)]
        if not serving:
            return []
        total = sum(b.weight for b in serving)
        if session is not None and self._settings.sticky_canary:
            point = stable_hash(session.encode()) % total
        else:
            point = random.randrange(total)
        first = serving[-1]
        for backend in serving:
            if point < backend.weight:
                first = backend
                break
            point -= backend.weight
        return [first] + sorted((b for b in serving if b is not first), key=lambda b: -b.weight)

    def _any_available(self, backend: Backend, now: float) -> bool:
        for url in backend.endpoints:
            state = self._endpoints.get(url)
            if state is not None and state.available(now):
                return True
        return False

    def _endpoint_order(
        self, backend: Backend, route: Route, prefix: bytes | None, session: str | None, prefer_idle: bool,
        budget_left: Callable[[], float | None],
    ) -> Iterator[EndpointState]:
        tried: set[str] = set()
        while True:
            now = time.monotonic()
            candidates = [
                s for url in backend.endpoints
                if url not in tried and (s := self._endpoints.get(url)) is not None and s.available(now)
            ]
            if not candidates:
                return
            left = budget_left()
            if left is not None:
                # One that cannot start it in time would refuse it (or answer late): only when none can.
                candidates = [s for s in candidates if s.fits(left)] or candidates
            if backend.adapter is not None:
                warm = [s for s in candidates if backend.adapter in s.loaded_adapters and s.waiting == 0]
                if not warm:
                    chosen = min(candidates, key=lambda s: (s.score(), random.random()))
                    tried.add(chosen.url)
                    yield chosen
                    continue
                candidates = warm
            if prefer_idle:
                candidates = [s for s in candidates if not s.saturated] or candidates
            if route.affinity == "prefix" and prefix:
                chosen = self._by_ring(backend, candidates, stable_hash(prefix), bounded=True)
            elif route.affinity == "session" and session:
                chosen = self._by_ring(backend, candidates, stable_hash(session.encode()), bounded=False)
            else:
                chosen = min(candidates, key=lambda s: (s.score(), random.random()))
            tried.add(chosen.url)
            yield chosen

    def _by_ring(
        self, backend: Backend, candidates: list[EndpointState], key: int, *, bounded: bool
    ) -> EndpointState:
        ring = self._rings.get(backend.endpoints)
        if ring is None:
            ring = self._rings[backend.endpoints] = _Ring(backend.endpoints)
        by_url = {s.url: s for s in candidates}
        if bounded:
            # Consistent hashing with bounded loads, over this replica's own in-flight counts: exact and current,
            # unlike polled figures up to an interval old, which would move prefixes off their cache for nothing.
            cap = math.ceil(self._settings.load_bound * (sum(s.in_flight for s in candidates) + 1) / len(candidates))
        for url in ring.walk(key):
            state = by_url.get(url)
            if state is not None and (not bounded or state.in_flight < cap):
                return state
        return min(candidates, key=lambda s: s.in_flight)
