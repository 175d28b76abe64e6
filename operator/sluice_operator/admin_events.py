"""The Normal events the operator writes for what an admin changed: how a ModelRoute's route in the routing table
changed (backends, weights, fallbacks, affinity), and which LoRA adapters were loaded on or unloaded from a
serving replica. Pure: the handlers pass what they saw last and what they see now, and post what comes back.

Scaling is not an admin's decision, so it gives no event: endpoints coming and going, a replica that appears
(status.adapters lists what it holds) or goes away (its adapters are not unloaded, the replica is gone).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from sluice_contracts.routing_table import Backend, Route

from .builders.adapter_status import Replicas


@dataclass(frozen=True)
class Event:
    reason: str
    message: str


def route_events(before: Mapping[str, Route], after: Mapping[str, Route],
                 missing: Mapping[str, Collection[str]]) -> dict[str, Event]:
    """ModelRoute → one RoutesChanged event saying everything its route changed, for each one that changed.
    `before`, `after`: the route each ModelRoute serves in the table, last time and now (absent: not in the table);
    `missing`: the backends (MODEL or MODEL/ADAPTER) each ModelRoute names that do not exist, so that a backend
    left out says why."""
    events: dict[str, Event] = {}
    for name in sorted(before.keys() | after.keys()):
        message = _message(before.get(name), after.get(name), missing.get(name, ()))
        if message:
            events[name] = Event("RoutesChanged", message)
    return events


def _message(was: Route | None, now: Route | None, missing: Collection[str]) -> str:
    if now is None:
        return f"no longer in the routing table (it routed {_weights(was)})" if was is not None else ""
    if was is None:
        return f"now in the routing table: {_weights(now)}" + (
            f"; fallbacks {', '.join(now.fallbacks)}" if now.fallbacks else "")
    return "; ".join(_changes(was, now, missing))


def _changes(was: Route, now: Route, missing: Collection[str]) -> list[str]:
    """Each backend added, removed or reweighted, then fallbacks and affinity; endpoints and versions are not
    the route's shape and are left out."""
    old, new = _by_label(was), _by_label(now)
    changes = []
    for label in sorted(old.keys() | new.keys()):
        if label not in new:
            why = ": its InferenceModel (or adapter) is not found" if label in missing else ""
            changes.append(f"backend {label} (weight {old[label]}) no longer routed{why}")
        elif label not in old:
            changes.append(f"backend {label} now routed (weight {new[label]})")
        elif old[label] != new[label]:
            changes.append(f"backend {label} weight {old[label]} → {new[label]}")
    if was.fallbacks != now.fallbacks:
        changes.append(f"fallbacks {', '.join(was.fallbacks) or 'none'} → {', '.join(now.fallbacks) or 'none'}")
    if was.affinity != now.affinity:
        changes.append(f"affinity {was.affinity} → {now.affinity}")
    return changes


def _label(backend: Backend) -> str:
    """As the ModelRoute's spec and its Backends column name it: MODEL, or MODEL/ADAPTER."""
    return f"{backend.name}/{backend.adapter}" if backend.adapter else backend.name


def _by_label(route: Route) -> dict[str, int]:
    return {_label(b): b.weight for b in route.backends}


def _weights(route: Route) -> str:
    return ", ".join(f"{label}={weight}" for label, weight in _by_label(route).items())


def adapter_events(before: Replicas, after: Replicas) -> list[Event]:
    """AdapterLoaded / AdapterUnloaded for each adapter that became loaded, or stopped being loaded, on a replica
    that both syncs reached. `before`, `after`: pod → adapter → (Loaded or Failed, message), every adapter the
    replica holds included, so one whose unload failed is still Loaded and not reported unloaded."""
    events = []
    for pod in sorted(before.keys() & after.keys()):
        for adapter in sorted(before[pod].keys() | after[pod].keys()):
            was = before[pod].get(adapter, ("", ""))[0] == "Loaded"
            now = after[pod].get(adapter, ("", ""))[0] == "Loaded"
            if now and not was:
                events.append(Event("AdapterLoaded", f"adapter {adapter} loaded on {pod}"))
            elif was and not now:
                events.append(Event("AdapterUnloaded", f"adapter {adapter} unloaded from {pod}"))
    return events
