"""The CRDs are generated from the pydantic models, are structural, and refuse what the models refuse."""
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from sluice_operator.cli import main as cli_main
from sluice_operator.crd import InferenceModelSpec, ModelRouteSpec
from sluice_operator.crd.definitions import all_definitions, render_definitions

ROOT = Path(__file__).resolve().parents[2]
SPECS = {"InferenceModel": InferenceModelSpec, "ModelRoute": ModelRouteSpec}
INVALID = yaml.safe_load((Path(__file__).parent / "data" / "invalid_specs.yaml").read_text())


def test_committed_crds_match_the_models():
    rendered = render_definitions()
    committed = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    assert committed == rendered, "crds/ is out of date: run `make crds`"


def test_cli_check_reports_stale_files(tmp_path, capsys):
    assert cli_main(["crds", "--out", str(tmp_path)]) == 0
    assert cli_main(["crds", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "sluice.dev_modelroutes.yaml").write_text("stale\n")
    assert cli_main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert "sluice.dev_modelroutes.yaml" in capsys.readouterr().err


def _walk(schema, path="spec"):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


@pytest.mark.parametrize("crd", ["sluice.dev_inferencemodels.yaml", "sluice.dev_modelroutes.yaml"])
def test_schema_is_structural_and_documented(crd):
    version = all_definitions()[crd]["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    for part in ("spec", "status"):
        for path, node in _walk(root["properties"][part], part):
            assert "$ref" not in node and "title" not in node, path
            if node.get("x-kubernetes-int-or-string"):
                continue
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
            assert "anyOf" not in node, path
            if part == "spec" and not path.endswith("[]"):
                assert node.get("description"), f"{path} has no description for kubectl explain"
    assert version["subresources"]["status"] == {}


def test_inference_model_has_scale_subresource_and_printer_columns():
    version = all_definitions()["sluice.dev_inferencemodels.yaml"]["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert [c["name"] for c in version["additionalPrinterColumns"]][:4] == ["Model", "Replicas", "Ready", "Endpoints"]


def test_defaults_reach_nested_objects():
    spec = all_definitions()["sluice.dev_inferencemodels.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]
    assert spec["runtime"]["default"]["maxModelLen"] == 2048 and spec["rollout"]["default"]["maxSurge"] == 1
    assert spec["runtime"]["properties"]["maxModelLen"]["default"] == 2048
    assert spec["autoscaling"]["properties"]["targetKVCacheUsage"]["default"] == 0.7


def _custom_resource_samples():
    """Samples of our own kinds; the folder also holds a kustomization and a gateway config."""
    paths = sorted((ROOT / "config" / "samples").glob("*.yaml"))
    return [p for p in paths if str(yaml.safe_load(p.read_text()).get("apiVersion", "")).startswith("sluice.dev/")]


@pytest.mark.parametrize("path", _custom_resource_samples(), ids=lambda p: p.name)
def test_samples_are_valid(path):
    doc = yaml.safe_load(path.read_text())
    SPECS[doc["kind"]].model_validate(doc["spec"])


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["case"])
def test_models_refuse_invalid_specs(case):
    with pytest.raises(ValidationError) as err:
        SPECS[case["kind"]].model_validate(case["spec"])
    assert case["model"] in str(err.value)
