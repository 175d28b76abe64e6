"""The operator's own Prometheus metrics (`sluice_operator_*`), served with /healthz on its health port."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(
            "sluice_operator_reconciles", "InferenceModel reconciles by outcome: applied, invalid_spec, refused, conflict, retry.",
            ["outcome"], registry=r)
        self.compile_seconds = Histogram(
            "sluice_operator_routing_table_compile_seconds", "Time to compile and publish one namespace's routing table.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=r)
        self.table_generation = Gauge(
            "sluice_operator_routing_table_generation", "Generation of the routing table last published.",
            ["namespace"], registry=r)
        self.endpoints = Gauge(
            "sluice_operator_ready_endpoints", "Endpoints of an InferenceModel in the routing table.",
            ["namespace", "model"], registry=r)
        self.decisions = Counter(
            "sluice_operator_autoscaler_decisions", "Autoscaler decisions by action: ScaleUp, ScaleDown, Hold.",
            ["namespace", "model", "action"], registry=r)
        self.desired_replicas = Gauge(
            "sluice_operator_autoscaler_desired_replicas", "Replicas the autoscaler last asked for.",
            ["namespace", "model"], registry=r)
        self.scrape_failures = Counter(
            "sluice_operator_autoscaler_scrape_failures", "Runtime pods whose /metrics could not be used.",
            ["namespace", "model"], registry=r)

    def forget_model(self, namespace: str, model: str) -> None:
        """A deleted InferenceModel's series go with it, so they do not linger as stale values."""
        for metric in (self.endpoints, self.desired_replicas, self.scrape_failures):
            try:
                metric.remove(namespace, model)
            except KeyError:
                pass
        for action in ("ScaleUp", "ScaleDown", "Hold"):
            try:
                self.decisions.remove(namespace, model, action)
            except KeyError:
                pass

    def forget_namespace(self, namespace: str) -> None:
        try:
            self.table_generation.remove(namespace)
        except KeyError:
            pass
