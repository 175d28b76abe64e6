"""`helm upgrade` restarts the gateway pods only for what the gateway cannot reload: keys and tenants apply in
place (a revoked key must not wait for a rollout), listen/timeouts/redis/routing changes roll the pods."""
from __future__ import annotations

import pytest
import yaml
from chart.helm_tool import CHART, FULL_VALUES, Helm, one

pytestmark = pytest.mark.integration

OTHER_KEY = "0" * 64


def pod_template(helm: Helm, *args: str) -> dict:
    return one(helm.template("-f", str(FULL_VALUES), *args), "Deployment", "-gateway")["spec"]["template"]


def test_the_charts_list_of_reloadable_fields_is_the_gateways():
    from sluice_gateway.config import RELOADABLE_FIELDS

    assert set(yaml.safe_load((CHART / "files/gateway-reloadable-fields.yaml").read_text())) == RELOADABLE_FIELDS


@pytest.mark.parametrize("change", [
    ["--set", f"gateway.config.tenants[0].keys[0].sha256={OTHER_KEY}"],  # a revoked and replaced key
    ["--set", "gateway.config.tenants[0].models={other}"],
    ["--set", "gateway.config.adminKeys=null"],
    ["--set", "gateway.config.maxBodyBytes=1024"],
    ["--set", "gateway.config.accessLog=false"],
], ids=["tenant-key", "tenant-models", "admin-keys", "max-body", "access-log"])
def test_a_change_the_gateway_reloads_leaves_the_pod_template_as_it_was(helm, change):
    before = pod_template(helm)
    assert "checksum/gateway-start-config" in before["metadata"]["annotations"]
    assert helm.template_text("-f", str(FULL_VALUES), *change) != helm.template_text("-f", str(FULL_VALUES))
    assert pod_template(helm, *change) == before


@pytest.mark.parametrize("change", [
    ["--set", "gateway.config.timeouts.total_s=1200"],
    ["--set", "gateway.config.routing.max_attempts=5"],
    ["--set", "redis.onFailure=open"],
    ["--set", "gateway.metricsPort=9191"],
], ids=["timeouts", "routing", "redis", "metrics-port"])
def test_a_change_bound_at_start_rolls_the_pods(helm, change):
    before = pod_template(helm)["metadata"]["annotations"]["checksum/gateway-start-config"]
    assert pod_template(helm, *change)["metadata"]["annotations"]["checksum/gateway-start-config"] != before


def test_pod_annotations_cannot_replace_the_checksum_and_an_existing_secret_has_none(helm):
    ours = pod_template(helm)["metadata"]["annotations"]["checksum/gateway-start-config"]
    forged = pod_template(helm, "--set", "gateway.podAnnotations.checksum/gateway-start-config=fixed",
                          "--set", "gateway.podAnnotations.team=ml")["metadata"]["annotations"]
    assert forged == {"checksum/gateway-start-config": ours, "team": "ml"}
    # The chart cannot see a config it does not render: no checksum that would pretend to follow it.
    external = pod_template(helm, "--set", "gateway.config.existingSecret=my-gateway-config")
    assert "checksum/gateway-start-config" not in (external["metadata"].get("annotations") or {})
