"""What the operator does on a running replica when the adapter list changes (a plan, no rollout), and what the
status says of each adapter per replica."""
from sluice_operator.adapter_sync import Step, plan
from sluice_operator.builders.adapter_status import adapters_status
from sluice_operator.crd import InferenceModelStatus


def test_a_replica_loads_what_it_lacks_and_unloads_what_is_no_longer_declared():
    wanted = {"sql-v2": "/adapters/sql/v2", "tone": "/opt/tone"}
    loaded = {"sql-v1": "/adapters/sql/v1", "tone": "/opt/tone"}
    assert plan(wanted, loaded) == [Step("unload", "sql-v1"), Step("load", "sql-v2", "/adapters/sql/v2")]
    assert plan(wanted, {**loaded, "sql-v2": "/adapters/sql/v2/"}) == [Step("unload", "sql-v1")]
    assert plan({}, {}) == []


def test_an_adapter_declared_from_another_path_is_reloaded_and_an_unsaid_path_is_trusted():
    wanted = {"tone": "/opt/tone-2"}
    assert plan(wanted, {"tone": "/opt/tone"}) == [Step("unload", "tone"), Step("load", "tone", "/opt/tone-2")]
    assert plan(wanted, {"tone": "/opt/./tone-2"}) == []
    assert plan(wanted, {"tone": None}) == []


def test_status_counts_an_adapter_ready_only_when_every_replica_has_it():
    replicas = {"pod-b": {"sql": ("Loaded", ""), "tone": ("Failed", "rank 64 is above --max-lora-rank 16")},
                "pod-a": {"sql": ("Loaded", ""), "tone": ("Loaded", "")}}
    status = adapters_status(["sql", "tone", "new"], replicas)
    assert status["adaptersReady"] == 1
    sql, tone, new = status["adapters"]
    assert (sql["name"], sql["readyReplicas"], [r["pod"] for r in sql["replicas"]]) == ("sql", 2, ["pod-a", "pod-b"])
    assert tone["readyReplicas"] == 1
    assert tone["replicas"][1] == {"pod": "pod-b", "state": "Failed", "message": "rank 64 is above --max-lora-rank 16"}
    assert new == {"name": "new", "readyReplicas": 0, "replicas": []}
    # What the operator writes is what the CRD's status schema reads back.
    assert InferenceModelStatus.model_validate(status).adapters_ready == 1


def test_no_replica_reached_means_no_adapter_ready():
    assert adapters_status(["sql"], {}) == {"adapters": [{"name": "sql", "readyReplicas": 0, "replicas": []}],
                                            "adaptersReady": 0}
