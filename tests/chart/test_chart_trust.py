"""What the chart lets the operator write, and the bundled Redis's password: rendered, and against the real API
server (RBAC `auth can-i`, the ValidatingAdmissionPolicy refusing an impersonated write)."""
from __future__ import annotations

import base64
import json
import uuid

import pytest
import yaml
from chart.helm_tool import CHART, Helm, by_kind, one, pod_spec

from fixtures.cluster import wait_for

pytestmark = pytest.mark.integration

MANAGED = {"app.kubernetes.io/managed-by": "sluice-operator"}


def _args(objects: list[dict], component: str) -> list[str]:
    return pod_spec(one(objects, "Deployment", f"-{component}"))["containers"][0]["args"]


def _write_policy(objects: list[dict]) -> list[dict]:
    return [o for o in by_kind(objects, "ValidatingAdmissionPolicy") if o["metadata"]["name"].endswith("-writes")]


def test_the_managed_label_is_the_operators():
    from sluice_operator.builders.names import managed_labels

    assert managed_labels().items() >= MANAGED.items()


def test_the_default_install_serves_its_own_namespace_only(helm):
    objects = helm.template(namespace="models")
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    assert not _write_policy(objects) and not by_kind(objects, "ClusterKopfPeering")
    served = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "sluice-operator"]
    assert [r["metadata"]["namespace"] for r in served] == ["models"]
    assert [a for a in _args(objects, "operator") if a.startswith("--namespace")] == ["--namespace=models"]
    assert one(objects, "KopfPeering")["metadata"]["namespace"] == "models"


def test_cluster_wide_brings_the_write_policy(helm):
    objects = helm.template("--set", "rbac.clusterWide=true", namespace="models")
    assert one(objects, "ClusterRole") and not [a for a in _args(objects, "operator") if a.startswith("--namespace")]
    policy = one(objects, "ValidatingAdmissionPolicy", "-operator-writes")
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(
        '"system:serviceaccount:models:sluice-operator"')
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "-operator-writes")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    bare = helm.template("--set", "rbac.clusterWide=true", "--set", "rbac.admissionPolicy=false")
    assert not _write_policy(bare) and one(bare, "ClusterRole")


@pytest.mark.parametrize("args, message", [
    (["--set", "rbac.clusterWide=true", "--set", "operator.watchNamespaces={a}"],
     "leave operator.watchNamespaces empty"),
    (["--set", "rbac.clusterWide=yes"], "/rbac/clusterWide"),
    (["--set", "rbac.everything=true"], "everything"),
    (["--set", "redis.tls.caSecret=ca", "--set", "redis.url=redis://r:6379/0"], "needs a rediss:// redis.url"),
    (["--set", "redis.passwordSecret.name=Not_A_Name", "--set", "redis.url=redis://r:6379/0"],
     "/redis/passwordSecret/name"),
    (["--set", "networkPolicy.monitoringPodSelector.app=1"], "/networkPolicy/monitoringPodSelector"),
])
def test_contradictions_and_typos_are_refused(helm, args, message):
    result = helm.run("template", "sluice", str(CHART), *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_the_bundled_redis_asks_for_a_generated_password_the_gateway_has(helm, tmp_path):
    from sluice_gateway.config import load_config

    objects = helm.template()
    secret = one(objects, "Secret", "-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert len(password) >= 32
    assert base64.b64decode(secret["data"]["redis.conf"]).decode() == f"requirepass {password}\n"
    redis = pod_spec(one(objects, "StatefulSet", "-redis"))
    args = redis["containers"][0]["args"]
    assert args[0] == "/etc/redis/redis.conf" and "--protected-mode" not in args and password not in json.dumps(redis)
    gateway_secret = one(objects, "Secret", "-gateway")
    (tmp_path / "gateway.yaml").write_text(gateway_secret["stringData"]["gateway.yaml"])
    settings = load_config(tmp_path / "gateway.yaml").redis
    gateway = pod_spec(one(objects, "Deployment", "-gateway"))
    mount = next(m for m in gateway["containers"][0]["volumeMounts"] if m["name"] == "redis-password")
    volume = next(v for v in gateway["volumes"] if v["name"] == "redis-password")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert settings.password_file == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    # Two renders, two passwords: nothing fixed ships in the chart (an upgrade keeps the live one, by lookup).
    assert base64.b64decode(one(helm.template(), "Secret", "-redis")["data"]["password"]).decode() != password


def test_an_external_redis_takes_a_password_user_and_ca(helm, tmp_path):
    from sluice_gateway.config import load_config

    objects = helm.template("--set", "redis.url=rediss://cache.example:6380/1",
                            "--set", "redis.passwordSecret.name=cache", "--set", "redis.passwordSecret.key=secret",
                            "--set", "redis.username=sluice",
                            "--set", "redis.tls.caSecret=cache-ca")
    assert not [o for o in objects if o["metadata"]["name"] == "sluice-redis"]
    (tmp_path / "gateway.yaml").write_text(one(objects, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    settings = load_config(tmp_path / "gateway.yaml").redis
    gateway = pod_spec(one(objects, "Deployment", "-gateway"))
    mounts = {m["name"]: m["mountPath"] for m in gateway["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v["secret"] for v in gateway["volumes"] if "secret" in v}
    assert volumes["redis-password"]["secretName"] == "cache" and volumes["redis-ca"]["secretName"] == "cache-ca"
    assert settings.password_file == f"{mounts['redis-password']}/secret"
    assert settings.tls_ca_file == f"{mounts['redis-ca']}/ca.crt" and settings.username == "sluice"
    plain = helm.template("--set", "redis.url=redis://cache.example:6379/0")
    (tmp_path / "plain.yaml").write_text(one(plain, "Secret", "-gateway")["stringData"]["gateway.yaml"])
    assert load_config(tmp_path / "plain.yaml").redis.password_file is None
    assert not [v for v in pod_spec(one(plain, "Deployment", "-gateway"))["volumes"] if v["name"].startswith("redis")]


def test_the_scraper_is_matched_by_namespace_and_pod_labels(helm):
    objects = helm.template()
    for name, port in (("-gateway", "metrics"), ("-operator", 8081)):
        policy = one(objects, "NetworkPolicy", name)
        (rule,) = [rule for rule in policy["spec"]["ingress"]
                   if rule.get("from") and "namespaceSelector" in rule["from"][0]
                   and rule["from"][0]["namespaceSelector"].get("matchLabels")]
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}], (name, rule)
        assert [p["port"] for p in rule["ports"]] == [port], (name, rule)


# -- against the API server ------------------------------------------------------------------------------------

def _can(cluster, account: str, *request: str) -> bool:
    result = cluster.kubectl("auth", "can-i", *request, f"--as={account}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def _rbac(helm: Helm, release: str, namespace: str, *values: str) -> str:
    return helm.run("template", release, str(CHART), "--namespace", namespace, "--show-only",
                    "templates/operator-rbac.yaml", *values).stdout


@pytest.fixture
def installed_rbac(kube_cluster):
    """Applies the chart's operator RBAC (and policy) for a fresh release; removes it after."""
    applied = []

    def apply(*values: str) -> tuple[str, str]:
        release = f"trust-{uuid.uuid4().hex[:6]}"
        kube_cluster.kubectl("create", "namespace", release)
        manifest = _rbac(Helm(kube_cluster.bin_dir / "helm"), release, release, *values)
        kube_cluster.kubectl("apply", "-f", "-", input=manifest)
        applied.append((release, manifest))
        return release, f"system:serviceaccount:{release}:{release}-sluice-operator"

    yield apply
    for release, manifest in applied:
        kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)
        kube_cluster.kubectl("delete", "namespace", release, "--wait=false", check=False)


def test_the_default_operator_may_write_nowhere_but_its_namespace(kube_cluster, installed_rbac):
    home, account = installed_rbac()
    for request in (("create", "deployments"), ("patch", "pods"), ("create", "services")):
        assert _can(kube_cluster, account, *request, "-n", home), request
        for elsewhere in ("kube-system", "default"):
            assert not _can(kube_cluster, account, *request, "-n", elsewhere), (elsewhere, request)
    assert not _can(kube_cluster, account, "list", "namespaces")


def _deployment(name: str, labels: dict[str, str] | None = None) -> dict:
    selector = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {**selector, **(labels or {})}},
            "spec": {"selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": selector},
                                  "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]}}}}


def test_cluster_wide_the_api_server_refuses_the_operators_writes_to_what_is_not_its_own(
        kube_cluster, installed_rbac, kube_namespace):
    home, account = installed_rbac("--set", "rbac.clusterWide=true")

    def write(namespace: str, doc: dict, verb: str = "apply"):
        return kube_cluster.kubectl("-n", namespace, verb, "--dry-run=server", f"--as={account}", "-f", "-",
                                    input=yaml.safe_dump(doc), check=False)

    # RBAC alone would allow it: the ClusterRole grants Deployments everywhere.
    assert _can(kube_cluster, account, "create", "deployments", "-n", "kube-system")
    refused = wait_for(lambda: (r := write("kube-system", _deployment("takeover"))).returncode != 0 and r,
                       what="the policy to refuse the unlabelled Deployment")
    assert "writes only objects labelled app.kubernetes.io/managed-by=sluice-operator" in refused.stderr
    assert "deployments kube-system/takeover" in refused.stderr
    # Its own kind of object, labelled as it labels them, is let through (here and in kube-system alike: RBAC,
    # not this policy, is what keeps a cluster-wide operator's writes to the namespaces it serves).
    assert write(kube_namespace, _deployment("model", MANAGED)).returncode == 0

    # An object someone else made cannot be taken over by labelling it in the same write.
    table = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sluice-routing-table"},
             "data": {"routing-table.json": "{}"}}
    kube_cluster.kubectl("-n", kube_namespace, "apply", "-f", "-", input=yaml.safe_dump(table))
    taken = {**table, "metadata": {**table["metadata"], "labels": MANAGED}}
    refused = kube_cluster.kubectl("-n", kube_namespace, "patch", "configmap", "sluice-routing-table",
                                   "--dry-run=server", f"--as={account}", "--type=merge",
                                   "-p", json.dumps({"metadata": {"labels": MANAGED}}), check=False)
    assert refused.returncode != 0 and "is not one" in refused.stderr, refused.stderr
    assert write(kube_namespace, taken).returncode != 0
    # Nor removed: a delete is judged by what is there.
    deleted = kube_cluster.kubectl("-n", kube_namespace, "delete", "configmap", "sluice-routing-table",
                                   "--dry-run=server", f"--as={account}", check=False)
    assert deleted.returncode != 0 and "is not one" in deleted.stderr, deleted.stderr
    # The chart's own credential Secret (Helm's labels) is the one unlabelled object it fills.
    credential = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{home}-sluice-runtime-credential"},
                  "data": {"api-key": ""}}
    kube_cluster.kubectl("-n", home, "apply", "-f", "-", input=yaml.safe_dump(credential))
    filled = kube_cluster.kubectl("-n", home, "patch", "secret", f"{home}-sluice-runtime-credential",
                                  "--dry-run=server", f"--as={account}", "--type=merge",
                                  "-p", json.dumps({"data": {"api-key": "c2VjcmV0"}}), check=False)
    assert filled.returncode == 0, filled.stderr
