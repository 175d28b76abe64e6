"""LoRA adapters in the runtime pods: flags, read-only claims, and a template that an edit of the list alone
leaves as it is (the running pods load and unload adapters through the runtime's API instead)."""
import json

import pytest

from sluice_operator.builders import Owner, build_all, build_deployment
from sluice_operator.builders.adapters import START_ADAPTERS_ANNOTATION
from sluice_operator.crd import InferenceModelSpec

OWNER = Owner(name="base", namespace="demo", uid="0b7e4c1e-1111-2222-3333-444455556666")
SQL = {"name": "sql-v1", "source": "pvc://adapters/sql/v1", "rank": 8}
TONE = {"name": "tone", "source": "file:///opt/.adapters/tone"}


def _spec(adapters=None, **fields):
    body = {"model": {"source": "smollm2"}, **fields}
    if adapters is not None:
        body["adapters"] = adapters
    return InferenceModelSpec.model_validate(body)


def _deployment(spec, existing=None):
    return build_all(OWNER, spec, deployment=existing)[-1]


def _args(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _loras(deployment):
    args = _args(deployment)
    return [args[i + 1] for i, a in enumerate(args) if a == "--lora"]


def test_adapters_start_with_the_pod_and_claims_are_mounted_read_only_once():
    deployment = _deployment(_spec([SQL, TONE, {"name": "sql-v2", "source": "pvc://adapters/sql/v2"}],
                                   runtime={"maxLoras": 3, "maxLoraRank": 8}))
    args = _args(deployment)
    assert args[args.index("--enable-lora"):args.index("--enable-lora") + 5] == [
        "--enable-lora", "--max-loras", "3", "--max-lora-rank", "8"]
    assert _loras(deployment) == ["sql-v1=/adapters/adapters/sql/v1", "tone=/opt/.adapters/tone",
                                  "sql-v2=/adapters/adapters/sql/v2"]
    pod = deployment["spec"]["template"]["spec"]
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert [v["persistentVolumeClaim"] for v in claims] == [{"claimName": "adapters", "readOnly": True}]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == claims[0]["name"]]
    assert mount == {"name": claims[0]["name"], "mountPath": "/adapters/adapters", "readOnly": True}


def test_no_adapter_list_no_lora_and_an_empty_one_turns_it_on():
    assert "--enable-lora" not in _args(_deployment(_spec()))
    assert START_ADAPTERS_ANNOTATION not in _deployment(_spec())["metadata"]["annotations"]
    empty = _deployment(_spec([]))
    assert "--enable-lora" in _args(empty) and _loras(empty) == []


@pytest.mark.parametrize("edit", [
    [SQL, TONE, {"name": "sql-v2", "source": "pvc://adapters/sql/v2"}],  # one more, on a claim already mounted
    [TONE],  # one less, its claim's last adapter
    [],  # none left
    [{**SQL, "rank": 4}, {**TONE, "source": "file:///opt/.adapters/tone-2"}],  # same names, other rank and path
])
def test_an_edit_of_the_adapter_list_alone_leaves_the_pod_template_as_it_is(edit):
    running = _deployment(_spec([SQL, TONE]))
    edited = _deployment(_spec(edit), running)
    assert edited["spec"]["template"] == running["spec"]["template"]
    assert _loras(edited) == ["sql-v1=/adapters/adapters/sql/v1", "tone=/opt/.adapters/tone"]
    # Edited again on top of the edit: still the template the pods run.
    assert _deployment(_spec([TONE]), edited)["spec"]["template"] == running["spec"]["template"]


def test_any_other_change_rolls_out_a_template_that_starts_with_the_spec_list():
    running = _deployment(_spec([SQL, TONE]))
    edited = _deployment(_spec([TONE], runtime={"maxNumSeqs": 8}), running)
    assert edited["spec"]["template"] != running["spec"]["template"]
    assert _loras(edited) == ["tone=/opt/.adapters/tone"]
    assert not [v for v in edited["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    # An adapter on a claim no pod mounts yet needs the volume: a rollout, with the spec's list.
    on_new_claim = _deployment(_spec([SQL, {"name": "x", "source": "pvc://other/x"}]), running)
    assert _loras(on_new_claim) == ["sql-v1=/adapters/adapters/sql/v1", "x=/adapters/other/x"]


@pytest.mark.parametrize("forged", ["not json", "[{\"name\": \"evil\", \"source\": \"file:///etc\"}]", "{}", "[1]"])
def test_a_tampered_start_list_annotation_is_not_trusted_beyond_the_digest(forged):
    running = _deployment(_spec([SQL]))
    running["metadata"]["annotations"][START_ADAPTERS_ANNOTATION] = forged
    rebuilt = _deployment(_spec([SQL]), running)
    # Whatever the annotation says, the template that is applied starts with the spec's list.
    assert _loras(rebuilt) == ["sql-v1=/adapters/adapters/sql/v1"]
    assert json.loads(rebuilt["metadata"]["annotations"][START_ADAPTERS_ANNOTATION]) == [SQL]


def test_turning_lora_off_or_on_is_a_rollout():
    running = _deployment(_spec([SQL]))
    assert "--enable-lora" not in _args(_deployment(_spec(), running))
    assert "--enable-lora" in _args(_deployment(_spec([]), build_deployment(OWNER, _spec())))


def test_vllm_pods_get_its_lora_flags_and_may_load_adapters_at_run_time():
    deployment = _deployment(_spec([SQL, TONE], model={"source": "hf:org/model"}, runtime={"engine": "vllm"}))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    at = args.index("--lora-modules")
    assert args[at + 1:at + 3] == ["sql-v1=/adapters/adapters/sql/v1", "tone=/opt/.adapters/tone"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in container["env"]
