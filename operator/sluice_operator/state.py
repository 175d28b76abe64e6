"""What the operator keeps in memory between events; all of it can be rebuilt from the cluster."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice_contracts.routing_table import Route, RoutingTable

from .autoscaler import DemandClock, History
from .builders import ModelPolicy, Release
from .builders.inference_pool import PoolDefaults
from .coalesce import Coalescer
from .gateway_demand import GatewayDemandReader
from .kube import Kube
from .metrics import OperatorMetrics

Key = tuple[str, str]  # (namespace, name)


@dataclass
class PendingDrain:
    """Pods taken out of the routing table one tick before the scale-down deletes them."""

    pods: list[str]
    replicas: int


@dataclass(frozen=True)
class ModelAdapters:
    """What the last adapter sync of one InferenceModel found on its serving replicas."""

    loaded: dict[str, frozenset[str]]  # endpoint URL → the adapters loaded there
    # pod → adapter → (Loaded or Failed, message): each declared adapter, and any other the replica still holds
    replicas: dict[str, dict[str, tuple[str, str]]]


@dataclass
class OperatorState:
    kube: Kube
    autoscale_interval: float
    apply_errors: dict[Key, tuple[str, str]] = field(default_factory=dict)
    endpoint_counts: dict[Key, int] = field(default_factory=dict)
    decisions: dict[Key, dict[str, Any]] = field(default_factory=dict)
    histories: dict[str, History] = field(default_factory=dict)  # by uid: a recreated model starts afresh
    drains: dict[str, PendingDrain] = field(default_factory=dict)
    tables: dict[str, RoutingTable] = field(default_factory=dict)  # by namespace, as last written
    served_routes: dict[str, dict[str, Route]] = field(default_factory=dict)  # by namespace: ModelRoute → its route
    statuses: Coalescer = field(default_factory=lambda: Coalescer(0.1))
    routing: Coalescer = field(default_factory=lambda: Coalescer(0.1))
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    release: Release | None = None  # None: no runtime credential (local use)
    credential: str | None = None  # the runtime credential, as its source Secret holds it now
    release_applied: dict[str, str] = field(default_factory=dict)  # namespace → what release_objects applied
    adapters: dict[Key, ModelAdapters] = field(default_factory=dict)
    adapter_syncs: Coalescer = field(default_factory=lambda: Coalescer(0.1))
    adapter_conflicts: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # by namespace, warned of
    engine_images: dict[str, str] = field(default_factory=dict)  # the release's image per engine (chart values)
    pool_defaults: PoolDefaults = field(default_factory=PoolDefaults)  # the chart's InferencePool settings
    policy: ModelPolicy = field(default_factory=ModelPolicy)  # the images and token Secrets models may use
    pool_errors: dict[Key, str] = field(default_factory=dict)  # why a model's InferencePool could not be applied
    gateway_demand: GatewayDemandReader | None = None  # None: no gateway to read, so no model goes to zero
    demand_interval: float = 0.5
    clocks: dict[str, DemandClock] = field(default_factory=dict)  # by uid: each model's idle clock
    cold_starts: dict[Key, float] = field(default_factory=dict)  # scale from zero in progress: since when
    last_cold_start: dict[Key, float] = field(default_factory=dict)  # seconds the last one took

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """A deleted InferenceModel leaves nothing behind in memory either."""
        for by_key in (self.apply_errors, self.endpoint_counts, self.decisions, self.adapters, self.pool_errors,
                       self.cold_starts, self.last_cold_start):
            by_key.pop((namespace, name), None)
        self.histories.pop(uid, None)
        self.drains.pop(uid, None)
        self.clocks.pop(uid, None)
        self.metrics.forget_model(namespace, name)
