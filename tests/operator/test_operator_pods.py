"""One reading of a runtime pod for the router and the autoscaler: a draining pod is still scraped, never sent
requests; a pod without an address or on its way out is neither."""
from sluice_operator.builders import Observed, model_status
from sluice_operator.pods import base_url, oom_killed_message, ready, serving, unschedulable_message


def _pod(ip="10.0.0.1", ready_status="True", deleting=False, draining=False, ips=None):
    meta = {"name": "p", "annotations": {"sluice.dev/draining": "true"} if draining else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"podIP": ip, "conditions": [{"type": "Ready", "status": ready_status}]}
    if ips is not None:
        status["podIPs"] = [{"ip": i} for i in ips]
    return {"metadata": meta, "status": status}


def test_a_draining_pod_is_scraped_but_not_routed():
    pod = _pod(draining=True)
    assert ready(pod) and not serving(pod)
    assert ready(_pod()) and serving(_pod())


def test_no_address_leaving_or_unready_is_neither():
    for pod in (_pod(ip=None), _pod(ip=""), _pod(deleting=True), _pod(ready_status="False"),
                _pod(ready_status="true"), {"metadata": {}, "status": None}, {}):
        assert not ready(pod) and not serving(pod), pod


def test_an_empty_draining_mark_does_not_drain():
    pod = _pod()
    pod["metadata"]["annotations"]["sluice.dev/draining"] = ""
    assert serving(pod)


def test_urls_bracket_ipv6_only():
    assert base_url("10.1.2.3") == "http://10.1.2.3:8000"
    assert base_url("fd00::5") == "http://[fd00::5]:8000"
    assert base_url("::ffff:10.0.0.1") == "http://[::ffff:10.0.0.1]:8000"
    assert base_url("not-an-ip") == "http://not-an-ip:8000"


def test_a_pod_listed_only_in_pod_ips_is_ready():
    assert ready(_pod(ip=None, ips=["fd00::7"]))


def test_the_schedulers_message_is_reported():
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": "0/1 nodes are available: insufficient nvidia.com/gpu"}]}}
    assert unschedulable_message([_pod(), pod]) == "0/1 nodes are available: insufficient nvidia.com/gpu"
    assert unschedulable_message([_pod()]) == ""


def _killed(where: str, reason: str = "OOMKilled", memory: str | None = "512Mi") -> dict:
    container = {"name": "runtime", "resources": {"limits": {"memory": memory}} if memory else {}}
    status = {"name": "runtime", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
              where: {"terminated": {"reason": reason, "exitCode": 137}}}
    return {"metadata": {"name": "m-1"}, "spec": {"containers": [container]},
            "status": {"containerStatuses": [status]}}


def test_a_container_killed_for_its_memory_limit_is_reported_with_the_limit_and_the_fix():
    for where in ("state", "lastState"):
        message = oom_killed_message([_pod(), _killed(where)])
        assert "m-1" in message and "512Mi" in message and "spec.resources.memory" in message, message
    assert "its memory limit" in oom_killed_message([_killed("lastState", memory=None)])
    # Other ends are not taken for one: an error exit, a kill by the kubelet, no status yet.
    assert oom_killed_message([_killed("lastState", reason="Error"), _killed("state", reason="Completed"),
                               _pod(), {"metadata": {"name": "x"}, "status": None}]) == ""


def test_a_replica_killed_once_that_came_back_ready_is_not_reported():
    recovered = _killed("lastState")
    (status,) = recovered["status"]["containerStatuses"]
    status.update(state={"running": {"startedAt": "2026-12-03T08:00:00Z"}}, ready=True)
    assert oom_killed_message([_pod(), recovered]) == ""
    # Running again but not ready yet (still loading): the kill is still the likeliest problem.
    status["ready"] = False
    assert "m-1" in oom_killed_message([recovered])


def test_an_oom_killed_replica_degrades_the_model_after_the_schedulers_word():
    deployment = {"spec": {"replicas": 1}, "status": {"replicas": 1}}
    status = model_status(Observed("m", 1, deployment, oom_killed="killed: raise spec.resources.memory"), {}, "now")
    (degraded,) = [c for c in status["conditions"] if c["type"] == "Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "OOMKilled") and "raise" in degraded["message"]
    both = model_status(Observed("m", 1, deployment, unschedulable="0/1 nodes", oom_killed="killed"), {}, "now")
    assert [c["reason"] for c in both["conditions"] if c["type"] == "Degraded"] == ["Unschedulable"]
