"""Files the chart carries that must not drift from their sources: CRDs, RBAC, values table, metric names."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from chart.helm_tool import CHART, REPO
from chart.values_table import main as values_table_check

# Names in PromQL: vLLM's use a colon, Sluice's own start with sluice_.
_METRIC = re.compile(r"\b(vllm:[a-z0-9_]+|sluice_[a-z0-9_]+)")
_DEFINED = re.compile(r"\"(vllm:[a-z0-9_]+|sluice_[a-z0-9_]+)\"")
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def _defined_metrics() -> set[str]:
    names = set()
    for source in ("contracts/sluice_contracts/metric_names.py", "contracts/sluice_contracts/demand.py",
                   "runtime/sluice_runtime/server/metrics.py", "gateway/sluice_gateway/metrics.py"):
        names |= set(_DEFINED.findall((REPO / source).read_text()))
    return names


def _base_name(series: str, defined: set[str]) -> str:
    for suffix in _SUFFIXES:
        if series.endswith(suffix) and series[: -len(suffix)] in defined:
            return series[: -len(suffix)]
    return series


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((CHART / "files/grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def _rule_exprs() -> list[str]:
    text = (CHART / "templates/monitoring.yaml").read_text()
    return re.findall(r"expr: \|\n((?:\s{12}.*\n)+)", text)


def test_chart_crds_match_the_generated_ones():
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    copied = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert copied == generated, "charts/sluice/crds is stale: run `make crds`"


def test_chart_rbac_is_the_operators_rbac():
    source = (REPO / "operator/sluice_operator/rbac/rules.yaml").read_text()
    assert (CHART / "files/operator-rbac.yaml").read_text() == source, "stale RBAC copy: run `make crds`"


def test_readme_values_table_is_current():
    assert values_table_check([]) == 0, "run: python tests/chart/values_table.py --write"


def test_every_value_is_documented():
    from chart.values_table import documented_values

    text = (CHART / "values.yaml").read_text()
    documented = {path for path, _, _ in documented_values(text)}

    def leaves(node, prefix=""):
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in documented:
                continue
            assert isinstance(value, dict) and value, f"values.yaml: `{path}` has no `# --` description"
            yield from leaves(value, path + ".")

    list(leaves(yaml.safe_load(text)))


@pytest.mark.parametrize("where", ["dashboard", "alerts"])
def test_queries_use_only_metrics_the_components_export(where):
    defined = _defined_metrics()
    exprs = _dashboard_exprs() if where == "dashboard" else _rule_exprs()
    assert exprs
    used = {_base_name(name, defined) for expr in exprs for name in _METRIC.findall(expr)}
    assert used and used <= defined, f"unknown metrics: {sorted(used - defined)}"


def test_dashboard_covers_the_seed_metrics():
    exprs = "\n".join(_dashboard_exprs())
    for metric in ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                   "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                   "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                   "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                   "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                   "sluice_runtime_http_requests_total", "sluice_runtime_requests_cancelled_total",
                   "sluice_runtime_requests_timeout_total"):
        assert metric in exprs, metric
    dashboard = json.loads((CHART / "files/grafana-dashboard.json").read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"model", "pod"} <= variables, "per model and per replica"


def test_alerts_cover_the_failure_modes():
    text = (CHART / "templates/monitoring.yaml").read_text()
    alerts = set(re.findall(r"alert: (\w+)", text))
    assert {"SluiceHighTimeToFirstToken", "SluiceKVCachePressure", "SluiceWaitingQueueGrowing",
            "SluiceHighErrorRate", "SluiceReplicasAtMax"} <= alerts


@pytest.mark.parametrize("path", sorted((REPO / "config/samples").glob("*.yaml")), ids=lambda p: p.name)
def test_samples_pass_the_operators_own_validation(path):
    from sluice_operator.crd import InferenceModelSpec, ModelRouteSpec

    doc = yaml.safe_load(path.read_text())
    models = {"InferenceModel": InferenceModelSpec, "ModelRoute": ModelRouteSpec}
    if doc.get("kind") in models:
        models[doc["kind"]].model_validate(doc["spec"])
    elif "apiVersion" not in doc:
        from sluice_gateway.config import load_config

        assert load_config(path).tenants
