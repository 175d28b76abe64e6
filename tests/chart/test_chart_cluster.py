"""Server-side dry run of everything the chart renders and every manifest in config/, on the local control
plane with Sluice's CRDs and the Prometheus Operator's and Argo CD's CRDs installed: the API server's own
validation (schemas, CRD structural schemas, defaulting) catches a typo in any manifest."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from chart.helm_tool import CHART, FULL_VALUES, REPO, Helm

pytestmark = pytest.mark.integration

# Upstream CRDs, pinned, from the Go module proxy (neither project publishes them on PyPI).
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "v0.85.0", "example/prometheus-operator-crd",
                       ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_podmonitors.yaml",
                        "monitoring.coreos.com_prometheusrules.yaml"))
ARGO_CD = ("github.com/argoproj/argo-cd/v3", "v3.1.8", "manifests/crds", ("application-crd.yaml",))


def _module_files(module: str, version: str, folder: str, names: tuple[str, ...]) -> list[Path]:
    from localcluster.binaries import go_binary

    go = go_binary()
    assert go, "the Go toolchain builds the local control plane, so it is present wherever kube_cluster runs"
    with tempfile.TemporaryDirectory() as empty:
        result = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"], cwd=empty,
                                capture_output=True, text=True, timeout=300, env={**os.environ, "GOFLAGS": "-mod=mod"})
    assert result.returncode == 0, f"go mod download {module}@{version}: {result.stdout}{result.stderr}"
    root = Path(json.loads(result.stdout)["Dir"]) / folder
    return [root / name for name in names]


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    crds = sorted((CHART / "crds").glob("*.yaml")) + _module_files(*PROMETHEUS_OPERATOR) + _module_files(*ARGO_CD)
    for crd in crds:
        kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    names = [yaml.safe_load(crd.read_text())["metadata"]["name"] for crd in crds]
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names])
    # Namespaces the manifests name themselves; created like any platform would have them.
    for namespace in ("monitoring", "argocd", "demo", "team-a"):
        manifest = kube_cluster.kubectl("create", "namespace", namespace, "--dry-run=client", "-o", "yaml").stdout
        kube_cluster.kubectl("apply", "-f", "-", input=manifest)
    return kube_cluster


def _dry_run(cluster, manifest: str) -> list[str]:
    """Every object names its own namespace (helm template and kustomize set it)."""
    result = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=manifest, check=False)
    assert result.returncode == 0, f"the API server refused:\n{result.stderr}"
    # PodSecurity admission checks a workload's pod template against the namespace's level and warns.
    assert "would violate PodSecurity" not in result.stderr, result.stderr
    return [line for line in result.stdout.splitlines() if line.strip()]


def _restricted(cluster, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/warn=restricted")


@pytest.mark.parametrize("values", [[], ["-f", str(FULL_VALUES)]], ids=["default", "full"])
def test_rendered_chart_is_accepted_by_the_api_server(cluster, kube_namespace, values):
    """In a namespace enforcing the `restricted` Pod Security Standard, as every release namespace should."""
    _restricted(cluster, kube_namespace)
    manifest = Helm(cluster.bin_dir / "helm").template_text(*values, namespace=kube_namespace)
    expected = len([doc for doc in yaml.safe_load_all(manifest) if doc])
    applied = _dry_run(cluster, manifest)
    assert len(applied) == expected and all("(server dry run)" in line for line in applied)


def test_a_pod_template_breaking_the_profile_is_flagged(cluster, kube_namespace):
    """The check above can fail: a Deployment whose pods may run as root draws PodSecurity's warning."""
    _restricted(cluster, kube_namespace)
    manifest = Helm(cluster.bin_dir / "helm").template_text("--set", "podSecurityContext.runAsNonRoot=false",
                                                            namespace=kube_namespace)
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert 'would violate PodSecurity "restricted:latest"' in result.stderr and "runAsNonRoot" in result.stderr


def test_a_typo_in_a_manifest_is_refused(cluster, kube_namespace):
    """The check above can fail: a misspelt field in a CRD-backed object is rejected, not dropped."""
    manifest = (REPO / "config/samples/inferencemodel-smollm2.yaml").read_text().replace("maxNumSeqs", "maxNumSeq")
    result = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", kube_namespace, "-f", "-",
                             input=manifest, check=False)
    assert result.returncode != 0 and "maxNumSeq" in result.stderr


def _config_files() -> list[Path]:
    return sorted(p for p in (REPO / "config").rglob("*") if p.is_file())


def test_every_manifest_in_config_is_accepted(cluster, kube_namespace):
    from sluice_gateway.config import load_config
    from sluice_gateway.routing_table import load_routing_table

    checked = []
    for path in _config_files():
        if path.suffix == ".json":
            load_routing_table(path)
        elif path.suffix in (".yaml", ".yml"):
            docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
            if all("apiVersion" not in doc for doc in docs):
                load_config(path)
            elif docs[0].get("kind") == "Kustomization":
                built = cluster.kubectl("kustomize", str(path.parent)).stdout
                _dry_run(cluster, built)
            else:
                own = any(doc.get("metadata", {}).get("namespace") for doc in docs)
                where = [] if own else ["-n", kube_namespace]
                result = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", *where, "-f", str(path),
                                         check=False)
                assert result.returncode == 0, f"{path.relative_to(REPO)}: {result.stderr}"
        else:
            pytest.fail(f"{path.relative_to(REPO)}: no check knows this kind of file; add one")
        checked.append(path.name)
    assert {"inferencemodel-smollm2.yaml", "argocd-applications.yaml", "kustomization.yaml",
            "gateway-two-tenants.yaml"} <= set(checked)


def _can(cluster, account: str, *request: str) -> bool:
    result = cluster.kubectl("auth", "can-i", *request, f"--as={account}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


@pytest.mark.parametrize("watching", [True, False], ids=["watch-namespaces", "all-namespaces"])
def test_installed_operator_may_do_what_it_needs_and_nothing_more(cluster, watching):
    """`kubectl auth can-i` as the operator's service account, against the chart as `helm install` leaves it."""
    import uuid

    from fixtures.gie import inference_pool_crd

    # kubectl answers "no" for a resource the API server does not know, whatever the RBAC says.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(inference_pool_crd()))
    cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                    "crd/inferencepools.inference.networking.k8s.io")
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    home, watched, elsewhere = release, f"{release}-w", f"{release}-x"
    for namespace in (home, watched, elsewhere):
        cluster.kubectl("create", "namespace", namespace)
    helm = Helm(cluster.bin_dir / "helm")
    values = ["--set", "gateway.enabled=false", "--set", "operator.leaderElection.enabled=false"]
    values += ["--set", f"operator.watchNamespaces={{{watched}}}"] if watching else ["--set", "rbac.clusterWide=true"]
    helm.run("install", release, str(CHART), "--namespace", home, "--skip-crds", "--kubeconfig", cluster.kubeconfig,
             *values)
    try:
        fullname = f"{release}-sluice"
        account = f"system:serviceaccount:{home}:{fullname}-operator"
        credential, policy = f"secrets/{fullname}-runtime-credential", f"networkpolicies/{fullname}-runtime"
        served = [watched] if watching else [watched, elsewhere]
        for namespace in served:
            for request in (("create", "deployments"), ("patch", "deployments"), ("patch", "inferencemodels/status"),
                            ("patch", "inferencemodels/scale"), ("list", "pods"), ("watch", "pods"), ("patch", "pods"),
                            ("create", "configmaps/sluice-routing-table"), ("delete", "configmaps/sluice-routing-table"),
                            ("create", credential), ("patch", credential), ("delete", credential),
                            ("create", policy), ("delete", policy), ("create", "events"),
                            ("get", "secrets/a-models-token"),
                            ("create", "inferencepools.inference.networking.k8s.io"),
                            ("patch", "inferencepools.inference.networking.k8s.io"),
                            ("delete", "inferencepools.inference.networking.k8s.io")):
                assert _can(cluster, account, *request, "-n", namespace), (namespace, request)
        for namespace in (watched, elsewhere):
            # Only what it owns, by name; nothing it has no feature for.
            for request in (("delete", "configmaps"), ("delete", "configmaps/kube-root-ca.crt"),
                            ("patch", "configmaps/someone-elses"), ("list", "secrets"), ("watch", "secrets"),
                            ("patch", "secrets/someone-elses"), ("delete", "pods"), ("create", "pods"),
                            ("delete", "deployments"), ("delete", "services"), ("get", "pods"),
                            ("delete", "networkpolicies/someone-elses"), ("create", "roles"),
                            ("update", "inferencemodels/status"),
                            ("deletecollection", "inferencepools.inference.networking.k8s.io"),
                            ("update", "inferencepools.inference.networking.k8s.io/status")):
                assert not _can(cluster, account, *request, "-n", namespace), (namespace, request)
        # Its own namespace: the credential's source, followed by a watch of that one name.
        for request in (("get", credential), ("watch", credential), ("list", credential), ("create", credential)):
            assert _can(cluster, account, *request, "-n", home), request
        assert not _can(cluster, account, "list", "secrets", "-n", home)
        if watching:
            for namespace in (elsewhere, home):
                assert not _can(cluster, account, "create", "deployments", "-n", namespace), namespace
            assert not _can(cluster, account, "list", "pods", "-n", elsewhere)
            assert not _can(cluster, account, "get", "secrets/a-models-token", "-n", elsewhere)
            # Home: the gateway pods, whose metrics carry each model's demand (scale from zero); read only.
            assert _can(cluster, account, "list", "pods", "-n", home)
            assert not _can(cluster, account, "patch", "pods", "-n", home)
            for request in (("list", "namespaces"), ("list", "customresourcedefinitions.apiextensions.k8s.io"),
                            ("list", "inferencemodels.sluice.dev", "--all-namespaces")):
                assert not _can(cluster, account, *request), request
            assert not cluster.kubectl("get", "clusterrole", f"{fullname}-operator", check=False).returncode == 0
        else:
            for request in (("list", "namespaces"), ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
                            ("list", "inferencemodels.sluice.dev", "--all-namespaces")):
                assert _can(cluster, account, *request), request
            assert not _can(cluster, account, "list", "secrets", "--all-namespaces")
    finally:
        helm.run("uninstall", release, "--namespace", home, "--kubeconfig", cluster.kubeconfig, check=False)
        cluster.kubectl("delete", "namespace", home, watched, elsewhere, "--wait=false", check=False)


def test_helm_install_adopts_the_peering_an_operator_created_first(cluster):
    """An operator that waited for the release's peering object in vain creates it owned by the
    release; the next helm install or upgrade adopts it."""
    import uuid

    from sluice_operator.builders.peering import build_peering

    release = f"peer-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", release)
    helm = Helm(cluster.bin_dir / "helm")
    install = ("install", release, str(CHART), "--namespace", release, "--skip-crds", "--kubeconfig",
               cluster.kubeconfig, "--set", "gateway.enabled=false",
               "--set", f"operator.watchNamespaces={{{release}}}")
    unowned = build_peering("sluice-operator", release, None)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(unowned))
    refused = helm.run(*install, check=False)
    assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr, "without it, helm cannot"
    helm.run("uninstall", release, "--namespace", release, "--kubeconfig", cluster.kubeconfig, check=False)

    owned = build_peering("sluice-operator", release, (release, release))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(owned))
    try:
        helm.run(*install)
    finally:
        helm.run("uninstall", release, "--namespace", release, "--kubeconfig", cluster.kubeconfig)
    gone = cluster.kubectl("get", "kopfpeering", "sluice-operator", "-n", release, check=False)
    assert gone.returncode != 0, "helm uninstall removes the adopted peering"
