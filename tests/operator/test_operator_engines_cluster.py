"""engine: vllm | sglang on the real API server: the CRD refuses what an engine lacks, naming engine and field,
and the objects the operator builds for each engine pass a server-side dry run."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from sluice_operator.builders import Owner, Release, build_all
from sluice_operator.crd import InferenceModelSpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MESSAGE = "runtime.kvCacheMemory is not supported by engine sglang"


@pytest.fixture(scope="module")
def namespace(kube_cluster):
    # Forced: the e2e scenarios install the same CRDs through helm, which then owns their fields.
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kube_cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                         "crd/inferencemodels.sluice.dev")
    name = f"engines-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _dry_run(kube_cluster, namespace: str, docs: list[dict]):
    return kube_cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-o", "name", "-f", "-",
                                input=yaml.safe_dump_all(docs), check=False)


def _model(name: str, runtime: dict) -> dict:
    return {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": name},
            "spec": {"model": {"source": "smollm2"}, "runtime": runtime}}


def test_the_api_server_refuses_a_field_the_engine_lacks(kube_cluster, namespace):
    refused = _dry_run(kube_cluster, namespace, [_model("sg", {"engine": "sglang", "kvCacheMemory": "2Gi"})])
    assert refused.returncode != 0 and MESSAGE in refused.stderr, refused.stderr
    accepted = _dry_run(kube_cluster, namespace, [
        _model("vl", {"engine": "vllm", "kvCacheMemory": "2Gi"}),
        _model("sg-ok", {"engine": "sglang", "gpuMemoryUtilization": 0.8}),
        _model("default", {}),
    ])
    assert accepted.returncode == 0, accepted.stderr
    assert set(accepted.stdout.split()) == {f"inferencemodel.sluice.dev/{n}" for n in ("vl", "sg-ok", "default")}


@pytest.mark.parametrize("runtime, fragment", [
    ({"engine": "sglang", "kv_cache_memory": "2Gi"}, 'unknown field "spec.runtime.kv_cache_memory"'),
    ({"engine": "VLLM"}, 'Unsupported value: "VLLM"'),
    ({"engine": ["vllm"]}, "spec.runtime.engine: Invalid value"),
    ({"engine": "vllm", "gpuMemoryUtilization": 1.5}, "spec.runtime.gpuMemoryUtilization"),
    ({"engine": "vllm", "gpuMemoryUtilization": 0}, "spec.runtime.gpuMemoryUtilization"),
    ({"engine": "vllm", "args": ["--api-key", "x"]}, "runtime.args: '--api-key' is not allowed with engine vllm"),
    ({"engine": "vllm", "args": ["--api-key=x"]}, "runtime.args: '--api-key=x' is not allowed with engine vllm"),
])
def test_other_spellings_and_values_do_not_get_around_it(kube_cluster, namespace, runtime, fragment):
    refused = _dry_run(kube_cluster, namespace, [_model("odd", runtime)])
    assert refused.returncode != 0 and fragment in refused.stderr, refused.stderr


def test_each_engines_objects_pass_a_server_side_dry_run(kube_cluster, namespace):
    docs = []
    for engine, extra in (("vllm", {"kvCacheMemory": "6Gi", "dtype": "bfloat16", "gpuMemoryUtilization": 0.9}),
                          ("sglang", {"gpuMemoryUtilization": 0.85, "prefixCaching": False}),
                          ("sluice", {})):
        spec = InferenceModelSpec.model_validate({
            "model": {"source": "hf:Qwen/Qwen3-0.6B", "revision": "main", "tokenSecret": {"name": "hf"}},
            "runtime": {"engine": engine, **extra}, "resources": {"gpus": 2}, "tensorParallelSize": 2})
        owner = Owner(name=f"m-{engine}", namespace=namespace, uid=str(uuid.uuid4()))
        docs += build_all(owner, spec, Release("sluice", "sluice-system"),
                          guard_image="ghcr.io/sluice-dev/sluice-operator:0.1.0")
    result = _dry_run(kube_cluster, namespace, docs)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) == len(docs) == 9
