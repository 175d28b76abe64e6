"""The chart's prompt capture (gateway.promptCapture): a volume of its own the captured prompts are written to,
the sink gateway.yaml names in it, and the settings the chart refuses before the gateway would."""
from __future__ import annotations

import json

import pytest
from chart.helm_tool import CHART, gateway_config, one, pod_spec

pytestmark = pytest.mark.integration

CAPTURE_DIR = "/var/lib/sluice/prompt-capture"
KEY = {"id": "k1", "sha256": "0" * 64}


def _tenants(rate: float | None = 0.25) -> list[str]:
    tenant = {"name": "reviewed", "keys": [KEY], "models": ["*"]}
    if rate is not None:
        tenant["prompt_capture_rate"] = rate
    return ["--set-json", f"gateway.config.tenants={json.dumps([tenant])}"]


ON = ["--set", "gateway.promptCapture.enabled=true"]


def _named(items: list[dict], name: str) -> list[dict]:
    return [item for item in items if item["name"] == name]


def test_off_by_default_with_no_volume_for_it(helm, tmp_path):
    objects = helm.template(*_tenants(rate=None))
    spec = pod_spec(one(objects, "Deployment", "-gateway"))
    assert not _named(spec["volumes"], "prompt-capture")
    assert "env" not in spec["containers"][0]
    assert gateway_config(objects, tmp_path).audit.prompt_capture.sink == "off"


def test_on_the_gateway_writes_a_file_on_an_emptydir_of_its_own(helm, tmp_path):
    objects = helm.template(*ON, *_tenants(), "--set", "gateway.config.audit.sink=stderr",
                            "--set", "gateway.config.audit.prompt_capture.max_chars=4096",
                            "--set-json", 'gateway.config.audit.prompt_capture.redact=["case-[0-9]+"]')
    spec = pod_spec(one(objects, "Deployment", "-gateway"))
    assert _named(spec["volumes"], "prompt-capture") == [{"name": "prompt-capture", "emptyDir": {}}]
    (mount,) = _named(spec["containers"][0]["volumeMounts"], "prompt-capture")
    assert mount == {"name": "prompt-capture", "mountPath": CAPTURE_DIR}
    assert spec["securityContext"]["fsGroup"], "the non-root gateway writes the volume through its group"
    config = gateway_config(objects, tmp_path)
    capture = config.audit.prompt_capture
    assert (str(capture.sink.parent), capture.max_chars, capture.redact) == (CAPTURE_DIR, 4096, ("case-[0-9]+",))
    assert config.audit.sink == "stderr"
    assert [t.prompt_capture_rate for t in config.tenants] == [0.25]


@pytest.mark.parametrize("own_config", [False, True], ids=["chart-config", "existing-secret"])
def test_on_a_claim_each_pod_writes_its_own_directory(helm, own_config):
    """Replicas appending to one file on a shared volume could interleave their lines."""
    args = ["--set", "gateway.config.existingSecret=mine"] if own_config else _tenants()
    objects = helm.template(*ON, *args, "--set", "gateway.promptCapture.volume.existingClaim=reviewers-only")
    spec = pod_spec(one(objects, "Deployment", "-gateway"))
    (volume,) = _named(spec["volumes"], "prompt-capture")
    assert volume["persistentVolumeClaim"] == {"claimName": "reviewers-only"}
    (batch,) = _named(spec["volumes"], "batch-store")
    assert "persistentVolumeClaim" not in batch, "the batch store keeps its own volume"
    container = spec["containers"][0]
    (mount,) = _named(container["volumeMounts"], "prompt-capture")
    assert (mount["mountPath"], mount["subPathExpr"]) == (CAPTURE_DIR, "$(POD_NAME)")
    assert _named(container["env"], "POD_NAME") == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def test_the_schema_has_the_gateways_bounds():
    from sluice_gateway.config import PromptCapture, Tenant

    gateway = json.loads((CHART / "values.schema.json").read_text())["properties"]["gateway"]["properties"]
    chart = gateway["config"]["properties"]["audit"]["properties"]["prompt_capture"]["properties"]
    model = PromptCapture.model_json_schema()["properties"]
    assert set(chart) == set(model)
    bounds = ("type", "minimum", "maximum")
    assert {k: chart["max_chars"].get(k) for k in bounds} == {k: model["max_chars"].get(k) for k in bounds}
    rate = gateway["config"]["properties"]["tenants"]["items"]["properties"]["prompt_capture_rate"]
    (bounded,) = [branch for branch in Tenant.model_json_schema()["properties"]["prompt_capture_rate"]["anyOf"]
                  if branch["type"] == "number"]
    bounds = ("exclusiveMinimum", "maximum")
    assert {k: rate.get(k) for k in bounds} == {k: bounded.get(k) for k in bounds}
    assert rate["type"] == ["number", "null"], "unset, as the gateway takes it: none of its requests is captured"


@pytest.mark.parametrize(("args", "message"), [
    (_tenants(), "gateway.config.tenants [reviewed] set prompt_capture_rate, but gateway.promptCapture.enabled is "
                 "false"),
    ([*ON, "--set", "gateway.config.audit.prompt_capture.sink=stderr"], "anyone allowed pods/log in the namespace"),
    (["--set", "gateway.config.audit.prompt_capture.sink=stdout"], "gateway.config.audit.prompt_capture.sink is the "
                                                                   "chart's"),
    ([*ON, "--set", "gateway.config.audit.prompt_capture.sink=/tmp/prompts.jsonl"], "set gateway.promptCapture"),
    ([*ON, *_tenants(rate=0)], "/gateway/config/tenants/0/prompt_capture_rate"),
    ([*ON, *_tenants(rate=1.5)], "/gateway/config/tenants/0/prompt_capture_rate"),
    ([*ON, "--set", "gateway.config.audit.prompt_capture.max_chars=255"], "/gateway/config/audit/prompt_capture"),
    ([*ON, "--set-json", 'gateway.config.audit.prompt_capture.redact=[""]'], "/gateway/config/audit/prompt_capture"),
    ([*ON, "--set", "gateway.promptCapture.volume.existingClaim=Not_A_Name"], "/gateway/promptCapture/volume"),
    ([*ON, "--set", "gateway.promptCapture.volume.existingClaim=store",
      "--set", "gateway.batchStore.volume.existingClaim=store"], "is the batch store's claim"),
    ([*ON, "--set", "gateway.promptCapture.volume.existingClaim=sluice-batch",
      "--set", "gateway.batchStore.volume.create=true"], "is the batch store's claim"),
], ids=["rate-while-off", "stderr", "stdout", "own-file", "rate-zero", "rate-above-one", "max-chars", "empty-redact",
        "claim-name", "batch-claim", "created-batch-claim"])
def test_a_capture_that_cannot_work_is_refused_at_install_time(helm, args, message):
    result = helm.run("template", "sluice", str(CHART), *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
