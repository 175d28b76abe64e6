"""operator.allowedImagePrefixes at admission: the chart's ValidatingAdmissionPolicy, applied to the real API
server, refuses an InferenceModel whose runtime.image is under none of them, with the operator's own message,
in the namespaces the release serves; the operator's side is tests/operator/test_operator_model_policy.py."""
from __future__ import annotations

import uuid

import pytest
import yaml
from chart.helm_tool import CHART, Helm, by_kind, helm_binary

from fixtures.cluster import wait_for
from sluice_operator.builders.model_policy import image_refusal
from sluice_operator.crd import ENGINE_IMAGES

pytestmark = pytest.mark.integration

PREFIXES = ("ghcr.io/sluice-dev/", "docker.io/vllm/vllm-openai", "registry.example:5000/team")


@pytest.fixture(scope="module")
def served(request, kube_cluster):
    """Two namespaces: one the release serves (the policy's binding names it), one it does not."""
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/inferencemodels.sluice.dev")
    suffix = uuid.uuid4().hex[:8]
    inside, outside = f"images-{suffix}", f"other-{suffix}"
    for namespace in (inside, outside):
        kube_cluster.kubectl("create", "namespace", namespace)
    helm = Helm(helm_binary(request))
    args = ["--set", f"fullnameOverride=img-{suffix}", "--set", f"operator.watchNamespaces={{{inside}}}"]
    for i, prefix in enumerate(PREFIXES):
        args += ["--set", f"operator.allowedImagePrefixes[{i}]={prefix}"]
    docs = helm.template(*args)
    policy = [o for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
              for o in by_kind(docs, kind) if o["metadata"]["name"].endswith("-model-images")]
    assert len(policy) == 2
    kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(policy))
    yield kube_cluster, inside, outside
    kube_cluster.kubectl("delete", "-f", "-", input=yaml.safe_dump_all(policy), check=False)
    for namespace in (inside, outside):
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _create(cluster, namespace: str, runtime: dict):
    doc = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel",
           "metadata": {"name": f"m-{uuid.uuid4().hex[:6]}"}, "spec": {"model": {"source": "smollm2"}, "runtime": runtime}}
    return cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc),
                           check=False)


def test_an_image_under_no_allowed_prefix_is_refused_at_admission(served):
    cluster, inside, _ = served
    image = "docker.io/vllm/vllm-openai-evil:1"
    # The API server starts enforcing a new policy within a few seconds.
    refused = wait_for(lambda: (r := _create(cluster, inside, {"image": image})).returncode != 0 and r,
                       what="the policy to refuse")
    assert image_refusal(image, PREFIXES) in refused.stderr, refused.stderr


@pytest.mark.parametrize("image", [
    "busybox", "library/busybox:1", "evil.example/ghcr.io/sluice-dev/runtime:1", "ghcr.io/sluice-devs/runtime:1",
    "registry.example:5000/teammate/x:1", "vllm/vllm-openai-evil",
])
def test_other_spellings_do_not_get_past_the_policy(served, image):
    cluster, inside, _ = served
    wait_for(lambda: _create(cluster, inside, {"image": "busybox"}).returncode != 0, what="the policy to refuse")
    refused = _create(cluster, inside, {"image": image, "engine": "vllm"})
    assert refused.returncode != 0 and "is not under a registry prefix this release allows" in refused.stderr


@pytest.mark.parametrize("runtime", [
    {}, {"image": "ghcr.io/sluice-dev/sluice-runtime:0.1.0-cuda"}, {"image": ENGINE_IMAGES["vllm"], "engine": "vllm"},
    {"image": "docker.io/vllm/vllm-openai@sha256:" + "a" * 64, "engine": "vllm"},
    {"image": "registry.example:5000/team:2"}, {"image": "registry.example:5000/team/x/y:3"},
])
def test_images_under_a_prefix_and_unset_ones_are_admitted(served, runtime):
    cluster, inside, _ = served
    wait_for(lambda: _create(cluster, inside, {"image": "busybox"}).returncode != 0, what="the policy to refuse")
    result = _create(cluster, inside, runtime)
    assert result.returncode == 0, result.stderr


def test_a_namespace_the_release_does_not_serve_is_left_to_its_own_release(served):
    cluster, inside, outside = served
    wait_for(lambda: _create(cluster, inside, {"image": "busybox"}).returncode != 0, what="the policy to refuse")
    result = _create(cluster, outside, {"image": "busybox"})
    assert result.returncode == 0, result.stderr
