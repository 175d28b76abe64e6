"""helm lint and helm template of charts/sluice: what the rendered objects promise an operator of the cluster."""
from __future__ import annotations

import json

import pytest
import yaml
from chart.helm_tool import CHART, FULL_VALUES, REPO, by_kind, one, pod_spec

pytestmark = pytest.mark.integration
# The Prometheus pods' labels the chart's networkPolicy.monitoringPodSelector names by default.
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}


@pytest.fixture(scope="module")
def default_objects(helm) -> list[dict]:
    return helm.template()


@pytest.fixture(scope="module")
def full_objects(helm) -> list[dict]:
    return helm.template("-f", str(FULL_VALUES))


@pytest.mark.parametrize("values", [[], ["-f", str(FULL_VALUES)]], ids=["default", "full"])
def test_lint_is_clean(helm, values):
    result = helm.run("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in result.stdout


def test_default_install_runs_operator_gateway_and_their_redis(default_objects):
    kinds = sorted({obj["kind"] for obj in default_objects})
    assert kinds == ["Deployment", "KopfPeering", "NetworkPolicy", "Role", "RoleBinding",
                     "Secret", "Service", "ServiceAccount", "StatefulSet", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding"]
    assert {d["metadata"]["name"] for d in by_kind(default_objects, "Deployment")} == {
        "sluice-operator", "sluice-gateway"}


def test_full_values_render_every_optional_object(full_objects):
    kinds = {obj["kind"] for obj in full_objects}
    assert {"HorizontalPodAutoscaler", "StatefulSet", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    dashboard = one(full_objects, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["sluice-overview.json"])["uid"] == "sluice-overview"
    assert "replicas" not in one(full_objects, "Deployment", "-gateway")["spec"], "the HPA owns the replica count"


@pytest.mark.parametrize("which", ["default", "full"])
def test_every_pod_passes_the_restricted_profile(which, default_objects, full_objects):
    objects = default_objects if which == "default" else full_objects
    workloads = by_kind(objects, "Deployment") + by_kind(objects, "StatefulSet")
    assert workloads
    for workload in workloads:
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["capabilities"]["drop"] == ["ALL"], container["name"]
            assert "limits" in container["resources"], container["name"]


def _rules(*sets: str, release: str = "sluice") -> list[dict]:
    source = yaml.safe_load((REPO / "operator/sluice_operator/rbac/rules.yaml").read_text())
    text = yaml.safe_dump([rule for name in sets for rule in source[name]])
    return yaml.safe_load(text.replace("sluice-runtime", f"{release}-runtime"))


def test_operator_rbac_all_namespaces_is_one_cluster_role(helm, default_objects):
    cluster_wide = helm.template("--set", "rbac.clusterWide=true")
    assert one(cluster_wide, "ClusterRole")["rules"] == _rules("served", "cluster")
    binding = one(cluster_wide, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sluice-operator", "namespace": "sluice"}]
    role = one(default_objects, "Role", "-release")
    assert role["metadata"]["namespace"] == "sluice" and role["rules"] == _rules("release")
    assert pod_spec(one(default_objects, "Deployment", "-operator"))["serviceAccountName"] == "sluice-operator"
    assert pod_spec(one(default_objects, "Deployment", "-gateway"))["automountServiceAccountToken"] is False


def test_operator_rbac_with_watch_namespaces_is_namespaced_only(helm, full_objects):
    """A Role and RoleBinding per watched namespace, nothing cluster-wide (kopf scans no namespaces or CRDs)."""
    assert not by_kind(full_objects, "ClusterRole") and not by_kind(full_objects, "ClusterRoleBinding")
    served = {r["metadata"]["namespace"]: r for r in by_kind(full_objects, "Role") if r["metadata"]["name"] == "sluice-operator"}
    assert sorted(served) == ["demo", "team-a"]
    assert all(role["rules"] == _rules("served") for role in served.values())
    bindings = [b for b in by_kind(full_objects, "RoleBinding") if b["metadata"]["name"] == "sluice-operator"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["demo", "team-a"]
    assert all(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sluice-operator"}
               and b["subjects"] == [{"kind": "ServiceAccount", "name": "sluice-operator", "namespace": "sluice"}]
               for b in bindings)
    assert one(full_objects, "Role", "-release")["metadata"]["namespace"] == "sluice"
    # Another release's names: its own routing table stays shared, its credential and policy are its own.
    other = helm.template("--set", "fullnameOverride=prod", "--set", "rbac.clusterWide=true")
    names = {tuple(r.get("resourceNames", [])) for r in one(other, "ClusterRole")["rules"]}
    assert {("sluice-routing-table",), ("prod-runtime-credential",), ("prod-runtime",)} <= names


def test_operator_rules_grant_nothing_broad():
    """No verb on a kind it does not own; ConfigMaps and Secrets written only by name, Secrets read by name only
    (a model's tokenSecret, whose opt-in label is checked); no delete outside what it owns (by name, or a model's
    own InferencePool)."""
    rules = _rules("served", "release", "cluster")
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        if {"configmaps", "secrets", "networkpolicies"} & set(rule["resources"]):
            assert rule.get("resourceNames") or (rule["resources"] == ["secrets"] and rule["verbs"] == ["get"]), rule
        assert "deletecollection" not in rule["verbs"], rule
        if "delete" in rule["verbs"]:
            # A model's InferencePool is named like the model (unknown in advance); the operator deletes only a
            # pool whose controller reference is that model, when the model stops asking for one.
            assert rule.get("resourceNames") or rule["resources"] == ["inferencepools"], rule
    pods = [r for r in rules if "pods" in r["resources"]]
    # Runtime pods where it serves; in the release's namespace only `list`, of the gateway pods (scale to zero).
    assert [sorted(r["verbs"]) for r in pods] == [["list", "patch", "watch"], ["list"]]


def test_gateway_reads_the_table_the_operator_writes(default_objects):
    from sluice_operator.builders import ROUTING_TABLE, ROUTING_TABLE_KEY

    # The operator alone writes the table: a chart copy would be put back over it by every `helm upgrade`.
    assert not [cm for cm in by_kind(default_objects, "ConfigMap") if cm["metadata"]["name"] == ROUTING_TABLE]
    spec = pod_spec(one(default_objects, "Deployment", "-gateway"))
    volume = next(v for v in spec["volumes"] if v["name"] == "routes")
    assert volume["configMap"] == {"name": ROUTING_TABLE, "optional": True}
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "routes")
    assert f"--routes={mount['mountPath']}/{ROUTING_TABLE_KEY}" in spec["containers"][0]["args"]


def test_rendered_gateway_config_loads_in_the_gateway(full_objects, tmp_path):
    from sluice_gateway.config import load_config

    secret = one(full_objects, "Secret", "-gateway")
    (tmp_path / "gateway.yaml").write_text(secret["stringData"]["gateway.yaml"])
    config = load_config(tmp_path / "gateway.yaml")
    assert [tenant.name for tenant in config.tenants] == ["demo", "batch"]
    assert config.tenants[0].limits.requests_per_minute == 600
    assert config.redis is not None and config.redis.url == "redis://sluice-redis:6379/0"
    assert config.redis.on_failure == "closed"
    assert config.timeouts.first_byte_s == 60 and config.routing.max_attempts == 2
    assert one(full_objects, "Service", "-redis")["metadata"]["name"] == "sluice-redis"


def test_existing_secret_replaces_the_rendered_one(helm):
    objects = helm.template("--set", "gateway.config.existingSecret=my-gateway-config")
    assert not [s for s in by_kind(objects, "Secret") if s["metadata"]["name"] == "sluice-gateway"]
    volume = next(v for v in pod_spec(one(objects, "Deployment", "-gateway"))["volumes"] if v["name"] == "config")
    assert volume["secret"]["secretName"] == "my-gateway-config"


def test_operator_replicas_elect_a_leader(helm, full_objects):
    operator = one(full_objects, "Deployment", "-operator")
    args = pod_spec(operator)["containers"][0]["args"]
    assert operator["spec"]["replicas"] == 2
    assert "--peering=sluice-operator" in args and "--standalone" not in args
    assert "--helm-release=sluice" in args, "the peering it creates first is the release's to adopt"
    assert {"--namespace=demo", "--namespace=team-a"} <= set(args)
    assert one(full_objects, "PodDisruptionBudget", "-operator")["spec"]["minAvailable"] == 1
    refused = helm.run("template", "sluice", str(CHART), "--set", "operator.replicaCount=2",
                       "--set", "operator.leaderElection.enabled=false", check=False)
    assert refused.returncode != 0 and "needs operator.leaderElection.enabled" in refused.stderr


def test_engine_images_and_inference_pools_reach_the_operator(helm):
    objects = helm.template("--set", "operator.engineImages.vllm=registry.local/vllm-openai:v0.11.0",
                            "--set", "inferencePool.enabled=true", "--set", "inferencePool.endpointPicker.name=epp",
                            "--set", "inferencePool.endpointPicker.failureMode=FailOpen")
    args = pod_spec(one(objects, "Deployment", "-operator"))["containers"][0]["args"]
    assert {"--engine-image=vllm=registry.local/vllm-openai:v0.11.0", "--inference-pools",
            "--endpoint-picker=epp:9002", "--endpoint-picker-failure-mode=FailOpen"} <= set(args)
    plain = pod_spec(one(helm.template(), "Deployment", "-operator"))["containers"][0]["args"]
    assert not [a for a in plain if a.startswith(("--engine-image", "--inference-pools", "--endpoint-picker"))]
    for bad, where in ((["--set", "operator.engineImages.tgi=x"], "additional properties 'tgi' not allowed"),
                       (["--set", "inferencePool.endpointPicker.name=EPP"], "/inferencePool/endpointPicker/name"),
                       (["--set", "inferencePool.endpointPicker.failureMode=Open"],
                        "/inferencePool/endpointPicker/failureMode")):
        refused = helm.run("template", "sluice", str(CHART), *bad, check=False)
        assert refused.returncode != 0 and where in refused.stderr, refused.stderr


def test_allowed_image_prefixes_and_the_guard_image_reach_the_operator_and_the_admission_policy(helm):
    from sluice_operator.cli import _parser, _policy

    objects = helm.template("--set", "image.tag=9.9.9")
    args = pod_spec(one(objects, "Deployment", "-operator"))["containers"][0]["args"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["operator"]["allowedImagePrefixes"]
    assert [a for a in args if a.startswith("--allowed-image-prefix=")] == [f"--allowed-image-prefix={p}" for p in values]
    assert "--guard-image=ghcr.io/sluice-dev/sluice-operator:9.9.9" in args
    # The operator's own parser takes what the chart passes.
    policy = _policy(_parser().parse_args(["run", *[a for a in args if a.startswith(("--allowed", "--guard"))]]))
    assert policy.image_prefixes == tuple(values) and policy.guard_image.endswith(":9.9.9")
    vap = one(objects, "ValidatingAdmissionPolicy", "-model-images")
    prefixes = next(v for v in vap["spec"]["variables"] if v["name"] == "prefixes")["expression"]
    assert json.loads(prefixes) == values
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "-model-images")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"]
    for bad in (["--set", "operator.allowedImagePrefixes=null"], ["--set-json", "operator.allowedImagePrefixes=[]"],
                ["--set-json", 'operator.allowedImagePrefixes=["vllm/vllm-openai"]'],
                ["--set-json", "operator.allowedImagePrefixes=[\"ghcr.io/x']\"]"]):
        refused = helm.run("template", "sluice", str(CHART), *bad, check=False)
        assert refused.returncode != 0 and "allowedImagePrefixes" in refused.stderr, (bad, refused.stderr)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "gateway.replicaCount=two"], "/gateway/replicaCount"),
        (["--set-json", 'gateway.config.tenants=[{"name":"a","keys":[{"id":"k","sha256":"sk-plain"}]}]'],
         "/gateway/config/tenants/0/keys/0/sha256"),
        (["--set", "gateway.replicas=3"], "additional properties 'replicas' not allowed"),
        (["--set", "redis.onFailure=sometimes"], "/redis/onFailure"),
        (["--set", "monitoring.prometheusRule.kvCacheUsage=90"], "/monitoring/prometheusRule/kvCacheUsage"),
        (["--set", "gateway.metricsPort=8080"], "/gateway/metricsPort"),
    ],
    ids=["type", "plain-key", "typo", "enum", "range", "metrics-on-the-api-port"],
)
def test_bad_values_fail_at_install_time(helm, args, message):
    result = helm.run("template", "sluice", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def _pod(objects: list[dict], suffix: str, namespace: str = "sluice"):
    from fixtures.network_policy import Pod

    template = one(objects, "Deployment", suffix)["spec"]["template"]
    ports = {port["name"]: port["containerPort"] for port in template["spec"]["containers"][0]["ports"]}
    return Pod(namespace, template["metadata"]["labels"], ports=ports)


def _operator_release(objects: list[dict]):
    """The Release the operator makes of the flags the chart gives it."""
    from sluice_operator.cli import _parser, _release

    args = pod_spec(one(objects, "Deployment", "-operator"))["containers"][0]["args"]
    return _release(_parser().parse_args(["run", *args]))


@pytest.mark.parametrize("which", ["default", "full"])
def test_network_policies_confine_each_component(which, default_objects, full_objects):
    from fixtures.network_policy import Pod, admits

    objects = default_objects if which == "default" else full_objects
    policies = by_kind(objects, "NetworkPolicy")
    gateway, operator = _pod(objects, "-gateway"), _pod(objects, "-operator")
    monitoring, stranger = Pod("monitoring", PROMETHEUS), Pod("team-b", dict(gateway.labels))
    assert not admits(policies, Pod("monitoring", {}), gateway, 9090), "any pod of the namespace is not Prometheus"
    # /metrics of the gateway (tenant names, backend addresses): its own port, Prometheus only.
    assert gateway.ports["metrics"] == 9090
    assert admits(policies, monitoring, gateway, 9090) and not admits(policies, stranger, gateway, 9090)
    assert not admits(policies, Pod("sluice", {}), gateway, 9090)
    if which == "full":  # clients only from the ingress controller's namespace
        assert admits(policies, Pod("ingress-nginx", {}), gateway, 8080)
        assert not admits(policies, monitoring, gateway, 8080) and not admits(policies, stranger, gateway, 8080)
    else:
        assert admits(policies, stranger, gateway, 8080), "clients from anywhere by default"
    assert admits(policies, monitoring, operator, 8081) and not admits(policies, stranger, operator, 8081)
    egress = one(objects, "NetworkPolicy", "-gateway")["spec"]["egress"][0]
    assert egress["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "sluice-runtime"
    assert egress["ports"] == [{"port": 8000, "protocol": "TCP"}]
    if which == "full":
        assert one(objects, "NetworkPolicy", "-operator")["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}]
        assert one(objects, "ServiceMonitor", "-gateway")["spec"]["endpoints"][0]["port"] == "metrics"
        assert one(objects, "PodMonitor", "-operator")["spec"]["podMetricsEndpoints"][0]["port"] == "health"


@pytest.mark.parametrize("which", ["default", "full"])
def test_the_operator_reads_each_models_demand_from_the_gateway_pods(which, default_objects, full_objects):
    """Scale to zero: the operator finds the gateway's pods by their labels and may reach their metrics port;
    nothing else in the namespace may, and the gateway's cold-start settings render into its config."""
    from fixtures.network_policy import Pod, admits
    from sluice_operator.cli import _gateway, _parser

    objects = default_objects if which == "default" else full_objects
    args = pod_spec(one(objects, "Deployment", "-operator"))["containers"][0]["args"]
    source = _gateway(_parser().parse_args(["run", *args]))
    gateway, operator = _pod(objects, "-gateway"), _pod(objects, "-operator")
    wanted = dict(pair.split("=") for pair in source.selector.split(","))
    assert wanted.items() <= gateway.labels.items() and not wanted.items() <= operator.labels.items()
    assert (source.namespace, source.port) == ("sluice", gateway.ports["metrics"])
    policies = by_kind(objects, "NetworkPolicy")
    assert admits(policies, operator, gateway, source.port)
    assert not admits(policies, Pod("team-b", dict(operator.labels)), gateway, source.port)
    egress = one(objects, "NetworkPolicy", "-operator")["spec"]["egress"]
    assert any(rule["ports"] == [{"port": source.port, "protocol": "TCP"}]
               and wanted.items() <= rule["to"][0]["podSelector"]["matchLabels"].items() for rule in egress)


def test_cold_start_settings_reach_the_gateway_and_bad_ones_are_refused(helm, tmp_path):
    from sluice_gateway.config import load_config

    objects = helm.template("--set-json", 'gateway.config.coldStart={"max_wait_s": 45, "max_held_per_model": 7}')
    (tmp_path / "gateway.yaml").write_text(one(objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    cold_start = load_config(tmp_path / "gateway.yaml").cold_start
    assert (cold_start.max_wait_s, cold_start.max_held_per_model, cold_start.keepalive_s) == (45, 7, 5)
    for bad in ('{"max_wait_s": 0}', '{"max_held_per_model": -1}', '{"max_wait": 10}', '{"keepalive_s": "5"}'):
        result = helm.run("template", "sluice", str(CHART), "--set-json", f"gateway.config.coldStart={bad}",
                          check=False)
        assert result.returncode != 0 and "coldStart" in result.stderr, bad


def test_the_audit_sink_reaches_the_gateway_and_a_file_or_typo_is_refused(helm, tmp_path):
    from sluice_gateway.config import load_config

    for values, sink in ((["--set", "gateway.config.audit.sink=stderr"], "stderr"),
                         # A bare `off` in a values file is YAML's false; it still means off.
                         (["--set-json", "gateway.config.audit={\"sink\": false}"], "off"), ([], "off")):
        objects = helm.template(*values)
        (tmp_path / "gateway.yaml").write_text(one(objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
        assert load_config(tmp_path / "gateway.yaml").audit.sink == sink, values
    # A file in the pod would be lost with it and shipped by nothing: the chart offers the streams only.
    for bad in ('{"sink": "/var/log/audit.jsonl"}', '{"sink": "stdout", "prompts": true}', '{"sink": 1}'):
        result = helm.run("template", "sluice", str(CHART), "--set-json", f"gateway.config.audit={bad}", check=False)
        assert result.returncode != 0 and "audit" in result.stderr, bad


@pytest.mark.parametrize("which", ["default", "full"])
def test_runtime_pods_admit_only_this_releases_gateway_and_operator(which, default_objects, full_objects):
    """Runtime pods live wherever InferenceModels are, so the operator writes their policy from the chart's flags:
    the chart's own gateway and operator pods get in, the same labels from another namespace do not."""
    from fixtures.network_policy import Pod, admits
    from sluice_operator.builders import build_deployment, build_runtime_network_policy
    from sluice_operator.builders.names import Owner
    from sluice_operator.crd import InferenceModelSpec

    objects = default_objects if which == "default" else full_objects
    assert not [p for p in by_kind(objects, "NetworkPolicy") if p["metadata"]["name"].endswith("-runtime")]
    release = _operator_release(objects)
    assert (release.name, release.namespace) == ("sluice", "sluice")
    owner = Owner("m", "team-a", "uid-1")
    runtime = Pod("team-a", build_deployment(owner, InferenceModelSpec.model_validate(
        {"model": {"source": "smollm2"}}))["spec"]["template"]["metadata"]["labels"])
    policy = build_runtime_network_policy(release, "team-a", [{"metadata": {"name": "m", "uid": "uid-1"}}])
    gateway, operator = _pod(objects, "-gateway"), _pod(objects, "-operator")
    assert admits([policy], gateway, runtime, 8000) and admits([policy], operator, runtime, 8000)
    assert admits([policy], Pod("monitoring", PROMETHEUS), runtime, 8000)
    assert not admits([policy], Pod("monitoring", {}), runtime, 8000)
    for forged in (gateway, operator):
        assert not admits([policy], Pod("team-a", forged.labels), runtime, 8000)
        assert not admits([policy], Pod("team-b", forged.labels), runtime, 8000)
    assert not admits([policy], Pod("sluice", {"app": "other"}), runtime, 8000)


def test_without_network_policies_the_operator_writes_none(helm):
    objects = helm.template("--set", "networkPolicy.enabled=false")
    assert not by_kind(objects, "NetworkPolicy")
    assert _operator_release(objects).peers is None


def test_extra_pod_labels_args_and_env_reach_both_pods(helm, full_objects, default_objects):
    clash = helm.template("--set", "operator.podLabels.app\\.kubernetes\\.io/component=other",
                          "--set", "gateway.podLabels.app\\.kubernetes\\.io/name=other")
    for suffix in ("-operator", "-gateway"):
        template = one(full_objects, "Deployment", suffix)["spec"]["template"]
        assert template["metadata"]["labels"]["team"] == "platform"
        container = template["spec"]["containers"][0]
        assert container["args"][-1] in ("--verbose", "--log-level=warning") and container["env"]
        assert "env" not in pod_spec(one(default_objects, "Deployment", suffix))["containers"][0]
        # Ours win: an extra label cannot detach the pods from their Deployment's selector.
        deployment = one(clash, "Deployment", suffix)
        assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_peering_object_belongs_to_the_release(helm, default_objects, full_objects):
    """The operator would create it too, but then nothing would delete it on `helm uninstall`."""
    (own,) = by_kind(default_objects, "KopfPeering")
    assert (own["metadata"]["name"], own["metadata"]["namespace"]) == ("sluice-operator", "sluice")
    (cluster_wide,) = by_kind(helm.template("--set", "rbac.clusterWide=true"), "ClusterKopfPeering")
    assert cluster_wide["metadata"]["name"] == "sluice-operator"
    assert sorted(p["metadata"]["namespace"] for p in by_kind(full_objects, "KopfPeering")) == ["demo", "team-a"]
    assert not by_kind(full_objects, "ClusterKopfPeering")
    standalone = helm.template("--set", "operator.leaderElection.enabled=false")
    assert not by_kind(standalone, "ClusterKopfPeering") and not by_kind(standalone, "KopfPeering")


def test_gateway_presents_the_runtime_credential_the_operator_fills(helm, default_objects, tmp_path):
    from sluice_contracts import runtime_credential
    from sluice_gateway.config import load_config

    name = runtime_credential.secret_name("sluice")
    shell = one(default_objects, "Secret", "-runtime-credential")
    assert shell["metadata"]["name"] == name and "data" not in shell and "stringData" not in shell, \
        "rendered empty: a helm upgrade must never overwrite the operator's credential"
    args = pod_spec(one(default_objects, "Deployment", "-operator"))["containers"][0]["args"]
    assert {"--release=sluice", "--release-namespace=sluice"} <= set(args)
    spec = pod_spec(one(default_objects, "Deployment", "-gateway"))
    volume = next(v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == name)
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == runtime_credential.MOUNT_DIR and "subPath" not in mount
    assert volume["secret"]["items"] == [{"key": runtime_credential.SECRET_KEY, "path": runtime_credential.SECRET_KEY}]
    (tmp_path / "gateway.yaml").write_text(one(default_objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    assert str(load_config(tmp_path / "gateway.yaml").upstream_credential_file) == runtime_credential.MOUNT_PATH

    # A gateway-only release next to models another release's operator serves mounts that release's copy.
    alone = helm.template("--set", "operator.enabled=false", "--set", "gateway.runtimeCredentialSecret=prod-runtime-credential")
    assert not [s for s in by_kind(alone, "Secret") if s["metadata"]["name"].endswith("-runtime-credential")]
    assert any(v.get("secret", {}).get("secretName") == "prod-runtime-credential"
               for v in pod_spec(one(alone, "Deployment", "-gateway"))["volumes"])


def test_the_default_gateway_keeps_its_counters_in_the_bundled_redis(default_objects, full_objects, tmp_path):
    """One gateway replica by default (its batch store is a SQLite file of its own); Redis is on all the same, so
    counters outlive the pod and replicas added later share them. No PodDisruptionBudget for one replica: it would
    block every node drain."""
    from sluice_gateway.config import load_config

    assert one(default_objects, "Deployment", "-gateway")["spec"]["replicas"] == 1
    assert not by_kind(default_objects, "PodDisruptionBudget")
    assert one(full_objects, "PodDisruptionBudget", "-gateway")["spec"]["minAvailable"] == 1
    redis = one(default_objects, "StatefulSet", "-redis")
    assert "volumeClaimTemplates" not in redis["spec"], "counters only: no volume to provision"
    assert "--save" in (args := pod_spec(redis)["containers"][0]["args"]) and args[args.index("--save") + 1] == ""
    (tmp_path / "gateway.yaml").write_text(one(default_objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    assert load_config(tmp_path / "gateway.yaml").redis.url == "redis://sluice-redis:6379/0"


@pytest.mark.parametrize("args", [
    ["--set", "redis.bundled.enabled=false", "--set", "gateway.replicaCount=2"],
    ["--set", "redis.bundled.enabled=false", "--set", "gateway.replicaCount=3"],
    ["--set", "redis.bundled.enabled=false", "--set", "gateway.replicaCount=1", "--set", "gateway.autoscaling.enabled=true"],
    ["--set", "redis.bundled.enabled=false", "--set", "redis.url=", "--set", "gateway.replicaCount=2"],
], ids=["two-replicas", "three-replicas", "autoscaled", "empty-url"])
def test_several_gateway_replicas_without_redis_are_refused(helm, args):
    result = helm.run("template", "sluice", str(CHART), *args, check=False)
    assert result.returncode != 0 and "/redis" in result.stderr, result.stderr


@pytest.mark.parametrize("args, redis_objects, url", [
    (["--set", "gateway.replicaCount=1", "--set", "redis.bundled.enabled=false"], 0, None),
    (["--set", "gateway.autoscaling.enabled=true", "--set", "gateway.autoscaling.minReplicas=1",
      "--set", "gateway.autoscaling.maxReplicas=1", "--set", "redis.bundled.enabled=false"], 0, None),
    (["--set", "redis.url=redis://shared:6379/2"], 0, "redis://shared:6379/2"),
    (["--set", "redis.bundled.enabled=false", "--set", "redis.url=redis://shared:6379/2"], 0, "redis://shared:6379/2"),
], ids=["one-replica", "autoscaled-to-one", "own-redis-wins-over-bundled", "own-redis"])
def test_one_replica_or_an_own_redis_is_accepted(helm, args, redis_objects, url, tmp_path):
    from sluice_gateway.config import load_config

    objects = helm.template(*args)
    assert len([o for o in objects if o["metadata"]["name"] == "sluice-redis"]) == redis_objects
    (tmp_path / "gateway.yaml").write_text(one(objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    config = load_config(tmp_path / "gateway.yaml")
    assert (config.redis.url if config.redis else None) == url


def test_gateway_config_reaches_the_running_gateway(default_objects):
    """A whole Secret volume (the kubelet updates it in place; a subPath mount never would) and no checksum of the
    whole config forcing restarts: the gateway reloads the file (only its start-only part is hashed, see
    test_chart_restart_checksum.py)."""
    deployment = one(default_objects, "Deployment", "-gateway")
    spec = pod_spec(deployment)
    assert all("subPath" not in m for m in spec["containers"][0]["volumeMounts"])
    config = next(v for v in spec["volumes"] if v["name"] == "config")
    assert config["secret"]["secretName"] == "sluice-gateway"
    assert "--config=/etc/sluice/gateway/gateway.yaml" in spec["containers"][0]["args"]
    annotations = deployment["spec"]["template"]["metadata"].get("annotations") or {}
    assert [k for k in annotations if k.startswith("checksum/")] == ["checksum/gateway-start-config"]


def test_gateway_pods_get_time_to_drain_what_they_serve(helm, tmp_path):
    """The kubelet's SIGKILL must not come before the gateway has finished the requests it drains."""
    from sluice_gateway.config import load_config

    objects = helm.template("--set", "gateway.shutdown.readyGraceSeconds=7", "--set", "gateway.shutdown.drainSeconds=600")
    (tmp_path / "gateway.yaml").write_text(one(objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    config = load_config(tmp_path / "gateway.yaml")
    assert (config.shutdown.ready_grace_s, config.drain_s) == (7, 600)
    assert pod_spec(one(objects, "Deployment", "-gateway"))["terminationGracePeriodSeconds"] == 7 + 600 + 10
