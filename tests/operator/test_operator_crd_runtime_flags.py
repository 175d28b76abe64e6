"""The InferenceModel CRD, on the real API server, accepts exactly the engine flags the runtime starts with.

For each value tried, three readers must agree: the API server (the generated schema and its CEL rules, by a
server-side dry run), the operator's own model of the spec, and the runtime's command line, given the
arguments the operator builds for the pod. A value only the runtime refuses would make a pod that exits on
every restart; one only the CRD refuses would be a setting nobody can use.
"""
from __future__ import annotations

import contextlib
import io
import json
import uuid
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from sluice_contracts.runtime_flags import DTYPES, MAX_MODEL_LEN, MAX_NUM_SEQS, QUANTIZATIONS, TENSOR_PARALLEL_SIZE
from sluice_operator.builders import Owner, build_deployment
from sluice_operator.crd import InferenceModelSpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _around(flag) -> list[int]:
    return [flag.minimum - 1, flag.minimum, flag.maximum, flag.maximum + 1]


# (spec path, values): the runtime section's engine flags, each value alone on top of the smollm2 sample.
TRIED = [
    (("runtime", "blockSize"), [0, 1, 2, 3, 16, 48, 128, 256, 512]),
    (("runtime", "dtype"), [*DTYPES, "fp8", "Float32", "float64", ""]),
    (("runtime", "maxModelLen"), _around(MAX_MODEL_LEN)),
    (("runtime", "maxNumSeqs"), [*_around(MAX_NUM_SEQS), 1024, 1025]),
    (("runtime", "quantization"), [*QUANTIZATIONS, "int4", "INT8", "fp8", ""]),
    (("tensorParallelSize",), _around(TENSOR_PARALLEL_SIZE)),
]
CASES = [(path, value) for path, values in TRIED for value in values]


def _spec(path: tuple[str, ...], value) -> dict:
    # GPUs enough for any tensor-parallel size the CRD allows, so the value alone decides.
    spec = {"model": {"source": "smollm2"}, "resources": {"gpus": TENSOR_PARALLEL_SIZE.maximum}}
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return spec


def _runtime_refusal(args: list[str]) -> str | None:
    """Why `sluice-runtime` would refuse this command line (its own parser and config), or None."""
    from sluice_runtime.cli import _parser
    from sluice_runtime.engine_config import EngineConfig
    from sluice_runtime.server.settings import ServerSettings

    parser, _ = _parser()
    # The pod's address comes from the downward API; here any address parses the same.
    args = [a.replace("$(POD_IP)", "127.0.0.1") for a in args]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            parsed = parser.parse_args(args)
        EngineConfig.from_cli_args(parsed)
        ServerSettings.from_cli_args(parsed)
    except SystemExit:
        return printed.getvalue().strip().splitlines()[-1]
    except ValueError as exc:
        return str(exc)
    return None


def _runtime_args(spec: dict, path: tuple[str, ...], value) -> list[str]:
    """The runtime's arguments as the operator builds them; for a value its model refuses, the valid default
    spec's arguments with this flag's value put in, as a user passing it by hand would."""
    try:
        model = InferenceModelSpec.model_validate(spec)
    except ValidationError:
        model = InferenceModelSpec.model_validate(_spec(("runtime", "blockSize"), 16))
        args = _container_args(model)
        flag = "--" + "-".join(_snake(path[-1]).split("_"))
        if flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag, str(value)]
        return args
    return _container_args(model)


def _container_args(model: InferenceModelSpec) -> list[str]:
    deployment = build_deployment(Owner(name="m", namespace="n", uid="u"), model)
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


@pytest.fixture(scope="module")
def crd_namespace(kube_cluster):
    # Forced: the e2e scenarios install the same CRDs through helm, which then owns their fields.
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kube_cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                         "crd/inferencemodels.sluice.dev")
    name = f"flags-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_crd_operator_and_runtime_accept_the_same_engine_flags(kube_cluster, crd_namespace):
    # One server-side dry run for all cases: kubectl reports each object it could not create by name.
    docs = [{"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": f"case-{i}"},
             "spec": _spec(path, value)} for i, (path, value) in enumerate(CASES)]
    result = kube_cluster.kubectl("-n", crd_namespace, "create", "--dry-run=server", "-o", "name", "-f", "-",
                                  input=yaml.safe_dump_all(docs), check=False)
    created = {line.rsplit("/", 1)[-1] for line in result.stdout.split()}
    disagreements = []
    for i, (path, value) in enumerate(CASES):
        spec = _spec(path, value)
        api_accepts = f"case-{i}" in created
        try:
            InferenceModelSpec.model_validate(spec)
            model_accepts = True
        except ValidationError:
            model_accepts = False
        refusal = _runtime_refusal(_runtime_args(spec, path, value))
        verdicts = {"API server": api_accepts, "operator": model_accepts, "runtime": refusal is None}
        if len(set(verdicts.values())) > 1:
            disagreements.append(f"{'.'.join(path)}={json.dumps(value)}: {verdicts} (runtime: {refusal})")
    # Both sides must have refused something, or the comparison proved nothing.
    assert len(created) not in (0, len(CASES)), result.stderr
    assert not disagreements, "\n".join(disagreements)
