"""Fairness across tenants within one priority: start-time fair queuing over admissions.

Each tenant of a priority has a tag, the virtual time at which its next admission starts. Admitting one of its
prompts moves its tag on by 1 / share, so between tenants that keep prompts waiting, admissions go in
proportion to their shares, however many each has queued: a tenant with 1,000 waiting and one with 1 take
turns. A tenant that arrives (or comes back) starts at the priority's clock, the tag of the latest admission,
so it neither inherits credit from being idle nor waits behind the others' backlog.
"""
from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class _Level:
    clock: float = 0.0
    tags: dict[str, float] = field(default_factory=dict)
    active: Counter = field(default_factory=Counter)  # requests queued or running, per tenant


class FairShare:
    def __init__(self) -> None:
        self._levels: dict[int, _Level] = {}

    def join(self, priority: int, tenant: str) -> None:
        """A request of `tenant` arrived at `priority`."""
        level = self._levels.setdefault(priority, _Level())
        if not level.active[tenant]:
            level.tags[tenant] = max(level.tags.get(tenant, 0.0), level.clock)
        level.active[tenant] += 1

    def leave(self, priority: int, tenant: str) -> None:
        """A request of `tenant` finished. An idle tenant's tag is kept only while it is ahead of the clock (it
        took more than its share and comes back owing it); a priority with no request left starts afresh."""
        level = self._levels[priority]
        level.active[tenant] -= 1
        if level.active[tenant] <= 0:
            del level.active[tenant]
            if level.tags.get(tenant, 0.0) <= level.clock:
                level.tags.pop(tenant, None)
        if not level.active:
            del self._levels[priority]

    def charge(self, priority: int, tenant: str, share: float) -> None:
        """One of `tenant`'s prompts was admitted."""
        level = self._levels[priority]
        start = level.tags.get(tenant, level.clock)
        level.clock = max(level.clock, start)
        level.tags[tenant] = start + 1.0 / share
        for idle in [t for t, tag in level.tags.items() if t not in level.active and tag <= level.clock]:
            del level.tags[idle]

    def interleave(self, ordered: Iterable[T], key: Callable[[T], tuple[int, str, float, bool]]) -> list[T]:
        """`ordered` (sorted by priority first) reordered so that, within each priority, tenants take turns by
        their tags; each tenant's items keep their order. `key` gives an item's priority, tenant, share and
        whether admitting it is charged (a prompt already running was charged when it was admitted)."""
        result: list[T] = []
        run: list[T] = []
        current: int | None = None
        for item in ordered:
            priority = key(item)[0]
            if priority != current and run:
                result += self._turns(current, run, key)
                run = []
            current = priority
            run.append(item)
        if run:
            result += self._turns(current, run, key)
        return result

    def _turns(self, priority: int, items: list[T], key: Callable[[T], tuple[int, str, float, bool]]) -> list[T]:
        queues: dict[str, list[T]] = {}
        for item in items:
            queues.setdefault(key(item)[1], []).append(item)
        if len(queues) == 1:
            return items
        level = self._levels.get(priority, _Level())
        position = {id(item): i for i, item in enumerate(items)}
        heads = {tenant: 0 for tenant in queues}
        heap = [(level.tags.get(t, level.clock), position[id(q[0])], t) for t, q in queues.items()]
        heapq.heapify(heap)
        result = []
        while heap:
            tag, _, tenant = heapq.heappop(heap)
            queue = queues[tenant]
            item = queue[heads[tenant]]
            heads[tenant] += 1
            result.append(item)
            _, _, share, charged = key(item)
            if charged:
                tag += 1.0 / share
            if heads[tenant] < len(queue):
                heapq.heappush(heap, (tag, position[id(queue[heads[tenant]])], tenant))
        return result
