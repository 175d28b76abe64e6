"""The operator's health port serves /healthz and its sluice_operator_* metrics; deleted models leave no series."""
import socket

import aiohttp

from sluice_operator import health
from sluice_operator.metrics import OperatorMetrics


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_health_port_serves_liveness_and_metrics():
    metrics = OperatorMetrics()
    metrics.decisions.labels("demo", "smollm2", "ScaleUp").inc()
    metrics.table_generation.labels("demo").set(7)
    port = _free_port()
    server = await health.serve(metrics, "127.0.0.1", port)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
                assert response.headers["Content-Type"].startswith("text/plain")
    finally:
        await server.cleanup()
    assert 'sluice_operator_autoscaler_decisions_total{action="ScaleUp",model="smollm2",namespace="demo"} 1.0' in text
    assert 'sluice_operator_routing_table_generation{namespace="demo"} 7.0' in text
    assert "sluice_operator_routing_table_compile_seconds_bucket" in text


def test_a_deleted_model_takes_its_series_along():
    metrics = OperatorMetrics()
    metrics.endpoints.labels("demo", "gone").set(2)
    metrics.decisions.labels("demo", "gone", "Hold").inc()
    metrics.endpoints.labels("demo", "kept").set(1)
    metrics.forget_model("demo", "gone")
    metrics.forget_model("demo", "never-seen")
    names = {tuple(sorted(s.labels.items())) for family in metrics.registry.collect() for s in family.samples}
    assert (("model", "kept"), ("namespace", "demo")) in names
    assert not any(("model", "gone") in labels for labels in names)
