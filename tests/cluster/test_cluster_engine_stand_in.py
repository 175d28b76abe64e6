"""The local cluster's vLLM stand-in: what the operator writes for vLLM becomes a command line Sluice's runtime
takes, with /load off as on vLLM; an image other than vLLM's runs as it is."""
import contextlib
import io

import pytest

from localcluster.engine_stand_in import stand_in_command, translate_vllm
from sluice_operator.builders import Owner, Release, build_deployment
from sluice_operator.crd import InferenceModelSpec


def _vllm_pod(**runtime) -> dict:
    spec = InferenceModelSpec.model_validate({"model": {"source": "smollm2"}, "runtime": {"engine": "vllm", **runtime}})
    deployment = build_deployment(Owner(name="chat", namespace="n", uid="u"), spec, Release("r", "ns").credential_secret,
                                  guard_image="ghcr.io/sluice-dev/sluice-operator:0.1.0")
    return deployment["spec"]["template"]["spec"]


def _runtime_parses(args: list[str]):
    from sluice_runtime.cli import _parser
    from sluice_runtime.engine_config import EngineConfig
    from sluice_runtime.server.settings import ServerSettings

    parser, _ = _parser()
    with contextlib.redirect_stderr(io.StringIO()):
        parsed = parser.parse_args([a.replace("$(POD_IP)", "127.0.0.1") for a in args])
    return EngineConfig.from_cli_args(parsed), ServerSettings.from_cli_args(parsed)


@pytest.mark.parametrize("image, stands_in", [
    ("vllm/vllm-openai:v0.11.0", True), ("vllm/vllm-openai", True), ("docker.io/vllm/vllm-openai:latest", True),
    ("vllm/vllm-openai@sha256:" + "a" * 64, True), ("registry.local/vllm/vllm-openai:v1", False),
    ("ghcr.io/sluice-dev/sluice-runtime:0.1.0", False), ("lmsysorg/sglang:v0.5.4", False), ("", False),
])
def test_only_vllms_image_is_stood_in_for(image, stands_in):
    assert (stand_in_command(image) is not None) == stands_in


def test_the_operators_vllm_command_line_runs_the_runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    engine_container, guard = _vllm_pod(maxModelLen=512, maxNumSeqs=4, kvCacheMemory="128Mi", prefixCaching=False,
                                        dtype="float32")["containers"]
    assert stand_in_command(guard["image"]) is None, "the guard is ours and runs as it is"
    args = translate_vllm(engine_container["args"], {})
    engine, server = _runtime_parses(args)
    assert not server.load_endpoint and server.served_model_names == ["chat"]
    assert args[args.index("--model") + 1] == "smollm2" and "--no-prefix-caching" in args
    assert args[args.index("--kv-cache-memory") + 1] == str(128 * 2**20)
    # Behind the guard the engine checks no key and listens on the pod's loopback only.
    assert "--api-key-file" not in args and server.host == "127.0.0.1"


def test_a_key_given_to_vllm_becomes_the_runtimes_key_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    args = translate_vllm(["m", "--port", "8000"], {"VLLM_API_KEY": "sk-credential"})
    assert open(args[args.index("--api-key-file") + 1]).read() == "sk-credential"


def test_a_pods_loopback_is_its_own_address():
    from localcluster.podspec import own_loopback

    assert own_loopback("http://127.0.0.1:8001", "127.1.0.7") == "http://127.1.0.7:8001"
    assert own_loopback("127.0.0.10 and 127.0.0.1", "127.1.0.7") == "127.0.0.10 and 127.1.0.7"


@pytest.mark.parametrize("args, message", [
    (["--max-model-len", "512"], "takes the model first"),
    (["m", "--speculative-config", "{}"], "does not translate --speculative-config"),
    (["m", "--max-model-len"], "--max-model-len needs a value"),
])
def test_what_it_cannot_translate_stops_it(args, message):
    with pytest.raises(ValueError, match=message):
        translate_vllm(args, {})
