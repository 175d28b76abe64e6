"""InferencePool: when a model gets one, what it holds, and how its status is read (the cluster test,
tests/operator/test_operator_cluster.py, checks the same against GIE's real CRD)."""
import pytest

from sluice_operator.builders import Owner, selector_labels
from sluice_operator.builders.inference_pool import (
    MSG_NO_PICKER,
    PoolDefaults,
    build_inference_pool,
    pool_acceptance,
    pool_enabled,
    wanted_pool,
)
from sluice_operator.cli import _parser, _pool_defaults
from sluice_operator.crd import InferenceModelSpec
from sluice_operator.crd.inference_model import EndpointPickerRef

CHART_PICKER = EndpointPickerRef(name="epp", port=9002)


def _spec(pool=None):
    return InferenceModelSpec.model_validate({"model": {"source": "smollm2"},
                                              **({"inferencePool": pool} if pool is not None else {})})


@pytest.mark.parametrize("pool, defaults, expected", [
    (None, PoolDefaults(), (False, None)),
    (None, PoolDefaults(True, CHART_PICKER), (True, CHART_PICKER)),
    (None, PoolDefaults(True, None), (True, None)),
    ({"enabled": False}, PoolDefaults(True, CHART_PICKER), (False, None)),
    ({}, PoolDefaults(False, CHART_PICKER), (True, CHART_PICKER)),
    ({"endpointPicker": {"name": "mine"}}, PoolDefaults(True, CHART_PICKER),
     (True, EndpointPickerRef(name="mine"))),
])
def test_the_spec_decides_else_the_chart(pool, defaults, expected):
    assert wanted_pool(_spec(pool), defaults) == expected
    raw = {} if pool is None else {"inferencePool": pool}
    assert pool_enabled(raw, defaults) == expected[0]


def test_the_pool_selects_the_models_pods_on_the_runtime_port():
    pool = build_inference_pool(Owner(name="chat", namespace="ns", uid="u-1"), EndpointPickerRef(name="epp"))
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pool["spec"]["selector"] == {"matchLabels": selector_labels("chat")}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]


@pytest.mark.parametrize("picker", [{"name": "EPP"}, {"name": ""}, {"name": "epp", "port": 0},
                                    {"name": "epp", "port": 70000}, {"name": "epp", "failureMode": "Open"},
                                    {"name": "epp", "extra": 1}, {"port": 9002}])
def test_a_picker_the_crd_would_not_take_is_refused(picker):
    with pytest.raises(ValueError):
        _spec({"endpointPicker": picker})


def _parent(status, name="gw", reason="Accepted"):
    return {"parentRef": {"kind": "Gateway", "name": name},
            "conditions": [{"type": "Accepted", "status": status, "reason": reason, "message": "m"}]}


@pytest.mark.parametrize("pool, accepted", [
    (None, "Unknown"),
    ({}, "Unknown"),
    ({"status": None}, "Unknown"),
    ({"status": {"parents": []}}, "Unknown"),
    ({"status": {"parents": [_parent("True")]}}, "True"),
    ({"status": {"parents": [_parent("False", reason="NotAllowed")]}}, "False"),
    ({"status": {"parents": [_parent("False", "a"), _parent("True", "b")]}}, "True"),
    ({"status": {"parents": [{"parentRef": {}, "conditions": [{"type": "ResolvedRefs", "status": "True"}]}]}},
     "Unknown"),
])
def test_acceptance_is_read_from_the_parents(pool, accepted):
    assert pool_acceptance(pool)[0] == accepted


def test_operator_flags_make_the_chart_defaults():
    args = _parser().parse_args(["run", "--inference-pools", "--endpoint-picker", "epp:9100",
                                 "--endpoint-picker-failure-mode", "FailOpen"])
    assert _pool_defaults(args) == PoolDefaults(True, EndpointPickerRef(name="epp", port=9100, failure_mode="FailOpen"))
    assert _pool_defaults(_parser().parse_args(["run"])) == PoolDefaults()
    for bad in ("EPP", "epp:0", "epp:x", "epp:99999", ""):
        with pytest.raises(SystemExit):
            _parser().parse_args(["run", "--endpoint-picker", bad])


@pytest.mark.parametrize("bad", ["vllm", "tgi=x", "vllm=", "=x"])
def test_engine_image_flags_name_a_known_engine(bad):
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--engine-image", bad])


def test_no_picker_is_said_in_words():
    assert "spec.inferencePool.endpointPicker" in MSG_NO_PICKER and "inferencePool.endpointPicker.name" in MSG_NO_PICKER
