"""One reading of a runtime pod for the router and the autoscaler: a draining pod is still scraped, never sent
requests; a pod without an address or on its way out is neither."""
from sluice_operator.pods import base_url, ready, serving, unschedulable_message


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
