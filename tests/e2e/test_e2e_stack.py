"""The whole stack as a platform team installs it and an application uses it, on the local cluster's real node.

helm installs the chart with the images `make images` built; every pod of the release namespace (the operator,
the gateway, the runtime pods the operator creates) runs in a container under its limits, in a namespace that
enforces Pod Security `restricted`, behind the chart's NetworkPolicies; the application reaches the gateway
through its Service. The scenarios run in order, each on the state the previous one left (tests/e2e/conftest.py);
numbers are in the timing table at the end of the run.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import time

import httpx
import openai
import pytest
import yaml

from fixtures.cluster import wait_for
from fixtures.real_node import memory_peak
from fixtures.sluice_stack import NAMESPACE, OVERLAY, RELEASE, REPO, ROUTING_TABLE, TENANT_KEY, VALUES, ready
from localcluster.engine_stand_in import STAND_IN_IMAGE
from sluice_contracts import runtime_credential

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHART = REPO / "charts" / "sluice"
CANARY_ROUTE = REPO / "config" / "samples" / "modelroute-canary.yaml"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False},
    },
}
LONG_STREAM = "Count from 1 to 300, one number per line. ({n})"
# Streams through the scale-down: lengths drawn from a range, so they end at mixed times and each replica
# always has some mid-way when the autoscaler marks one; short enough to end within the removed replica's
# drain (60 s grace less the 5 s preStop and a margin) also on a busy 2-core machine; six of them stay under
# the KV-cache target, so the model still shrinks.
TRICKLE_TOKENS = (96, 176)


@pytest.fixture(scope="module")
def stack(sluice_stack):
    return sluice_stack


def _im_columns(stack) -> dict[str, dict[str, str]]:
    """Each row by the header's column positions: a column a row leaves empty (a model without adapters) shifts
    nothing."""
    header, *rows = stack.kubectl("get", "im").stdout.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    spans = list(zip(starts, starts[1:] + [None]))
    return {row.split()[0]: {name: row[a:b].strip() for name, (a, b) in zip(header.split(), spans)} for row in rows}


def _wait_ready(stack, name: str) -> None:
    """The model Ready, or the failure says why: its pods as the scheduler and the kubelet see them."""
    waited = stack.kubectl("wait", "--for=condition=Ready", f"im/{name}", "--timeout=240s", timeout=260, check=False)
    if waited.returncode != 0:
        described = stack.kubectl("describe", "pods", "-l", f"sluice.dev/inference-model={name}", check=False).stdout
        node = stack.cluster.kubectl("describe", "node", "node-0", check=False).stdout
        allocated = node[node.find("Non-terminated Pods"):node.find("Events:")]
        raise AssertionError(f"{name} not Ready: {waited.stderr}\n{described[-2500:]}\n{allocated}")


def _spec_replicas(stack, name: str) -> int:
    return stack.get("im", name)["spec"]["replicas"]


def _failures(results) -> list[str]:
    return [f"{r.request_id}: {r.error}" for r in results if not r.ok]


def test_1_helm_install(stack, record_property):
    started = time.monotonic()
    # As a platform team prepares it: every pod here, the runtime pods included, must pass `restricted`.
    stack.cluster.kubectl("create", "namespace", NAMESPACE)
    stack.cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    # And storage for the models' cache.
    stack.cache_claim()
    stack.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(stack.values),
               "--wait", "--timeout", "4m")
    record_property("install_s", round(time.monotonic() - started, 1))

    for crd in ("inferencemodels.sluice.dev", "modelroutes.sluice.dev"):
        stack.cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")
    assert stack.get("secret", f"{RELEASE}-gateway") is not None, "the tenant Secret"
    # Rendered empty by the chart, filled by the operator (the gateway's pod waited for it).
    credential = stack.get("secret", runtime_credential.secret_name(RELEASE))
    assert len(credential["data"][runtime_credential.SECRET_KEY]) >= 40
    assert credential["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", "still the release's"
    (operator,) = stack.pods("app.kubernetes.io/component=operator")
    gateway = stack.gateway_pod()
    assert ready(operator) and ready(gateway)

    for pod in (operator, gateway):
        assert all(c["containerID"].startswith("containerd://") for c in pod["status"]["containerStatuses"])
    # The operator acts as its own service account, with the token the kubelet projects into its container.
    token = stack.exec(operator, "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token").stdout
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=" * (-len(token.split(".")[1]) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{NAMESPACE}:{operator['spec']['serviceAccountName']}"
    assert operator["spec"]["serviceAccountName"] == f"{RELEASE}-operator"
    assert stack.get("kopfpeering", "sluice-operator") is not None, "the release's peering object"

    # The gateway answers before any model exists: no routing table yet, so no models.
    assert stack.gateway_get("/ready")["routes"] == 0
    assert stack.client().models.list().data == []


def test_2_samples_become_ready(stack, record_property):
    started = time.monotonic()
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(stack.samples()))
    stack.kubectl("wait", "--for=condition=Ready", "im/smollm2", "--timeout=240s", timeout=260)
    record_property("model_ready_s", round(time.monotonic() - started, 1))
    stack.kubectl("wait", "--for=condition=Ready", "mr/chat", "--timeout=60s")

    columns = wait_for(lambda: (row := _im_columns(stack).get("smollm2")) and row.get("ENDPOINTS") == "1" and row,
                       timeout=30, what="kubectl get im to show the endpoint")
    assert (columns["MODEL"], columns["REPLICAS"], columns["READY"], columns["STATUS"]) == (
        "smollm2", "1", "1", "Serving")
    assert "Routable" in stack.kubectl("get", "mr", "chat").stdout
    # Ready means the pod serves; the gateway learns its address a moment later, from the routing table.
    (pod,) = stack.model_pods("smollm2")
    wait_for(lambda: stack.gateway_endpoints("chat") == {"smollm2": [f"http://{pod['status']['podIP']}:8000"]},
             timeout=20, what="the gateway to load the endpoint")
    record_property("routable_s", round(time.monotonic() - started, 1))
    assert {"chat", "smollm2"} <= {m.id for m in stack.client().models.list().data}


def test_3_openai_client_through_the_gateway(stack):
    client = stack.client()
    completion = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12)
    assert completion.choices[0].message.content and completion.usage.completion_tokens > 0

    chunks = list(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    called = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=64,
        temperature=0, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments).keys() == {"city"}
    assert called.choices[0].finish_reason == "tool_calls"

    with pytest.raises(openai.AuthenticationError) as refused:
        stack.client(key="sk-not-a-key").chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    assert refused.value.status_code == 401


# Run inside the operator's container, which the NetworkPolicies let reach a runtime pod (for its metrics and
# adapters) but which holds no runtime credential: every inference path with each header given (argv[2], JSON),
# then the paths the scraper and the kubelet use, with none.
BYPASS = """
import json, sys, urllib.error, urllib.request
chat = b'{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}'
paths = [("/v1/chat/completions", chat), ("/v1/completions", b'{"model": "smollm2", "prompt": "Hi"}'),
         ("/v1/models", None), ("/tokenize", b'{"prompt": "Hi"}')]
def status(path, data, headers):
    request = urllib.request.Request(sys.argv[1] + path, data=data, headers={"content-type": "application/json",
                                                                            **headers})
    try:
        return urllib.request.urlopen(request, timeout=60).status
    except urllib.error.HTTPError as error:
        return error.code
seen = {json.dumps(h): {p: status(p, d, h) for p, d in paths} for h in json.loads(sys.argv[2])}
seen["none"] = {p: status(p, None, {}) for p in ("/metrics", "/load", "/health", "/ready")}
print(json.dumps(seen))
"""


def test_3b_a_pod_with_the_gateways_labels_is_refused_and_a_reachable_runtime_needs_the_credential(stack):
    """Forged gateway labels would get a pod past the NetworkPolicies: the chart refuses such a pod at admission.
    A pod that reaches a runtime anyway (the operator does, for its metrics) gets 401 without the credential."""
    (runtime,) = stack.model_pods("smollm2")
    gateway = stack.gateway_pod()
    labels = {k: v for k, v in gateway["metadata"]["labels"].items() if k != "pod-template-hash"}
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                  "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bypass", "labels": labels},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [{
               "name": "probe", "image": gateway["spec"]["containers"][0]["image"], "command": ["sleep", "60"],
               "securityContext": restricted}]}}
    forged = stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert forged.returncode != 0 and "is made only by its Deployment" in forged.stderr, forged.stderr

    secret = stack.get("secret", runtime_credential.secret_name(RELEASE))
    credential = base64.b64decode(secret["data"][runtime_credential.SECRET_KEY]).decode()
    tried = [{}, {"authorization": f"Bearer {TENANT_KEY}"}, {"authorization": f"Bearer {credential[:-1]}"},
             {"authorization": credential}, {"authorization": f"Basic {credential}"}]
    (operator,) = stack.pods("app.kubernetes.io/component=operator")
    seen = json.loads(stack.exec(operator, "python3", "-c", BYPASS, f"http://{runtime['status']['podIP']}:8000",
                                 json.dumps(tried)).stdout)
    for headers in tried:
        assert set(seen[json.dumps(headers)].values()) == {401}, (headers, seen)
    assert seen["none"] == {"/metrics": 200, "/load": 200, "/health": 200, "/ready": 200}, seen
    # The gateway holds the credential: the same request through it is served.
    reply = stack.client().chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=2)
    assert reply.usage.completion_tokens > 0


def _answers(stack, key: str) -> bool:
    try:
        stack.client(key=key).models.list()
        return True
    except openai.AuthenticationError:
        return False


def test_3c_a_revoked_key_stops_working_without_a_restart(stack, record_property):
    """`helm upgrade` replaces the tenant's key: the running gateway reloads its config, the old key gets 401,
    the new one works, no pod restarts, and the operator's runtime credential survives the upgrade."""
    import hashlib

    gateway = stack.gateway_pod()
    credential = stack.get("secret", runtime_credential.secret_name(RELEASE))["data"]
    rotated = "sk-sluice-e2e-rotated"
    tenants = yaml.safe_load(VALUES.read_text())["gateway"]["config"]["tenants"]
    tenants[0]["keys"] = [{"id": "rotated", "sha256": hashlib.sha256(rotated.encode()).hexdigest()}]
    started = time.monotonic()
    stack.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(stack.values),
               "--set-json", f"gateway.config.tenants={json.dumps(tenants)}")
    wait_for(lambda: not _answers(stack, TENANT_KEY), timeout=120, interval=0.5, what="the old key to be refused")
    record_property("revoked_s", round(time.monotonic() - started, 1))
    assert _answers(stack, rotated)
    still = stack.gateway_pod()
    assert still["metadata"]["name"] == gateway["metadata"]["name"]
    assert stack.container_id(still) == stack.container_id(gateway), "the gateway was not restarted"
    assert still["status"]["containerStatuses"][0]["restartCount"] == 0
    assert stack.get("secret", runtime_credential.secret_name(RELEASE))["data"] == credential

    stack.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(stack.values))
    wait_for(lambda: _answers(stack, TENANT_KEY), timeout=120, interval=0.5, what="the e2e key to work again")


def test_3d_a_batch_runs_through_the_installed_gateway(stack, record_property):
    """OpenAI's Files and Batches through the gateway's Service: the store on the chart's volume, the lines sent to
    the runtime pod like online requests, each custom_id answered once."""
    import io

    client = stack.client()
    lines = [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": f"Say {n}."}]}}
             for n in range(6)]
    upload = client.files.create(file=("lines.jsonl", io.BytesIO("\n".join(map(json.dumps, lines)).encode())),
                                 purpose="batch")
    started = time.monotonic()
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(lambda: (seen := client.batches.retrieve(batch.id)).status in ("completed", "failed") and seen,
                    timeout=180, interval=1, what="the batch to end")
    record_property("batch_of_6_s", round(time.monotonic() - started, 1))
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (6, 0), done
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == sorted(line["custom_id"] for line in lines)
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["usage"]["completion_tokens"] > 0
               for o in output), output


def _canary_route(smollm2: int, canary: int) -> str:
    route = yaml.safe_load(CANARY_ROUTE.read_text())
    route["spec"]["backends"] = [{"inferenceModel": "smollm2", "weight": smollm2},
                                 {"inferenceModel": "smollm2-canary", "weight": canary}]
    return yaml.safe_dump(route)


def _share(results, backend: str) -> float:
    return sum(r.backend == backend for r in results) / len(results)


def test_4_canary_split_follows_the_weights(stack, record_property):
    (model,) = [d for d in stack.samples() if d["kind"] == "InferenceModel"]
    model["metadata"]["name"] = "smollm2-canary"
    del model["spec"]["autoscaling"]
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    stack.kubectl("apply", "-f", "-", input=_canary_route(80, 20))
    stack.kubectl("wait", "--for=condition=Ready", "im/smollm2-canary", "--timeout=240s", timeout=260)
    stack.kubectl("wait", "--for=condition=Ready", "mr/chat-canary", "--timeout=60s")
    wait_for(lambda: len([urls for urls in stack.gateway_endpoints("assistant").values() if urls]) == 2,
             timeout=20, what="both canary backends in the gateway")

    # Four at a time: even all on one runtime, fewer queue than its autoscaler's target, so it stays out of it.
    load = stack.load("assistant", concurrency=4, max_tokens=1).start()
    wait_for(lambda: len(load.snapshot()) >= 120, timeout=180, interval=0.5, what="120 answers at 80/20")
    before = load.snapshot()[:120]
    changed = time.monotonic()
    stack.kubectl("apply", "-f", "-", input=_canary_route(20, 80))
    wait_for(lambda: [b["weight"] for b in stack.gateway_get("/admin/routes")["routes"]["assistant"]["backends"]]
             == [20, 80], timeout=20, interval=0.1, what="the gateway to load the new weights")
    applied = time.monotonic()
    wait_for(lambda: len(load.done_after(applied)) >= 80, timeout=180, interval=0.5, what="80 answers at 20/80")
    results = load.stop()
    after = [r for r in results if r.started >= applied][:80]

    assert _failures(results) == [], "a request failed while the weights changed"
    first, second = _share(before, "smollm2-canary"), _share(after, "smollm2-canary")
    record_property("requests", len(results))
    record_property("canary_share_at_80_20", round(first, 3))
    record_property("canary_share_at_20_80", round(second, 3))
    record_property("weights_applied_s", round(applied - changed, 2))
    # Binomial spread at these counts is about 3.7 and 4.5 points; three and a half of them still flag a split
    # off by a third.
    assert abs(first - 0.2) < 0.13 and abs(second - 0.8) < 0.16, (first, second)

    # The canary served its purpose; its runtime would only take CPU from the scenarios that follow.
    stack.kubectl("delete", "mr", "chat-canary")
    stack.kubectl("delete", "im", "smollm2-canary", "--wait=true", "--timeout=60s")


def _decisions(recorder, action: str, since: float) -> list[dict]:
    """The autoscaler's decisions of one kind, each once, from the status versions the watch saw after `since`."""
    found = {}
    for seen, _, model in recorder.seen():
        decision = (model.get("status") or {}).get("autoscaler") or {}
        if seen >= since and decision.get("action") == action:
            found[decision["time"]] = decision
    return list(found.values())


def _operator_decisions(stack, action: str) -> float:
    (operator,) = stack.pods("app.kubernetes.io/component=operator")
    return stack.metric(operator, 8081, "sluice_operator_autoscaler_decisions_total", f'action="{action}"',
                        'model="smollm2"')


def _first(recorder, matches) -> tuple[float, dict] | None:
    return next(((seen, pod) for seen, _, pod in recorder.seen() if matches(pod)), None)


def test_5_autoscaling_up_under_a_burst_and_down_after_the_window(stack, record_property):
    def one_replica():
        pods = stack.model_pods("smollm2")
        return _spec_replicas(stack, "smollm2") == 1 and len(pods) == 1 and pods
    (first,) = wait_for(one_replica, timeout=90, what="one replica before the burst")
    counted = {action: _operator_decisions(stack, action) for action in ("ScaleUp", "ScaleDown")}
    with stack.record_model("smollm2") as model, stack.record_pods("sluice.dev/inference-model=smollm2") as pods:
        # Short streams, many at once: four run per replica, the rest queue, and the queue is what scales.
        burst = stack.load("chat", concurrency=16, max_tokens=24, stream=True, ignore_eos=True,
                           prompt=LONG_STREAM).start()
        started = time.monotonic()
        (up,) = wait_for(lambda: _decisions(model, "ScaleUp", started), timeout=60, what="a ScaleUp decision in status")
        record_property("scale_up_decision_s", round(time.monotonic() - started, 1))
        second = wait_for(lambda: [p for p in stack.model_pods("smollm2") if ready(p)
                                   and p["metadata"]["name"] != first["metadata"]["name"]], timeout=180,
                          what="the second replica to be Ready")[0]
        record_property("second_replica_ready_s", round(time.monotonic() - started, 1))
        wait_for(lambda: stack.runtime_metric(second, "vllm:prompt_tokens_total") > 0, timeout=60,
                 what="the second replica to take requests")
        record_property("second_replica_serving_s", round(time.monotonic() - started, 1))
        calm = burst.halt()
        burst_results = burst.stop()
        # The heaviest load of the suite: both replicas within their cgroup's memory limit.
        for n, replica in enumerate((first, second)):
            _record_peak(stack, replica, record_property, f"runtime_{n}")

        # Light load through the scale-down: long streams on both replicas (started with nothing else in
        # flight, bounded-load affinity puts at least two of six on each), so the replica removed has some
        # in flight; KV-cache usage and queues stay below the targets, so the autoscaler still shrinks.
        trickle = stack.load("chat", concurrency=6, max_tokens=TRICKLE_TOKENS, stream=True, ignore_eos=True,
                             prompt=LONG_STREAM).start()
        (down,) = wait_for(lambda: _decisions(model, "ScaleDown", calm), timeout=120,
                           what="a ScaleDown decision in status")
        deleted = wait_for(lambda: _first(pods, lambda p: p["metadata"].get("deletionTimestamp")), timeout=30,
                           what="a replica's deletion")
        deleted_at, victim = deleted
        record_property("scale_down_after_load_s", round(deleted_at - calm, 1))
        drained = _first(pods, lambda p: p["metadata"]["uid"] == victim["metadata"]["uid"]
                         and (p["metadata"].get("annotations") or {}).get("sluice.dev/draining"))
        wait_for(lambda: stack.get("pod", victim["metadata"]["name"]) is None, timeout=75,
                 what="the removed replica's container to drain and exit")
        results = trickle.stop()

    assert _failures(burst_results) == [] and _failures(results) == [], "a request failed while scaling"
    assert (up["currentReplicas"], up["desiredReplicas"]) == (1, 2)
    assert up["metrics"]["podsScraped"] == 1 and up["metrics"]["waiting"] >= 4, up
    assert (down["currentReplicas"], down["desiredReplicas"]) == (2, 1)
    assert down["metrics"]["podsScraped"] == 2 and down["metrics"]["kvCacheUsage"] is not None, down
    assert drained is not None and drained[0] < deleted_at, "the gateway stopped routing to it before it went"
    assert _spec_replicas(stack, "smollm2") == 1

    # The streams the drain exists for: on the victim when it was marked. Those still running when the pod was
    # deleted are counted too, but how many outlast the tick between mark and deletion depends on the host's speed.
    victim_url = f"http://{victim['status']['podIP']}:8000"
    log = stack.access_log()
    on_victim = [r for r in results if log.get(r.request_id, {}).get("endpoint") == victim_url]
    drained_at = drained[0]
    in_flight = [r for r in on_victim if r.started < drained_at < r.finished]
    record_property("streams_in_flight_on_removed_replica_when_marked", len(in_flight))
    record_property("streams_in_flight_on_removed_replica_when_deleted",
                    sum(r.started < deleted_at < r.finished for r in on_victim))
    assert in_flight, "no stream was in flight on the removed replica when it was marked, so its drain was not exercised"
    assert all(r.finish_reason == "length" and r.completion_tokens == r.max_tokens for r in in_flight), in_flight

    messages = [e["message"] for e in stack.events("smollm2", "Scaled")]
    assert any(m.startswith("1 → 2 replicas") and "waiting" in m for m in messages), messages
    assert any(m.startswith("2 → 1 replicas") and "KV-cache usage" in m for m in messages), messages
    for action in ("ScaleUp", "ScaleDown"):
        assert _operator_decisions(stack, action) - counted[action] == 1, action


def _set_min_replicas(stack, count: int) -> None:
    stack.kubectl("patch", "im", "smollm2", "--type=merge", "-p",
                  json.dumps({"spec": {"autoscaling": {"minReplicas": count}}}))


def _serving_pods(stack, count: int, timeout: float = 180) -> list[dict]:
    """`count` Ready runtime pods whose endpoints the gateway has loaded."""
    def check():
        pods = [p for p in stack.model_pods("smollm2") if ready(p)]
        urls = sorted(f"http://{p['status']['podIP']}:8000" for p in pods)
        return len(pods) == count and sorted(stack.gateway_endpoints("chat").get("smollm2", [])) == urls and pods
    return wait_for(check, timeout=timeout, what=f"{count} serving replicas in the gateway's table")


def _mixed_load(stack):
    short = stack.load("chat", concurrency=3, max_tokens=8).start()
    streams = stack.load("chat", concurrency=2, max_tokens=48, stream=True, ignore_eos=True, prompt=LONG_STREAM).start()
    return short, streams


def test_6_a_killed_runtime_is_routed_around_and_replaced(stack, record_property):
    _set_min_replicas(stack, 2)
    first, second = _serving_pods(stack, 2)
    short, streams = _mixed_load(stack)
    time.sleep(3)

    # A crash: the engine's process dies at once; the kubelet restarts the container in place.
    killed_at = time.monotonic()
    stack.kill(first)

    def restarted():
        pod = stack.get("pod", first["metadata"]["name"])
        status = (pod["status"].get("containerStatuses") or [{}])[0]
        return ready(pod) and status.get("restartCount", 0) >= 1 and status
    status = wait_for(restarted, timeout=180, what="the killed container to be restarted and Ready")
    restarted_at = time.monotonic()
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert status["containerID"].removeprefix("containerd://") != stack.container_id(first)
    _serving_pods(stack, 2)
    wait_for(lambda: stack.runtime_metric(first, "vllm:request_success_total") > 0, timeout=60,
             what="the restarted process to answer requests")
    record_property("crash_to_serving_again_s", round(time.monotonic() - killed_at, 1))
    # Meanwhile the gateway sent the route's requests to the other replica.
    routed_around = [r for r in short.snapshot() if killed_at < r.started and r.finished < restarted_at and r.ok]
    record_property("answered_while_one_was_down", len(routed_around))
    assert routed_around

    # A lost pod: force-deleted, the ReplicaSet replaces it and the kubelet starts the new one.
    lost_at = time.monotonic()
    stack.kubectl("delete", "pod", second["metadata"]["name"], "--grace-period=0", "--force")
    pods = wait_for(lambda: (pods := _serving_pods(stack, 2)) and second["metadata"]["name"] not in
                    [p["metadata"]["name"] for p in pods] and pods, timeout=180, what="a replacement replica")
    record_property("pod_loss_to_serving_again_s", round(time.monotonic() - lost_at, 1))
    (replacement,) = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
    wait_for(lambda: stack.runtime_metric(replacement, "vllm:request_success_total") > 0, timeout=60,
             what="the replacement to answer requests")

    results = short.stop() + streams.stop()
    unstarted = [r for r in results if not r.ok and r.chunks == 0]
    record_property("requests", len(results))
    record_property("streams_cut_mid_way", sum(1 for r in results if not r.ok and r.chunks > 0))
    record_property("retried_by_gateway", sum(1 for e in stack.access_log().values() if (e.get("attempts") or 0) > 1))
    assert unstarted == [], [f"{r.request_id}: {r.error}" for r in unstarted]


def test_7_rollout_of_new_runtime_args_fails_no_request(stack, record_property):
    before = {p["metadata"]["name"] for p in _serving_pods(stack, 2)}
    short, streams = _mixed_load(stack)
    time.sleep(2)
    started = time.monotonic()
    stack.kubectl("patch", "im", "smollm2", "--type=merge", "-p",
                  json.dumps({"spec": {"runtime": {"args": ["--max-num-batched-tokens", "512"]}}}))
    # The operator applies the new spec a moment later; `rollout status` of the Deployment as it still is
    # would report the old rollout complete.
    generation = str(stack.get("im", "smollm2")["metadata"]["generation"])
    wait_for(lambda: ((stack.get("deployment", "smollm2") or {}).get("metadata", {}).get("annotations") or {})
             .get("sluice.dev/generation") == generation, timeout=60, what="the operator to apply the new spec")
    stack.kubectl("rollout", "status", "deployment/smollm2", "--timeout=300s", timeout=320)
    after = _serving_pods(stack, 2)
    record_property("rollout_s", round(time.monotonic() - started, 1))
    time.sleep(2)
    results = short.stop() + streams.stop()

    assert not before & {p["metadata"]["name"] for p in after}, "every replica was replaced"
    for pod in after:
        arguments = stack.command_line(pod)
        assert arguments[arguments.index("--max-num-batched-tokens") + 1] == "512", arguments
    model = stack.get("im", "smollm2")
    wait_for(lambda: stack.condition("im", "smollm2", "Progressing").get("reason") == "RolloutComplete",
             timeout=30, what="Progressing=False/RolloutComplete")
    assert stack.get("im", "smollm2")["status"]["observedGeneration"] == model["metadata"]["generation"]
    record_property("requests", len(results))
    assert _failures(results) == [], "a request failed during the rollout"


# engine: vllm, run on the local cluster by Sluice's runtime STANDING IN for the vLLM image (STAND_IN_IMAGE, the
# runtime image with localcluster/engine_stand_in.py as its `vllm` command: vLLM's flags translated, no /load),
# behind our engine guard, sized like the sample.
VLLM_MODEL = """
apiVersion: sluice.dev/v1alpha1
kind: InferenceModel
metadata: {name: smollm2-vllm}
spec:
  model: {source: smollm2}
  runtime: {engine: vllm, maxModelLen: 512, maxNumSeqs: 4, kvCacheMemory: 128Mi, startupTimeoutSeconds: 240}
  resources: {cpu: 100m, cpuLimit: "1", memory: 3Gi}
  autoscaling: {minReplicas: 1, maxReplicas: 2}
"""


def test_7b_a_vllm_engine_model_is_routed_scaled_and_reported(stack, record_property):
    started = time.monotonic()
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(stack.placed(yaml.safe_load(VLLM_MODEL))))
    stack.kubectl("wait", "--for=condition=Ready", "im/smollm2-vllm", "--timeout=240s", timeout=260)
    record_property("model_ready_s", round(time.monotonic() - started, 1))
    (pod,) = stack.model_pods("smollm2-vllm")
    container = pod["spec"]["containers"][0]
    # The release's image for the vllm engine (the chart's operator.engineImages), run as vLLM's image is.
    assert container["image"] == STAND_IN_IMAGE and container["command"] == ["vllm", "serve"]
    assert [c["name"] for c in pod["spec"]["containers"]][1:] == ["engine-guard"]
    assert "--no-load-endpoint" in stack.command_line(pod, container=container["name"]), "the stand-in runs the engine"
    # Only the guard is on the serving port: every path but the probes' needs the runtime credential.
    serving = f"http://{pod['status']['podIP']}:8000"
    for path in ("/tokenize", "/invocations", "/v1/chat/completions"):
        assert httpx.post(serving + path, json={}, timeout=10).status_code == 401, path
    assert httpx.get(serving + "/metrics", timeout=10).status_code == 200
    (backend,) = stack.routing_table()["routes"]["smollm2-vllm"]["backends"]
    assert backend["engine"] == "vllm"

    # The autoscaler reads the pod's load from its /metrics by vLLM's names.
    scraped = wait_for(lambda: ((stack.get("im", "smollm2-vllm")["status"].get("autoscaler") or {})
                                .get("metrics", {}).get("podsScraped") == 1), timeout=60,
                       what="the autoscaler to scrape the vLLM pod")
    assert scraped
    # Scaling: a second replica joins the route, and the gateway, reading /metrics for both, serves through each.
    stack.kubectl("patch", "im", "smollm2-vllm", "--type=merge", "-p", '{"spec": {"autoscaling": {"minReplicas": 2}}}')
    endpoints = wait_for(lambda: len(eps := stack.gateway_endpoints("smollm2-vllm").get("smollm2-vllm", [])) == 2
                         and eps, timeout=240, what="two vLLM endpoints in the gateway's table")
    record_property("second_replica_routable_s", round(time.monotonic() - started, 1))
    client = stack.client()
    for _ in range(6):
        completion = client.chat.completions.create(
            model="smollm2-vllm", messages=[{"role": "user", "content": "Say hello."}], max_tokens=4)
        assert completion.choices[0].message.content
    gateway = stack.gateway_pod()
    for url in endpoints:
        assert stack.metric(gateway, 9090, "sluice_gateway_endpoint_up", f'endpoint="{url}"') == 1, url
    served = [stack.runtime_metric(p, "vllm:request_success_total") for p in stack.model_pods("smollm2-vllm")]
    assert sum(served) >= 6, served
    status = stack.get("im", "smollm2-vllm")["status"]
    assert (status["readyReplicas"], status["endpoints"]) == (2, 2)
    stack.kubectl("delete", "im", "smollm2-vllm", "--wait=true", "--timeout=120s", timeout=150)
    wait_for(lambda: not stack.model_pods("smollm2-vllm"), timeout=90, what="the vLLM pods to go")


IDLE_S = 10  # the scenario's scaleToZeroAfterSeconds: short, so the model goes to zero within the test's patience


def _at_zero(stack) -> bool:
    """No replica, and the gateway's own table says so: it learns from its routing-table volume, which the kubelet
    rewrites at its next sync, while the replicas it had may still be draining (and answering)."""
    model = stack.get("im", "smollm2")
    return (model["spec"]["replicas"] == 0 and not stack.model_pods("smollm2")
            and stack.condition("im", "smollm2", "Ready").get("reason") == "ScaledToZero"
            and not stack.gateway_endpoints("chat").get("smollm2"))


def _ask(client, n: int, stream: bool) -> tuple[bool, str]:
    """One chat request as an application sends it: (answered in full, what went wrong)."""
    try:
        messages = [{"role": "user", "content": f"Say hello to visitor {n}."}]
        if stream:
            chunks = list(client.chat.completions.create(model="chat", messages=messages, max_tokens=8, stream=True))
            return any(c.choices and c.choices[0].finish_reason for c in chunks), ""
        reply = client.chat.completions.create(model="chat", messages=messages, max_tokens=8)
        return reply.choices[0].finish_reason is not None, ""
    except Exception as error:  # every kind counts
        return False, f"{type(error).__name__}: {error}"[:300]


def test_7c_scale_to_zero_and_back_without_losing_a_request(stack, record_property):
    import concurrent.futures

    from openai import OpenAI

    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=TENANT_KEY, max_retries=0, timeout=400)
    stack.kubectl("patch", "im", "smollm2", "--type=merge", "-p", json.dumps(
        {"spec": {"autoscaling": {"minReplicas": 0, "scaleToZeroAfterSeconds": IDLE_S}}}))
    idle_from = time.monotonic()
    wait_for(lambda: _at_zero(stack), timeout=180, interval=1, what="the idle model to scale to zero")
    record_property("to_zero_s", round(time.monotonic() - idle_from, 1))
    # At zero the model is still a model: listed, routable, with no endpoint; `kubectl get im` says why.
    assert _im_columns(stack)["smollm2"]["STATUS"] == "ScaledToZero"
    assert {"chat", "smollm2"} <= {m.id for m in client.models.list().data}
    assert stack.routing_table()["routes"]["smollm2"]["backends"][0]["endpoints"] == []
    assert any("scaling to zero" in e["message"] for e in stack.events("smollm2", "Scaled"))

    # Ten requests at once, five streaming: held at the gateway, the operator starts a replica, all are answered.
    (gateway,) = stack.pods("app.kubernetes.io/component=gateway")
    holds = stack.metric(gateway, 9090, "sluice_gateway_hold_seconds_count")
    sent = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda n: _ask(client, n, stream=n % 2 == 0), range(10)))
    record_property("cold_start_round_trip_s", round(time.monotonic() - sent, 1))
    assert [why for ok, why in answers if not ok] == [], "a request held at zero was lost"
    assert stack.metric(gateway, 9090, "sluice_gateway_hold_seconds_count") - holds == 10
    held_ms = sorted(line["held_ms"] for line in stack.access_log().values() if line.get("held_ms"))[-10:]
    record_property("hold_s_p50", round(held_ms[4] / 1000, 1))
    record_property("hold_s_max", round(held_ms[-1] / 1000, 1))
    scaled = [e["message"] for e in stack.events("smollm2", "Scaled") if e["message"].startswith("0 → 1")]
    assert scaled and "requests held" in scaled[0], scaled
    cold = wait_for(lambda: (stack.get("im", "smollm2").get("status") or {}).get("lastColdStartSeconds"),
                    timeout=30, what="status.lastColdStartSeconds")
    record_property("last_cold_start_s", cold)
    assert 0 < cold < time.monotonic() - sent
    assert stack.events("smollm2", "ColdStart")

    # Idle again: back to zero. Then a request that arrives while the last replica drains is still answered.
    wait_for(lambda: _at_zero(stack), timeout=180, interval=1, what="the model to return to zero")
    assert _ask(client, 99, stream=False)[0], "one request brings it back"
    with stack.record_pods("sluice.dev/inference-model=smollm2") as pods:
        drained = wait_for(lambda: _first(pods, lambda p: (p["metadata"].get("annotations") or {})
                                          .get("sluice.dev/draining")), timeout=120, interval=0.1,
                           what="the last replica to be drained on its way to zero")
        # Sent once the gateway no longer routes to it: the request is held, not forwarded to the leaving replica.
        wait_for(lambda: not stack.gateway_endpoints("chat").get("smollm2"), timeout=30, interval=0.05,
                 what="the gateway to drop the draining replica")
        late = _ask(client, 100, stream=True)
    record_property("request_during_drain_s_after_mark", round(time.monotonic() - drained[0], 1))
    assert late[0], f"a request arriving while the last replica drained was lost: {late[1]}"
    # Either the drain was called off (the replica stays) or the scale to zero had happened (a cold start).
    record_property("drain_cancelled", bool(stack.events("smollm2", "ScaleDownCancelled")))


LORA_MODEL = "smollm2-lora"


ADAPTER_CLAIM = "adapters"


def _adapter(smollm2_dir, root, name: str, seed: int) -> dict:
    """A random PEFT adapter of the embedded model, built here with peft on the claim's volume, which the pod
    mounts read-only."""
    from fixtures.lora import build_lora

    build_lora(smollm2_dir, root / name, seed, rank=8)
    # Written here as root; the runtime reads them as its own user.
    for path in [root, root / name, *(root / name).rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"name": name, "source": f"pvc://{ADAPTER_CLAIM}/{name}", "rank": 8}


def _sql_route(v1: int, v2: int) -> str:
    return yaml.safe_dump({"apiVersion": "sluice.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "sql"},
                           "spec": {"model": "sql", "affinity": "none", "backends": [
                               {"inferenceModel": LORA_MODEL, "adapter": "sql-v1", "weight": v1},
                               {"inferenceModel": LORA_MODEL, "adapter": "sql-v2", "weight": v2}]}})


def _served(stack, model: str) -> bool:
    try:
        stack.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
        return True
    except openai.NotFoundError:
        return False


@pytest.fixture
def adapter_dir(stack):
    """The adapters' volume: a directory of the real node behind the namespace's claim `ADAPTER_CLAIM`."""
    root = stack.node.home / "volumes" / ADAPTER_CLAIM
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    stack.local_claim(ADAPTER_CLAIM, root, read_only=True)
    yield root
    stack.kubectl("delete", "pvc", ADAPTER_CLAIM, "--wait=false", check=False)
    shutil.rmtree(root, ignore_errors=True)


def test_7d_lora_adapters_served_added_without_a_restart_and_split_by_a_canary(stack, smollm2_dir, adapter_dir,
                                                                              record_property):
    root = adapter_dir
    (model,) = [d for d in stack.samples() if d["kind"] == "InferenceModel"]
    model["metadata"]["name"] = LORA_MODEL
    del model["spec"]["autoscaling"]
    model["spec"]["adapters"] = [_adapter(smollm2_dir, root, "sql-v1", 1), _adapter(smollm2_dir, root, "sql-v2", 2)]
    started = time.monotonic()
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    stack.kubectl("apply", "-f", "-", input=_sql_route(80, 20))
    _wait_ready(stack, LORA_MODEL)
    wait_for(lambda: _im_columns(stack).get(LORA_MODEL, {}).get("ADAPTERS") == "2", timeout=60,
             what="kubectl get im to show both adapters ready")
    # The route reaches the gateway with its mounted table, on the kubelet's next sync of the pod.
    wait_for(lambda: (route := stack.gateway_get("/admin/routes")["routes"].get("sql"))
             and all(b["endpoints"] for b in route["backends"]),
             timeout=30, what="the gateway to route both adapter versions")
    record_property("adapters_ready_s", round(time.monotonic() - started, 1))

    client = stack.client()
    assert {LORA_MODEL, "sql-v1", "sql-v2", "sql"} <= {m.id for m in client.models.list().data}
    answers = {}
    for name in (LORA_MODEL, "sql-v1", "sql-v2"):
        raw = client.chat.completions.with_raw_response.create(
            model=name, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0)
        assert raw.headers["x-sluice-backend"] == name
        answers[name] = raw.parse().choices[0].message.content
    assert len(set(answers.values())) == 3, answers  # each adapter changes the answer

    # A third adapter by `kubectl apply`: loaded on the running replica, no rollout, no restart.
    (pod,) = stack.model_pods(LORA_MODEL)
    deployment = stack.get("deployment", LORA_MODEL)
    model["spec"]["adapters"].append(_adapter(smollm2_dir, root, "tone", 3))
    applied = time.monotonic()
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    wait_for(lambda: _served(stack, "tone"), timeout=90, interval=0.5, what="the added adapter to be served")
    record_property("added_adapter_served_s", round(time.monotonic() - applied, 1))
    (same,) = stack.model_pods(LORA_MODEL)
    assert same["metadata"]["name"] == pod["metadata"]["name"]
    assert stack.container_id(same) == stack.container_id(pod), "the runtime was restarted"
    after = stack.get("deployment", LORA_MODEL)
    # (Its generation moves anyway: a Deployment counts changes of its annotations too.)
    assert after["spec"]["template"] == deployment["spec"]["template"], "the pod template changed"
    loaded = [{"pod": pod["metadata"]["name"], "state": "Loaded", "message": ""}]
    wait_for(lambda: {a["name"]: a["replicas"] for a in stack.get("im", LORA_MODEL)["status"]["adapters"]}
             == {"sql-v1": loaded, "sql-v2": loaded, "tone": loaded}, timeout=30, what="each adapter Loaded in status")
    wait_for(lambda: _im_columns(stack)[LORA_MODEL]["ADAPTERS"] == "3", timeout=30, what="kubectl get im to show 3")
    # The admin trail on the object: the load is an event naming the adapter and the replica.
    wait_for(lambda: f"adapter tone loaded on {pod['metadata']['name']}"
             in {e["message"] for e in stack.events(LORA_MODEL, "AdapterLoaded")}, timeout=30,
             what="an AdapterLoaded event for the added adapter")

    # A canary between two versions of an adapter splits as the weights say.
    load = stack.load("sql", concurrency=4, max_tokens=1).start()
    wait_for(lambda: len(load.snapshot()) >= 160, timeout=240, interval=0.5, what="160 answers at 80/20")
    results = load.stop()
    assert _failures(results) == []
    share = _share(results, "sql-v2")
    record_property("requests", len(results))
    record_property("sql_v2_share_at_80_20", round(share, 3))
    assert abs(share - 0.2) < 0.13, share  # binomial spread at 160 requests: about 3.2 points

    _record_peak(stack, pod, record_property, "runtime_with_adapters")
    stack.kubectl("delete", "mr", "sql")
    stack.kubectl("delete", "im", LORA_MODEL, "--wait=true", "--timeout=60s")


def _record_peak(stack, pod: dict, record_property, name: str) -> None:
    """A running container's peak memory since it started (cgroup accounting) against its limit."""
    seen = memory_peak(stack.cluster, pod)
    record_property(f"{name}_peak_memory", f"{seen['peak'] / 2**20:.0f} MiB of {seen['limit'] / 2**20:.0f}")
    assert seen["peak"] < seen["limit"], (name, seen)


def test_7e_the_release_ran_within_its_limits_and_no_container_was_oom_killed(stack, record_property):
    for component in ("operator", "gateway"):
        (pod,) = stack.pods(f"app.kubernetes.io/component={component}")
        _record_peak(stack, pod, record_property, component)
        assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0], component
    # The kubelet's record of every container that ended: a crash the suite made (SIGKILL), never the kernel's
    # OOM killer.
    events = json.loads(stack.kubectl("get", "events", "-o", "json").stdout)["items"]
    assert not [e for e in events if "OOM" in e["reason"] or "OOMKilled" in e.get("message", "")], "an OOM kill"


@pytest.mark.e2e_always
def test_8_delete_and_uninstall_leave_nothing_behind(stack, record_property):
    started = time.monotonic()
    stack.kubectl("delete", "-k", str(OVERLAY), "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    # What a scenario that failed half-way left (a canary, its route) goes the same way.
    stack.kubectl("delete", "inferencemodels,modelroutes", "--all", "--wait=true", "--timeout=120s", timeout=150)
    wait_for(lambda: not stack.model_pods("smollm2"), timeout=90, what="the runtime pods to go")
    wait_for(lambda: stack.get("configmap", ROUTING_TABLE) is None, timeout=30, what="the routing table to go")
    stack.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")
    # The storage the platform team gave the namespace, once no pod holds it.
    stack.kubectl("delete", "pvc", "--all", "--wait=true", "--timeout=60s", timeout=90)
    record_property("teardown_s", round(time.monotonic() - started, 1))

    kinds = stack.cluster.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout.split()
    # What every namespace has; Events are history, expired by the API server's TTL.
    expected = {("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")}

    def left():
        items = json.loads(stack.kubectl("get", ",".join(kinds), "-o", "json", "--ignore-not-found").stdout
                           or '{"items": []}')["items"]
        return [f"{i['kind']}/{i['metadata']['name']}" for i in items
                if i["kind"] != "Event" and (i["kind"], i["metadata"]["name"]) not in expected]
    wait_for(lambda: not left(), timeout=60, what="the namespace to be empty")
    for kind in ("clusterrole", "clusterrolebinding"):
        assert stack.cluster.kubectl("get", kind, f"{RELEASE}-operator", check=False).returncode != 0, kind
    # Nothing of the namespace is left on the node: no container, no pod sandbox.
    in_namespace = f'labels."io.kubernetes.pod.namespace"=={NAMESPACE}'
    wait_for(lambda: not stack.node.ctr("containers", "ls", "-q", in_namespace).stdout.split(), timeout=60,
             what="every container of the namespace to be gone")
