"""The `adapters` and `adaptersReady` of an InferenceModel's status, from the last adapter sync of its replicas."""
from __future__ import annotations

from typing import Any, Mapping

from ..crd.adapters import AdapterReplica, AdapterStatus

# pod → adapter → (state, message), for each serving replica the sync reached
Replicas = Mapping[str, Mapping[str, tuple[str, str]]]


def adapters_status(declared: list[str], replicas: Replicas) -> dict[str, Any]:
    """Each declared adapter with its state per replica; ready: the adapters every synced replica has loaded."""
    adapters = []
    ready = 0
    for name in declared:
        entries = [AdapterReplica(pod=pod, state=found[0], message=found[1])
                   for pod in sorted(replicas) if (found := replicas[pod].get(name)) is not None]
        loaded = sum(1 for e in entries if e.state == "Loaded")
        ready += 1 if replicas and loaded == len(replicas) else 0
        adapters.append(AdapterStatus(name=name, ready_replicas=loaded, replicas=entries).wire())
    return {"adapters": adapters, "adaptersReady": ready}
