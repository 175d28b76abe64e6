"""The local cluster's vLLM stand-in: what the operator writes for vLLM becomes a command line Sluice's runtime
takes, with /load off as on vLLM."""
import contextlib
import io

import pytest

from localcluster.engine_stand_in import main, translate_vllm
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


def test_the_operators_vllm_command_line_runs_the_runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    engine_container, guard = _vllm_pod(maxModelLen=512, maxNumSeqs=4, kvCacheMemory="128Mi", prefixCaching=False,
                                        dtype="float32")["containers"]
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


@pytest.mark.parametrize("args, message", [
    (["--max-model-len", "512"], "takes the model first"),
    (["m", "--speculative-config", "{}"], "does not translate --speculative-config"),
    (["m", "--max-model-len"], "--max-model-len needs a value"),
])
def test_what_it_cannot_translate_stops_it(args, message):
    with pytest.raises(ValueError, match=message):
        translate_vllm(args, {})


def test_only_vllm_serve_is_stood_in_for(capsys):
    assert main(["bench", "latency"]) == 2 and "usage: vllm serve MODEL" in capsys.readouterr().err
